//! `leangrad memory`: the memory of one whole training step of a model,
//! predicted on the meta device (no data, no arithmetic: seconds for a
//! full-size model) or measured on the CPU, under the lean save policy and
//! under save-all side by side.
//!
//! One step is: build the model (parameters counted), apply the
//! [`Case`] (which parameters train, whether the input needs a gradient,
//! BatchNorm mode), a synthetic input and class targets, forward,
//! cross-entropy loss, backward and an optimizer step (the usual
//! `backward` + `step`, or the fused `backward_step`). Everything runs in a
//! fresh [`Ledger`], so the report is exactly that step's allocations; on
//! meta it equals the CPU's byte for byte (`tests/meta_ledger.rs`).
//!
//! Models come from [`MODELS`], a table of names and constructors: adding a
//! model is one entry.

use crate::autograd::{with_save_policy, SavePolicy};
use crate::memory::{human_bytes, Category, DeviceReport, LayerBytes, Ledger, MemoryReport};
use crate::models::{MobileNetV2, MobileNetV2Config, ResNet, ResNetConfig, Vgg, VggConfig};
use crate::nn::{LayerKind, Module};
use crate::ops::CrossEntropyOptions;
use crate::optim::{Adam, Algorithm, Optimizer, Sgd};
use crate::{DType, Device, Error, Result, Tensor};
use serde::Serialize;
use std::collections::BTreeSet;
use std::fmt::Write;
use std::time::Instant;

/// A model that a training step can be planned for: a [`Module`] whose
/// parameters can be frozen by name.
pub trait TrainModel: Module {
    /// Makes each parameter require grad exactly when `want(name)` says so.
    fn set_trainable(&mut self, want: &mut dyn FnMut(&str) -> bool) -> Result<()>;
}

impl TrainModel for ResNet {
    fn set_trainable(&mut self, want: &mut dyn FnMut(&str) -> bool) -> Result<()> {
        self.set_requires_grad(want)
    }
}

impl TrainModel for Vgg {
    fn set_trainable(&mut self, want: &mut dyn FnMut(&str) -> bool) -> Result<()> {
        self.set_requires_grad(want)
    }
}

impl TrainModel for MobileNetV2 {
    fn set_trainable(&mut self, want: &mut dyn FnMut(&str) -> bool) -> Result<()> {
        self.set_requires_grad(want)
    }
}

/// Builds a model with `classes` outputs in `dtype` on `device`.
pub type BuildFn = fn(classes: usize, dtype: DType, device: Device) -> Result<Box<dyn TrainModel>>;

/// One model the `memory` command knows.
pub struct ModelEntry {
    /// The name on the command line (`resnet18`).
    pub name: &'static str,
    /// The constructor (full size, torchvision's configuration).
    pub build: BuildFn,
    /// Channels of the input image.
    pub in_channels: usize,
    /// Default input height and width.
    pub default_size: usize,
}

fn resnet18(classes: usize, dtype: DType, device: Device) -> Result<Box<dyn TrainModel>> {
    Ok(Box::new(ResNet::new(
        ResNetConfig::resnet18(classes),
        dtype,
        device,
        0,
    )?))
}

fn resnet50(classes: usize, dtype: DType, device: Device) -> Result<Box<dyn TrainModel>> {
    Ok(Box::new(ResNet::new(
        ResNetConfig::resnet50(classes),
        dtype,
        device,
        0,
    )?))
}

fn vgg16(classes: usize, dtype: DType, device: Device) -> Result<Box<dyn TrainModel>> {
    Ok(Box::new(Vgg::new(
        &VggConfig::vgg16(false, classes),
        dtype,
        device,
        0,
    )?))
}

fn vgg16_bn(classes: usize, dtype: DType, device: Device) -> Result<Box<dyn TrainModel>> {
    Ok(Box::new(Vgg::new(
        &VggConfig::vgg16(true, classes),
        dtype,
        device,
        0,
    )?))
}

fn mobilenet_v2(classes: usize, dtype: DType, device: Device) -> Result<Box<dyn TrainModel>> {
    Ok(Box::new(MobileNetV2::new(
        &MobileNetV2Config::v2(classes),
        dtype,
        device,
        0,
    )?))
}

