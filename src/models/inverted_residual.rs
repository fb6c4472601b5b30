//! What torchvision's MobileNetV3 and EfficientNet share: the
//! `Conv2dNormActivation` unit ([`Unit`]), `SqueezeExcitation` with a
//! choice of activation and gate ([`Se`]), inverted-residual blocks whose
//! stages run in order with an optional residual connection (through
//! stochastic depth for EfficientNet: [`Block`]), and the model-level
//! chores over the list of `features` blocks ([`Blocks`]): freezing by
//! name, listing tensors, training mode, synchronised BatchNorm and the
//! walk from the input to the flattened pooled features.

use super::{
    checkpoint_block, part_of, set_bn, set_conv, square_conv_builder, stop_if, Ctx, Named, Part,
};
use crate::memory::scope;
use crate::nn::{
    adaptive_avg_pool2d, BatchNorm, BatchStatsSync, Conv2d, Init, Module, StochasticDepth,
};
use crate::{Result, Tensor};
use std::sync::Arc;

/// torchvision's `_make_divisible`: `v` rounded to the nearest multiple of
/// `divisor` (at least `divisor`), never more than 10 % below `v`.
pub fn make_divisible(v: f64, divisor: usize) -> usize {
    let d = divisor as f64;
    let mut new_v = (((v + d / 2.0) as usize) / divisor * divisor).max(divisor);
    if (new_v as f64) < 0.9 * v {
        new_v = new_v.saturating_add(divisor);
    }
    new_v
}

/// What follows a convolution and its BatchNorm (or squeeze-and-
/// excitation's first 1×1 convolution).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Act {
    /// Nothing (a linear projection).
    None,
    /// ReLU, in place.
    Relu,
    /// Hardswish (MobileNetV3).
    Hardswish,
    /// SiLU (EfficientNet).
    Silu,
}

impl Act {
    /// The activation of `y`, written over it where it may be.
    fn apply(self, y: Tensor) -> Result<Tensor> {
        match self {
            Act::None => Ok(y),
            Act::Relu => y.relu_inplace(),
            Act::Hardswish => y.hardswish_owned(),
            Act::Silu => y.silu_owned(),
        }
    }
}

/// The gate squeeze-and-excitation multiplies its input by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Gate {
    /// Hardsigmoid (MobileNetV3).
    Hardsigmoid,
    /// Sigmoid (torchvision's default, EfficientNet).
    Sigmoid,
}

/// A convolution + BatchNorm + activation as torchvision's
/// `Conv2dNormActivation` builds it: `k`×`k`, padding `(k - 1) / 2`.
#[derive(Clone, Copy, Debug)]
pub(super) struct UnitSpec {
    /// The activation after the norm.
    pub act: Act,
    /// Input and output channels.
    pub io: [usize; 2],
    /// Kernel size.
    pub k: usize,
    /// Stride.
    pub stride: usize,
    /// Groups (the output channels for a depthwise convolution).
    pub groups: usize,
}

impl UnitSpec {
    /// A `k`×`k` unit with stride 1 and one group.
    pub fn new(act: Act, io: [usize; 2], k: usize) -> Self {
        UnitSpec {
            act,
            io,
            k,
            stride: 1,
            groups: 1,
        }
    }

    /// The same unit with stride `stride`.
    pub fn stride(self, stride: usize) -> Self {
        UnitSpec { stride, ..self }
    }

    /// The same unit as a depthwise convolution (one group per channel).
    pub fn depthwise(self) -> Self {
        UnitSpec {
            groups: self.io[1],
            ..self
        }
    }
}

/// How a model builds its layers: dtype and device, and the options of its
/// BatchNorms.
#[derive(Clone, Copy, Debug)]
pub(super) struct Builder {
    /// The dtype and device of every layer.
    pub c: Ctx,
    /// BatchNorm's eps.
    pub bn_eps: f64,
    /// BatchNorm's momentum.
    pub bn_momentum: f64,
}

/// A bias-free convolution, its BatchNorm and its activation, with names
/// relative to the block.
#[derive(Clone)]
pub(super) struct Unit {
    conv: Conv2d,
    bn: BatchNorm,
    bn_name: String,
    act: Act,
    act_name: String,
}

/// torchvision's `SqueezeExcitation`: average pool, `fc1` (1×1 conv),
/// activation, `fc2` (1×1 conv), gate, times the input.
#[derive(Clone)]
pub(super) struct Se {
    name: String,
    fc1: Conv2d,
    fc2: Conv2d,
    act: Act,
    gate: Gate,
}

