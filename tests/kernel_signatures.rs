//! Checks every `launch!` in `src/` against the kernels NVRTC compiles
//! from the `.cu` files, without a GPU: a launch whose argument list does not
//! match its kernel's parameters would read garbage or fault on a device,
//! and no test on a machine without one could notice.
//!
//! The PTX of each kernel file (compute_80) gives every entry's parameters
//! (`.u32`, `.f64`, `.align 8 .b8 p[N]` for a struct passed by value…).
//! Each `launch!(dev, "file.cu", name, cfg; args…)` site in the Rust source
//! gives the kernel name (a literal, `format!` pattern or a `let` of one)
//! and the argument expressions; an argument's kind comes from its text
//! (`x.slice()` is a device pointer) or from the declared type of the local
//! it names (`let n64 = n as i64`, `lx: &Strided`, `let (a, b) = (x as
//! i32, y as f64)`). The test asserts that every site names kernels that
//! exist, that the argument count equals every matching kernel's parameter
//! count, and that every argument whose kind is known fits its parameter
//! (size and integer/float/struct class), and that no argument's kind is
//! unknown (the reader follows `let`s, nested tuple patterns, casts,
//! `T::from`, struct fields, array elements, `match` arms and the return
//! types of functions in the same file). Needs libnvrtc and CUDA's headers (as
//! `kernels_nvrtc`), not a GPU.

use leangrad::cuda::nvrtc;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Prints past libtest's output capture.
macro_rules! report {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// What a kernel parameter or a launch argument is, as far as the ABI cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// An integer (or a pointer, which is a 64-bit integer in PTX) of this
    /// many bytes.
    Int(usize),
    /// A float of this many bytes.
    Float(usize),
    /// A struct passed by value, of this many bytes (`None`: size unknown
    /// on the Rust side).
    Struct(Option<usize>),
}

impl Kind {
    /// Whether an argument of kind `self` may be passed for parameter `p`.
    fn fits(self, p: Kind) -> bool {
        match (self, p) {
            (Kind::Struct(None), Kind::Struct(_)) => true,
            (a, b) => a == b,
        }
    }
}

/// One kernel entry of a PTX module: its name and parameter kinds.
fn ptx_entries(ptx: &str) -> BTreeMap<String, Vec<Kind>> {
    let mut out = BTreeMap::new();
    let mut rest = ptx;
    while let Some(i) = rest.find(".entry ") {
        rest = &rest[i + ".entry ".len()..];
        let open = rest.find('(').expect("an entry's parameter list");
        let name = rest[..open].trim().to_string();
        let close = rest.find(')').expect("the end of a parameter list");
        let params = rest[open + 1..close]
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| ptx_param(p).unwrap_or_else(|| panic!("{name}: unparsed PTX param {p}")))
            .collect();
        out.insert(name, params);
        rest = &rest[close..];
    }
    out
}

/// The kind of one PTX parameter declaration, e.g. `.param .u64 k_param_0`
/// or `.param .align 8 .b8 k_param_3[72]`.
fn ptx_param(p: &str) -> Option<Kind> {
    let words: Vec<&str> = p.split_whitespace().collect();
    if words.contains(&".b8") {
        let name = words.last()?;
        let n = name[name.find('[')? + 1..name.find(']')?].parse().ok()?;
        return Some(Kind::Struct(Some(n)));
    }
    let ty = words.get(1)?;
    let bytes = |t: &str| t[2..].parse::<usize>().ok().map(|b| b / 8);
    match &ty[..2] {
        ".u" | ".s" | ".b" => Some(Kind::Int(bytes(ty)?)),
        ".f" => Some(Kind::Float(bytes(ty)?)),
        _ => None,
    }
}

/// A `launch!` site: where it is, the kernel file, the name patterns it may
/// launch, and its argument expressions.
struct Site {
    at: String,
    file: String,
    names: Vec<String>,
    args: Vec<String>,
    /// The text of the enclosing function up to the launch (for types).
    context: String,
    /// The whole source file.
    file_text: String,
}