/// The models of `leangrad memory --model`, full size (1000 classes).
pub const MODELS: &[ModelEntry] = &[
    ModelEntry {
        name: "resnet18",
        build: resnet18,
        in_channels: 3,
        default_size: 224,
    },
    ModelEntry {
        name: "resnet50",
        build: resnet50,
        in_channels: 3,
        default_size: 224,
    },
    ModelEntry {
        name: "vgg16",
        build: vgg16,
        in_channels: 3,
        default_size: 224,
    },
    ModelEntry {
        name: "vgg16_bn",
        build: vgg16_bn,
        in_channels: 3,
        default_size: 224,
    },
    ModelEntry {
        name: "mobilenet_v2",
        build: mobilenet_v2,
        in_channels: 3,
        default_size: 224,
    },
];

/// The entry of [`MODELS`] called `name`, or an error listing the names.
pub fn find_model(name: &str) -> Result<&'static ModelEntry> {
    MODELS
        .iter()
        .find(|m| m.name == name)
        .ok_or_else(|| Error::InvalidArgument {
            op: "memory",
            msg: format!(
                "unknown model `{name}`; known models: {}",
                MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
            ),
        })
}

/// Which parameters train and what needs a gradient (the cases of
/// `python-compare/export.py`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Case {
    /// Every parameter trains; the input needs no gradient.
    All,
    /// Every parameter frozen; the input needs a gradient; BatchNorm in
    /// training mode.
    Input,
    /// As `Input` with BatchNorm in evaluation mode.
    InputBnEval,
    /// Only the normalisation layers' affine parameters train.
    Norm,
    /// Only the last quarter of the parameterised layers trains.
    SurgicalLast,
}

impl Case {
    /// Every case, in the order the tests and the documentation use.
    pub const ALL: [Case; 5] = [
        Case::All,
        Case::Input,
        Case::InputBnEval,
        Case::Norm,
        Case::SurgicalLast,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Case::All => "all",
            Case::Input => "input",
            Case::InputBnEval => "input-bn-eval",
            Case::Norm => "norm",
            Case::SurgicalLast => "surgical-last",
        }
    }

    /// The case called `name`.
    pub fn parse(name: &str) -> Result<Case> {
        Case::ALL
            .into_iter()
            .find(|c| c.name() == name)
            .ok_or_else(|| Error::InvalidArgument {
                op: "memory",
                msg: format!(
                    "unknown case `{name}`; known cases: {}",
                    Case::ALL.map(Case::name).join(", ")
                ),
            })
    }

    fn input_grad(self) -> bool {
        matches!(self, Case::Input | Case::InputBnEval)
    }
}

fn layer_of(name: &str) -> &str {
    name.rsplit_once('.').map_or(name, |(p, _)| p)
}

/// Applies `case` to `model`: which parameters train, and the mode.
/// (Kept small and private: a library-wide case API may replace it.)
fn apply_case(model: &mut dyn TrainModel, case: Case) -> Result<()> {
    let names: Vec<String> = model
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    // Normalisation layers: those the model labels so, or that keep running statistics.
    let mut norm: BTreeSet<String> = model
        .parameter_kinds()
        .into_iter()
        .filter(|(_, k)| *k == LayerKind::Norm)
        .map(|(n, _)| layer_of(&n).to_string())
        .collect();
    norm.extend(
        model
            .named_buffers()
            .into_iter()
            .filter_map(|(n, _)| n.strip_suffix(".running_var").map(str::to_string)),
    );
    let mut layers: Vec<&str> = Vec::new();
    for n in &names {
        let l = layer_of(n);
        if !layers.contains(&l) {
            layers.push(l);
        }
    }
    let last: BTreeSet<String> = layers[layers.len() - layers.len().div_ceil(4)..]
        .iter()
        .map(|s| s.to_string())
        .collect();
    model.set_trainable(&mut |n: &str| match case {
        Case::All => true,
        Case::Norm => norm.contains(layer_of(n)),
        Case::SurgicalLast => last.contains(layer_of(n)),
        Case::Input | Case::InputBnEval => false,
    })?;
    model.set_training(case != Case::InputBnEval);
    Ok(())
}

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
    /// Images per batch.
    pub batch: usize,
    /// Input channels.
    pub in_channels: usize,
    /// Input height and width.
    pub size: usize,
    /// Classes of the synthetic targets (the model's outputs).
    pub classes: usize,
    /// Compute dtype of the model and input.
    #[serde(serialize_with = "lower_debug")]
    pub dtype: DType,
    /// The optimizer.
    pub optimizer: OptimizerKind,
    /// The fused `backward_step` (update each parameter as its gradient is
    /// final) instead of `backward` + `step`.
    pub fused: bool,
    /// Which parameters train.
    pub case: Case,
    /// Where to run: [`Device::Meta`] predicts, [`Device::Cpu`] measures.
    #[serde(serialize_with = "display")]
    pub device: Device,
}

