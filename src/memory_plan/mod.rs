//! `leangrad memory`: the memory of one whole training step of a model,
//! predicted on the meta device (no data, no arithmetic: seconds for a
//! full-size model) or measured on the CPU, under the lean save policy and
//! under the save-everything policy (what PyTorch's autograd keeps) side by
//! side.
//!
//! One step is: build the model (parameters counted), apply the
//! [`Case`] (which parameters train, whether the input needs a gradient,
//! training or evaluation mode), a synthetic input and targets, forward,
//! cross-entropy loss, backward and an optimizer step (the usual
//! `backward` + `step`, or the fused `backward_step`). Everything runs in a
//! fresh [`Ledger`], so the report is exactly that step's allocations; on
//! meta it equals the CPU's byte for byte (`tests/meta_ledger.rs`). The
//! step marks its phases on the ledger ([`Phase`]: setup, forward and loss,
//! backward — with the updates when fused — and the optimizer step), and
//! can record the ledger's timeline ([`run_step_recording`]), which
//! [`plot`] draws.
//!
//! Models come from [`MODELS`], a table of names, constructors and input
//! kinds: adding a model is one entry. The step's forward and loss:
//!
//! * CNNs: images `[N, C, S, S]` → logits `[N, classes]`, one class per
//!   image.
//! * `vit_b16`: [`ViTClassifier`](crate::models::ViTClassifier), Hugging Face's
//!   `ViTForImageClassification` (no pooler; a Linear `classifier` on the
//!   final-LayerNorm `[CLS]` token), one class per image.
//! * `bert_base`: [`BertClassifier`](crate::models::BertClassifier), Hugging Face's
//!   `BertForSequenceClassification` (a Linear `classifier` on the tanh
//!   pooler's output; no dropout), token ids `[N, seq]`, one class per
//!   sequence.
//! * `roberta_base`, `xlm_roberta_base`: the same classifier on RoBERTa-
//!   and XLM-RoBERTa-base ([`BertConfig::roberta_base`](crate::models::BertConfig::roberta_base):
//!   positions after the padding token, one token type; a pooler and a
//!   Linear `classifier` as BERT's, where Hugging Face's
//!   `RobertaForSequenceClassification` has the same two layers as
//!   `classifier.dense` and `classifier.out_proj` on the first token).
//! * `gpt2`: GPT-2 small with its tied LM head, token ids `[N, seq]`,
//!   next-token cross-entropy over the logits `[N·seq, vocab]` (the
//!   targets are given already shifted, as a data loader's `labels`, so
//!   the logits are not sliced).
//! * `mistral_7b`: Mistral-7B v0.1 with its own (untied) LM head, the same
//!   next-token step as `gpt2` (grouped-query attention, rotary
//!   embeddings, SwiGLU; see [`crate::models::Mistral`]).
//!
//! For the `input` cases the input that needs a gradient is the image, or
//! for the text models the input embeddings `[N, seq, hidden]` fed in place
//! of the word-embedding lookup (`forward_embeds`).

use crate::autograd::{save_policy, with_save_policy, SavePolicy};
use crate::memory::{DeviceReport, Ledger, MemoryReport, Phase, TimelineEvent};
use crate::models::Case;
use crate::ops::CrossEntropyOptions;
use crate::optim::{Adam, Algorithm, Optimizer, Sgd, StateFormat};
use crate::{DType, Device, Error, Result, Tensor};
use serde::Serialize;

mod models;
mod parallel;
pub mod plot;
mod report;
mod runner;

pub use models::{
    find_model, parse_case, BuildFn, InputKind, ModelEntry, StepInput, StepModel, MODELS,
};
pub use parallel::{plan_parallel, ParallelPlan, ParallelSpec, RankPeak};
pub use report::{LayerComparison, TorchMeasured};
pub use runner::StepRunner;
use std::fmt::Display;
use std::time::Instant;

/// The optimizer of the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// SGD with momentum 0.9 (one state tensor per parameter).
    Sgd,
    /// Adam (two state tensors per parameter).
    Adam,
    /// AdamW (two state tensors per parameter).
    Adamw,
}

