//! MobileNetV3-Large as in torchvision (`mobilenet_v3_large`), with
//! torchvision's `features.N.block.M` names, squeeze-and-excitation
//! (`block.M.fc1`, `block.M.fc2`), Hardswish activations and BatchNorm with
//! eps 0.001 and momentum 0.01, plus small configurations for tests.

use super::checkpoint_block;
use super::surgery::{head_like, HeadInit};
use super::{
    part_of, set_bn, set_conv, set_linear, square_conv_builder, stop_if, walked_module_methods,
    Ctx, FeatureMaps, Named, Part, ReplaceHead,
};
use crate::memory::scope;
use crate::nn::{
    adaptive_avg_pool2d, BatchNorm, BatchStatsSync, Conv2d, Dropout, Init, Linear, Module,
};
use crate::{DType, Device, Error, Result, Tensor};
use std::sync::Arc;

/// One bneck row as torchvision's `InvertedResidualConfig`, with channels
/// before the width multiplier (dilation 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BneckSetting {
    /// Input channels.
    pub input: usize,
    /// Kernel size of the depthwise convolution.
    pub kernel: usize,
    /// Expanded (hidden) channels.
    pub expanded: usize,
    /// Output channels.
    pub out: usize,
    /// Whether the block has squeeze-and-excitation.
    pub use_se: bool,
    /// Hardswish (`"HS"`) rather than ReLU (`"RE"`).
    pub use_hs: bool,
    /// Stride of the depthwise convolution (1 or 2).
    pub stride: usize,
}

impl BneckSetting {
    /// A setting from torchvision's `bneck_conf` row order: (input, kernel,
    /// expanded, out, use_se, use_hs, stride).
    pub fn from_row(row: (usize, usize, usize, usize, bool, bool, usize)) -> Self {
        let (input, kernel, expanded, out, use_se, use_hs, stride) = row;
        BneckSetting {
            input,
            kernel,
            expanded,
            out,
            use_se,
            use_hs,
            stride,
        }
    }
}

/// torchvision's `_make_divisible`: `v` rounded to the nearest multiple of
/// `divisor` (at least `divisor`), never more than 10 % below `v`.
pub fn make_divisible(v: f64, divisor: usize) -> usize {
    let d = divisor as f64;
    let mut new_v = (((v + d / 2.0) as usize) / divisor * divisor).max(divisor);
    if (new_v as f64) < 0.9 * v {
        new_v += divisor;
    }
    new_v
}

/// The shape of a [`MobileNetV3`]; torchvision's is
/// [`MobileNetV3Config::mobilenet_v3_large`].
#[derive(Clone, Debug, PartialEq)]
pub struct MobileNetV3Config {
    /// Channels of the input image.
    pub in_channels: usize,
    /// The bneck rows (`features.1` … ); the stem has the first row's
    /// input channels, the last 1×1 convolution six times the last row's
    /// output channels.
    pub settings: Vec<BneckSetting>,
    /// Width multiplier of every row's channels (torchvision's
    /// `width_mult`, rounded by [`make_divisible`] to multiples of 8).
    pub width_mult: f64,
    /// Outputs of `classifier.0` (torchvision: 1280 times the width
    /// multiplier, rounded).
    pub last_channel: usize,
    /// Outputs of `classifier.3`.
    pub num_classes: usize,
    /// Drop probability of `classifier.2` (torchvision: 0.2).
    pub dropout: f64,
}

impl MobileNetV3Config {
    /// torchvision's MobileNetV3-Large (width multiplier 1).
    pub fn mobilenet_v3_large(num_classes: usize) -> Self {
        Self::mobilenet_v3_large_width(num_classes, 1.0)
    }

