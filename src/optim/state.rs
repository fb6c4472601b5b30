//! An optimizer's state as data, to save and restore (`state_dict` /
//! `load_state_dict`, as `torch.optim.Optimizer`'s).
//!
//! Parameters are identified as PyTorch identifies them: by their position
//! over the groups in group order (the first group's parameters are `0..n₀`,
//! the next group's follow), frozen parameters included; and, where the
//! caller gives the model's named tensors, by name as well. The state holds
//! each parameter's step count and state tensors by PyTorch's names
//! (`momentum_buffer`; `exp_avg`, `exp_avg_sq`, `max_exp_avg_sq`), each
//! group's hyper-parameters (learning rate included, so a schedule resumes
//! from the exact rate), the update count, the clipping mode, and the
//! accumulation window: its length, the position in it and the fused path's
//! per-parameter buffers, so a checkpoint taken between micro-batches
//! resumes bit for bit. The usual path's pending `.grad`s are included on
//! request ([`Optimizer::pending_grads`]).

use super::compact::{expected_tensor, StateFormat};
use super::kernels::{nonneg, Algorithm};
use super::{Adam, Clip, Optimizer, ParamState, Sgd};
use crate::autograd::no_grad;
use crate::memory::{with_category, Category};
use crate::{DType, Error, Result, Tensor};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Hyper-parameters that can be saved with an optimizer's state: their
/// kind, the names of their per-parameter state tensors, and a JSON form
/// with PyTorch's keys (`lr`, `momentum`, `betas`, …).
pub trait CheckpointHyper: Algorithm {
    /// The algorithm as saved: `"SGD"`, `"Adam"` or `"AdamW"`.
    fn kind(&self) -> &'static str;

    /// The names of the state tensors, in the order of the update's slots.
    fn slot_names(&self) -> Vec<&'static str>;

    /// The hyper-parameters as a JSON object (finite numbers only).
    fn to_json(&self) -> Result<Map<String, Value>>;

    /// Reads hyper-parameters written by [`CheckpointHyper::to_json`] (or by
    /// PyTorch: other keys are ignored); `entry` names the group in errors.
    fn from_json(group: &Map<String, Value>, entry: &str) -> Result<Self>;
}

/// The largest step count a restored state may hold: 2^53, past which
/// PyTorch's floating-point step counts are no longer exact, and far below
/// where counting on could wrap around.
pub const MAX_STEP_COUNT: u64 = 1 << 53;

/// One parameter group of an [`OptimizerState`].
#[derive(Clone, Debug, PartialEq)]
pub struct GroupState {
    /// The hyper-parameters with PyTorch's keys.
    pub hyper: Map<String, Value>,
    /// The ids of the group's parameters.
    pub params: Vec<usize>,
    /// Their names where known (same length as `params`).
    pub param_names: Vec<Option<String>>,
}

/// One parameter's saved state.
#[derive(Clone, Debug)]
pub struct SavedParamState {
    /// Updates this parameter has had (Adam's bias correction uses it).
    pub step: u64,
    /// State tensors by name (e.g. `exp_avg`).
    pub tensors: BTreeMap<String, Tensor>,
}

/// Everything an [`Optimizer`] needs to continue exactly where it was.
/// The tensors share storage with the optimizer's when exported.
#[derive(Clone, Debug)]
pub struct OptimizerState {
    /// The algorithm ([`Algorithm::NAME`]: `"SGD"` or `"Adam"`).
    pub kind: String,
    /// The groups, in order.
    pub param_groups: Vec<GroupState>,
    /// Per-parameter state by parameter id (parameters never updated have none).
    pub state: BTreeMap<usize, SavedParamState>,
    /// The fused path's accumulation buffers by parameter id (only between
    /// micro-batches of an accumulation window).
    pub accumulated: BTreeMap<usize, Tensor>,
    /// The usual path's collected `.grad`s by parameter id, when captured
    /// (`None`: not captured, and loading leaves `.grad`s alone; `Some`:
    /// loading replaces every owned parameter's `.grad`).
    pub grads: Option<BTreeMap<usize, Tensor>>,
    /// Updates done (by either path).
    pub steps: u64,
    /// Micro-batches per update in the fused path.
    pub accumulation: usize,
    /// Micro-batches of the current window already taken (0 at a boundary).
    pub micro_batch: usize,
    /// The clipping mode.
    pub clip: Clip,
    /// The total norm from a [`Optimizer::backward_norm_pass`] not yet used.
    pub pending_global_norm: Option<f64>,
}