impl OptimizerKind {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Adam => "adam",
            OptimizerKind::Adamw => "adamw",
        }
    }

    /// The optimizer called `name` (`sgd`, `adam`, `adamw`).
    pub fn parse(name: &str) -> Result<OptimizerKind> {
        match name {
            "sgd" => Ok(OptimizerKind::Sgd),
            "adam" => Ok(OptimizerKind::Adam),
            "adamw" => Ok(OptimizerKind::Adamw),
            _ => Err(Error::InvalidArgument {
                op: "memory",
                msg: format!("unknown optimizer `{name}`; known: sgd, adam, adamw"),
            }),
        }
    }
}

/// Everything about one step but the model.
#[derive(Clone, Debug, Serialize)]
pub struct StepSpec {
    /// Samples per batch.
    pub batch: usize,
    /// The input (images or tokens) and the kind of targets.
    pub input: StepInput,
    /// Classes of the synthetic targets (the classifier's outputs; unused
    /// by next-token inputs, whose classes are the vocabulary).
    pub classes: usize,
    /// Compute dtype of the model and of float inputs.
    #[serde(serialize_with = "lower_debug")]
    pub dtype: DType,
    /// The optimizer.
    pub optimizer: OptimizerKind,
    /// The fused `backward_step` (update each parameter as its gradient is
    /// final) instead of `backward` + `step`.
    pub fused: bool,
    /// Each block of the model a checkpointed segment (its
    /// `gradient_checkpointing(true)`; an error for a model without one).
    pub checkpoint: bool,
    /// How the optimizer keeps its state: `f32` (the parameters' dtype),
    /// `bf16`, or block-wise `8bit` (Adam moments; see
    /// [`Optimizer::set_state_format`]).
    pub optimizer_state: StateFormat,
    /// The forward under [`crate::autocast`] in this dtype (`bf16` or
    /// `f16`; `None`, null in JSON, for none).
    #[serde(serialize_with = "optional_lower_debug")]
    pub autocast: Option<DType>,
    /// Which parameters train, the input gradient and the mode (by name:
    /// `surgical-last-bn-eval`).
    #[serde(serialize_with = "display")]
    pub case: Case,
    /// Where to run: [`Device::Meta`] predicts, [`Device::Cpu`] or
    /// [`Device::Cuda`] measures.
    #[serde(serialize_with = "display")]
    pub device: Device,
}

fn lower_debug<S: serde::Serializer>(d: &DType, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{d:?}").to_lowercase())
}

fn optional_lower_debug<S: serde::Serializer>(
    d: &Option<DType>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match d {
        Some(d) => lower_debug(d, s),
        None => s.serialize_none(),
    }
}

fn display<T: Display, S: serde::Serializer>(d: &T, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&d.to_string())
}

/// The ledger of one step under one policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StepMemory {
    /// On the step's device: the breakdown by category at the moment of
    /// the peak (and where it was reached), each category's own peak, the
    /// peak total, live bytes at the end of the step (model, gradients,
    /// optimizer state, input and loss still alive) and saved bytes by
    /// layer.
    pub report: DeviceReport,
    /// The step's device's timeline, when it was recorded (not part of the
    /// plan's JSON: [`MemoryPlan::timeline_json`] writes it).
    #[serde(skip)]
    pub timeline: Option<Vec<TimelineEvent>>,
}

/// Runs one training step of the model made by `build` (inside a fresh
/// ledger, so its parameters are counted) as `spec` says, under `policy`,
/// and returns the ledger of the step's device. A case that trains no
/// parameter of the model and needs no input gradient is an error.
pub fn run_step(
    build: &dyn Fn(DType, Device) -> Result<Box<dyn StepModel>>,
    spec: &StepSpec,
    policy: SavePolicy,
) -> Result<StepMemory> {
    run_step_recording(build, spec, policy, false)
}

/// [`run_step`], also recording the ledger's timeline when `timeline` is
/// true (the report is the same either way).
pub fn run_step_recording(
    build: &dyn Fn(DType, Device) -> Result<Box<dyn StepModel>>,
    spec: &StepSpec,
    policy: SavePolicy,
    timeline: bool,
) -> Result<StepMemory> {
    run_step_as(build, spec, policy, timeline, None)
}

