//! PyTorch-style state dicts: a module's parameters and buffers by name, and
//! loading named tensors back into them in place.
//!
//! A composite model (a struct holding layers) is described by a list of
//! `(name, layer)` pairs: [`state_dict_of`] and [`load_state_dict_of`]
//! prefix each layer's names with its own, as PyTorch does for submodules
//! (`"layer1.0.conv1"` + `"weight"` → `"layer1.0.conv1.weight"`).

use crate::nn::Module;
use crate::{DType, Error, Result, Tensor};
use std::collections::{BTreeMap, BTreeSet};

/// How [`load_state_dict`] treats names that do not line up.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Like PyTorch's `strict`: when true (the default), missing and
    /// unexpected names are errors; when false they are only reported.
    /// Shape and dtype-class mismatches are errors either way.
    pub strict: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { strict: true }
    }
}

/// What [`load_state_dict`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Names written into the module (sorted).
    pub loaded: Vec<String>,
    /// Names of the module absent from the state dict (non-strict only; sorted).
    pub missing: Vec<String>,
    /// Names of the state dict the module lacks (non-strict only; sorted).
    pub unexpected: Vec<String>,
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// The module's parameters then its buffers, named `prefix.name` (just
/// `name` when `prefix` is empty). The tensors share storage with the
/// module's.
pub fn state_dict(module: &dyn Module, prefix: &str) -> Vec<(String, Tensor)> {
    module
        .named_parameters()
        .into_iter()
        .chain(module.named_buffers())
        .map(|(n, t)| (join(prefix, &n), t))
        .collect()
}

/// The state dict of a composite model given as `(name, layer)` pairs, each
/// layer's names prefixed with its name.
pub fn state_dict_of(children: &[(&str, &dyn Module)]) -> Vec<(String, Tensor)> {
    children
        .iter()
        .flat_map(|(name, m)| state_dict(*m, name))
        .collect()
}

/// Writes `tensors` into `module`'s parameters and buffers in place (see
/// [`load_into`] for the rules).
pub fn load_state_dict(
    module: &dyn Module,
    tensors: &BTreeMap<String, Tensor>,
    options: LoadOptions,
) -> Result<LoadReport> {
    load_into(&state_dict(module, ""), tensors, options)
}

/// [`load_state_dict`] for a composite model given as `(name, layer)` pairs.
pub fn load_state_dict_of(
    children: &[(&str, &dyn Module)],
    tensors: &BTreeMap<String, Tensor>,
    options: LoadOptions,
) -> Result<LoadReport> {
    load_into(&state_dict_of(children), tensors, options)
}

fn same_class(a: DType, b: DType) -> bool {
    a.is_float() == b.is_float()
}

/// What loading would do, checked: the pairs to copy and the report.
type Plan<'a> = (Vec<(&'a String, &'a Tensor, &'a Tensor)>, LoadReport);

/// Checks every name, shape and dtype class of `tensors` against
/// `destinations` and reports all problems together in
/// [`Error::StateDictMismatch`] (with hints: a prefix the file's names
/// carry or lack); nothing is read or written. With `strict` off, missing
/// and unexpected names are only reported.
fn plan<'a>(
    destinations: &'a [(String, Tensor)],
    tensors: &'a BTreeMap<String, Tensor>,
    options: LoadOptions,
) -> Result<Plan<'a>> {
    let names: BTreeSet<&str> = destinations.iter().map(|(n, _)| n.as_str()).collect();
    let mut missing = Vec::new();
    let mut mismatched = Vec::new();
    let mut wrong_dtype = Vec::new();
    let mut pairs = Vec::new();
    for (name, dst) in destinations {
        let Some(src) = tensors.get(name) else {
            missing.push(name.clone());
            continue;
        };
        if src.shape() != dst.shape() {
            mismatched.push((name.clone(), dst.shape().to_vec(), src.shape().to_vec()));
        } else if !same_class(dst.dtype(), src.dtype()) {
            wrong_dtype.push((name.clone(), dst.dtype(), src.dtype()));
        } else {
            pairs.push((name, dst, src));
        }
    }
    let unexpected: Vec<String> = tensors
        .keys()
        .filter(|k| !names.contains(k.as_str()))
        .cloned()
        .collect();
    missing.sort();
    mismatched.sort();
    wrong_dtype.sort_by(|a, b| a.0.cmp(&b.0));
    let names_fail = options.strict && !(missing.is_empty() && unexpected.is_empty());
    if names_fail || !mismatched.is_empty() || !wrong_dtype.is_empty() {
        let hints = prefix_hints(&names, &missing, &unexpected);
        let (missing, unexpected) = if options.strict {
            (missing, unexpected)
        } else {
            (Vec::new(), Vec::new())
        };
        return Err(Error::StateDictMismatch {
            missing,
            unexpected,
            mismatched,
            wrong_dtype,
            hints,
        });
    }
    let mut loaded: Vec<String> = pairs.iter().map(|(n, _, _)| (*n).clone()).collect();
    loaded.sort();
    let report = LoadReport {
        loaded,
        missing,
        unexpected,
    };
    Ok((pairs, report))
}