    /// torchvision's MobileNetV3-Large with width multiplier `width_mult`
    /// (`mobilenet_v3_large(width_mult=…)`).
    pub fn mobilenet_v3_large_width(num_classes: usize, width_mult: f64) -> Self {
        let rows = [
            (16, 3, 16, 16, false, false, 1),
            (16, 3, 64, 24, false, false, 2),
            (24, 3, 72, 24, false, false, 1),
            (24, 5, 72, 40, true, false, 2),
            (40, 5, 120, 40, true, false, 1),
            (40, 5, 120, 40, true, false, 1),
            (40, 3, 240, 80, false, true, 2),
            (80, 3, 200, 80, false, true, 1),
            (80, 3, 184, 80, false, true, 1),
            (80, 3, 184, 80, false, true, 1),
            (80, 3, 480, 112, true, true, 1),
            (112, 3, 672, 112, true, true, 1),
            (112, 5, 672, 160, true, true, 2),
            (160, 5, 960, 160, true, true, 1),
            (160, 5, 960, 160, true, true, 1),
        ];
        let settings = rows
            .iter()
            .map(|&row| BneckSetting::from_row(row))
            .collect();
        let last_channel = if width_mult.is_finite() && width_mult > 0.0 {
            make_divisible(1280.0 * width_mult, 8)
        } else {
            0
        };
        MobileNetV3Config {
            in_channels: 3,
            settings,
            width_mult,
            last_channel,
            num_classes,
            dropout: 0.2,
        }
    }

    /// `c` times the width multiplier, rounded as torchvision's
    /// `InvertedResidualConfig.adjust_channels`.
    fn adjust(&self, c: usize) -> usize {
        make_divisible(c as f64 * self.width_mult, 8)
    }

    /// Refuses what torchvision refuses or cannot build: no rows, a zero
    /// size, a stride other than 1 or 2, a non-finite or non-positive width
    /// multiplier, a dropout outside [0, 1], rows whose input is not the
    /// previous row's output.
    fn validate(&self) -> Result<()> {
        let bad = |msg: String| {
            Err(Error::InvalidArgument {
                op: "MobileNetV3",
                msg,
            })
        };
        if self.settings.is_empty() {
            return bad("at least one bneck row is needed".into());
        }
        if !(self.width_mult.is_finite() && self.width_mult > 0.0 && self.width_mult <= 1e6) {
            return bad(format!("width_mult must be positive: {}", self.width_mult));
        }
        if !(0.0..=1.0).contains(&self.dropout) {
            return bad(format!("dropout must lie in [0, 1]: {}", self.dropout));
        }
        if self.in_channels == 0 || self.last_channel == 0 || self.num_classes == 0 {
            return bad(format!("every size must be positive: {self:?}"));
        }
        for (i, r) in self.settings.iter().enumerate() {
            if r.input == 0 || r.kernel == 0 || r.expanded == 0 || r.out == 0 {
                return bad(format!("row {i}: every size must be positive: {r:?}"));
            }
            if !(1..=2).contains(&r.stride) {
                return bad(format!("row {i}: illegal stride value {}", r.stride));
            }
            if i > 0 && self.adjust(r.input) != self.adjust(self.settings[i - 1].out) {
                return bad(format!(
                    "row {i}: input channels {} differ from the previous row's output {}",
                    r.input,
                    self.settings[i - 1].out
                ));
            }
        }
        Ok(())
    }
}

/// What follows a convolution and its BatchNorm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    None,
    Relu,
    Hardswish,
}

/// A bias-free convolution, its BatchNorm and its activation, with names
/// relative to the block.
#[derive(Clone)]
struct Unit {
    conv: Conv2d,
    bn: BatchNorm,
    bn_name: String,
    act: Act,
    act_name: String,
}

/// torchvision's `SqueezeExcitation`: average pool, `fc1` (1×1 conv),
/// ReLU, `fc2` (1×1 conv), Hardsigmoid, times the input.
#[derive(Clone)]
struct Se {
    name: String,
    fc1: Conv2d,
    fc2: Conv2d,
}

/// One layer of a block.
#[derive(Clone)]
enum Stage {
    Unit(Unit),
    Se(Se),
}

/// `features.N`: stages in order, plus the residual connection if any.
#[derive(Clone)]
struct Block {
    name: String,
    stages: Vec<Stage>,
    residual: bool,
}