/// [`run_step_recording`] as `rank` of a data parallel group when given.
fn run_step_as(
    build: &dyn Fn(DType, Device) -> Result<Box<dyn StepModel>>,
    spec: &StepSpec,
    policy: SavePolicy,
    timeline: bool,
    rank: Option<parallel::Rank>,
) -> Result<StepMemory> {
    if spec.batch == 0 || spec.classes == 0 || spec.input.is_empty() {
        return Err(Error::InvalidArgument {
            op: "memory",
            msg: "batch, input size and classes must be at least 1".into(),
        });
    }
    if !spec.dtype.is_float() {
        return Err(Error::UnsupportedDType {
            op: "memory",
            dtype: spec.dtype,
        });
    }
    let input_grad = spec.case.input_requires_grad();
    let ledger = Ledger::new().record_timeline(timeline);
    let (report, mut events) = {
        let _l = ledger.enter();
        // Also forgets the op that ran last on this thread: it was not this step's.
        ledger.set_phase(Phase::Setup);
        let mut model = build(spec.dtype, spec.device)?;
        let params = trained_params(model.as_mut(), spec)?;
        let x = spec
            .input
            .make(spec.batch, input_grad, spec.dtype, spec.device)?;
        let targets = spec.input.targets(spec.batch, spec.classes, spec.device)?;
        let _p = with_save_policy(policy);
        let _autocast = spec.autocast.map(crate::autocast).transpose()?;
        let m: &dyn StepModel = model.as_ref();
        let run = |opt| -> Result<(MemoryReport, Vec<TimelineEvent>)> {
            match &rank {
                None => step(m, &x, &targets, opt, spec.fused, &ledger),
                Some(r) => r.step(m, &x, &targets, opt, spec.fused, &ledger),
            }
        };
        match spec.optimizer {
            OptimizerKind::Sgd => run(AnyOptimizer::Sgd(optimizer(
                params,
                Sgd::new(0.01).momentum(0.9),
                spec,
            )?))?,
            OptimizerKind::Adam => run(AnyOptimizer::Adam(optimizer(
                params,
                Adam::new(1e-3),
                spec,
            )?))?,
            OptimizerKind::Adamw => run(AnyOptimizer::Adam(optimizer(
                params,
                Adam::adamw(1e-3),
                spec,
            )?))?,
        }
    };
    let report = report
        .devices
        .into_iter()
        .find(|d| d.device == spec.device.to_string())
        .ok_or_else(|| Error::InvalidArgument {
            op: "memory",
            msg: format!("nothing was allocated on {}", spec.device),
        })?;
    let timeline = timeline.then(|| {
        events.retain(|e| e.device == spec.device);
        events
    });
    Ok(StepMemory { report, timeline })
}

/// The step's optimizer over `params`, keeping its state as
/// `spec.optimizer_state` says.
fn optimizer<A: Algorithm>(params: Vec<Tensor>, alg: A, spec: &StepSpec) -> Result<Optimizer<A>> {
    let mut opt = Optimizer::new(params, alg)?;
    opt.set_state_format(spec.optimizer_state)?;
    Ok(opt)
}

/// Applies `spec.case` (and `spec.checkpoint`) to `model` and returns the
/// parameters it trains; a case that trains nothing and needs no input
/// gradient is an error.
fn trained_params(model: &mut dyn StepModel, spec: &StepSpec) -> Result<Vec<Tensor>> {
    spec.case.apply(model)?;
    if spec.checkpoint {
        model.set_gradient_checkpointing(true)?;
    }
    let params: Vec<Tensor> = model
        .parameters()
        .into_iter()
        .filter(|p| p.requires_grad())
        .collect();
    if params.is_empty() && !spec.case.input_requires_grad() {
        return Err(Error::InvalidArgument {
            op: "memory",
            msg: format!(
                "case `{}` trains nothing in this model (no parameter requires grad)",
                spec.case
            ),
        });
    }
    Ok(params)
}

/// Forward, loss, backward and update with `opt`, each phase marked on
/// `ledger`; returns the ledger's report and timeline at the end of the
/// step, while the model, its gradients, the optimizer state, the input and
/// the loss are still alive (what is freed afterwards is not the step's).
fn step(
    model: &dyn StepModel,
    x: &Tensor,
    targets: &Tensor,
    mut opt: AnyOptimizer,
    fused: bool,
    ledger: &Ledger,
) -> Result<(MemoryReport, Vec<TimelineEvent>)> {
    let loss = forward_loss(model, x, targets, ledger)?;
    if fused {
        opt.backward_step(&loss)?;
    } else {
        loss.backward()?;
        ledger.set_phase(Phase::Optimizer);
        opt.step()?;
    }
    Ok((ledger.report(), ledger.timeline()))
}