/// Checks, as [`load_into`] does, whether `tensors` would load into
/// `destinations`, without reading or writing any data: the report names
/// what would load. The destinations may be on the meta device, so a model
/// can be checked against a file before it is built for real.
pub fn check_state_dict(
    destinations: &[(String, Tensor)],
    tensors: &BTreeMap<String, Tensor>,
    options: LoadOptions,
) -> Result<LoadReport> {
    plan(destinations, tensors, options).map(|(_, report)| report)
}

/// Checks every name, shape and dtype class first and reports all problems
/// together in [`Error::StateDictMismatch`]; only when everything fits does
/// it cast each source to its destination's dtype (so f32/f16/bf16 files
/// load into any float compute dtype) and copy it into the destination's
/// storage, under `no_grad`, bumping its version. Nothing is written on
/// error.
pub fn load_into(
    destinations: &[(String, Tensor)],
    tensors: &BTreeMap<String, Tensor>,
    options: LoadOptions,
) -> Result<LoadReport> {
    let (pairs, report) = plan(destinations, tensors, options)?;
    // Cast (and move to each destination's device: a file's tensors are
    // read to the host) everything before writing anything, so a failing
    // cast or upload leaves the module untouched.
    let _g = crate::autograd::no_grad();
    let cast = pairs
        .iter()
        .map(|(_, dst, src)| src.detach().to_dtype(dst.dtype())?.to_device(dst.device()))
        .collect::<Result<Vec<_>>>()?;
    for ((_, dst, _), src) in pairs.iter().zip(&cast) {
        crate::primitives::copy_into(dst, src)?;
    }
    Ok(report)
}

/// The prefixes of `name` that end at a dot (`a.`, `a.b.`), longest first.
fn dotted_prefixes(name: &str) -> Vec<&str> {
    let mut found: Vec<&str> = name.match_indices('.').map(|(i, _)| &name[..=i]).collect();
    found.reverse();
    found
}

/// Hints for names that do not line up because of a prefix: one that the
/// file's names carry and that, stripped, gives names of the model
/// (`module.` from DistributedDataParallel, `backbone.`), or one that the
/// model's names carry and that, added, turns the file's names into them.
/// A prefix is hinted when it makes at least half the unexpected names fit.
fn prefix_hints(names: &BTreeSet<&str>, missing: &[String], unexpected: &[String]) -> Vec<String> {
    let candidates = |list: &[String]| -> BTreeSet<String> {
        list.iter()
            .flat_map(|n| dotted_prefixes(n).into_iter().map(str::to_string))
            .collect()
    };
    let best = |candidates: BTreeSet<String>, fits: &dyn Fn(&str, &str) -> bool| {
        candidates
            .into_iter()
            .map(|p| {
                let hits = unexpected.iter().filter(|u| fits(&p, u)).count();
                (hits, p)
            })
            .filter(|(hits, _)| *hits > 0 && 2 * hits >= unexpected.len())
            .max_by_key(|(hits, p)| (*hits, std::cmp::Reverse(p.len())))
    };
    let strip = best(candidates(unexpected), &|p, u| {
        u.strip_prefix(p).is_some_and(|rest| names.contains(rest))
    });
    let add = best(candidates(missing), &|p, u| {
        names.contains(format!("{p}{u}").as_str())
    });
    match (strip, add) {
        (Some((s, p)), a) if a.as_ref().is_none_or(|(h, _)| s >= *h) => vec![format!(
            "the file's names start with `{p}` where the model's do not: strip that prefix"
        )],
        (_, Some((_, p))) => vec![format!(
            "the model's names start with `{p}` where the file's do not: add that prefix"
        )],
        _ => Vec::new(),
    }
}

/// `tensors` with `strip` removed from the front of every name that starts
/// with it (as PyTorch's `consume_prefix_in_state_dict_if_present`), then
/// `add` put in front of every name. Two names that become one are
/// [`Error::InvalidArgument`] naming them.
pub fn rename_prefix(
    tensors: BTreeMap<String, Tensor>,
    strip: &str,
    add: &str,
) -> Result<BTreeMap<String, Tensor>> {
    let mut renamed = BTreeMap::new();
    for (name, t) in tensors {
        let new = format!("{add}{}", name.strip_prefix(strip).unwrap_or(&name));
        if renamed.contains_key(&new) {
            return Err(Error::InvalidArgument {
                op: "rename_prefix",
                msg: format!("`{name}` and another name both become `{new}`"),
            });
        }
        renamed.insert(new, t);
    }
    Ok(renamed)
}