/// Splits `s` at top-level occurrences of `sep` (outside (), [], {}, <>
/// in generic position is not tracked: arguments do not contain them).
fn split_top(s: &str, sep: char) -> Vec<String> {
    let (mut depth, mut cur, mut out, mut in_str) = (0i32, String::new(), Vec::new(), false);
    for ch in s.chars() {
        match ch {
            '"' => in_str = !in_str,
            '(' | '[' | '{' if !in_str => depth += 1,
            ')' | ']' | '}' if !in_str => depth -= 1,
            c if c == sep && depth == 0 && !in_str => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    out.push(cur);
    out.into_iter()
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty())
        .collect()
}

/// The first occurrence of `pat` in `s` outside parentheses and brackets.
fn top_level_find(s: &str, pat: &str) -> Option<usize> {
    let mut depth = 0i32;
    for (i, ch) in s.char_indices() {
        match ch {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            _ if depth == 0 && s[i..].starts_with(pat) => return Some(i),
            _ => {}
        }
    }
    None
}

/// The text from `open` (just past a `(`) to its matching `)`.
fn balanced(s: &str, open: usize) -> &str {
    let mut depth = 1;
    let mut in_str = false;
    for (i, ch) in s[open..].char_indices() {
        match ch {
            '"' => in_str = !in_str,
            '(' if !in_str => depth += 1,
            ')' if !in_str => {
                depth -= 1;
                if depth == 0 {
                    return &s[open..open + i];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced launch! at byte {open}");
}

/// Every `format!("…")` or string literal in `expr`, as a name pattern
/// (`{…}` becomes a wildcard).
fn name_patterns(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find('"') {
        let after = &rest[i + 1..];
        let Some(j) = after.find('"') else { break };
        let lit = &after[..j];
        let mut pat = String::new();
        let mut placeholder: Option<String> = None;
        for ch in lit.chars() {
            match (ch, placeholder.as_mut()) {
                ('{', None) => placeholder = Some(String::new()),
                ('}', Some(p)) => {
                    // `{sfx}` is always a dtype suffix.
                    pat.push(if p == "sfx" { '#' } else { '*' });
                    placeholder = None;
                }
                (c, Some(p)) => p.push(c),
                (c, None) => pat.push(c),
            }
        }
        out.push(pat);
        rest = &after[j + 1..];
    }
    out
}

/// The kernel-name suffixes of the dtypes (`{sfx}` in a name pattern).
const DTYPE_SUFFIXES: [&str; 7] = ["f32", "f64", "f16", "bf16", "u8", "u32", "i64"];

/// Whether `name` matches `pat`, where `#` stands for a dtype suffix and
/// `*` stands for one or more
/// letters and digits (a dtype suffix, a byte size: never an underscore,
/// so `compare_*` does not match `compare_scalar_f32`).
fn matches(pat: &str, name: &str) -> bool {
    match pat.find(['*', '#']) {
        None => pat == name,
        Some(i) if pat[i..].starts_with('#') => {
            let (head, tail) = (&pat[..i], &pat[i + 1..]);
            name.strip_prefix(head).is_some_and(|rest| {
                DTYPE_SUFFIXES
                    .iter()
                    .any(|d| rest.strip_prefix(d).is_some_and(|r| matches(tail, r)))
            })
        }
        Some(i) => {
            let (head, tail) = (&pat[..i], &pat[i + 1..]);
            let Some(rest) = name.strip_prefix(head) else {
                return false;
            };
            (1..=rest.len()).any(|k| {
                rest[..k].chars().all(|c| c.is_ascii_alphanumeric()) && matches(tail, &rest[k..])
            })
        }
    }
}

/// A pattern that starts with a placeholder (`format!("{kind}_{sfx}")`,
/// `kind` a `&str` parameter) is resolved through the string literals the
/// enclosing function's callers in the same file pass it.
fn resolve_leading(pat: &str, context: &str, file_text: &str) -> Vec<String> {
    if !pat.starts_with('*') {
        return vec![pat.to_string()];
    }
    let out: Vec<String> = caller_literals(context, file_text)
        .iter()
        .map(|lit| pat.replacen('*', lit, 1))
        .collect();
    assert!(
        !out.is_empty(),
        "cannot resolve the kernel name pattern {pat}"
    );
    out
}

/// The string literals that calls of the enclosing function (in the same
/// file) pass it: what a parameter used as a kernel file or name may be.
fn caller_literals(context: &str, file_text: &str) -> Vec<String> {
    let fn_name = context
        .split("fn ")
        .nth(1)
        .and_then(|s| s.split('(').next())
        .expect("the enclosing function's name")
        .trim();
    let mut out = Vec::new();
    let call = format!("{fn_name}(");
    let mut rest = file_text;
    while let Some(i) = rest.find(&call) {
        let args = balanced(rest, i + call.len());
        out.extend(name_patterns(args));
        rest = &rest[i + call.len()..];
    }
    out
}

/// Every `launch!` site in the Rust files under `dir`.
fn sites(dir: &Path) -> Vec<Site> {
    let mut out = Vec::new();
    // Every .rs file under `dir`, sub-folders (e.g. `nn/norm/`) included.
    let mut files: Vec<PathBuf> = Vec::new();
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
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let fname = path
            .strip_prefix(dir)
            .unwrap_or(&path)
            .to_string_lossy()
            .to_string();
        let mut from = 0;
        while let Some(i) = text[from..].find("launch!(") {
            let start = from + i;
            from = start + 1;
            let line_start = text[..start].rfind('\n').map_or(0, |p| p + 1);
            // The macro's own definition and doc mentions are not sites.
            let line = &text[line_start..start];
            if line.trim_start().starts_with("//") || line.contains("macro_rules") {
                continue;
            }
            let body = balanced(&text, start + "launch!(".len());
            if body.contains("$dev") {
                continue;
            }
            let semi = body.find(';').expect("launch!(header; args)");
            let header = split_top(&body[..semi], ',');
            assert_eq!(header.len(), 4, "{fname}: launch! header {header:?}");
            let args = split_top(&body[semi + 1..], ',');
            let fn_start = text[..start].rfind("\nfn ").into_iter();
            let fn_start = fn_start
                .chain(text[..start].rfind("\npub fn "))
                .chain(text[..start].rfind("\npub(crate) fn "))
                .chain(text[..start].rfind("\n    fn "))
                .chain(text[..start].rfind("\n    pub fn "))
                .chain(text[..start].rfind("\n    pub(crate) fn "))
                .max()
                .unwrap_or(0);
            let context = text[fn_start..start].to_string();
            // A literal kernel file, or a parameter: the `.cu` literals the
            // enclosing function's callers pass (one site per file).
            let files: Vec<String> = if header[1].starts_with('"') {
                vec![header[1].trim_matches('"').to_string()]
            } else {
                let f: Vec<String> = caller_literals(&context, &text)
                    .into_iter()
                    .filter(|l| l.ends_with(".cu"))
                    .collect();
                assert!(
                    !f.is_empty(),
                    "{fname}: cannot resolve kernel file {}",
                    header[1]
                );
                f
            };
            let name_expr = header[2].clone();
            let names = if name_expr.contains('"') {
                name_patterns(&name_expr)
            } else {
                let let_at = context
                    .rfind(&format!("let {name_expr} ="))
                    .unwrap_or_else(|| panic!("{fname}: cannot resolve kernel name {name_expr}"));
                let stmt = &context[let_at..];
                let stmt = &stmt[..stmt.find(";\n").unwrap_or(stmt.len())];
                name_patterns(stmt)
            };
            let names: Vec<String> = names
                .into_iter()
                .flat_map(|p| resolve_leading(&p, &context, &text))
                .collect();
            let lineno = text[..start].lines().count() + 1;
            for file in files {
                out.push(Site {
                    at: format!("src/{fname}:{lineno}"),
                    file,
                    names: names.clone(),
                    args: args.clone(),
                    context: context.clone(),
                    file_text: text.clone(),
                });
            }
        }
    }
    out
}

/// The kind of a Rust type's text, where it is known.
fn type_kind(ty: &str, structs: &BTreeMap<&str, usize>) -> Option<Kind> {
    let ty = ty.trim().trim_start_matches('&').trim();
    Some(match ty {
        "i8" | "u8" | "bool" => Kind::Int(1),
        "i32" | "u32" => Kind::Int(4),
        "i64" | "u64" | "usize" | "isize" | "ptr" => Kind::Int(8),
        "f32" => Kind::Float(4),
        "f64" => Kind::Float(8),
        t => {
            let base = t.rsplit("::").next()?;
            if !base.chars().next()?.is_ascii_uppercase() || base.contains('<') {
                return None;
            }
            Kind::Struct(structs.get(base).copied())
        }
    })
}

/// What a pattern is bound to: an expression, or a known type.
enum Bound<'a> {
    Expr(&'a str),
    Type(String),
}

/// Where an argument's type is looked up: the enclosing function's text
/// up to the launch, and the whole file (struct fields, return types).
struct Scope<'a> {
    ctx: &'a str,
    file: &'a str,
    /// Lookups in progress: a binding that names itself (`let (a, b) =
    /// (b, a)`) must end as unknown, not recurse forever.
    depth: std::cell::Cell<u32>,
}

/// The text of a type annotation starting at `s`, up to its end.
fn type_text(s: &str) -> &str {
    let mut depth = 0;
    for (i, ch) in s.char_indices() {
        match ch {
            '(' | '[' | '<' => depth += 1,
            ')' | ']' | '>' if depth > 0 => depth -= 1,
            ' ' | '=' | ';' | ',' | ')' | '\n' | '{' if depth == 0 => return &s[..i],
            _ => {}
        }
    }
    s
}

/// The element types of a tuple type `(A, B)`, or the type itself.
fn tuple_parts(ty: &str) -> Vec<String> {
    let t = ty.trim();
    if t.starts_with('(') && t.ends_with(')') {
        split_top(&t[1..t.len() - 1], ',')
    } else {
        vec![t.to_string()]
    }
}

impl Scope<'_> {
    /// The declared return type of function or method `name` in the file.
    fn return_type(&self, name: &str) -> Option<String> {
        let at = self.file.find(&format!("fn {name}("))?;
        let sig = &self.file[at..];
        let sig = &sig[..sig.find('{')?];
        let arrow = sig.find("->")?;
        let ty = sig[arrow + 2..].trim();
        Some(
            ty.trim_start_matches("Result<")
                .trim_end_matches('>')
                .trim()
                .to_string(),
        )
    }

    /// The declared type of field `field` of struct `ty` in the file.
    fn field_type(&self, ty: &str, field: &str) -> Option<String> {
        let base = ty.trim_start_matches('&').trim();
        let at = self.file.find(&format!("struct {base} {{"))?;
        let body = &self.file[at..];
        let body = &body[..body.find("\n}")?];
        let pat = format!(" {field}: ");
        let i = body.find(&pat)?;
        Some(type_text(&body[i + pat.len()..]).to_string())
    }

    /// The type of the value of a call `f(..)` / `x.f(..)` / `T::f(..)?`.
    fn call_type(&self, e: &str) -> Option<String> {
        let e = e.trim().trim_end_matches('?');
        // The callee of the outermost (last) call: `w.unwrap_or(x).slice()`
        // calls `slice`.
        let mut depth = 0;
        let mut open = None;
        for (i, ch) in e.char_indices().rev() {
            match ch {
                ')' => depth += 1,
                '(' => {
                    depth -= 1;
                    if depth == 0 {
                        open = Some(i);
                        break;
                    }
                }
                _ => {}
            }
        }
        let callee = &e[..open?];
        let name = callee.rsplit(['.', ':']).next()?;
        let prim = ["i32", "u32", "i64", "u64", "f32", "f64", "usize"];
        // `i32::from(b)`, `u64::from_le_bytes(..)`: the primitive's own type.
        if let Some((ty, _)) = callee.split_once("::").filter(|(t, _)| prim.contains(t)) {
            return Some(ty.to_string());
        }
        if let Some((ty, _)) = callee.rsplit_once("::") {
            let ty = ty.rsplit("::").next()?;
            if ty.chars().next()?.is_ascii_uppercase() && matches!(name, "new" | "contiguous") {
                return Some(ty.to_string());
            }
        }
        match name {
            "slice" | "slice_mut" => Some("ptr".into()),
            "coalesced" => Some("Strided".into()),
            "len" | "numel" => Some("usize".into()),
            _ => self.return_type(name),
        }
    }

    /// Where `ident` sits in the (possibly nested) tuple pattern `pat`
    /// bound to `value`: `Some(type)` when it is bound there (`Some(None)`:
    /// bound, type unknown), `None` when `pat` does not bind it.
    fn bind(&self, pat: &str, value: Bound, ident: &str) -> Option<Option<String>> {
        let pat = pat.trim().trim_start_matches("mut ").trim();
        if !pat.starts_with('(') {
            return (pat == ident).then(|| match value {
                Bound::Expr(e) => self.expr(e),
                Bound::Type(t) => Some(t),
            });
        }
        let parts = split_top(&pat[1..pat.len() - 1], ',');
        let values: Vec<Option<String>> = match &value {
            Bound::Expr(e) => {
                let e = e.trim();
                let items = (e.starts_with('(') && e.ends_with(')'))
                    .then(|| split_top(&e[1..e.len() - 1], ','))
                    .filter(|v| v.len() == parts.len());
                match items {
                    Some(items) => {
                        for (p, item) in parts.iter().zip(&items) {
                            if let Some(t) = self.bind(p, Bound::Expr(item), ident) {
                                return Some(t);
                            }
                        }
                        return None;
                    }
                    None => {
                        let t = self.expr(e);
                        let tys = t.map(|t| tuple_parts(&t)).unwrap_or_default();
                        (0..parts.len()).map(|k| tys.get(k).cloned()).collect()
                    }
                }
            }
            Bound::Type(t) => {
                let tys = tuple_parts(t);
                (0..parts.len()).map(|k| tys.get(k).cloned()).collect()
            }
        };
        for (p, t) in parts.iter().zip(values) {
            let found = match t {
                Some(t) => self.bind(p, Bound::Type(t), ident),
                // Unknown value: still bound here if the pattern names it.
                None => self.bind(p, Bound::Type("?".into()), ident),
            };
            if let Some(t) = found {
                return Some(t.filter(|t| t != "?"));
            }
        }
        None
    }

    /// The type of the local or parameter `ident` declared before the launch.
    fn declared(&self, ident: &str) -> Option<String> {
        if self.depth.get() > 3 {
            return None;
        }
        self.depth.set(self.depth.get() + 1);
        let ty = self.declared_inner(ident);
        self.depth.set(self.depth.get() - 1);
        ty
    }

    fn declared_inner(&self, ident: &str) -> Option<String> {
        let ctx = self.ctx;
        // The latest `let` of `ident`, typed or not, plain or in a tuple.
        let mut best: Option<(usize, Option<String>)> = None;
        for pat in [format!("let {ident}: "), format!("let mut {ident}: ")] {
            if let Some(i) = ctx.rfind(&pat) {
                let ty = type_text(&ctx[i + pat.len()..]).to_string();
                if best.as_ref().is_none_or(|b| i > b.0) {
                    best = Some((i, Some(ty)));
                }
            }
        }
        for pat in [format!("let {ident} = "), format!("let mut {ident} = ")] {
            if let Some(i) = ctx.rfind(&pat) {
                let stmt = &ctx[i + pat.len()..];
                let stmt = stmt[..stmt.find(";\n").unwrap_or(stmt.len())].trim();
                if best.as_ref().is_none_or(|b| i > b.0) {
                    best = Some((i, self.expr(stmt)));
                }
            }
        }
        let mut search = ctx;
        while let Some(i) = search.rfind("let (") {
            let stmt = &search[i + 4..];
            let stmt = &stmt[..stmt.find(";\n").unwrap_or(stmt.len())];
            if let Some((lhs, rhs)) = stmt.split_once(" = ") {
                if let Some(ty) = self.bind(lhs, Bound::Expr(rhs), ident) {
                    if best.as_ref().is_none_or(|b| i > b.0) {
                        best = Some((i, ty));
                    }
                    break;
                }
            }
            search = &search[..i];
        }
        if let Some((_, ty)) = best {
            return ty;
        }
        // A function parameter `ident: Ty`.
        let pat = format!("{ident}: ");
        let mut search = ctx;
        while let Some(i) = search.find(&pat) {
            let before = search[..i].chars().last();
            if matches!(before, Some('(') | Some(' ') | Some('\n')) {
                return Some(type_text(&search[i + pat.len()..]).to_string());
            }
            search = &search[i + pat.len()..];
        }
        None
    }

    /// The type of an argument or initializer expression, where it is known.
    fn expr(&self, expr: &str) -> Option<String> {
        let e = expr
            .trim()
            .trim_start_matches('&')
            .trim_start_matches("mut ")
            .trim();
        // `x as T` (a cast binds tighter than arithmetic: `a as f64 / b` is f64).
        if let Some(i) = top_level_find(e, " as ") {
            let ty = e[i + 4..].trim();
            let ty = &ty[..ty
                .find(|c: char| !c.is_ascii_alphanumeric())
                .unwrap_or(ty.len())];
            let primitive =
                type_kind(ty, &BTreeMap::new()).is_some_and(|k| !matches!(k, Kind::Struct(_)));
            if primitive {
                return Some(ty.to_string());
            }
        }
        // A tuple `(a, b)`: `(A, B)` with `?` for an unknown element.
        if e.starts_with('(') && e.ends_with(')') {
            let items = split_top(&e[1..e.len() - 1], ',');
            if items.len() > 1 {
                let tys: Vec<String> = items
                    .iter()
                    .map(|x| self.expr(x).unwrap_or_else(|| "?".into()))
                    .collect();
                return Some(format!("({})", tys.join(", ")));
            }
        }
        // `match v { A => value, … }`: the first arm's value.
        if let Some(rest) = e.strip_prefix("match ") {
            let arm = &rest[rest.find("=>")? + 2..];
            let arm = split_top(arm.trim_start(), ',').into_iter().next()?;
            return self.expr(arm.trim_end_matches('}').trim());
        }
        for suffix in ["i32", "u32", "i64", "u64", "f32", "f64"] {
            if let Some(digits) = e.strip_suffix(suffix) {
                let digits = digits.trim_end_matches('_');
                let lit = |c: char| c.is_ascii_digit() || matches!(c, '.' | '_' | '-');
                if !digits.is_empty() && digits.chars().all(lit) {
                    return Some(suffix.to_string());
                }
            }
        }
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        if !e.is_empty() && e.chars().all(word) {
            return self.declared(e);
        }
        // `a.b`: a field of a local's struct type.
        if let Some((a, b)) = e.split_once('.') {
            if a.chars().all(word) && b.chars().all(word) {
                let ty = self.declared(a)?;
                return self.field_type(&ty, b);
            }
        }
        // `a[i]`: an element of a local array `[x as T, …]` or `[T; n]`.
        if let Some(open) = e.find('[') {
            let a = &e[..open];
            if e.ends_with(']') && a.chars().all(word) {
                let at = self.ctx.rfind(&format!("let {a} = ["))?;
                let items = &self.ctx[at + format!("let {a} = [").len()..];
                let items = &items[..items.find("];")?];
                return split_top(items, ',').first().and_then(|x| self.expr(x));
            }
        }
        if e.ends_with(')') || e.ends_with(")?") {
            if let Some(t) = self.call_type(e) {
                return Some(t);
            }
        }
        // Float arithmetic: the type of its first operand with a known float type.
        if e.contains("1.0") || e.contains(".powf(") || e.contains(".sqrt()") {
            let operands = e.split(|c: char| !(word(c) || c == '.'));
            for op in
                operands.filter(|o| !o.is_empty() && !o.starts_with(|c: char| c.is_ascii_digit()))
            {
                // `hp.beta2.powf` names the field `hp.beta2`.
                let parts: Vec<&str> = op.trim_end_matches('.').split('.').collect();
                for k in (1..=parts.len().min(2)).rev() {
                    let t = self.expr(&parts[..k].join("."));
                    if let Some(t) = t.filter(|t| t == "f32" || t == "f64") {
                        return Some(t);
                    }
                }
            }
        }
        None
    }
}

/// The kind of an argument expression at a launch site, where it is known.
fn expr_kind(expr: &str, scope: &Scope, structs: &BTreeMap<&str, usize>) -> Option<Kind> {
    scope.expr(expr).and_then(|t| type_kind(&t, structs))
}

#[test]
fn every_launch_matches_its_kernels_parameters() {
    let required = std::env::var("LEANGRAD_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    if !nvrtc::nvrtc_present() || nvrtc::include_dir().is_err() {
        assert!(
            !required,
            "LEANGRAD_REQUIRE_NVRTC=1 but NVRTC or CUDA's headers are missing"
        );
        report!("skipped: libnvrtc or the CUDA headers not found");
        return;
    }
    let root = manifest_dir();
    if !root.join("src/cuda").is_dir() {
        report!("skipped: src/cuda not found (binary run outside the repository)");
        return;
    }
    let structs: BTreeMap<&str, usize> = [
        ("NormGeom", std::mem::size_of::<leangrad::nn::NormGeom>()),
        ("Strided", std::mem::size_of::<leangrad::cuda::Strided>()),
        ("ConvGeom", std::mem::size_of::<leangrad::nn::ConvGeom>()),
        ("PoolGeom", std::mem::size_of::<leangrad::nn::PoolGeom>()),
        ("LaneGeom", std::mem::size_of::<leangrad::ops::LaneGeom>()),
        ("ScoreGeom", std::mem::size_of::<leangrad::nn::ScoreGeom>()),
        ("FlashGeom", std::mem::size_of::<leangrad::nn::FlashGeom>()),
        ("View4", std::mem::size_of::<leangrad::nn::View4>()),
        (
            "RotaryGeom",
            std::mem::size_of::<leangrad::nn::RotaryGeom>(),
        ),
        (
            "InterpGeom",
            std::mem::size_of::<leangrad::nn::InterpGeom>(),
        ),
        (
            "TensorList",
            std::mem::size_of::<leangrad::optim::TensorList>(),
        ),
        (
            "QuantMaps",
            std::mem::size_of::<leangrad::optim::QuantMaps>(),
        ),
    ]
    .into_iter()
    .collect();
    let mut modules: BTreeMap<String, BTreeMap<String, Vec<Kind>>> = BTreeMap::new();
    for (file, _) in nvrtc::SOURCES {
        let ptx = nvrtc::compile(file, "compute_80").unwrap();
        modules.insert(file.to_string(), ptx_entries(&ptx));
    }
    let sites = sites(&root.join("src"));
    assert!(
        sites.len() >= 40,
        "found only {} launch! sites",
        sites.len()
    );
    let (mut problems, mut checked, mut unknown) = (Vec::new(), 0, Vec::new());
    let mut launched = std::collections::BTreeSet::new();
    for s in &sites {
        let Some(entries) = modules.get(&s.file) else {
            problems.push(format!("{}: no kernel file {}", s.at, s.file));
            continue;
        };
        let targets: Vec<(&String, &Vec<Kind>)> = entries
            .iter()
            .filter(|(n, _)| s.names.iter().any(|p| matches(p, n)))
            .collect();
        if targets.is_empty() {
            problems.push(format!(
                "{}: no kernel in {} matches {:?}",
                s.at, s.file, s.names
            ));
            continue;
        }
        let kinds: Vec<Option<Kind>> = s
            .args
            .iter()
            .map(|a| {
                let scope = Scope {
                    ctx: &s.context,
                    file: &s.file_text,
                    depth: Default::default(),
                };
                expr_kind(a, &scope, &structs)
            })
            .collect();
        for (a, k) in s.args.iter().zip(&kinds) {
            match k {
                None => unknown.push(format!("{}: {a}", s.at)),
                Some(_) => checked += 1,
            }
        }
        for (name, params) in targets {
            launched.insert(format!("{}/{name}", s.file));
            if params.len() != s.args.len() {
                problems.push(format!(
                    "{}: {name} takes {} parameters, launched with {} ({:?})",
                    s.at,
                    params.len(),
                    s.args.len(),
                    s.args
                ));
                continue;
            }
            for (i, (k, p)) in kinds.iter().zip(params).enumerate() {
                if let Some(k) = k {
                    if !k.fits(*p) {
                        problems.push(format!(
                            "{}: {name} parameter {i} is {p:?}, argument `{}` is {k:?}",
                            s.at, s.args[i]
                        ));
                    }
                }
            }
        }
    }
    let never: Vec<String> = modules
        .iter()
        .flat_map(|(f, es)| es.keys().map(move |n| format!("{f}/{n}")))
        .filter(|k| !launched.contains(k))
        .collect();
    report!(
        "kernel signatures: {} launch! sites; {checked} arguments of known kind checked against every kernel they may launch, {} of unknown kind; {} kernels never launched: {}",
        sites.len(),
        unknown.len(),
        never.len(),
        never.join(", ")
    );
    for u in &unknown {
        report!("  unknown kind: {u}");
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Every argument must stay checkable: bind it with a visible type
    // (`let n64 = n as i64;`, `let x: f64 = …`) rather than through an
    // expression this reader cannot type.
    assert!(
        unknown.is_empty(),
        "launch! arguments of unknown kind:\n{}",
        unknown.join("\n")
    );
}

#[test]
fn the_name_patterns_and_ptx_parser_work() {
    assert!(matches("unary_#", "unary_f32"));
    assert!(!matches("dropout_#", "dropout_mask"));
    assert!(matches("where_*", "where_4"));
    assert!(!matches("unary_*", "unary_"));
    assert!(matches("cast_*_*", "cast_f32_bf16"));
    assert!(!matches("cast_*_*", "copy_f32_bf16"));
    assert_eq!(
        name_patterns(r#"format!("norm_fwd_{sfx}")"#),
        ["norm_fwd_#"]
    );
    let ptx = ".visible .entry k(\n\t.param .u32 k_param_0,\n\t.param .f64 k_param_1,\n\t.param .align 8 .b8 k_param_2[136]\n)\n{";
    let e = ptx_entries(ptx);
    assert_eq!(
        e["k"],
        [Kind::Int(4), Kind::Float(8), Kind::Struct(Some(136))]
    );
    let ctx = "pub fn f(x: &CudaBuffer, lx: &Strided, alpha: f64, hp: &Hp) -> Result<()> {\n    let (code, n64) = (op as i32, n as i64);\n    let m = k as u32;\n    let (c, p) = op.code();\n    let flags = [i32::from(a), 0];\n    let w = 1.0 - hp.beta;\n    let lo = lx.coalesced();\n";
    let file = "struct Hp {\n    pub beta: f64,\n}\nfn code(self) -> (i32, f64) {\n";
    let scope = Scope {
        ctx,
        file,
        depth: Default::default(),
    };
    let s = BTreeMap::from([("Strided", 136usize)]);
    let kind = |e: &str| expr_kind(e, &scope, &s);
    assert_eq!(kind("&code"), Some(Kind::Int(4)));
    assert_eq!(kind("&n64"), Some(Kind::Int(8)));
    assert_eq!(kind("&m"), Some(Kind::Int(4)));
    assert_eq!(kind("&alpha"), Some(Kind::Float(8)));
    assert_eq!(kind("lx"), Some(Kind::Struct(Some(136))));
    assert_eq!(kind("&lo"), Some(Kind::Struct(Some(136))));
    assert_eq!(kind("x.slice()"), Some(Kind::Int(8)));
    assert_eq!(kind("&c"), Some(Kind::Int(4)));
    assert_eq!(kind("&p"), Some(Kind::Float(8)));
    assert_eq!(kind("&flags[1]"), Some(Kind::Int(4)));
    assert_eq!(kind("&hp.beta"), Some(Kind::Float(8)));
    assert_eq!(kind("&w"), Some(Kind::Float(8)));
    assert_eq!(kind("&unknown"), None);
    let nested = "fn g() {\n    let ((c2, p2), m2) = (op.code(), n as i64);\n";
    let scope2 = Scope {
        ctx: nested,
        file,
        depth: Default::default(),
    };
    assert_eq!(expr_kind("&c2", &scope2, &s), Some(Kind::Int(4)));
    assert_eq!(expr_kind("&p2", &scope2, &s), Some(Kind::Float(8)));
    assert_eq!(expr_kind("&m2", &scope2, &s), Some(Kind::Int(8)));
    assert_eq!(kind("w.unwrap_or(x).slice()"), Some(Kind::Int(8)));
    assert_eq!(kind("u64::from_le_bytes(b)"), Some(Kind::Int(8)));
    assert_eq!(kind("match m { A => 0i32, B => 1 }"), Some(Kind::Int(4)));
    assert_eq!(
        scope.expr("match m { A => (0i32, s), B => (1, t) }"),
        Some("(i32, ?)".to_string())
    );
    assert_eq!(
        kind("count as f64 / (count as f64 - 1.0)"),
        Some(Kind::Float(8))
    );
    assert_eq!(kind("idx.len() as i64"), Some(Kind::Int(8)));
    assert_eq!(kind("f(x as i32)"), None);
}