/// The step's forward and loss, then the backward phase marked.
fn forward_loss(
    model: &dyn StepModel,
    x: &Tensor,
    targets: &Tensor,
    ledger: &Ledger,
) -> Result<Tensor> {
    ledger.set_phase(Phase::Forward);
    // The PyTorch policy measures PyTorch's own path (the whole logits,
    // then cross-entropy); the lean one takes the model's leanest loss.
    let loss = if save_policy() == SavePolicy::SaveAll {
        model
            .step_logits(x)?
            .cross_entropy(targets, CrossEntropyOptions::default())?
    } else {
        model.step_loss(x, targets)?
    };
    ledger.set_phase(Phase::Backward);
    Ok(loss)
}

/// The step's optimizer, of either algorithm family.
enum AnyOptimizer {
    Sgd(Optimizer<Sgd>),
    Adam(Optimizer<Adam>),
}

impl AnyOptimizer {
    fn backward_step(&mut self, loss: &Tensor) -> Result<()> {
        match self {
            AnyOptimizer::Sgd(o) => o.backward_step(loss).map(drop),
            AnyOptimizer::Adam(o) => o.backward_step(loss).map(drop),
        }
    }

    fn step(&mut self) -> Result<()> {
        match self {
            AnyOptimizer::Sgd(o) => o.step(),
            AnyOptimizer::Adam(o) => o.step(),
        }
    }
}

/// The constructor of the model `name` of [`MODELS`] for `spec`'s input
/// (an error when the model reads another kind of input).
fn plan_build(
    name: &str,
    spec: &StepSpec,
) -> Result<impl Fn(DType, Device) -> Result<Box<dyn StepModel>>> {
    let entry = find_model(name)?;
    let matches = matches!(
        (entry.input, spec.input),
        (InputKind::Image { .. }, StepInput::Image { .. })
            | (InputKind::Tokens { .. }, StepInput::Tokens { .. })
    );
    if !matches {
        return Err(Error::InvalidArgument {
            op: "memory",
            msg: format!("{name} reads {:?}, not the step's input", entry.input),
        });
    }
    let classes = spec.classes;
    let size = match spec.input {
        StepInput::Image { size, .. } => size,
        StepInput::Tokens { .. } => 0,
    };
    Ok(move |dtype: DType, device: Device| (entry.build)(classes, size, dtype, device))
}

/// The lean policy next to what PyTorch's autograd keeps, for one model
/// and step.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryPlan {
    /// The model's name.
    pub model: String,
    /// The step.
    pub spec: StepSpec,
    /// Under the lean policy (the default).
    pub lean: StepMemory,
    /// Under the save-everything policy: what PyTorch's autograd keeps
    /// ([`SavePolicy::SaveAll`]).
    pub pytorch: StepMemory,
    /// Every layer that saved bytes for backward under either policy, with
    /// both policies' bytes, largest difference first.
    pub layers: Vec<LayerComparison>,
    /// Wall-clock seconds for both steps.
    pub seconds: f64,
}

/// Plans (meta) or measures (CPU) one step of the model `name` of
/// [`MODELS`] under both policies.
pub fn plan(name: &str, spec: &StepSpec) -> Result<MemoryPlan> {
    plan_recording(name, spec, false)
}

/// [`plan`], also recording both steps' timelines when `timeline` is true.
pub fn plan_recording(name: &str, spec: &StepSpec, timeline: bool) -> Result<MemoryPlan> {
    let build = plan_build(name, spec)?;
    let start = Instant::now();
    let lean = run_step_recording(&build, spec, SavePolicy::Lean, timeline)?;
    let pytorch = run_step_recording(&build, spec, SavePolicy::SaveAll, timeline)?;
    Ok(MemoryPlan {
        model: name.to_string(),
        spec: spec.clone(),
        layers: report::compare_layers(&lean.report, &pytorch.report),
        lean,
        pytorch,
        seconds: start.elapsed().as_secs_f64(),
    })
}
