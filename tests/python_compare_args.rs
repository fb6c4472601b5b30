//! The PyTorch twins of the jobs (`python-compare/finetune.py`,
//! `adversarial.py`, `style.py`) take the same options as `leangrad
//! finetune`, `adversarial` and `style`: the same names in the same order,
//! the same defaults, the same required options, the same flags and, where
//! the script lists them, the same possible values. Read from the scripts'
//! source (CI has no PyTorch) and from the commands' `--help`, so neither
//! side can change an option without the other.

use std::collections::BTreeMap;
use std::process::Command;

/// One command-line option as both sides describe it.
#[derive(Clone, Debug, Default, PartialEq)]
struct Opt {
    /// `--name`.
    name: String,
    /// The default as written (`[default: …]`, or Python's `default=`
    /// expression); `None` when there is none.
    default: Option<String>,
    /// Must be given.
    required: bool,
    /// Takes no value (clap's bool flag, Python's `store_true`).
    flag: bool,
    /// The accepted values, when listed.
    values: Option<Vec<String>>,
}

/// The options of `leangrad <command> --help`, `--help` itself left out.
fn clap_options(command: &str) -> Vec<Opt> {
    let out = Command::new(env!("CARGO_BIN_EXE_leangrad"))
        .args([command, "--help"])
        .output()
        .expect("the leangrad binary runs");
    assert!(out.status.success(), "leangrad {command} --help failed");
    parse_help(&String::from_utf8_lossy(&out.stdout))
}

/// Options from clap's help text: the `Usage:` line says which are
/// required; each entry of `Options:` (continuation lines joined) gives the
/// name, whether it takes a value, `[default: …]` and `[possible values: …]`.
fn parse_help(help: &str) -> Vec<Opt> {
    let usage = help
        .lines()
        .find(|l| l.starts_with("Usage:"))
        .unwrap_or_default();
    let mut entries: Vec<String> = Vec::new();
    let mut in_options = false;
    for line in help.lines() {
        if line.starts_with("Options:") {
            in_options = true;
            continue;
        }
        let trimmed = line.trim_start();
        if !in_options || trimmed.is_empty() {
            continue;
        }
        if trimmed.starts_with('-') {
            entries.push(trimmed.to_string());
        } else if let Some(last) = entries.last_mut() {
            last.push(' ');
            last.push_str(trimmed);
        }
    }
    entries
        .iter()
        .filter_map(|entry| {
            let start = entry.find("--")?;
            let rest = &entry[start..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '-')
                .collect();
            if name == "--help" || name == "--version" {
                return None;
            }
            let bracket = |label: &str| {
                let open = format!("[{label}: ");
                entry.find(&open).map(|i| {
                    let tail = &entry[i + open.len()..];
                    tail[..tail.find(']').unwrap_or(tail.len())].to_string()
                })
            };
            Some(Opt {
                flag: !rest[name.len()..].trim_start().starts_with('<'),
                required: usage.contains(&format!("{name} <")),
                default: bracket("default"),
                values: bracket("possible values")
                    .map(|v| v.split(", ").map(str::to_string).collect()),
                name,
            })
        })
        .collect()
}

/// The `add_argument(…)` calls of a Python script, as options.
fn parse_argparse(source: &str) -> Vec<Opt> {
    let mut opts = Vec::new();
    let mut rest = source;
    while let Some(i) = rest.find(".add_argument(") {
        let call = &rest[i + ".add_argument(".len()..];
        let body = &call[..closing_paren(call)];
        let args = split_top_level(body);
        let keyword = |key: &str| -> Option<String> {
            args.iter()
                .find_map(|a| a.strip_prefix(&format!("{key}=")))
                .map(|v| v.trim().to_string())
        };
        let name = unquote(args[0].trim()).unwrap_or_default();
        if name.starts_with("--") {
            let values = keyword("choices").and_then(|c| {
                let list = c.strip_prefix('[')?.strip_suffix(']')?;
                split_top_level(list)
                    .iter()
                    .map(|v| unquote(v.trim()))
                    .collect()
            });
            opts.push(Opt {
                name,
                default: keyword("default").filter(|d| d != "None"),
                required: keyword("required").as_deref() == Some("True"),
                flag: keyword("action").as_deref() == Some("\"store_true\""),
                values,
            });
        }
        rest = &call[body.len()..];
    }
    opts
}

/// The index of the `)` closing a call whose arguments start `text`
/// (strings and nested brackets skipped).
fn closing_paren(text: &str) -> usize {
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '(' | '[' | '{') => depth += 1,
            (None, ')') if depth == 0 => return i,
            (None, ')' | ']' | '}') => depth -= 1,
            _ => {}
        }
    }
    text.len()
}

/// `text` split at the commas outside strings and brackets.
fn split_top_level(text: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '(' | '[' | '{') => depth += 1,
            (None, ')' | ']' | '}') => depth -= 1,
            (None, ',') if depth == 0 => {
                parts.push(String::new());
                continue;
            }
            _ => {}
        }
        parts.last_mut().expect("never empty").push(c);
    }
    parts.retain(|p| !p.trim().is_empty());
    parts.into_iter().map(|p| p.trim().to_string()).collect()
}