fn fault(entry: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::Checkpoint {
        entry: entry.into(),
        reason: reason.into(),
    }
}

/// Whether `a` and `b` are the same parameter: the same leaf, or (for
/// parameters that do not require grad) the same view of the same storage.
fn same_param(a: &Tensor, b: &Tensor) -> bool {
    match (a.leaf_id(), b.leaf_id()) {
        (Some(x), Some(y)) => x == y,
        (None, None) => Arc::ptr_eq(a.storage(), b.storage()) && a.layout() == b.layout(),
        _ => false,
    }
}

fn name_of(p: &Tensor, names: &[(String, Tensor)]) -> Option<String> {
    names
        .iter()
        .find(|(_, t)| same_param(p, t))
        .map(|(n, _)| n.clone())
}

/// A new tensor shaped, typed and placed as `like`, holding `src`'s values
/// (cast to `like`'s dtype), counted under `category`.
fn fresh_copy(src: &Tensor, like: &Tensor, category: Category) -> Result<Tensor> {
    fresh_copy_as(src, like, like.dtype(), category)
}

/// [`fresh_copy`] in `dtype`, shaped as `src`, on `like`'s device.
fn fresh_copy_as(src: &Tensor, like: &Tensor, dtype: DType, category: Category) -> Result<Tensor> {
    let _category = with_category(category);
    let _no_grad = no_grad();
    let dst = Tensor::zeros(src.shape(), dtype, like.device())?;
    let src = src.detach().to_dtype(dtype)?.to_device(like.device())?;
    crate::primitives::copy_into(&dst, &src)?;
    Ok(dst)
}

/// The names of a parameter's state tensors in `format`: the slots' names,
/// each followed in 8-bit by `{slot}_absmax` (its blocks' scales).
fn state_names(slots: &[&str], format: StateFormat) -> Vec<String> {
    slots
        .iter()
        .flat_map(|s| match format {
            StateFormat::Blockwise8 => vec![s.to_string(), format!("{s}_absmax")],
            _ => vec![s.to_string()],
        })
        .collect()
}

/// Checks saved tensor `i` of a compact state (`entry` names it) against
/// what the format needs for `param`: bf16 state may come from any float
/// tensor of the parameter's shape (it is rounded to bf16); 8-bit codes
/// and scales must be exactly the u8 and f32 tensors the format keeps.
fn check_compact(
    entry: &str,
    src: &Tensor,
    param: &Tensor,
    format: StateFormat,
    i: usize,
) -> Result<()> {
    let (dtype, numel) = expected_tensor(format, i, param.numel());
    let fits = match (format, i % 2) {
        (StateFormat::Bf16, _) => src.shape() == param.shape() && src.dtype().is_float(),
        (_, 0) => src.shape() == param.shape() && src.dtype() == dtype,
        _ => src.shape() == [numel] && src.dtype() == dtype,
    };
    if fits {
        return Ok(());
    }
    Err(fault(
        entry,
        format!(
            "{:?} {:?} cannot be {format} state of a parameter of shape {:?} (expected {dtype:?} × {numel})",
            src.dtype(),
            src.shape(),
            param.shape()
        ),
    ))
}

/// The ledger category of a restored gradient of `param`.
fn gradient_category(param: &Tensor) -> Category {
    if param.memory_category() == Some(Category::Parameter) {
        Category::ParameterGradient
    } else {
        Category::InputGradient
    }
}

