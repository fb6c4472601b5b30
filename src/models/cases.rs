//! Freezing by name and the selective-differentiation cases.
//!
//! * [`Glob`] / [`glob_match`]: shell-style patterns over parameter names
//!   (`*` any run of characters, dots included; `?` one character;
//!   `[abc]`, `[a-z]`, `[!a-z]` one character of (not of) a class).
//! * [`Freeze`]: a model whose parameters can be frozen and unfrozen by
//!   name (a predicate) or by globs ([`Freeze::freeze`],
//!   [`Freeze::unfreeze`], [`Freeze::train_only`]).
//! * [`Case`]: the named cases the benchmarks and the PyTorch comparison
//!   run (`all`, `input`, `norm`, `conv`, `linear`, `surgical-first`,
//!   `surgical-last`, each also with `-bn-eval`), applied to a model with
//!   [`Case::apply`].
//!
//! A parameter's *layer* is its name without the last dot-component
//! (`layer1.0.conv1.weight` → `layer1.0.conv1`); layers are ordered by
//! their first appearance in [`Module::named_parameters`].

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;

use super::{AlexNet, MobileNetV2, ResNet, Vgg};
use crate::nn::{LayerKind, Module};
use crate::{Error, Result};

/// One element of a compiled [`Glob`].
#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    /// This character.
    Literal(char),
    /// Any one character (`?`).
    One,
    /// Any run of characters, possibly empty (`*`).
    Star,
    /// One character in (or, `negated`, not in) the inclusive ranges.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Token {
    /// Whether this single-character token accepts `c` (never called for
    /// [`Token::Star`]).
    fn accepts(&self, c: char) -> bool {
        match self {
            Token::Literal(l) => *l == c,
            Token::One => true,
            Token::Star => false,
            Token::Class { negated, ranges } => {
                ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
            }
        }
    }
}

/// A compiled shell-style pattern over parameter names: `*` matches any run
/// of characters (dots included, so `layer4.*` is everything under
/// `layer4`), `?` exactly one character, `[abc]` / `[a-z]` one character of
/// a class and `[!abc]` one character outside it. Every other character
/// matches itself. The whole name must match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob {
    pattern: String,
    tokens: Vec<Token>,
}

fn malformed(pattern: &str, why: &str) -> Error {
    Error::InvalidArgument {
        op: "Glob",
        msg: format!("malformed pattern {pattern:?}: {why}"),
    }
}

impl Glob {
    /// Compiles `pattern`. Errors ([`Error::InvalidArgument`]) for an
    /// unclosed `[`, a `[` inside a class, an empty class (`[]`, `[!]`), a
    /// reversed range (`[z-a]`) and a `]` outside a class. A `-` first or
    /// last in a class is itself (`[a-]`).
    pub fn new(pattern: &str) -> Result<Glob> {
        let chars: Vec<char> = pattern.chars().collect();
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                '*' => {
                    if tokens.last() != Some(&Token::Star) {
                        tokens.push(Token::Star);
                    }
                    i += 1;
                }
                '?' => {
                    tokens.push(Token::One);
                    i += 1;
                }
                ']' => return Err(malformed(pattern, "`]` without `[`")),
                '[' => {
                    let (token, next) = Self::class(pattern, &chars, i)?;
                    tokens.push(token);
                    i = next;
                }
                c => {
                    tokens.push(Token::Literal(c));
                    i += 1;
                }
            }
        }
        Ok(Glob {
            pattern: pattern.to_string(),
            tokens,
        })
    }

    /// Parses the class opening at `chars[start]` (`[`); returns it and
    /// the index after its `]`.
    fn class(pattern: &str, chars: &[char], start: usize) -> Result<(Token, usize)> {
        let mut i = start + 1;
        let negated = chars.get(i) == Some(&'!');
        if negated {
            i += 1;
        }
        let mut ranges = Vec::new();
        loop {
            let Some(&c) = chars.get(i) else {
                return Err(malformed(pattern, "`[` without `]`"));
            };
            if c == ']' {
                if ranges.is_empty() {
                    return Err(malformed(pattern, "empty character class"));
                }
                return Ok((Token::Class { negated, ranges }, i + 1));
            }
            if c == '[' {
                return Err(malformed(pattern, "`[` inside a character class"));
            }
            match (chars.get(i + 1), chars.get(i + 2)) {
                (Some('-'), Some(&hi)) if hi != ']' => {
                    if hi < c {
                        return Err(malformed(pattern, &format!("reversed range {c}-{hi}")));
                    }
                    ranges.push((c, hi));
                    i += 3;
                }
                _ => {
                    ranges.push((c, c));
                    i += 1;
                }
            }
        }
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Whether the whole of `name` matches.
    pub fn matches(&self, name: &str) -> bool {
        let name: Vec<char> = name.chars().collect();
        let (mut t, mut n) = (0, 0);
        // Where the last `*` was and how much of the name it had taken.
        let mut star: Option<(usize, usize)> = None;
        while n < name.len() {
            match self.tokens.get(t) {
                Some(Token::Star) => {
                    star = Some((t, n));
                    t += 1;
                }
                Some(tok) if tok.accepts(name[n]) => {
                    t += 1;
                    n += 1;
                }
                _ => match star {
                    // Let the last `*` take one more character and retry.
                    Some((st, sn)) => {
                        star = Some((st, sn + 1));
                        t = st + 1;
                        n = sn + 1;
                    }
                    None => return false,
                },
            }
        }
        self.tokens[t..].iter().all(|tok| *tok == Token::Star)
    }
}

