//! PTX text → a syntax tree of functions and statements (no semantics
//! yet: [`super::decode`] resolves names, types and opcodes).
//!
//! Statements are split on `;`, not on lines (NVRTC spreads `call.uni`
//! over several lines), and every statement keeps the line it starts on and
//! its text, for error messages.

use super::LoadError;

/// One token and the 1-based line it is on.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    /// A name, directive or opcode: `%r1`, `.reg`, `ld.global.u32`, `$L__BB0_2`.
    Ident(String),
    /// A number as written (sign not included): `12`, `0x1F`, `0f3F800000`.
    Num(String),
    /// One punctuation character.
    Punct(char),
}

fn lex(text: &str) -> Result<Vec<(Tok, usize)>, LoadError> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut line) = (0usize, 1usize);
    let ident_start = |c: u8| c.is_ascii_alphabetic() || matches!(c, b'_' | b'$' | b'%' | b'.');
    let ident_char = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'.');
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                if b[i] == b'\n' {
                    line += 1;
                }
                i += 1;
            }
            i += 2;
        } else if ident_start(c) {
            let s = i;
            i += 1;
            loop {
                if i < b.len() && ident_char(b[i]) {
                    i += 1;
                } else if b.get(i) == Some(&b':')
                    && b.get(i + 1) == Some(&b':')
                    && b.get(i + 2).is_some_and(|&c| ident_char(c))
                {
                    // A `::` sub-qualifier (`.shared::cta`, `.L2::cache_hint`)
                    // stays in the opcode; a label's `:` never doubles.
                    i += 2;
                } else {
                    break;
                }
            }
            out.push((Tok::Ident(text[s..i].to_string()), line));
        } else if c.is_ascii_digit() {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                i += 1;
            }
            out.push((Tok::Num(text[s..i].to_string()), line));
        } else if c == b'"' {
            // A string (`.pragma "nounroll"`): kept as one name token.
            let s = i;
            i += 1;
            while i < b.len() && b[i] != b'"' && b[i] != b'\n' {
                i += 1;
            }
            i += 1;
            out.push((Tok::Ident(text[s..i.min(b.len())].to_string()), line));
        } else if b",;:{}[]()+-@!|<>=".contains(&c) {
            out.push((Tok::Punct(c as char), line));
            i += 1;
        } else {
            return Err(LoadError {
                line,
                message: format!("unexpected character {:?}", c as char),
            });
        }
    }
    Ok(out)
}

/// An immediate as written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Imm {
    /// An integer (two's complement bits of the value, sign applied).
    Int(i128),
    /// `0fXXXXXXXX`: f32 bits.
    F32(u32),
    /// `0dXXXXXXXXXXXXXXXX`: f64 bits.
    F64(u64),
}

/// An instruction operand, unresolved.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Operand {
    /// A register, special register or symbol name.
    Name(String),
    /// `!%p` (a negated predicate source).
    Not(String),
    /// `%p|%q` (the two destinations of `setp`).
    Pair(String, String),
    /// An immediate.
    Imm(Imm),
    /// `[base+off]` with base a register or symbol name (or none).
    Addr(Option<String>, i64),
    /// `{a, b, …}` vector of names/immediates.
    Vec(Vec<Operand>),
    /// `( a, b )` list (call arguments / return values).
    List(Vec<String>),
    /// `_`, a sink.
    Sink,
}

/// A `.param`/`.shared`/`.local`/`.global` variable declaration.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct VarDecl {
    /// `.param`, `.shared`, `.local`, `.global`.
    pub space: String,
    /// The name.
    pub name: String,
    /// Bytes.
    pub size: usize,
    /// Alignment in bytes.
    pub align: usize,
    /// `= {…}` initialiser bytes (module globals).
    pub init: Option<Vec<u8>>,
    /// Declared `.extern` (dynamic shared memory: no size of its own).
    pub is_extern: bool,
    /// Line.
    pub line: usize,
}

/// One statement of a function body.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Stmt {
    /// `.reg .ty names…` — names expanded (`%r<3>` gives `%r0 %r1 %r2`).
    Reg {
        ty: String,
        names: Vec<String>,
        line: usize,
    },
    /// A `.shared`/`.local`/`.param` variable.
    Var(VarDecl),
    /// `label:`
    Label(String, usize),
    /// `{`
    Open,
    /// `}`
    Close,
    /// An instruction.
    Inst(RawInst),
}