/// A 1×1 convolution with a bias (squeeze-and-excitation's `fc1`, `fc2`),
/// initialised as torchvision's MobileNetV3 (`kaiming_normal_(mode=
/// "fan_out")`, bias zero).
fn pointwise_with_bias(name: &str, io: [usize; 2], c: Ctx, seed: u64) -> Result<Conv2d> {
    square_conv_builder(name, io, 1, 1, 1, c, seed)
        .bias(true)
        .bias_init(Init::zeros())
        .build(&c.1)
}

/// torchvision's `Conv2dNormActivation` at `prefix` (`prefix.0` conv,
/// `prefix.1` BatchNorm with eps 0.001 and momentum 0.01, `prefix.2`
/// activation).
#[allow(clippy::too_many_arguments)]
fn unit(
    prefix: &str,
    act: Act,
    io: [usize; 2],
    k: usize,
    stride: usize,
    groups: usize,
    c: Ctx,
    seed: u64,
) -> Result<Unit> {
    let p = |s: &str| match prefix {
        "" => s.to_string(),
        _ => format!("{prefix}.{s}"),
    };
    let bn = BatchNorm::builder(io[1])
        .name(&p("1"))
        .eps(1e-3)
        .momentum(Some(0.01))
        .dtype(c.0)
        .build2d(&c.1)?;
    Ok(Unit {
        // torchvision's padding here is `(k - 1) / 2` (the same as
        // `k / 2` for the odd kernels it uses).
        conv: square_conv_builder(&p("0"), io, k, stride, groups, c, seed)
            .padding((k - 1) / 2)
            .build(&c.1)?,
        bn,
        bn_name: p("1"),
        act,
        act_name: p("2"),
    })
}

/// torchvision's MobileNetV3: `features.0` (3×3/2 conv, BN, Hardswish),
/// inverted residuals `features.1…` (`block.0` 1×1 expansion unless the
/// expanded width equals the input, depthwise `k`×`k`, squeeze-and-
/// excitation if the row says so, linear 1×1 projection and BN; residual
/// when the stride is 1 and the width unchanged), a last 1×1 conv + BN +
/// Hardswish, `avgpool`, `classifier.0` (Linear), `classifier.1`
/// (Hardswish), `classifier.2` (Dropout), `classifier.3` (Linear). Starts
/// in training mode.
pub struct MobileNetV3 {
    blocks: Vec<Block>,
    fc1: Linear,
    dropout: Dropout,
    fc2: Linear,
    checkpointing: bool,
}