impl FromStr for Glob {
    type Err = Error;

    fn from_str(s: &str) -> Result<Glob> {
        Glob::new(s)
    }
}

impl fmt::Display for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.pattern)
    }
}

/// Whether `name` matches `pattern` (see [`Glob`]); errors for a malformed
/// pattern.
pub fn glob_match(pattern: &str, name: &str) -> Result<bool> {
    Ok(Glob::new(pattern)?.matches(name))
}

/// Compiles `patterns`.
fn compile(patterns: &[&str]) -> Result<Vec<Glob>> {
    patterns.iter().map(|p| Glob::new(p)).collect()
}

/// The names of `model`'s parameters that match any of `globs`; errors if
/// a glob matches no parameter at all (most likely a typo).
fn matching<M: Module + ?Sized>(
    model: &M,
    globs: &[Glob],
    op: &'static str,
) -> Result<BTreeSet<String>> {
    let names: Vec<String> = model
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    for g in globs {
        if !names.iter().any(|n| g.matches(n)) {
            return Err(Error::InvalidArgument {
                op,
                msg: format!("pattern {:?} matches no parameter", g.as_str()),
            });
        }
    }
    Ok(names
        .into_iter()
        .filter(|n| globs.iter().any(|g| g.matches(n)))
        .collect())
}

/// A model whose parameters can be frozen (made not to require grad) and
/// unfrozen by name, keeping their storage and values. Object safe:
/// `&mut dyn Freeze` works for any model.
pub trait Freeze: Module {
    /// Makes each parameter require grad exactly when `want(name)` is true
    /// (names as in [`Module::named_parameters`]).
    fn set_requires_grad(&mut self, want: &mut dyn FnMut(&str) -> bool) -> Result<()>;

    /// Freezes the parameters whose names match any of the glob `patterns`
    /// (see [`Glob`]); the others keep their state. Errors for a malformed
    /// pattern or one that matches no parameter (nothing is changed then).
    fn freeze(&mut self, patterns: &[&str]) -> Result<()> {
        let hit = matching(self, &compile(patterns)?, "freeze")?;
        let now = requires_grad_by_name(self);
        Freeze::set_requires_grad(self, &mut |n| !hit.contains(n) && now.get(n) == Some(&true))
    }

    /// Unfreezes the parameters whose names match any of the glob
    /// `patterns`; the others keep their state. Errors as
    /// [`Freeze::freeze`].
    fn unfreeze(&mut self, patterns: &[&str]) -> Result<()> {
        let hit = matching(self, &compile(patterns)?, "unfreeze")?;
        let now = requires_grad_by_name(self);
        Freeze::set_requires_grad(self, &mut |n| hit.contains(n) || now.get(n) == Some(&true))
    }

