//! The layering of the code, checked from the sources: the layers written in
//! `docs/ARCHITECTURE.md` (the fenced block after "Layers, bottom first")
//! list the top-level modules of `src/`, lowest first. A module may use
//! (`crate::…`, or a type the crate root re-exports from it) only modules of
//! lower layers; modules on one line may not use each other. So there is no
//! cycle between top-level modules, and none inside a module either: the
//! files and folders directly inside a module (its `mod.rs` aside, which
//! declares and re-exports them) must not use each other in a cycle.
//!
//! The block may list known upward uses as `! a -> b: why`: each one must
//! still exist (so the list shrinks as they are removed) and none other may.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The text without `//` comments (doc comments included) and without
/// string literals, so that examples and messages are not read as uses.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let (mut in_str, mut in_comment) = (false, false);
    while let Some(c) = chars.next() {
        if in_comment {
            if c == '\n' {
                in_comment = false;
                out.push('\n');
            }
            continue;
        }
        if in_str {
            if c == '\\' {
                chars.next();
            } else if c == '"' {
                in_str = false;
            }
            continue;
        }
        match c {
            '/' if chars.peek() == Some(&'/') => in_comment = true,
            '"' => in_str = true,
            // A char literal such as '"' must not open a string.
            '\'' => {
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with("\"'") || rest.starts_with("\\\"'") {
                    let skip = if rest.starts_with('\\') { 3 } else { 2 };
                    for _ in 0..skip {
                        chars.next();
                    }
                }
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out
}

/// Identifiers at the top level of a `{…}` group (nested groups skipped).
fn group_idents(group: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut current = String::new();
    let mut at_start = true;
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                if at_start && !current.is_empty() {
                    out.push(std::mem::take(&mut current));
                }
                at_start = true;
                current.clear();
                continue;
            }
            _ => {}
        }
        if depth == 0 && at_start {
            if c.is_alphanumeric() || c == '_' {
                current.push(c);
            } else if !current.is_empty() {
                out.push(std::mem::take(&mut current));
                at_start = false;
            }
        }
    }
    if at_start && !current.is_empty() {
        out.push(current);
    }
    out
}

/// Every first path segment after `prefix` (`crate::x`, `crate::{x, y}`).
fn first_segments(code: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = code[from..].find(prefix) {
        let start = from + i;
        from = start + prefix.len();
        // `$crate::` and identifiers ending in "crate" are not the crate root.
        if start > 0 {
            let prev = code[..start].chars().next_back().unwrap_or(' ');
            if prev.is_alphanumeric() || prev == '_' || prev == '$' {
                continue;
            }
        }
        let rest = &code[from..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let end = group
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map_or(group.len(), |(i, _)| i);
            out.extend(group_idents(&group[..end]));
        } else {
            let ident: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !ident.is_empty() {
                out.push(ident);
            }
        }
    }
    out
}