/// One layer of a block.
#[derive(Clone)]
pub(super) enum Stage {
    /// Convolution, BatchNorm, activation.
    Unit(Unit),
    /// Squeeze-and-excitation.
    Se(Se),
}

impl Builder {
    /// torchvision's `Conv2dNormActivation` at `prefix` (`prefix.0` conv
    /// initialised `kaiming_normal_(mode="fan_out")`, `prefix.1`
    /// BatchNorm, `prefix.2` the activation's scope).
    pub fn unit(&self, prefix: &str, spec: UnitSpec, seed: u64) -> Result<Unit> {
        let c = self.c;
        let p = |s: &str| match prefix {
            "" => s.to_string(),
            _ => format!("{prefix}.{s}"),
        };
        let bn = BatchNorm::builder(spec.io[1])
            .name(&p("1"))
            .eps(self.bn_eps)
            .momentum(Some(self.bn_momentum))
            .dtype(c.0)
            .build2d(&c.1)?;
        let k = spec.k;
        Ok(Unit {
            // torchvision's padding here is `(k - 1) / 2` (the same as
            // `k / 2` for the odd kernels it uses).
            conv: square_conv_builder(&p("0"), spec.io, k, spec.stride, spec.groups, c, seed)
                .padding(k.saturating_sub(1) / 2)
                .build(&c.1)?,
            bn,
            bn_name: p("1"),
            act: spec.act,
            act_name: p("2"),
        })
    }

    /// torchvision's `SqueezeExcitation(channels, squeeze)` named `name`
    /// (`name.fc1`, `name.fc2`: 1×1 convolutions with bias, initialised
    /// `kaiming_normal_(mode="fan_out")` with bias zero, as both models
    /// initialise every convolution), seeds `seed` and `seed + 1`.
    pub fn se(
        &self,
        name: String,
        [channels, squeeze]: [usize; 2],
        (act, gate): (Act, Gate),
        seed: u64,
    ) -> Result<Se> {
        let pointwise = |fc: &str, io: [usize; 2], seed: u64| {
            square_conv_builder(&format!("{name}.{fc}"), io, 1, 1, 1, self.c, seed)
                .bias(true)
                .bias_init(Init::zeros())
                .build(&self.c.1)
        };
        Ok(Se {
            fc1: pointwise("fc1", [channels, squeeze], seed)?,
            fc2: pointwise("fc2", [squeeze, channels], seed.wrapping_add(1))?,
            name,
            act,
            gate,
        })
    }
}

impl Se {
    /// The layers' scopes are full names under the block (`block.K.fc1`,
    /// `block.K.avgpool`, …), the multiply's is `block.K`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let sub = |s: &str| scope(format!("{}.{s}", self.name));
        let scale = {
            let _a = sub("avgpool");
            adaptive_avg_pool2d(x, [1, 1])?
        };
        let scale = self.fc1.forward(&scale)?;
        let scale = {
            let _a = sub("activation");
            self.act.apply(scale)?
        };
        let scale = self.fc2.forward(&scale)?;
        let scale = {
            let _a = sub("scale_activation");
            match self.gate {
                Gate::Hardsigmoid => scale.hardsigmoid_owned()?,
                Gate::Sigmoid => scale.sigmoid_owned()?,
            }
        };
        let _s = scope(self.name.clone());
        scale.mul(x)
    }
}

/// One of a model's `features` blocks: stages in order, plus the residual
/// connection if any, through stochastic depth if the block has it.
#[derive(Clone)]
pub(super) struct Block {
    /// The block's state-dict prefix (`features.3`, `features.3.1`).
    pub name: String,
    /// Its layers in order.
    pub stages: Vec<Stage>,
    /// Whether the block's input is added to its output.
    pub residual: bool,
    /// Applied to the branch before the residual add (EfficientNet's
    /// `stochastic_depth`, scoped under the block).
    pub drop_path: Option<StochasticDepth>,
    /// A second feature name for the block's output: the EfficientNet
    /// stage (`features.3`) that this block ends.
    pub ends: Option<String>,
}

impl Block {
    /// A block without stochastic depth that ends no stage.
    pub fn new(name: String, stages: Vec<Stage>, residual: bool) -> Block {
        Block {
            name,
            stages,
            residual,
            drop_path: None,
            ends: None,
        }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        let mut h = x.clone();
        for stage in &self.stages {
            h = match stage {
                Stage::Unit(u) => {
                    // The norm writes over the convolution's output.
                    let y = u.bn.forward_owned(u.conv.forward(&h)?)?;
                    let _a = scope(u.act_name.clone());
                    u.act.apply(y)?
                }
                Stage::Se(se) => se.forward(&h)?,
            };
        }
        if self.residual {
            if let Some(sd) = &self.drop_path {
                h = sd.forward_owned(h)?;
            }
            h = h.add_owned(x)?;
        }
        Ok(h)
    }
}