fn lower_debug<S: serde::Serializer>(d: &DType, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{d:?}").to_lowercase())
}

fn display<S: serde::Serializer>(d: &Device, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&d.to_string())
}

/// The ledger of one step under one policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StepMemory {
    /// Peak bytes by category, peak total, live bytes at the end of the
    /// step (model, gradients, optimizer state, input and loss still
    /// alive), parameter-gradient peak and saved bytes by layer, on the
    /// step's device.
    pub report: DeviceReport,
}

/// Runs one training step of the model made by `build` (inside a fresh
/// ledger, so its parameters are counted) as `spec` says, under `policy`,
/// and returns the ledger of the step's device.
pub fn run_step(
    build: &dyn Fn(DType, Device) -> Result<Box<dyn TrainModel>>,
    spec: &StepSpec,
    policy: SavePolicy,
) -> Result<StepMemory> {
    if spec.batch == 0 || spec.size == 0 || spec.classes == 0 {
        return Err(Error::InvalidArgument {
            op: "memory",
            msg: "batch, size and classes must be at least 1".into(),
        });
    }
    if !spec.dtype.is_float() {
        return Err(Error::UnsupportedDType {
            op: "memory",
            dtype: spec.dtype,
        });
    }
    let ledger = Ledger::new();
    let report = {
        let _l = ledger.enter();
        let mut model = build(spec.dtype, spec.device)?;
        apply_case(model.as_mut(), spec.case)?;
        let shape = [spec.batch, spec.in_channels, spec.size, spec.size];
        let x = Tensor::randn(&shape, spec.dtype, spec.device, 1)?
            .set_requires_grad(spec.case.input_grad())?;
        let targets = match spec.device {
            Device::Meta => Tensor::zeros(&[spec.batch], DType::I64, Device::Meta)?,
            d => Tensor::from_vec(
                (0..spec.batch)
                    .map(|i| (i % spec.classes) as i64)
                    .collect::<Vec<_>>(),
                &[spec.batch],
                d,
            )?,
        };
        let params: Vec<Tensor> = model
            .parameters()
            .into_iter()
            .filter(|p| p.requires_grad())
            .collect();
        if params.is_empty() && !spec.case.input_grad() {
            return Err(Error::InvalidArgument {
                op: "memory",
                msg: format!(
                    "case `{}` trains nothing in this model (no parameter requires grad)",
                    spec.case.name()
                ),
            });
        }
        let _p = with_save_policy(policy);
        let m: &dyn TrainModel = model.as_ref();
        match spec.optimizer {
            OptimizerKind::Sgd => step(
                m,
                &x,
                &targets,
                Optimizer::new(params, Sgd::new(0.01).momentum(0.9))?,
                spec.fused,
                &ledger,
            )?,
            OptimizerKind::Adam => step(
                m,
                &x,
                &targets,
                Optimizer::new(params, Adam::new(1e-3))?,
                spec.fused,
                &ledger,
            )?,
            OptimizerKind::Adamw => step(
                m,
                &x,
                &targets,
                Optimizer::new(params, Adam::adamw(1e-3))?,
                spec.fused,
                &ledger,
            )?,
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
    Ok(StepMemory { report })
}

/// Forward, loss, backward and update with `opt`; returns the ledger's
/// report at the end of the step, while the model, its gradients, the
/// optimizer state, the input and the loss are still alive.
fn step<A: Algorithm>(
    model: &dyn TrainModel,
    x: &Tensor,
    targets: &Tensor,
    mut opt: Optimizer<A>,
    fused: bool,
    ledger: &Ledger,
) -> Result<MemoryReport> {
    let loss = model
        .forward(x)?
        .cross_entropy(targets, CrossEntropyOptions::default())?;
    if fused {
        opt.backward_step(&loss)?;
    } else {
        loss.backward()?;
        opt.step()?;
    }
    Ok(ledger.report())
}

/// The lean policy next to save-all for one model and step.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryPlan {
    /// The model's name.
    pub model: String,
    /// The step.
    pub spec: StepSpec,
    /// Under the lean policy (the default).
    pub lean: StepMemory,
    /// Under the save-everything policy (what PyTorch keeps).
    pub save_all: StepMemory,
    /// Wall-clock seconds for both steps.
    pub seconds: f64,
}

/// Plans (meta) or measures (CPU) one step of the model `name` of
/// [`MODELS`] under both policies.
pub fn plan(name: &str, spec: &StepSpec) -> Result<MemoryPlan> {
    let entry = find_model(name)?;
    let classes = spec.classes;
    let build = move |dtype: DType, device: Device| (entry.build)(classes, dtype, device);
    let start = Instant::now();
    let lean = run_step(&build, spec, SavePolicy::Lean)?;
    let save_all = run_step(&build, spec, SavePolicy::SaveAll)?;
    Ok(MemoryPlan {
        model: name.to_string(),
        spec: spec.clone(),
        lean,
        save_all,
        seconds: start.elapsed().as_secs_f64(),
    })
}

fn ratio(lean: usize, all: usize) -> String {
    if lean == 0 {
        if all == 0 {
            "—".into()
        } else {
            "∞".into()
        }
    } else {
        format!("{:.2}×", all as f64 / lean as f64)
    }
}

/// Saved bytes of the layer part of a `layer/op` label, summed over ops.
fn by_layer(rows: &[LayerBytes]) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for r in rows {
        let layer = r.layer.split('/').next().unwrap_or_default();
        let layer = if layer.is_empty() { "(top)" } else { layer };
        match out.iter_mut().find(|(l, _)| l == layer) {
            Some((_, b)) => *b += r.peak,
            None => out.push((layer.to_string(), r.peak)),
        }
    }
    out.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    out
}