/// Checks that `src` (entry `entry`) can stand for a tensor like `param`.
fn check_fits(entry: &str, src: &Tensor, param: &Tensor, name: Option<&str>) -> Result<()> {
    let of = name.map(|n| format!(" `{n}`")).unwrap_or_default();
    if src.shape() != param.shape() {
        return Err(fault(
            entry,
            format!(
                "shape {:?} does not match parameter{of}'s shape {:?}",
                src.shape(),
                param.shape()
            ),
        ));
    }
    if !src.dtype().is_float() {
        return Err(fault(
            entry,
            format!(
                "dtype {:?} is not a float type (parameter{of} is {:?})",
                src.dtype(),
                param.dtype()
            ),
        ));
    }
    Ok(())
}

/// The parameter an id names, with its group and name.
struct Target {
    group: usize,
    param: Tensor,
    name: Option<String>,
}

impl<A: CheckpointHyper> Optimizer<A> {
    /// The state to save (see [`OptimizerState`]); parameter names unknown.
    pub fn state_dict(&self) -> Result<OptimizerState> {
        self.state_dict_named(&[])
    }

    /// The state to save, each parameter also named by the entry of
    /// `names` (typically the model's state dict) that is the same tensor.
    pub fn state_dict_named(&self, names: &[(String, Tensor)]) -> Result<OptimizerState> {
        let mut param_groups = Vec::with_capacity(self.groups.len());
        let mut state = BTreeMap::new();
        let mut accumulated = BTreeMap::new();
        let mut id = 0;
        for group in &self.groups {
            let slots = group.hyper.slot_names();
            let (mut ids, mut group_names) = (Vec::new(), Vec::new());
            for p in &group.params {
                if let Some(leaf) = p.leaf_id() {
                    if let Some(s) = self.state.get(&leaf) {
                        let names = state_names(&slots, s.format);
                        if s.tensors.len() != names.len() {
                            return Err(fault(
                                format!("state.{id}"),
                                format!(
                                    "holds {} state tensors, the group's hyper-parameters need {}",
                                    s.tensors.len(),
                                    names.len()
                                ),
                            ));
                        }
                        let tensors = names.into_iter().zip(s.tensors.iter().cloned()).collect();
                        state.insert(
                            id,
                            SavedParamState {
                                step: s.step,
                                tensors,
                            },
                        );
                    }
                    if let Some(b) = self.buffers.get(&leaf) {
                        accumulated.insert(id, b.clone());
                    }
                }
                ids.push(id);
                group_names.push(name_of(p, names));
                id += 1;
            }
            param_groups.push(GroupState {
                hyper: group.hyper.to_json()?,
                params: ids,
                param_names: group_names,
            });
        }
        Ok(OptimizerState {
            kind: A::NAME.to_string(),
            param_groups,
            state,
            accumulated,
            grads: None,
            steps: self.steps,
            accumulation: self.accumulation,
            micro_batch: self.micro,
            clip: self.clip,
            pending_global_norm: self.global_norm,
        })
    }

    /// The collected `.grad`s of the owned parameters, by parameter id: what
    /// the usual path has accumulated so far (put it in
    /// [`OptimizerState::grads`] to checkpoint between `backward()` calls).
    pub fn pending_grads(&self) -> BTreeMap<usize, Tensor> {
        self.groups
            .iter()
            .flat_map(|g| &g.params)
            .enumerate()
            .filter(|(_, p)| p.leaf_id().is_some())
            .filter_map(|(id, p)| Some((id, p.grad()?)))
            .collect()
    }

    /// Restores a saved state (see [`Optimizer::load_state_dict_named`]).
    pub fn load_state_dict(&mut self, saved: &OptimizerState) -> Result<()> {
        self.load_state_dict_named(saved, &[])
    }