impl MobileNetV3 {
    /// A MobileNetV3 of `config` initialised as torchvision's (seeded):
    /// every convolution `kaiming_normal_(mode="fan_out")` with bias 0,
    /// every BatchNorm weight 1 and bias 0, both Linear layers weight
    /// N(0, 0.01²) and bias 0; ready for [`crate::io::load_state_dict`].
    /// A bad config is an [`Error::InvalidArgument`].
    pub fn new(
        config: &MobileNetV3Config,
        dtype: DType,
        device: Device,
        seed: u64,
    ) -> Result<MobileNetV3> {
        let cfg = config;
        cfg.validate()?;
        let c = (dtype, device);
        let stem_ch = cfg.adjust(cfg.settings[0].input);
        let stem = unit(
            "",
            Act::Hardswish,
            [cfg.in_channels, stem_ch],
            3,
            2,
            1,
            c,
            seed,
        )?;
        let mut blocks = vec![Block {
            name: "features.0".into(),
            stages: vec![Stage::Unit(stem)],
            residual: false,
        }];
        for row in &cfg.settings {
            let (cin, hidden, cout) = (
                cfg.adjust(row.input),
                cfg.adjust(row.expanded),
                cfg.adjust(row.out),
            );
            let act = if row.use_hs {
                Act::Hardswish
            } else {
                Act::Relu
            };
            let s = seed.wrapping_add(10 * blocks.len() as u64);
            let mut stages = Vec::new();
            if hidden != cin {
                stages.push(Stage::Unit(unit(
                    "block.0",
                    act,
                    [cin, hidden],
                    1,
                    1,
                    1,
                    c,
                    s,
                )?));
            }
            let j = stages.len();
            stages.push(Stage::Unit(unit(
                &format!("block.{j}"),
                act,
                [hidden, hidden],
                row.kernel,
                row.stride,
                hidden,
                c,
                s + 1,
            )?));
            if row.use_se {
                let name = format!("block.{}", stages.len());
                let squeeze = make_divisible((hidden / 4) as f64, 8);
                let fc1 = pointwise_with_bias(&format!("{name}.fc1"), [hidden, squeeze], c, s + 2)?;
                let fc2 = pointwise_with_bias(&format!("{name}.fc2"), [squeeze, hidden], c, s + 3)?;
                stages.push(Stage::Se(Se { name, fc1, fc2 }));
            }
            let k = stages.len();
            stages.push(Stage::Unit(unit(
                &format!("block.{k}"),
                Act::None,
                [hidden, cout],
                1,
                1,
                1,
                c,
                s + 4,
            )?));
            blocks.push(Block {
                name: format!("features.{}", blocks.len()),
                stages,
                residual: row.stride == 1 && cin == cout,
            });
        }
        let last_in = cfg.adjust(cfg.settings[cfg.settings.len() - 1].out);
        let last_out = 6 * last_in;
        let last = unit(
            "",
            Act::Hardswish,
            [last_in, last_out],
            1,
            1,
            1,
            c,
            seed.wrapping_add(7),
        )?;
        blocks.push(Block {
            name: format!("features.{}", blocks.len()),
            stages: vec![Stage::Unit(last)],
            residual: false,
        });
        let linear = |name: &str, i: usize, o: usize, s: u64| {
            Linear::builder(i, o)
                .name(name)
                .weight_init(Init::normal(0.01))
                .bias_init(Init::zeros())
                .dtype(dtype)
                .seed(s)
                .build(&device)
        };
        Ok(MobileNetV3 {
            blocks,
            fc1: linear(
                "classifier.0",
                last_out,
                cfg.last_channel,
                seed.wrapping_add(8),
            )?,
            dropout: Dropout::new("classifier.2", cfg.dropout, seed.wrapping_add(9))?,
            fc2: linear(
                "classifier.3",
                cfg.last_channel,
                cfg.num_classes,
                seed.wrapping_add(11),
            )?,
            checkpointing: false,
        })
    }

    /// Runs each `features.N` block (the stem, every inverted residual, the
    /// last 1×1 convolution) as a checkpointed segment when `on`: forward
    /// keeps only each block's input, backward runs the block again;
    /// gradients are unchanged. Off by default.
    pub fn gradient_checkpointing(&mut self, on: bool) {
        self.checkpointing = on;
    }

    /// Whether [`MobileNetV3::gradient_checkpointing`] is on.
    pub fn is_gradient_checkpointing(&self) -> bool {
        self.checkpointing
    }

