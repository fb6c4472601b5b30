//! The integers Rust hands kernels to choose a formula (op codes, modes,
//! mask kinds) come from one source, `src/op_code.rs`: the kernels name
//! them (`case UnaryOp::Silu:`) from the C++ enumerations generated in
//! front of every kernel file, never as numbers. Reads the kernel sources
//! as text (no NVRTC needed; `tests/kernels_nvrtc.rs` compiles them).

use leangrad::cuda::nvrtc;
use leangrad::op_code::{kernel_code_header, TABLES};
use std::collections::BTreeSet;

/// The kernel parameters that carry a code (`int op`, `int mode`, …).
const CODE_PARAMETERS: [&str; 5] = ["op", "mode", "gmode", "kind", "mask_kind"];

/// The tables whose kernels `switch` over every code: each variant needs
/// its own `case`, or the kernel's `default` would silently compute
/// something else.
const SWITCHED: [&str; 3] = ["UnaryOp", "BinaryOp", "CompareOp"];

/// Every kernel file's text, with the prelude.
fn sources() -> Vec<(&'static str, &'static str)> {
    let mut all = vec![("common.cuh", nvrtc::PRELUDE)];
    all.extend(nvrtc::SOURCES.iter().copied());
    all
}

/// Whether `text[at..]` starts with `word` as a whole identifier.
fn word_at(text: &str, at: usize, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    text[at..].starts_with(word)
        && !text[..at].chars().next_back().is_some_and(ident)
        && !text[at + word.len()..].chars().next().is_some_and(ident)
}

/// The label of `case <label>: …` (`rest` follows `case `): up to the
/// first `:` that is not half of a `::`.
fn case_label(rest: &str) -> String {
    let b = rest.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b':' {
            if b.get(i + 1) == Some(&b':') {
                i += 2;
                continue;
            }
            break;
        }
        i += 1;
    }
    rest[..i].trim().to_string()
}

/// Each `case` label inside `switch (<code parameter>) { … }` blocks.
fn switch_cases(text: &str) -> Vec<String> {
    let mut cases = Vec::new();
    let mut from = 0;
    while let Some(pos) = text[from..].find("switch (") {
        let start = from + pos + "switch (".len();
        from = start;
        let Some(close) = text[start..].find(')') else {
            break;
        };
        let subject = text[start..start + close].trim();
        if !CODE_PARAMETERS.contains(&subject) {
            continue;
        }
        let Some(open) = text[start..].find('{').map(|o| start + o) else {
            break;
        };
        let mut depth = 0usize;
        let mut end = text.len();
        for (i, c) in text[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        for line in text[open..end].lines() {
            if let Some(rest) = line.trim_start().strip_prefix("case ") {
                cases.push(case_label(rest));
            }
        }
    }
    cases
}

/// `(parameter, operand)` of every `==` / `!=` comparison of a code
/// parameter, `x == 2` as well as `2 == x`.
fn code_comparisons(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for op in ["==", "!="] {
        for (at, _) in text.match_indices(op) {
            let left = text[..at].trim_end();
            let right = text[at + 2..].trim_start();
            let left_word: String = left
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let right_word: String = right
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':' || *c == '.')
                .collect();
            let param = |w: &str| {
                let last = w.rsplit('.').next().unwrap_or(w);
                CODE_PARAMETERS.contains(&last)
            };
            if param(&left_word) {
                found.push((left_word.clone(), right_word.clone()));
            }
            if param(&right_word) {
                found.push((right_word, left_word));
            }
        }
    }
    found
}

#[test]
fn kernels_name_codes_and_never_write_them_as_numbers() {
    let mut checked = 0;
    for (file, text) in sources() {
        for label in switch_cases(text) {
            assert!(
                label.contains("::"),
                "{file}: `case {label}:` in a switch over a code: name it from src/op_code.rs \
                 (e.g. `case UnaryOp::Silu:`)"
            );
            checked += 1;
        }
        for (param, operand) in code_comparisons(text) {
            assert!(
                operand.contains("::"),
                "{file}: `{param}` compared with `{operand}`: name the code from src/op_code.rs"
            );
            checked += 1;
        }
    }
    // The unary, binary and compare switches alone have over 50 labels.
    assert!(
        checked > 60,
        "only {checked} code uses found: is the scan broken?"
    );
}

#[test]
fn every_named_code_exists_and_every_table_is_used() {
    let all: String = sources().iter().map(|(_, t)| *t).collect();
    for table in TABLES {
        let prefix = format!("{}::", table.name);
        let mut used = BTreeSet::new();
        for (at, _) in all.match_indices(&prefix) {
            if !word_at(&all, at, table.name) {
                continue;
            }
            let variant: String = all[at + prefix.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                table.codes.iter().any(|(v, _)| *v == variant),
                "the kernels use {}{variant}, which src/op_code.rs does not declare",
                prefix
            );
            used.insert(variant);
        }
        assert!(!used.is_empty(), "no kernel uses {}", table.name);
        if SWITCHED.contains(&table.name) {
            let missing: Vec<_> = table
                .codes
                .iter()
                .filter(|(v, _)| !used.contains(*v))
                .map(|(v, _)| *v)
                .collect();
            assert!(
                missing.is_empty(),
                "{}: no kernel formula for {missing:?}",
                table.name
            );
        }
    }
}

#[test]
fn the_header_declares_each_table_once_in_front_of_every_file() {
    let header = kernel_code_header();
    for table in TABLES {
        let decl = format!("namespace {} {{", table.name);
        assert_eq!(header.matches(&decl).count(), 1, "{}", table.name);
        for (v, c) in table.codes {
            assert!(
                header.contains(&format!("{v} = {c}")),
                "{}::{v}",
                table.name
            );
        }
        let values: BTreeSet<i32> = table.codes.iter().map(|(_, c)| *c).collect();
        assert_eq!(
            values.len(),
            table.codes.len(),
            "{}: repeated values",
            table.name
        );
    }
    for (file, text) in nvrtc::SOURCES {
        let full = nvrtc::full_source(file, text);
        assert!(
            full.contains(&header),
            "{file} is compiled without the codes"
        );
        assert!(full.ends_with(text), "{file}");
    }
}