    /// Trains exactly the parameters whose names match any of the glob
    /// `patterns` and freezes all others. Errors as [`Freeze::freeze`].
    fn train_only(&mut self, patterns: &[&str]) -> Result<()> {
        let hit = matching(self, &compile(patterns)?, "train_only")?;
        Freeze::set_requires_grad(self, &mut |n| hit.contains(n))
    }
}

/// Whether each parameter of `model` requires grad now, by name.
fn requires_grad_by_name<M: Module + ?Sized>(model: &M) -> HashMap<String, bool> {
    model
        .named_parameters()
        .into_iter()
        .map(|(n, t)| (n, t.requires_grad()))
        .collect()
}

/// `Freeze` for models whose inherent `set_requires_grad` does the work.
macro_rules! freeze_by_inherent {
    ($($model:ty),*) => {$(
        impl Freeze for $model {
            fn set_requires_grad(&mut self, want: &mut dyn FnMut(&str) -> bool) -> Result<()> {
                <$model>::set_requires_grad(self, want)
            }
        }
    )*};
}
freeze_by_inherent!(
    ResNet,
    Vgg,
    AlexNet,
    MobileNetV2,
    super::MobileNetV3,
    super::ConvNeXt,
    super::EfficientNet,
    super::ViT,
    super::Bert,
    super::Gpt2,
    super::Mistral
);

/// The layer of parameter `name`: the name without its last dot-component
/// (`layer1.0.conv1.weight` → `layer1.0.conv1`; a name without a dot is its
/// own layer).
pub fn layer_of(name: &str) -> &str {
    name.rsplit_once('.').map_or(name, |(layer, _)| layer)
}

/// The layers of `names` (see [`layer_of`]) in order of first appearance.
pub fn layers_in_order<S: AsRef<str>>(names: &[S]) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for n in names {
        let l = layer_of(n.as_ref());
        if seen.insert(l.to_string()) {
            out.push(l.to_string());
        }
    }
    out
}

/// Which parameters a [`Case`] trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Selection {
    /// Every parameter.
    All,
    /// No parameter; the input requires grad instead.
    Input,
    /// Parameters of normalisation layers ([`LayerKind::Norm`]).
    Norm,
    /// Parameters of convolutions ([`LayerKind::Conv`]).
    Conv,
    /// Parameters of fully connected layers ([`LayerKind::Linear`]).
    Linear,
    /// Parameters of the first ⌈L/4⌉ of the model's L layers.
    SurgicalFirst,
    /// Parameters of the last ⌈L/4⌉ of the model's L layers.
    SurgicalLast,
}

impl Selection {
    /// Every selection, in the order of [`Case::all_names`].
    pub const ALL: [Selection; 7] = [
        Selection::All,
        Selection::Input,
        Selection::Norm,
        Selection::Conv,
        Selection::Linear,
        Selection::SurgicalFirst,
        Selection::SurgicalLast,
    ];

    /// The name of the selection (`surgical-first`, …).
    pub fn name(self) -> &'static str {
        match self {
            Selection::All => "all",
            Selection::Input => "input",
            Selection::Norm => "norm",
            Selection::Conv => "conv",
            Selection::Linear => "linear",
            Selection::SurgicalFirst => "surgical-first",
            Selection::SurgicalLast => "surgical-last",
        }
    }
}

/// A selective-differentiation case: which parameters train (the input
/// requires grad only for [`Selection::Input`]) and whether BatchNorm (and
/// Dropout) run in evaluation mode. Written `"<selection>"` or
/// `"<selection>-bn-eval"`, e.g. `"surgical-last-bn-eval"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Case {
    /// Which parameters train.
    pub selection: Selection,
    /// Evaluation mode (`set_training(false)`) instead of training mode.
    pub bn_eval: bool,
}

/// Every case name, in the order of [`Case::all`].
const NAMES: [&str; 14] = [
    "all",
    "input",
    "norm",
    "conv",
    "linear",
    "surgical-first",
    "surgical-last",
    "all-bn-eval",
    "input-bn-eval",
    "norm-bn-eval",
    "conv-bn-eval",
    "linear-bn-eval",
    "surgical-first-bn-eval",
    "surgical-last-bn-eval",
];