    /// Makes each parameter require grad exactly when `want(name)` is true
    /// (names as in [`Module::named_parameters`]); values are kept.
    pub fn set_requires_grad(&mut self, mut want: impl FnMut(&str) -> bool) -> Result<()> {
        let want: &mut dyn FnMut(&str) -> bool = &mut want;
        for block in &mut self.blocks {
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
        set_linear(&mut self.fc1, "classifier.0", want)?;
        set_linear(&mut self.fc2, "classifier.3", want)
    }

    fn parts(&self, part: Part) -> Vec<Named> {
        let of = |p: &str, m: &dyn Module| part_of(p, m, part);
        let mut out = Vec::new();
        for block in &self.blocks {
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
        out.extend(of("classifier.0", &self.fc1));
        out.extend(of("classifier.3", &self.fc2));
        out
    }

    fn bns_mut(&mut self) -> impl Iterator<Item = &mut BatchNorm> {
        self.blocks
            .iter_mut()
            .flat_map(|b| b.stages.iter_mut())
            .filter_map(|s| match s {
                Stage::Unit(u) => Some(&mut u.bn),
                Stage::Se(_) => None,
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
            scale.relu_inplace()?
        };
        let scale = self.fc2.forward(&scale)?;
        let scale = {
            let _a = sub("scale_activation");
            scale.hardsigmoid_owned()?
        };
        let _s = scope(self.name.clone());
        scale.mul(x)
    }
}

impl Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        let mut h = x.clone();
        for stage in &self.stages {
            h = match stage {
                Stage::Unit(u) => {
                    // The norm writes over the convolution's output.
                    let y = u.bn.forward_owned(u.conv.forward(&h)?)?;
                    let _a = scope(u.act_name.clone());
                    match u.act {
                        Act::None => y,
                        Act::Relu => y.relu_inplace()?,
                        Act::Hardswish => y.hardswish_owned()?,
                    }
                }
                Stage::Se(se) => se.forward(&h)?,
            };
        }
        if self.residual {
            h = h.add_owned(x)?;
        }
        Ok(h)
    }
}

impl FeatureMaps for MobileNetV3 {
    fn model_name(&self) -> &'static str {
        "MobileNetV3"
    }

    /// `features.0` … `features.N` (the stem, each inverted residual, the
    /// last 1×1 convolution), `avgpool`, torchvision's functional node
    /// `flatten`, then `classifier.0` … `classifier.3`.
    fn feature_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.blocks.iter().map(|b| b.name.clone()).collect();
        names.extend(
            [
                "avgpool",
                "flatten",
                "classifier.0",
                "classifier.1",
                "classifier.2",
                "classifier.3",
            ]
            .map(String::from),
        );
        names
    }

    fn walk(
        &self,
        x: &Tensor,
        visit: &mut dyn FnMut(&str, &Tensor) -> bool,
    ) -> Result<Option<Tensor>> {
        let mut h = x.clone();
        for block in &self.blocks {
            h = match self.checkpointing {
                true => checkpoint_block(block, &[&h], |b, xs| b.forward(&xs[0]))?,
                false => block.forward(&h)?,
            };
            stop_if!(visit(&block.name, &h));
        }
        h = {
            let _s = scope("avgpool".to_string());
            adaptive_avg_pool2d(&h, [1, 1])?
        };
        stop_if!(visit("avgpool", &h));
        h = h.flatten(1, -1)?;
        stop_if!(visit("flatten", &h));
        h = self.fc1.forward(&h)?;
        stop_if!(visit("classifier.0", &h));
        h = {
            let _s = scope("classifier.1".to_string());
            h.hardswish_owned()?
        };
        stop_if!(visit("classifier.1", &h));
        h = self.dropout.forward_owned(h)?;
        stop_if!(visit("classifier.2", &h));
        h = self.fc2.forward(&h)?;
        stop_if!(visit("classifier.3", &h));
        Ok(Some(h))
    }
}

impl ReplaceHead for MobileNetV3 {
    fn head_name(&self) -> &str {
        "classifier.3"
    }

    fn num_classes(&self) -> usize {
        self.fc2.weight.shape()[0]
    }

    /// A fresh `classifier.3`, initialised as torchvision's MobileNetV3
    /// initialises it (weight normal with std 0.01, bias zero).
    fn replace_head(&mut self, num_classes: usize, seed: u64) -> Result<()> {
        self.fc2 = head_like(&self.fc2, num_classes, HeadInit::Normal(0.01), seed)?;
        Ok(())
    }
}

impl Module for MobileNetV3 {
    walked_module_methods!("MobileNetV3");

    fn set_training(&mut self, training: bool) {
        for bn in self.bns_mut() {
            bn.set_training(training);
        }
        self.dropout.set_training(training);
    }

    fn sync_batch_norm(&mut self, sync: Option<&Arc<dyn BatchStatsSync>>) -> usize {
        self.bns_mut().map(|bn| bn.sync_batch_norm(sync)).sum()
    }
}