/// An instruction as written.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RawInst {
    /// `@%p` / `@!%p`.
    pub guard: Option<(String, bool)>,
    /// The opcode with its modifiers, e.g. `ld.global.nc.v2.f64`.
    pub opcode: String,
    /// Operands.
    pub operands: Vec<Operand>,
    /// Line the statement starts on.
    pub line: usize,
    /// The statement's text, for error messages.
    pub text: String,
}

/// A `.entry` or `.func`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RawFunc {
    /// The name.
    pub name: String,
    /// `.entry`.
    pub is_entry: bool,
    /// The return parameter of a `.func`.
    pub ret: Option<VarDecl>,
    /// Parameters in order.
    pub params: Vec<VarDecl>,
    /// The body (`None` for a prototype).
    pub body: Option<Vec<Stmt>>,
    /// Line of the declaration.
    pub line: usize,
}

/// A parsed module.
#[derive(Debug, Default)]
pub(crate) struct RawModule {
    /// Module-scope variables (`.global`, `.shared`).
    pub globals: Vec<VarDecl>,
    /// Functions, prototypes included.
    pub funcs: Vec<RawFunc>,
}

struct P<'a> {
    toks: Vec<(Tok, usize)>,
    i: usize,
    lines: Vec<&'a str>,
}

fn err<T>(line: usize, message: impl Into<String>) -> Result<T, LoadError> {
    Err(LoadError {
        line,
        message: message.into(),
    })
}

/// The value of an integer literal (`12`, `0x1f`, `017`, `12U`).
pub(crate) fn parse_int(s: &str) -> Option<i128> {
    let s = s.trim_end_matches(['U', 'u']);
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        i128::from_str_radix(h, 16).ok()
    } else if s.len() > 1 && s.starts_with('0') && s.bytes().all(|c| c.is_ascii_digit()) {
        i128::from_str_radix(&s[1..], 8).ok()
    } else {
        s.parse().ok()
    }
}

fn parse_num(s: &str, neg: bool, line: usize) -> Result<Imm, LoadError> {
    let bad = || LoadError {
        line,
        message: format!("bad number `{s}`"),
    };
    let sign32 = if neg { 0x8000_0000u32 } else { 0 };
    let sign64 = if neg { 1u64 << 63 } else { 0 };
    if let Some(h) = s.strip_prefix("0f").or_else(|| s.strip_prefix("0F")) {
        if h.len() == 8 {
            return Ok(Imm::F32(
                u32::from_str_radix(h, 16).map_err(|_| bad())? ^ sign32,
            ));
        }
    }
    if let Some(h) = s.strip_prefix("0d").or_else(|| s.strip_prefix("0D")) {
        if h.len() == 16 {
            return Ok(Imm::F64(
                u64::from_str_radix(h, 16).map_err(|_| bad())? ^ sign64,
            ));
        }
    }
    if s.contains('.') || s.contains('e') && !s.starts_with("0x") {
        let v: f64 = s.parse().map_err(|_| bad())?;
        return Ok(Imm::F64((if neg { -v } else { v }).to_bits()));
    }
    let v = parse_int(s).ok_or_else(bad)?;
    Ok(Imm::Int(if neg { -v } else { v }))
}