/// What the crate root re-exports: name → the module it comes from
/// (`pub use tensor::Tensor;` in `src/lib.rs`).
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in code_only(lib).lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let rest = rest.trim_end_matches(';');
        let Some((module, items)) = rest.split_once("::") else {
            continue;
        };
        let items = items.trim();
        let names = match items.strip_prefix('{') {
            Some(g) => group_idents(g.trim_end_matches('}')),
            None => vec![items.to_string()],
        };
        for n in names {
            out.insert(n, module.to_string());
        }
    }
    out
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(d) = folders.pop() {
        for p in std::fs::read_dir(&d).unwrap().flatten().map(|e| e.path()) {
            if p.is_dir() {
                folders.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

/// The top-level module of a file under `src/` (`None` for the crate root
/// and the binaries, which sit above every layer).
fn top_module(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_string_lossy();
    match first.as_ref() {
        "lib.rs" | "main.rs" | "bin" => None,
        f => Some(f.trim_end_matches(".rs").to_string()),
    }
}

/// Whether a file under `src/` is an in-crate test module (or the
/// helpers of those, `cuda/testing.rs`).
fn is_test_code(rel: &Path) -> bool {
    rel.file_name()
        .is_some_and(|n| n == "tests.rs" || n == "testing.rs")
        || rel.components().any(|c| c.as_os_str() == "tests")
}

/// Uses between top-level modules: (from, to) → the files that make them.
fn module_uses() -> BTreeMap<(String, String), BTreeSet<String>> {
    let src = root().join("src");
    let reexports = root_reexports(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut uses: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for path in rust_files(&src) {
        let rel = path.strip_prefix(&src).unwrap().to_path_buf();
        let Some(from) = top_module(&rel) else {
            continue;
        };
        // In-crate tests (`tests.rs`, `tests/`) compare with anything.
        if is_test_code(&rel) {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(&path).unwrap());
        for seg in first_segments(&code, "crate::") {
            let to = reexports.get(&seg).cloned().unwrap_or(seg);
            let is_module = src.join(&to).is_dir() || src.join(format!("{to}.rs")).is_file();
            if to != from && is_module {
                uses.entry((from.clone(), to))
                    .or_default()
                    .insert(rel.display().to_string());
            }
        }
    }
    uses
}

/// Known upward uses: (from, to) → why.
type KnownUses = BTreeMap<(String, String), String>;

/// The layers block of docs/ARCHITECTURE.md: layers (lowest first) and the
/// known upward uses.
fn layers() -> (Vec<Vec<String>>, KnownUses) {
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let start = doc
        .find("Layers, bottom first")
        .expect("docs/ARCHITECTURE.md has no \"Layers, bottom first\" block");
    let block_start = doc[start..].find("```").unwrap() + start;
    let body_start = doc[block_start..].find('\n').unwrap() + block_start + 1;
    let body_end = doc[body_start..].find("```").unwrap() + body_start;
    let (mut layers, mut known) = (Vec::new(), BTreeMap::new());
    for line in doc[body_start..body_end].lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('!') {
            let (edge, why) = rest.split_once(':').unwrap_or((rest, ""));
            let (a, b) = edge.split_once("->").expect("`! a -> b: why`");
            known.insert(
                (a.trim().to_string(), b.trim().to_string()),
                why.trim().to_string(),
            );
            continue;
        }
        // "name name   # comment": the names before the comment.
        let names = line.split('#').next().unwrap_or("");
        layers.push(names.split_whitespace().map(str::to_string).collect());
    }
    (layers, known)
}

#[test]
fn every_module_is_in_exactly_one_layer() {
    let (layers, _) = layers();
    let mut listed = BTreeSet::new();
    for name in layers.iter().flatten() {
        assert!(listed.insert(name.clone()), "{name} is listed twice");
    }
    let src = root().join("src");
    let mut on_disk = BTreeSet::new();
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        if let Some(m) = top_module(Path::new(&e.file_name())) {
            on_disk.insert(m);
        }
    }
    assert_eq!(
        listed, on_disk,
        "the layers in docs/ARCHITECTURE.md must list every top-level module of src/"
    );
}

#[test]
fn no_module_uses_a_higher_layer_or_a_neighbour() {
    let (layers, known) = layers();
    let level: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .flat_map(|(i, l)| l.iter().map(move |m| (m.as_str(), i)))
        .collect();
    let uses = module_uses();
    let mut wrong = Vec::new();
    let mut seen_known = BTreeSet::new();
    for ((from, to), files) in &uses {
        let (Some(&lf), Some(&lt)) = (level.get(from.as_str()), level.get(to.as_str())) else {
            continue;
        };
        if lt < lf {
            continue;
        }
        let edge = (from.clone(), to.clone());
        if known.contains_key(&edge) {
            seen_known.insert(edge);
            continue;
        }
        let files: Vec<&String> = files.iter().collect();
        wrong.push(format!(
            "{from} (layer {lf}) uses {to} (layer {lt}) in {files:?}"
        ));
    }
    assert!(
        wrong.is_empty(),
        "uses against the layering of docs/ARCHITECTURE.md:\n{}",
        wrong.join("\n")
    );
    let gone: Vec<String> = known
        .keys()
        .filter(|e| !seen_known.contains(*e))
        .map(|(a, b)| format!("{a} -> {b}"))
        .collect();
    assert!(
        gone.is_empty(),
        "known upward uses that no longer exist (remove them from docs/ARCHITECTURE.md): {gone:?}"
    );
}

/// Strongly connected components with more than one member.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Tarjan's algorithm, recursive (the graphs are small).
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        if let Some(ws) = s.graph.get(v) {
            for w in ws {
                let w = w.as_str();
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let lw = s.low[w];
                    let lv = s.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if s.on_stack.contains(w) {
                    let iw = s.index[w];
                    let lv = s.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// Identifiers following `prefix` (`super::x`, `super::{x, y}`).
fn children_used(code: &str, prefix: &str) -> Vec<String> {
    first_segments(code, prefix)
}

#[test]
fn no_cycle_between_the_files_of_a_module() {
    let src = root().join("src");
    let mut problems = Vec::new();
    let mut folders = vec![src.clone()];
    while let Some(dir) = folders.pop() {
        // The children of `dir`: its files (mod.rs and lib.rs aside) and folders.
        let mut children = BTreeSet::new();
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if p.is_dir() {
                folders.push(p);
                children.insert(name);
            } else if let Some(stem) = name.strip_suffix(".rs") {
                if stem != "mod" && stem != "lib" {
                    children.insert(stem.to_string());
                }
            }
        }
        // The path of `dir` from the crate root (`cpu::norm`), for
        // `crate::`-paths that name a sibling.
        let rel = dir.strip_prefix(&src).unwrap();
        if rel.as_os_str().is_empty() {
            // Between top-level modules: the layering test's business.
            continue;
        }
        let module_path: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().to_string())
            .collect();
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for child in &children {
            let file = dir.join(format!("{child}.rs"));
            let files = if file.is_file() {
                vec![(file, 0usize)]
            } else if dir.join(child).is_dir() {
                rust_files(&dir.join(child))
                    .into_iter()
                    .map(|f| {
                        // Path components below the child's folder
                        // (1: a file directly in it).
                        let depth = f
                            .strip_prefix(dir.join(child))
                            .unwrap()
                            .components()
                            .count();
                        (f, depth)
                    })
                    .collect()
            } else {
                continue;
            };
            let mut used = BTreeSet::new();
            for (f, depth) in files {
                let code = code_only(&std::fs::read_to_string(&f).unwrap());
                // `super::` from a file directly in `dir` (depth 0) or from
                // a folder's mod.rs (depth 1) reaches `dir`'s children;
                // deeper files need more `super::`s.
                let supers = if depth == 0 {
                    1
                } else if f.ends_with("mod.rs") {
                    depth
                } else {
                    depth + 1
                };
                let prefix = "super::".repeat(supers);
                let mut names = children_used(&code, &prefix);
                let crate_prefix = if module_path.is_empty() {
                    "crate::".to_string()
                } else {
                    format!("crate::{}::", module_path.join("::"))
                };
                names.extend(children_used(&code, &crate_prefix));
                for n in names {
                    if children.contains(&n) && &n != child {
                        used.insert(n);
                    }
                }
            }
            graph.insert(child.clone(), used);
        }
        for comp in cycles(&graph) {
            problems.push(format!("src/{}: {comp:?}", rel.display()));
        }
    }
    problems.sort();
    assert!(
        problems.is_empty(),
        "files of one module that use each other in a cycle:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_reader_sees_uses() {
    let code = code_only(
        "use crate::{a, b::{C, d}, Tensor};\n// crate::hidden\nlet s = \"crate::no\";\nfn f() -> crate::e::F { super::g::h() }\n",
    );
    assert_eq!(first_segments(&code, "crate::"), ["a", "b", "Tensor", "e"]);
    assert_eq!(first_segments(&code, "super::"), ["g"]);
    assert_eq!(group_idents("x, y::{Z}, w as v"), ["x", "y", "w"]);
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), ["b".to_string()].into_iter().collect());
    g.insert("b".to_string(), ["a".to_string()].into_iter().collect());
    g.insert("c".to_string(), ["a".to_string()].into_iter().collect());
    assert_eq!(cycles(&g), vec![vec!["a".to_string(), "b".to_string()]]);
}

/// A markdown table's lines with rustdoc links reduced to their text.
fn normalized(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line.trim();
    // `[`X`](path)` → `X`
    while let Some(i) = rest.find("[`") {
        let Some(close) = rest[i..].find("`](") else {
            break;
        };
        let Some(end) = rest[i + close..].find(')') else {
            break;
        };
        out.push_str(&rest[..i]);
        out.push_str(&rest[i + 1..i + close + 1]);
        rest = &rest[i + close + end + 1..];
    }
    out.push_str(rest);
    // `| --- |` and `|---|` are the same separator.
    if out.chars().all(|c| matches!(c, '|' | '-' | ' ' | ':')) {
        return out.replace(' ', "");
    }
    out
}

/// The saved-state tables in module docs (`//!` tables whose first
/// column is "op"), by file.
fn saved_state_tables() -> Vec<(String, Vec<String>)> {
    let src = root().join("src");
    let mut out = Vec::new();
    for path in rust_files(&src) {
        let text = std::fs::read_to_string(&path).unwrap();
        let mut current: Vec<String> = Vec::new();
        let mut flush = |current: &mut Vec<String>| {
            let first = current
                .first()
                .and_then(|h| h.split('|').nth(1))
                .map(str::trim);
            if first == Some("op") {
                let rel = path.strip_prefix(root()).unwrap().display().to_string();
                out.push((rel, current.clone()));
            }
            current.clear();
        };
        for line in text.lines() {
            let doc = line.strip_prefix("//!").map(str::trim_start);
            match doc {
                Some(l) if l.starts_with('|') => current.push(normalized(l)),
                _ => flush(&mut current),
            }
        }
        flush(&mut current);
    }
    out
}

#[test]
fn the_architecture_doc_shows_every_saved_state_table_as_the_code_has_it() {
    let doc: Vec<String> = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md"))
        .unwrap()
        .lines()
        .map(normalized)
        .collect();
    let tables = saved_state_tables();
    assert!(
        tables.len() >= 8,
        "found only {} saved-state tables",
        tables.len()
    );
    let mut missing = Vec::new();
    for (file, table) in &tables {
        let found = doc
            .windows(table.len())
            .any(|w| w.iter().zip(table).all(|(a, b)| a == b));
        if !found {
            missing.push(format!("{file}: {}", table[0]));
        }
    }
    assert!(
        missing.is_empty(),
        "saved-state tables of these modules are not in docs/ARCHITECTURE.md as they are in the code:\n{}",
        missing.join("\n")
    );
}

/// Where CUDA may be named: the CUDA runtime, each family's `cuda.rs` (and
/// its `tests.rs`, which tests the launch code), the primitives' CUDA arms
/// and the tensor's CUDA backing.
fn in_cuda_backend(rel: &str) -> bool {
    rel.starts_with("cuda/")
        || rel.ends_with("/cuda.rs")
        || rel.contains("/cuda/")
        || rel.ends_with("/tests.rs")
        || rel == "tensor/storage.rs"
}

/// Files outside the CUDA backend that still name it, with why (to remove;
/// each must still be true).
const NAMES_CUDA_FOR_NOW: &[(&str, &str)] = &[];

#[test]
fn only_the_cuda_backend_names_cuda() {
    let src = root().join("src");
    let mut naming = BTreeSet::new();
    for path in rust_files(&src) {
        let rel = path.strip_prefix(&src).unwrap().display().to_string();
        if in_cuda_backend(&rel) || top_module(Path::new(&rel)).is_none() {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(&path).unwrap());
        let names = ["crate::cuda", "CudaBuffer", "CudaDevice", "cudarc"]
            .iter()
            .any(|n| code.contains(n));
        if names {
            naming.insert(rel);
        }
    }
    let known: BTreeSet<String> = NAMES_CUDA_FOR_NOW
        .iter()
        .map(|(f, _)| f.to_string())
        .collect();
    let new: Vec<&String> = naming.difference(&known).collect();
    assert!(
        new.is_empty(),
        "files outside the CUDA backend that name CUDA types (move that code into the family's cuda.rs and call it through the seam): {new:?}"
    );
    let gone: Vec<&String> = known.difference(&naming).collect();
    assert!(
        gone.is_empty(),
        "no longer name CUDA (remove them from NAMES_CUDA_FOR_NOW): {gone:?}"
    );
}
