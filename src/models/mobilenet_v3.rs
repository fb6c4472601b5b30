//! MobileNetV3-Large as in torchvision (`mobilenet_v3_large`), with
//! torchvision's `features.N.block.M` names, squeeze-and-excitation
//! (`block.M.fc1`, `block.M.fc2`), Hardswish activations and BatchNorm with
//! eps 0.001 and momentum 0.01, plus small configurations for tests.

pub use super::inverted_residual::make_divisible;
use super::inverted_residual::{Act, Block, Blocks, Builder, Gate, Stage, UnitSpec};
use super::surgery::{head_like, HeadInit};
use super::{
    part_of, set_linear, stop_if, walked_module_methods, FeatureMaps, Named, Part, ReplaceHead,
};
use crate::memory::scope;
use crate::nn::{BatchStatsSync, Dropout, Init, Linear, Module};
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

/// torchvision's MobileNetV3: `features.0` (3×3/2 conv, BN, Hardswish),
/// inverted residuals `features.1…` (`block.0` 1×1 expansion unless the
/// expanded width equals the input, depthwise `k`×`k`, squeeze-and-
/// excitation if the row says so, linear 1×1 projection and BN; residual
/// when the stride is 1 and the width unchanged), a last 1×1 conv + BN +
/// Hardswish, `avgpool`, `classifier.0` (Linear), `classifier.1`
/// (Hardswish), `classifier.2` (Dropout), `classifier.3` (Linear). Starts
/// in training mode.
pub struct MobileNetV3 {
    blocks: Blocks,
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
        let b = Builder {
            c: (dtype, device),
            bn_eps: 1e-3,
            bn_momentum: 0.01,
        };
        let stem_ch = cfg.adjust(cfg.settings[0].input);
        let stem = UnitSpec::new(Act::Hardswish, [cfg.in_channels, stem_ch], 3).stride(2);
        let mut blocks = vec![Block::new(
            "features.0".into(),
            vec![Stage::Unit(b.unit("", stem, seed)?)],
            false,
        )];
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
                let expand = UnitSpec::new(act, [cin, hidden], 1);
                stages.push(Stage::Unit(b.unit("block.0", expand, s)?));
            }
            let j = stages.len();
            let dw = UnitSpec::new(act, [hidden, hidden], row.kernel)
                .stride(row.stride)
                .depthwise();
            stages.push(Stage::Unit(b.unit(&format!("block.{j}"), dw, s + 1)?));
            if row.use_se {
                let name = format!("block.{}", stages.len());
                let squeeze = make_divisible((hidden / 4) as f64, 8);
                let gates = (Act::Relu, Gate::Hardsigmoid);
                stages.push(Stage::Se(b.se(name, [hidden, squeeze], gates, s + 2)?));
            }
            let k = stages.len();
            let project = UnitSpec::new(Act::None, [hidden, cout], 1);
            stages.push(Stage::Unit(b.unit(
                &format!("block.{k}"),
                project,
                s + 4,
            )?));
            blocks.push(Block::new(
                format!("features.{}", blocks.len()),
                stages,
                row.stride == 1 && cin == cout,
            ));
        }
        let last_in = cfg.adjust(cfg.settings[cfg.settings.len() - 1].out);
        let last_out = 6 * last_in;
        let last = UnitSpec::new(Act::Hardswish, [last_in, last_out], 1);
        blocks.push(Block::new(
            format!("features.{}", blocks.len()),
            vec![Stage::Unit(b.unit("", last, seed.wrapping_add(7))?)],
            false,
        ));
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
            blocks: Blocks(blocks),
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
        self.blocks.set_requires_grad(want)?;
        set_linear(&mut self.fc1, "classifier.0", want)?;
        set_linear(&mut self.fc2, "classifier.3", want)
    }

    fn parts(&self, part: Part) -> Vec<Named> {
        let mut out = self.blocks.parts(part);
        out.extend(part_of("classifier.0", &self.fc1, part));
        out.extend(part_of("classifier.3", &self.fc2, part));
        out
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
        let mut names = self.blocks.feature_names();
        names.extend(
            [
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
        let Some(mut h) = self.blocks.walk(x, self.checkpointing, visit)? else {
            return Ok(None);
        };
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
        self.blocks.set_training(training);
        self.dropout.set_training(training);
    }

    fn sync_batch_norm(&mut self, sync: Option<&Arc<dyn BatchStatsSync>>) -> usize {
        self.blocks.sync_batch_norm(sync)
    }
}