/// A model's `features` blocks, in order.
pub(super) struct Blocks(pub Vec<Block>);

impl Blocks {
    /// Makes each parameter require grad exactly when `want(name)` says.
    pub fn set_requires_grad(&mut self, want: &mut dyn FnMut(&str) -> bool) -> Result<()> {
        for block in &mut self.0 {
            for stage in &mut block.stages {
                match stage {
                    Stage::Unit(u) => {
                        let conv_name = format!("{}.{}", block.name, u.conv.name());
                        set_conv(&mut u.conv, &conv_name, want)?;
                        let bn_name = format!("{}.{}", block.name, u.bn_name);
                        set_bn(&mut u.bn, &bn_name, want)?;
                    }
                    Stage::Se(se) => {
                        let n1 = format!("{}.{}", block.name, se.fc1.name());
                        set_conv(&mut se.fc1, &n1, want)?;
                        let n2 = format!("{}.{}", block.name, se.fc2.name());
                        set_conv(&mut se.fc2, &n2, want)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// `part` of every layer, full names, in torchvision's order.
    pub fn parts(&self, part: Part) -> Vec<Named> {
        let of = |p: &str, m: &dyn Module| part_of(p, m, part);
        let mut out = Vec::new();
        for block in &self.0 {
            let full = |n: &str| format!("{}.{n}", block.name);
            for stage in &block.stages {
                match stage {
                    Stage::Unit(u) => {
                        out.extend(of(&full(u.conv.name()), &u.conv));
                        out.extend(of(&full(&u.bn_name), &u.bn));
                    }
                    Stage::Se(se) => {
                        out.extend(of(&full(se.fc1.name()), &se.fc1));
                        out.extend(of(&full(se.fc2.name()), &se.fc2));
                    }
                }
            }
        }
        out
    }

    fn bns_mut(&mut self) -> impl Iterator<Item = &mut BatchNorm> {
        self.0
            .iter_mut()
            .flat_map(|b| b.stages.iter_mut())
            .filter_map(|s| match s {
                Stage::Unit(u) => Some(&mut u.bn),
                Stage::Se(_) => None,
            })
    }

    /// Every BatchNorm and stochastic-depth layer in training or
    /// evaluation mode.
    pub fn set_training(&mut self, training: bool) {
        for bn in self.bns_mut() {
            bn.set_training(training);
        }
        for sd in self.0.iter_mut().filter_map(|b| b.drop_path.as_mut()) {
            sd.set_training(training);
        }
    }

    /// [`Module::sync_batch_norm`] of every BatchNorm; how many.
    pub fn sync_batch_norm(&mut self, sync: Option<&Arc<dyn BatchStatsSync>>) -> usize {
        self.bns_mut().map(|bn| bn.sync_batch_norm(sync)).sum()
    }

    /// The feature names of the blocks (each block, then the stage it
    /// ends), `avgpool` and torchvision's functional node `flatten`.
    pub fn feature_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        for b in &self.0 {
            names.push(b.name.clone());
            names.extend(b.ends.clone());
        }
        names.extend(["avgpool", "flatten"].map(String::from));
        names
    }

    /// Runs the blocks (each a checkpointed segment when `checkpointing`),
    /// `avgpool` and `flatten`, calling `visit` after each named layer;
    /// `None` when `visit` stopped the walk.
    pub fn walk(
        &self,
        x: &Tensor,
        checkpointing: bool,
        visit: &mut dyn FnMut(&str, &Tensor) -> bool,
    ) -> Result<Option<Tensor>> {
        let mut h = x.clone();
        for block in &self.0 {
            h = match checkpointing {
                true => checkpoint_block(block, &[&h], |b, xs| b.forward(&xs[0]))?,
                false => block.forward(&h)?,
            };
            stop_if!(visit(&block.name, &h));
            if let Some(stage) = &block.ends {
                stop_if!(visit(stage, &h));
            }
        }
        h = {
            let _s = scope("avgpool".to_string());
            adaptive_avg_pool2d(&h, [1, 1])?
        };
        stop_if!(visit("avgpool", &h));
        h = h.flatten(1, -1)?;
        stop_if!(visit("flatten", &h));
        Ok(Some(h))
    }
}