impl<'a> P<'a> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.i).map(|t| &t.0)
    }
    fn line(&self) -> usize {
        self.toks
            .get(self.i)
            .or(self.toks.last())
            .map_or(1, |t| t.1)
    }
    fn next(&mut self) -> Result<Tok, LoadError> {
        let t = self.toks.get(self.i).cloned();
        self.i += 1;
        match t {
            Some((t, _)) => Ok(t),
            None => err(self.line(), "unexpected end of PTX text"),
        }
    }
    fn is_punct(&self, c: char) -> bool {
        self.peek() == Some(&Tok::Punct(c))
    }
    fn expect(&mut self, c: char) -> Result<(), LoadError> {
        let line = self.line();
        match self.next()? {
            Tok::Punct(p) if p == c => Ok(()),
            t => err(line, format!("expected `{c}`, found {t:?}")),
        }
    }
    fn ident(&mut self) -> Result<String, LoadError> {
        let line = self.line();
        match self.next()? {
            Tok::Ident(s) => Ok(s),
            t => err(line, format!("expected a name, found {t:?}")),
        }
    }
    fn number(&mut self) -> Result<i128, LoadError> {
        let line = self.line();
        match self.next()? {
            Tok::Num(s) => parse_int(&s).ok_or(LoadError {
                line,
                message: format!("bad integer `{s}`"),
            }),
            t => err(line, format!("expected a number, found {t:?}")),
        }
    }
    fn skip_to_semi(&mut self) -> Result<(), LoadError> {
        while !self.is_punct(';') {
            self.next()?;
        }
        self.next().map(|_| ())
    }

    /// `[.align N] .type name[N] [= {…}]` after the state space.
    fn var_decl(&mut self, space: &str) -> Result<VarDecl, LoadError> {
        let line = self.line();
        let mut align = 0;
        let mut elem = 0;
        loop {
            match self.peek() {
                Some(Tok::Ident(s)) if s == ".align" => {
                    self.next()?;
                    align = self.number()? as usize;
                }
                Some(Tok::Ident(s)) if s.starts_with('.') => {
                    let s = self.ident()?;
                    elem = type_bytes(&s).ok_or(LoadError {
                        line,
                        message: match s.as_str() {
                            ".texref" | ".surfref" | ".samplerref" => unsupported_directive(&s),
                            _ => format!("unsupported variable type `{s}`"),
                        },
                    })?;
                }
                _ => break,
            }
        }
        let name = self.ident()?;
        let mut count = 1usize;
        if self.is_punct('[') {
            self.next()?;
            count = if self.is_punct(']') {
                0
            } else {
                self.number()? as usize
            };
            self.expect(']')?;
        }
        if elem == 0 {
            return err(line, format!("variable `{name}` has no type"));
        }
        if count > 1 << 30 || align > 1 << 16 || align & align.wrapping_sub(1) != 0 {
            return err(
                line,
                format!("variable `{name}`: unsupported size or alignment"),
            );
        }
        let mut init = None;
        if self.is_punct('=') {
            self.next()?;
            let mut bytes = Vec::new();
            let braced = self.is_punct('{');
            if braced {
                self.next()?;
            }
            loop {
                let neg = self.is_punct('-');
                if neg {
                    self.next()?;
                }
                let l = self.line();
                let v = match self.next()? {
                    Tok::Num(s) => match parse_num(&s, neg, l)? {
                        Imm::Int(v) => v as u64,
                        Imm::F32(v) => v as u64,
                        Imm::F64(v) => v,
                    },
                    t => return err(l, format!("bad initialiser {t:?}")),
                };
                bytes.extend_from_slice(&v.to_le_bytes()[..elem]);
                if !braced || !self.is_punct(',') {
                    break;
                }
                self.next()?;
            }
            if braced {
                self.expect('}')?;
            }
            bytes.resize(elem * count, 0);
            init = Some(bytes);
        }
        Ok(VarDecl {
            space: space.to_string(),
            name,
            size: elem * count,
            align: if align == 0 { elem } else { align },
            init,
            is_extern: false,
            line,
        })
    }

    fn param_list(&mut self) -> Result<Vec<VarDecl>, LoadError> {
        let mut v = Vec::new();
        self.expect('(')?;
        while !self.is_punct(')') {
            let line = self.line();
            let sp = self.ident()?;
            if sp != ".param" && sp != ".reg" {
                return err(line, format!("unsupported parameter space `{sp}`"));
            }
            v.push(self.var_decl(".param")?);
            if self.is_punct(',') {
                self.next()?;
            }
        }
        self.expect(')')?;
        Ok(v)
    }

    fn operand(&mut self) -> Result<Operand, LoadError> {
        let line = self.line();
        if self.is_punct('[') {
            self.next()?;
            let mut base = None;
            let mut off = 0i64;
            if let Some(Tok::Ident(_)) = self.peek() {
                base = Some(self.ident()?);
            }
            loop {
                let sign = match self.peek() {
                    Some(Tok::Punct('+')) => 1,
                    Some(Tok::Punct('-')) => -1,
                    Some(Tok::Num(_)) if base.is_none() => 1,
                    _ => break,
                };
                if !matches!(self.peek(), Some(Tok::Num(_))) {
                    self.next()?;
                }
                let neg = self.is_punct('-');
                if neg {
                    self.next()?;
                }
                let v = self.number()? as i64;
                off += sign * if neg { -v } else { v };
            }
            self.expect(']')?;
            return Ok(Operand::Addr(base, off));
        }
        if self.is_punct('{') {
            self.next()?;
            let mut v = Vec::new();
            while !self.is_punct('}') {
                v.push(self.operand()?);
                if self.is_punct(',') {
                    self.next()?;
                }
            }
            self.next()?;
            return Ok(Operand::Vec(v));
        }
        if self.is_punct('(') {
            self.next()?;
            let mut v = Vec::new();
            while !self.is_punct(')') {
                v.push(self.ident()?);
                if self.is_punct(',') {
                    self.next()?;
                }
            }
            self.next()?;
            return Ok(Operand::List(v));
        }
        if self.is_punct('!') {
            self.next()?;
            return Ok(Operand::Not(self.ident()?));
        }
        let neg = self.is_punct('-');
        if neg {
            self.next()?;
        }
        match self.next()? {
            Tok::Num(s) => Ok(Operand::Imm(parse_num(&s, neg, line)?)),
            Tok::Ident(s) if !neg => {
                if s == "_" {
                    return Ok(Operand::Sink);
                }
                if self.is_punct('|') {
                    self.next()?;
                    let q = self.ident()?;
                    return Ok(Operand::Pair(s, q));
                }
                Ok(Operand::Name(s))
            }
            t => err(line, format!("bad operand {t:?}")),
        }
    }

    fn stmt_text(&self, start: usize, end: usize) -> String {
        let (l0, l1) = (
            self.toks[start].1,
            self.toks[end.min(self.toks.len() - 1)].1,
        );
        let text: Vec<&str> = (l0..=l1)
            .filter_map(|l| self.lines.get(l - 1))
            .map(|s| s.trim())
            .collect();
        text.join(" ")
    }

    fn body(&mut self) -> Result<Vec<Stmt>, LoadError> {
        let mut out = Vec::new();
        let mut depth = 0usize;
        loop {
            let line = self.line();
            let start = self.i;
            match self.next()? {
                Tok::Punct('{') => {
                    depth += 1;
                    out.push(Stmt::Open);
                }
                Tok::Punct('}') => {
                    if depth == 0 {
                        return Ok(out);
                    }
                    depth -= 1;
                    out.push(Stmt::Close);
                }
                // `.reg.b32 t;` (no space, as cuda_fp16.hpp writes it) lexes
                // as one name.
                Tok::Ident(s) if s == ".reg" || s.starts_with(".reg.") => {
                    let ty = match s.strip_prefix(".reg") {
                        Some(t) if !t.is_empty() => t.to_string(),
                        _ => self.ident()?,
                    };
                    let mut names = Vec::new();
                    loop {
                        let n = self.ident()?;
                        if self.is_punct('<') {
                            self.next()?;
                            let k = self.number()?;
                            self.expect('>')?;
                            names.extend((0..k).map(|j| format!("{n}{j}")));
                        } else {
                            names.push(n);
                        }
                        if !self.is_punct(',') {
                            break;
                        }
                        self.next()?;
                    }
                    self.expect(';')?;
                    out.push(Stmt::Reg { ty, names, line });
                }
                Tok::Ident(s) if matches!(s.as_str(), ".shared" | ".local" | ".param") => {
                    let d = self.var_decl(&s)?;
                    self.expect(';')?;
                    out.push(Stmt::Var(d));
                }
                Tok::Ident(s) if s == ".pragma" => self.skip_to_semi()?,
                Tok::Ident(s) if s.starts_with('.') => {
                    return err(
                        line,
                        format!("unsupported directive `{s}` in a function body"),
                    );
                }
                Tok::Ident(s) if self.is_punct(':') => {
                    self.next()?;
                    out.push(Stmt::Label(s, line));
                }
                t => {
                    let mut guard = None;
                    let opcode = match t {
                        Tok::Punct('@') => {
                            let neg = self.is_punct('!');
                            if neg {
                                self.next()?;
                            }
                            guard = Some((self.ident()?, neg));
                            self.ident()?
                        }
                        Tok::Ident(s) => s,
                        t => return err(line, format!("unexpected {t:?}")),
                    };
                    let mut operands = Vec::new();
                    while !self.is_punct(';') {
                        operands.push(self.operand()?);
                        if self.is_punct(',') {
                            self.next()?;
                        } else if !self.is_punct(';') {
                            return err(self.line(), format!("expected `,` or `;` in `{opcode}`"));
                        }
                    }
                    let end = self.i;
                    self.next()?;
                    out.push(Stmt::Inst(RawInst {
                        guard,
                        opcode,
                        operands,
                        line,
                        text: self.stmt_text(start, end),
                    }));
                }
            }
        }
    }

    /// A `.entry`/`.func` (definition or prototype) after its leading
    /// directives; `kind` is `.entry`, `.func`, or a variable's space
    /// (`.visible .global x;`).
    fn function(&mut self, m: &mut RawModule, line: usize, kind: String) -> Result<(), LoadError> {
        let is_entry = match kind.as_str() {
            ".entry" => true,
            ".func" => false,
            ".global" | ".shared" => {
                let v = self.var_decl(&kind)?;
                self.expect(';')?;
                m.globals.push(v);
                return Ok(());
            }
            k => return err(line, unsupported_directive(k)),
        };
        let mut ret = None;
        if !is_entry && self.is_punct('(') {
            let mut r = self.param_list()?;
            if r.len() > 1 {
                return err(line, "more than one return parameter");
            }
            ret = r.pop();
        }
        let name = self.ident()?;
        let params = if self.is_punct('(') {
            self.param_list()?
        } else {
            Vec::new()
        };
        while let Some(Tok::Ident(s)) = self.peek() {
            if s.starts_with(".max") || s.starts_with(".req") || s == ".noreturn" {
                self.next()?;
                while matches!(self.peek(), Some(Tok::Num(_)) | Some(Tok::Punct(','))) {
                    self.next()?;
                }
            } else {
                return err(self.line(), format!("unsupported function directive `{s}`"));
            }
        }
        let body = if self.is_punct(';') {
            self.next()?;
            None
        } else {
            self.expect('{')?;
            Some(self.body()?)
        };
        m.funcs.push(RawFunc {
            name,
            is_entry,
            ret,
            params,
            body,
            line,
        });
        Ok(())
    }

    /// `.extern .func …;` (a prototype: the decoder decides which external
    /// functions exist) or `.extern .shared … name[];` (dynamic shared
    /// memory); any other external symbol names itself as unsupported.
    fn extern_decl(&mut self, m: &mut RawModule, line: usize) -> Result<(), LoadError> {
        let kind = self.ident()?;
        match kind.as_str() {
            ".func" => {
                let before = m.funcs.len();
                self.function(m, line, kind)?;
                if m.funcs.len() > before && m.funcs[before].body.is_some() {
                    return err(line, "an `.extern .func` with a body");
                }
                Ok(())
            }
            ".shared" => {
                let mut v = self.var_decl(".shared")?;
                self.expect(';')?;
                v.is_extern = true;
                m.globals.push(v);
                Ok(())
            }
            k => err(line, unsupported_directive(&format!(".extern {k}"))),
        }
    }

    fn module(&mut self) -> Result<RawModule, LoadError> {
        let mut m = RawModule::default();
        while self.i < self.toks.len() {
            let line = self.line();
            let d = self.ident()?;
            match d.as_str() {
                ".version" | ".target" | ".address_size" => {
                    // Their arguments end at the line's end (no `;`).
                    while self.i < self.toks.len() && self.toks[self.i].1 == line {
                        self.i += 1;
                    }
                }
                ".extern" => self.extern_decl(&mut m, line)?,
                ".visible" | ".entry" | ".func" | ".weak" => {
                    let kind = if d == ".visible" || d == ".weak" {
                        self.ident()?
                    } else {
                        d
                    };
                    self.function(&mut m, line, kind)?;
                }
                ".global" | ".shared" => {
                    let v = self.var_decl(&d)?;
                    self.expect(';')?;
                    m.globals.push(v);
                }
                ".file" | ".loc" | ".section" => self.skip_to_semi()?,
                d => return err(line, unsupported_directive(d)),
            }
        }
        Ok(m)
    }
}