impl Case {
    /// The 14 case names: every [`Selection`] in training mode, then every
    /// one with `-bn-eval`.
    pub fn all_names() -> &'static [&'static str] {
        &NAMES
    }

    /// The 14 cases, in the order of [`Case::all_names`].
    pub fn all() -> Vec<Case> {
        [false, true]
            .into_iter()
            .flat_map(|bn_eval| {
                Selection::ALL
                    .into_iter()
                    .map(move |selection| Case { selection, bn_eval })
            })
            .collect()
    }

    /// Whether the input requires grad in this case (only for `input`).
    pub fn input_requires_grad(&self) -> bool {
        self.selection == Selection::Input
    }

    /// Whether the model runs in training mode in this case.
    pub fn training(&self) -> bool {
        !self.bn_eval
    }

    /// The names of the parameters this case trains, given each
    /// parameter's kind in [`Module::named_parameters`] order (what
    /// [`Module::parameter_kinds`] returns).
    pub fn trainable(&self, kinds: &[(String, LayerKind)]) -> BTreeSet<String> {
        let names: Vec<&str> = kinds.iter().map(|(n, _)| n.as_str()).collect();
        let of_kind = |k: LayerKind| -> BTreeSet<String> {
            kinds
                .iter()
                .filter(|(_, kind)| *kind == k)
                .map(|(n, _)| n.clone())
                .collect()
        };
        let in_layers = |layers: &[String]| -> BTreeSet<String> {
            let layers: BTreeSet<&str> = layers.iter().map(String::as_str).collect();
            names
                .iter()
                .filter(|n| layers.contains(layer_of(n)))
                .map(|n| n.to_string())
                .collect()
        };
        let layers = layers_in_order(&names);
        let quarter = layers.len().div_ceil(4);
        match self.selection {
            Selection::All => names.iter().map(|n| n.to_string()).collect(),
            Selection::Input => BTreeSet::new(),
            Selection::Norm => of_kind(LayerKind::Norm),
            Selection::Conv => of_kind(LayerKind::Conv),
            Selection::Linear => of_kind(LayerKind::Linear),
            Selection::SurgicalFirst => in_layers(&layers[..quarter]),
            Selection::SurgicalLast => in_layers(&layers[layers.len() - quarter..]),
        }
    }

    /// Makes exactly the parameters of [`Case::trainable`] require grad and
    /// sets the model's mode (`set_training(!bn_eval)`). The caller makes
    /// the input require grad when [`Case::input_requires_grad`] says so.
    /// A case that selects no parameter of this model (`norm` on a model
    /// without normalisation layers) leaves every parameter frozen.
    pub fn apply(&self, model: &mut dyn Freeze) -> Result<()> {
        let train = self.trainable(&model.parameter_kinds());
        Freeze::set_requires_grad(model, &mut |n| train.contains(n))?;
        model.set_training(self.training());
        Ok(())
    }
}

impl FromStr for Case {
    type Err = Error;

    /// Parses a case name (one of [`Case::all_names`]).
    fn from_str(s: &str) -> Result<Case> {
        let (base, bn_eval) = match s.strip_suffix("-bn-eval") {
            Some(base) => (base, true),
            None => (s, false),
        };
        Selection::ALL
            .into_iter()
            .find(|sel| sel.name() == base)
            .map(|selection| Case { selection, bn_eval })
            .ok_or_else(|| Error::InvalidArgument {
                op: "Case",
                msg: format!("unknown case {s:?}; known: {}", NAMES.join(", ")),
            })
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.selection.name())?;
        if self.bn_eval {
            f.write_str("-bn-eval")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let cases = Case::all();
        assert_eq!(cases.len(), 14);
        for (c, n) in cases.iter().zip(Case::all_names()) {
            assert_eq!(c.to_string(), *n);
            assert_eq!(n.parse::<Case>().unwrap(), *c);
        }
        assert!("bn-eval".parse::<Case>().is_err());
        assert!("all-bn-eval-bn-eval".parse::<Case>().is_err());
    }

    #[test]
    fn star_backtracks() {
        let g = Glob::new("a*b*c").unwrap();
        assert!(g.matches("abc") && g.matches("axxbyyc") && g.matches("abbbc"));
        assert!(!g.matches("abcd") && !g.matches("acb"));
        assert!(Glob::new("**").unwrap().matches(""));
    }
}