    /// Restores a saved state: the groups' hyper-parameters, every
    /// parameter's step and state tensors (copied, cast to the parameter's
    /// dtype, onto its device), the update count, clipping, the
    /// accumulation window and its buffers, and the pending `.grad`s if
    /// saved. Everything is checked first — the kind, the number of groups
    /// and of parameters in each, the names where both sides know them,
    /// every tensor's name, shape and dtype class — and nothing changes on
    /// error ([`Error::Checkpoint`] naming the entry at fault).
    pub fn load_state_dict_named(
        &mut self,
        saved: &OptimizerState,
        names: &[(String, Tensor)],
    ) -> Result<()> {
        if saved.kind != A::NAME {
            return Err(fault(
                "kind",
                format!(
                    "the state was saved by {}, this optimizer is {}",
                    saved.kind,
                    A::NAME
                ),
            ));
        }
        if saved.param_groups.len() != self.groups.len() {
            return Err(fault(
                "param_groups",
                format!(
                    "{} groups saved, the optimizer has {}",
                    saved.param_groups.len(),
                    self.groups.len()
                ),
            ));
        }
        let mut targets: BTreeMap<usize, Target> = BTreeMap::new();
        let mut hypers = Vec::with_capacity(self.groups.len());
        for (g, (sg, group)) in saved.param_groups.iter().zip(&self.groups).enumerate() {
            let entry = format!("param_groups.{g}");
            let hyper = A::from_json(&sg.hyper, &entry)?;
            hyper
                .validate()
                .map_err(|e| fault(entry.as_str(), e.to_string()))?;
            if hyper.kind() != group.hyper.kind() {
                return Err(fault(
                    entry,
                    format!(
                        "saved as {}, this optimizer's group is {}",
                        hyper.kind(),
                        group.hyper.kind()
                    ),
                ));
            }
            if sg.params.len() != group.params.len() || sg.param_names.len() != sg.params.len() {
                return Err(fault(
                    format!("{entry}.params"),
                    format!(
                        "{} parameters ({} names) saved, the group has {}",
                        sg.params.len(),
                        sg.param_names.len(),
                        group.params.len()
                    ),
                ));
            }
            for (k, (&id, p)) in sg.params.iter().zip(&group.params).enumerate() {
                let name = name_of(p, names);
                if let (Some(was), Some(now)) = (&sg.param_names[k], &name) {
                    if was != now {
                        return Err(fault(
                            format!("{entry}.param_names.{k}"),
                            format!("saved for `{was}`, this position holds `{now}`"),
                        ));
                    }
                }
                let target = Target {
                    group: g,
                    param: p.clone(),
                    name: name.or_else(|| sg.param_names[k].clone()),
                };
                if targets.insert(id, target).is_some() {
                    return Err(fault(
                        format!("{entry}.params"),
                        format!("parameter id {id} appears twice"),
                    ));
                }
            }
            hypers.push(hyper);
        }
        let count = targets.len();
        let owned = |id: usize, entry: &str| -> Result<(&Target, u64)> {
            let t = targets.get(&id).ok_or_else(|| {
                fault(
                    entry,
                    format!("no parameter has id {id} (the groups hold {count})"),
                )
            })?;
            let leaf = t.param.leaf_id().ok_or_else(|| {
                fault(
                    entry,
                    "the parameter does not require grad, so has no state",
                )
            })?;
            Ok((t, leaf))
        };

        let mut state = HashMap::new();
        for (&id, s) in &saved.state {
            let (t, leaf) = owned(id, &format!("state.{id}"))?;
            let format = self.state_format.for_param(t.param.numel());
            let wanted = state_names(&hypers[t.group].slot_names(), format);
            if let Some(extra) = s.tensors.keys().find(|k| !wanted.contains(k)) {
                return Err(fault(
                    format!("state.{id}.{extra}"),
                    format!(
                        "not a state of {} with these hyper-parameters and {format} state (expected {wanted:?})",
                        hypers[t.group].kind()
                    ),
                ));
            }
            let mut tensors = Vec::with_capacity(wanted.len());
            for (i, slot) in wanted.iter().enumerate() {
                let entry = format!("state.{id}.{slot}");
                let src = s
                    .tensors
                    .get(slot)
                    .ok_or_else(|| fault(entry.as_str(), format!("missing (step {})", s.step)))?;
                if format == StateFormat::Full {
                    check_fits(&entry, src, &t.param, t.name.as_deref())?;
                } else {
                    check_compact(&entry, src, &t.param, format, i)?;
                }
                tensors.push((src, t, i));
            }
            if s.step > MAX_STEP_COUNT {
                return Err(fault(
                    format!("state.{id}.step"),
                    format!(
                        "{} is past the largest step count ({MAX_STEP_COUNT})",
                        s.step
                    ),
                ));
            }
            state.insert(leaf, (s.step, format, tensors));
        }
        let mut buffers = Vec::new();
        for (&id, b) in &saved.accumulated {
            let entry = format!("accumulated.{id}");
            let (t, leaf) = owned(id, &entry)?;
            check_fits(&entry, b, &t.param, t.name.as_deref())?;
            buffers.push((leaf, b, t));
        }
        let mut grads = Vec::new();
        for (&id, g) in saved.grads.iter().flatten() {
            let entry = format!("grad.{id}");
            let (t, _) = owned(id, &entry)?;
            check_fits(&entry, g, &t.param, t.name.as_deref())?;
            grads.push((g, t));
        }
        if saved.accumulation == 0 || saved.micro_batch >= saved.accumulation {
            return Err(fault(
                "accumulation",
                format!(
                    "position {} in a window of {} micro-batches",
                    saved.micro_batch, saved.accumulation
                ),
            ));
        }
        if saved.micro_batch == 0 && !saved.accumulated.is_empty() {
            return Err(fault(
                "accumulated",
                "accumulation buffers saved at a window boundary",
            ));
        }
        let clip_ok = match saved.clip {
            Clip::None => true,
            Clip::Value(c) | Clip::ParamNorm(c) | Clip::GlobalNorm(c) => nonneg(c),
        };
        if !clip_ok {
            return Err(fault(
                "clip",
                format!("{:?}: the bound must be ≥ 0", saved.clip),
            ));
        }

        // Everything fits: copy (which may still run out of memory) before
        // changing anything.
        let mut new_state = HashMap::with_capacity(state.len());
        for (leaf, (step, format, tensors)) in state {
            let tensors = tensors
                .into_iter()
                .map(|(src, t, i)| {
                    let dtype = match format {
                        StateFormat::Full => t.param.dtype(),
                        _ => expected_tensor(format, i, t.param.numel()).0,
                    };
                    fresh_copy_as(src, &t.param, dtype, Category::OptimizerState)
                })
                .collect::<Result<Vec<_>>>()?;
            new_state.insert(
                leaf,
                ParamState {
                    step,
                    format,
                    tensors,
                },
            );
        }
        let mut new_buffers = HashMap::with_capacity(buffers.len());
        for (leaf, b, t) in buffers {
            new_buffers.insert(leaf, fresh_copy(b, &t.param, gradient_category(&t.param))?);
        }
        let new_grads = grads
            .into_iter()
            .map(|(g, t)| {
                Ok((
                    t.param.clone(),
                    fresh_copy(g, &t.param, gradient_category(&t.param))?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;

        for (group, hyper) in self.groups.iter_mut().zip(hypers) {
            group.hyper = hyper;
        }
        self.state = new_state;
        self.buffers = new_buffers;
        self.steps = saved.steps;
        self.accumulation = saved.accumulation;
        self.micro = saved.micro_batch;
        self.clip = saved.clip;
        self.global_norm = saved.pending_global_norm;
        if saved.grads.is_some() {
            self.zero_grad();
            for (p, g) in new_grads {
                if let Some(leaf) = p.leaf() {
                    leaf.set_grad(Some(g));
                }
            }
        }
        Ok(())
    }
}

fn number(group: &Map<String, Value>, entry: &str, key: &str) -> Result<f64> {
    group
        .get(key)
        .and_then(Value::as_f64)
        .ok_or_else(|| fault(format!("{entry}.{key}"), "missing or not a number"))
}

fn flag(group: &Map<String, Value>, entry: &str, key: &str) -> Result<bool> {
    group
        .get(key)
        .and_then(Value::as_bool)
        .ok_or_else(|| fault(format!("{entry}.{key}"), "missing or not a boolean"))
}

/// A JSON number for `key`, refusing what JSON cannot hold (NaN, ±∞).
fn finite(kind: &str, key: &str, v: f64) -> Result<Value> {
    serde_json::Number::from_f64(v)
        .map(Value::Number)
        .ok_or_else(|| {
            fault(
                key,
                format!("{kind}'s {key} is {v}, which JSON cannot hold"),
            )
        })
}

impl CheckpointHyper for Sgd {
    fn kind(&self) -> &'static str {
        "SGD"
    }

    fn slot_names(&self) -> Vec<&'static str> {
        vec!["momentum_buffer"; self.state_slots()]
    }

    fn to_json(&self) -> Result<Map<String, Value>> {
        let mut m = Map::new();
        for (key, v) in [
            ("lr", self.lr),
            ("momentum", self.momentum),
            ("dampening", self.dampening),
            ("weight_decay", self.weight_decay),
        ] {
            m.insert(key.into(), finite("SGD", key, v)?);
        }
        m.insert("nesterov".into(), Value::Bool(self.nesterov));
        m.insert("maximize".into(), Value::Bool(self.maximize));
        Ok(m)
    }

    fn from_json(group: &Map<String, Value>, entry: &str) -> Result<Sgd> {
        Ok(Sgd {
            lr: number(group, entry, "lr")?,
            momentum: number(group, entry, "momentum")?,
            dampening: number(group, entry, "dampening")?,
            weight_decay: number(group, entry, "weight_decay")?,
            nesterov: flag(group, entry, "nesterov")?,
            maximize: flag(group, entry, "maximize")?,
        })
    }
}

impl CheckpointHyper for Adam {
    fn kind(&self) -> &'static str {
        if self.decoupled_weight_decay {
            "AdamW"
        } else {
            "Adam"
        }
    }

    fn slot_names(&self) -> Vec<&'static str> {
        let mut names = vec!["exp_avg", "exp_avg_sq"];
        if self.amsgrad {
            names.push("max_exp_avg_sq");
        }
        names
    }