impl MemoryPlan {
    /// The plan as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// A table: peak bytes by category (lean, save-all, ratio) and the
    /// `top` layers with the most saved bytes under the lean policy.
    pub fn to_table(&self, top: usize) -> String {
        let s = &self.spec;
        let (l, a) = (&self.lean.report, &self.save_all.report);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{}: batch {}, {}×{}, {}, case {}, {}{}, {} (both policies in {:.1} ms)",
            self.model,
            s.batch,
            s.size,
            s.size,
            format!("{:?}", s.dtype).to_lowercase(),
            s.case.name(),
            s.optimizer.name(),
            if s.fused { " fused" } else { "" },
            if s.device == Device::Meta {
                "predicted on meta".to_string()
            } else {
                format!("measured on {}", s.device)
            },
            self.seconds * 1e3
        );
        let _ = writeln!(
            out,
            "{:<18} {:>24} {:>24} {:>9}",
            "peak", "lean", "save-all", "save/lean"
        );
        let rows = [
            ("parameters", Category::Parameter),
            ("gradients", Category::Gradient),
            ("saved", Category::Saved),
            ("optimizer state", Category::OptimizerState),
            ("workspace", Category::Workspace),
            ("other", Category::Other),
        ];
        for (name, c) in rows {
            let (x, y) = (l.peak.get(c), a.peak.get(c));
            let _ = writeln!(
                out,
                "{name:<18} {:>24} {:>24} {:>9}",
                human_bytes(x),
                human_bytes(y),
                ratio(x, y)
            );
        }
        let _ = writeln!(
            out,
            "{:<18} {:>24} {:>24} {:>9}",
            "total",
            human_bytes(l.peak_total),
            human_bytes(a.peak_total),
            ratio(l.peak_total, a.peak_total)
        );
        let _ = writeln!(
            out,
            "{:<18} {:>24} {:>24} {:>9}",
            "leaf gradients",
            human_bytes(l.parameter_gradient_peak),
            human_bytes(a.parameter_gradient_peak),
            ratio(l.parameter_gradient_peak, a.parameter_gradient_peak)
        );
        if top > 0 {
            let (lean, all) = (by_layer(&l.saved_by_layer), by_layer(&a.saved_by_layer));
            let _ = writeln!(out, "layers with the most saved bytes (peak, lean):");
            for (layer, bytes) in lean.iter().take(top) {
                let other = all.iter().find(|(n, _)| n == layer).map_or(0, |(_, b)| *b);
                let _ = writeln!(
                    out,
                    "  {layer:<24} {:>24} {:>24} {:>9}",
                    human_bytes(*bytes),
                    human_bytes(other),
                    ratio(*bytes, other)
                );
            }
            if lean.is_empty() {
                let _ = writeln!(out, "  (nothing saved)");
            }
        }
        out
    }
}