/// The contents of a Python string literal `"…"` or `'…'`.
fn unquote(text: &str) -> Option<String> {
    let q = text.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    text.strip_prefix(q)?.strip_suffix(q).map(str::to_string)
}

/// A default's value: a string literal's contents, or a number (Python's
/// `a / b` evaluated), printed so that equal numbers print alike.
fn default_value(text: &str) -> String {
    if let Some(s) = unquote(text) {
        return s;
    }
    let number = |t: &str| t.trim().parse::<f64>().ok();
    let value = match text.split_once('/') {
        Some((a, b)) => number(a).zip(number(b)).map(|(a, b)| a / b),
        None => number(text),
    };
    value.map_or(text.to_string(), |v| format!("{v:e}"))
}

/// Where the two lists of options differ, one line per difference.
fn differences(clap: &[Opt], python: &[Opt]) -> Vec<String> {
    let names = |opts: &[Opt]| opts.iter().map(|o| o.name.clone()).collect::<Vec<_>>();
    let mut out = Vec::new();
    if names(clap) != names(python) {
        out.push(format!(
            "options differ: leangrad {:?}, python {:?}",
            names(clap),
            names(python)
        ));
    }
    let by_name: BTreeMap<&str, &Opt> = python.iter().map(|o| (o.name.as_str(), o)).collect();
    for c in clap {
        let Some(p) = by_name.get(c.name.as_str()) else {
            continue;
        };
        let (cd, pd) = (
            c.default.as_deref().map(default_value),
            p.default.as_deref().map(default_value),
        );
        if cd != pd {
            out.push(format!("{}: default {cd:?} vs {pd:?}", c.name));
        }
        if c.required != p.required {
            out.push(format!(
                "{}: required {} vs {}",
                c.name, c.required, p.required
            ));
        }
        if c.flag != p.flag {
            out.push(format!("{}: flag {} vs {}", c.name, c.flag, p.flag));
        }
        if let (Some(cv), Some(pv)) = (&c.values, &p.values) {
            if cv != pv {
                out.push(format!("{}: values {cv:?} vs {pv:?}", c.name));
            }
        }
    }
    out
}

fn check_twin(command: &str) {
    let path = format!("{}/python-compare/{command}.py", env!("CARGO_MANIFEST_DIR"));
    let source = std::fs::read_to_string(&path).expect("the python-compare script exists");
    let python = parse_argparse(&source);
    let clap = clap_options(command);
    assert!(
        clap.len() >= 10,
        "too few options read from --help: {clap:?}"
    );
    let diff = differences(&clap, &python);
    assert!(
        diff.is_empty(),
        "python-compare/{command}.py drifted from `leangrad {command}`:\n{}",
        diff.join("\n")
    );
}

#[test]
fn finetune_twin_takes_the_commands_options() {
    check_twin("finetune");
}

#[test]
fn adversarial_twin_takes_the_commands_options() {
    check_twin("adversarial");
}

#[test]
fn style_twin_takes_the_commands_options() {
    check_twin("style");
}

/// The readers themselves, on text with known answers, and a drift they
/// must report.
#[test]
fn readers_find_names_defaults_and_differences() {
    let help = "Usage: leangrad x [OPTIONS] --images <IMAGES>\n\nOptions:\n      \
        --images <IMAGES>  The images\n      --eps <EPS>  Bound, in pixel\n          \
        units [default: 0.03137254901960784]\n      --attack <ATTACK>  Which \
        [default: pgd] [possible values: fgsm, pgd]\n      --json  JSON only\n  \
        -h, --help  Print help\n";
    let source = r#"
p.add_argument("--images", required=True, help="a folder, (or not)")
p.add_argument("--eps", type=float, default=8.0 / 255.0, help="bound")
p.add_argument("--attack", default="pgd", choices=["fgsm", "pgd"])
p.add_argument("--json", action="store_true")
"#;
    let clap = parse_help(help);
    let python = parse_argparse(source);
    let names: Vec<&str> = clap.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["--images", "--eps", "--attack", "--json"]);
    assert!(clap[0].required && !clap[1].required && clap[3].flag && !clap[1].flag);
    assert_eq!(clap[1].default.as_deref(), Some("0.03137254901960784"));
    assert_eq!(python[1].default.as_deref(), Some("8.0 / 255.0"));
    assert_eq!(python[2].values, Some(vec!["fgsm".into(), "pgd".into()]));
    assert_eq!(differences(&clap, &python), Vec::<String>::new());

    let drifted = source
        .replace("8.0 / 255.0", "4.0 / 255.0")
        .replace("\"--json\"", "\"--as-json\"");
    let diff = differences(&clap, &parse_argparse(&drifted));
    assert_eq!(diff.len(), 2, "{diff:?}");
    assert!(diff[0].starts_with("options differ"), "{diff:?}");
    assert!(diff[1].starts_with("--eps: default"), "{diff:?}");
}