    fn to_json(&self) -> Result<Map<String, Value>> {
        let kind = self.kind();
        let mut m = Map::new();
        m.insert("lr".into(), finite(kind, "lr", self.lr)?);
        m.insert(
            "betas".into(),
            Value::Array(vec![
                finite(kind, "betas", self.beta1)?,
                finite(kind, "betas", self.beta2)?,
            ]),
        );
        m.insert("eps".into(), finite(kind, "eps", self.eps)?);
        m.insert(
            "weight_decay".into(),
            finite(kind, "weight_decay", self.weight_decay)?,
        );
        m.insert("amsgrad".into(), Value::Bool(self.amsgrad));
        m.insert(
            "decoupled_weight_decay".into(),
            Value::Bool(self.decoupled_weight_decay),
        );
        m.insert("maximize".into(), Value::Bool(self.maximize));
        Ok(m)
    }

    fn from_json(group: &Map<String, Value>, entry: &str) -> Result<Adam> {
        let betas = group
            .get("betas")
            .and_then(Value::as_array)
            .filter(|b| b.len() == 2)
            .and_then(|b| Some((b[0].as_f64()?, b[1].as_f64()?)))
            .ok_or_else(|| fault(format!("{entry}.betas"), "missing or not two numbers"))?;
        Ok(Adam {
            lr: number(group, entry, "lr")?,
            beta1: betas.0,
            beta2: betas.1,
            eps: number(group, entry, "eps")?,
            weight_decay: number(group, entry, "weight_decay")?,
            amsgrad: flag(group, entry, "amsgrad")?,
            decoupled_weight_decay: flag(group, entry, "decoupled_weight_decay")?,
            maximize: flag(group, entry, "maximize")?,
        })
    }
}