/// The load error of a module directive the interpreter does not support,
/// naming the feature.
fn unsupported_directive(d: &str) -> String {
    let what = match d.trim_start_matches(".extern ") {
        ".tex" | ".texref" => "texture references are not supported",
        ".surfref" => "surface references are not supported",
        ".samplerref" => "sampler references are not supported",
        ".const" => "constant memory (`.const` variables) is not supported",
        ".local" => "module-scope `.local` variables are not supported",
        ".global" if d.starts_with(".extern") => {
            "external `.global` variables (defined in another module) are not supported"
        }
        _ => return format!("unsupported module directive `{d}`"),
    };
    format!("`{d}`: {what}")
}

/// Bytes of a scalar PTX type (`.b8` … `.f64`), `None` for others.
pub(crate) fn type_bytes(t: &str) -> Option<usize> {
    Some(match t {
        ".b8" | ".u8" | ".s8" => 1,
        ".b16" | ".u16" | ".s16" | ".f16" | ".bf16" => 2,
        ".b32" | ".u32" | ".s32" | ".f32" | ".f16x2" | ".bf16x2" => 4,
        ".b64" | ".u64" | ".s64" | ".f64" => 8,
        _ => return None,
    })
}

/// Parses PTX text.
pub(crate) fn parse(text: &str) -> Result<RawModule, LoadError> {
    let mut p = P {
        toks: lex(text)?,
        i: 0,
        lines: text.lines().collect(),
    };
    p.module()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_and_operands() {
        let m = parse(
            ".version 9.5\n.target sm_80\n.address_size 64\n\
             .global .align 4 .b8 g[6] = {1, 2, 255};\n\
             .visible .entry k(\n .param .u64 k_param_0,\n .param .align 8 .b8 k_param_1[144]\n)\n{\n\
             .reg .b32 %r<3>;\n\
             L1:\n@!%p1 ld.global.nc.v2.f32 {%r1, %r2}, [%rd1+-8];\n\
             setp.eq.s32 %p|%q, %r1, 0f3F800000;\n\
             call.uni (retval0),\n f,\n (param0, param1);\n}\n",
        )
        .unwrap();
        assert_eq!(
            m.globals[0].init.as_deref(),
            Some(&[1, 2, 255, 0, 0, 0][..])
        );
        let f = &m.funcs[0];
        assert_eq!(f.params[1].size, 144);
        let body = f.body.as_ref().unwrap();
        assert_eq!(
            body[0],
            Stmt::Reg {
                ty: ".b32".into(),
                names: vec!["%r0".into(), "%r1".into(), "%r2".into()],
                line: 10
            }
        );
        let Stmt::Inst(i) = &body[2] else { panic!() };
        assert_eq!(i.guard, Some(("%p1".into(), true)));
        assert_eq!(i.operands[1], Operand::Addr(Some("%rd1".into()), -8));
        let Stmt::Inst(i) = &body[3] else { panic!() };
        assert_eq!(i.operands[0], Operand::Pair("%p".into(), "%q".into()));
        assert_eq!(i.operands[2], Operand::Imm(Imm::F32(0x3F80_0000)));
        let Stmt::Inst(i) = &body[4] else { panic!() };
        assert_eq!(i.line, 14);
        assert!(i.text.contains("(param0, param1);"), "{}", i.text);
    }

    #[test]
    fn double_colon_qualifiers_stay_in_the_opcode() {
        let toks: Vec<Tok> = lex("L2:\ncp.async.ca.shared::cta.global.L2::128B [%r1], [%rd1], 4;")
            .unwrap()
            .into_iter()
            .map(|(t, _)| t)
            .collect();
        assert_eq!(toks[0], Tok::Ident("L2".into()));
        assert_eq!(toks[1], Tok::Punct(':'));
        assert_eq!(
            toks[2],
            Tok::Ident("cp.async.ca.shared::cta.global.L2::128B".into())
        );
    }
}
