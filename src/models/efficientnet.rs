//! EfficientNetV2 as in torchvision (`efficientnet_v2_s`, `_m`, `_l`), with
//! torchvision's `features.N.M.block.K` names: FusedMBConv blocks (a fused
//! `k`×`k` expansion and a 1×1 projection, or one `k`×`k` convolution when
//! the expansion ratio is 1), MBConv blocks (1×1 expansion, depthwise
//! convolution, squeeze-and-excitation with SiLU and a sigmoid gate, 1×1
//! projection), SiLU activations, BatchNorm with eps 0.001, stochastic
//! depth on every residual branch, plus small configurations for tests.
//!
//! What each layer saves for backward is its own (see `nn::conv`,
//! `nn::norm`, SiLU and sigmoid in `ops`, `nn::dropout`'s stochastic
//! depth): the model adds nothing.

use super::inverted_residual::{
    make_divisible, Act, Block, Blocks, Builder, Gate, Stage, UnitSpec,
};
use super::surgery::{head_like, HeadInit};
use super::{
    part_of, set_linear, stop_if, walked_module_methods, FeatureMaps, Named, Part, ReplaceHead,
};
use crate::nn::{
    BatchStatsSync, Dropout, Init, Linear, Module, StochasticDepth, StochasticDepthMode,
};
use crate::{DType, Device, Error, Result, Tensor};
use std::sync::Arc;

/// Which block a row of an [`EfficientNetConfig`] repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MBConvKind {
    /// torchvision's `MBConv`: 1×1 expansion (unless the ratio keeps the
    /// width), depthwise `k`×`k`, squeeze-and-excitation, 1×1 projection.
    MBConv,
    /// torchvision's `FusedMBConv`: `k`×`k` expansion and 1×1 projection,
    /// or a single `k`×`k` convolution when the ratio keeps the width.
    FusedMBConv,
}

/// One stage of an EfficientNet as torchvision's `MBConvConfig` /
/// `FusedMBConvConfig` (width and depth multipliers 1): `layers` blocks,
/// the first with `stride` and `input` channels, the others with stride 1
/// and `out` channels in and out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MBConvSetting {
    /// MBConv or FusedMBConv.
    pub kind: MBConvKind,
    /// Expansion ratio: the hidden width is `input · expand_ratio`
    /// rounded by [`make_divisible`] to a multiple of 8.
    pub expand_ratio: f64,
    /// Kernel size of the depthwise (MBConv) or fused (FusedMBConv)
    /// convolution.
    pub kernel: usize,
    /// Stride of the stage's first block (1 or 2).
    pub stride: usize,
    /// Input channels of the stage's first block (MBConv rows round them
    /// to a multiple of 8, as torchvision's `MBConvConfig`).
    pub input: usize,
    /// Output channels (MBConv rows: rounded to a multiple of 8).
    pub out: usize,
    /// Blocks in the stage.
    pub layers: usize,
}

impl MBConvSetting {
    /// torchvision's `MBConvConfig(expand_ratio, kernel, stride,
    /// input_channels, out_channels, num_layers)`.
    pub fn mbconv(
        expand_ratio: f64,
        kernel: usize,
        stride: usize,
        input: usize,
        out: usize,
        layers: usize,
    ) -> Self {
        MBConvSetting {
            kind: MBConvKind::MBConv,
            expand_ratio,
            kernel,
            stride,
            input,
            out,
            layers,
        }
    }

    /// torchvision's `FusedMBConvConfig(expand_ratio, kernel, stride,
    /// input_channels, out_channels, num_layers)`.
    pub fn fused(
        expand_ratio: f64,
        kernel: usize,
        stride: usize,
        input: usize,
        out: usize,
        layers: usize,
    ) -> Self {
        MBConvSetting {
            kind: MBConvKind::FusedMBConv,
            ..Self::mbconv(expand_ratio, kernel, stride, input, out, layers)
        }
    }

    /// Input and output channels of the stage as torchvision builds them
    /// (`MBConvConfig` rounds both with `_make_divisible(c, 8)`).
    fn channels(&self) -> (usize, usize) {
        match self.kind {
            MBConvKind::MBConv => (
                make_divisible(self.input as f64, 8),
                make_divisible(self.out as f64, 8),
            ),
            MBConvKind::FusedMBConv => (self.input, self.out),
        }
    }
}

/// The shape of an [`EfficientNet`]; torchvision's are
/// [`EfficientNetConfig::efficientnet_v2_s`], `_m` and `_l`.
#[derive(Clone, Debug, PartialEq)]
pub struct EfficientNetConfig {
    /// Channels of the input image (torchvision: 3).
    pub in_channels: usize,
    /// The stages (`features.1` …); the stem has the first row's input
    /// channels.
    pub settings: Vec<MBConvSetting>,
    /// Outputs of the last 1×1 convolution; `None`: four times the last
    /// row's output (torchvision's `last_channel=None`).
    pub last_channel: Option<usize>,
    /// Outputs of `classifier.1`.
    pub num_classes: usize,
    /// Drop probability of `classifier.0` (torchvision: 0.2, 0.3, 0.4 for
    /// V2-S, -M, -L).
    pub dropout: f64,
    /// Stochastic depth of the last block; block `i` of `n` drops its
    /// residual branch with probability `stochastic_depth_prob · i / n`
    /// (torchvision: 0.2).
    pub stochastic_depth_prob: f64,
}

impl EfficientNetConfig {
    fn v2(
        rows: &[(bool, f64, usize, usize, usize, usize, usize)],
        classes: usize,
        dropout: f64,
    ) -> Self {
        let settings = rows
            .iter()
            .map(|&(fused, e, k, s, i, o, n)| match fused {
                true => MBConvSetting::fused(e, k, s, i, o, n),
                false => MBConvSetting::mbconv(e, k, s, i, o, n),
            })
            .collect();
        EfficientNetConfig {
            in_channels: 3,
            settings,
            last_channel: Some(1280),
            num_classes: classes,
            dropout,
            stochastic_depth_prob: 0.2,
        }
    }

    /// torchvision's `efficientnet_v2_s(num_classes=…)` (21,458,488
    /// parameters with 1000 classes).
    pub fn efficientnet_v2_s(num_classes: usize) -> Self {
        Self::v2(
            &[
                (true, 1.0, 3, 1, 24, 24, 2),
                (true, 4.0, 3, 2, 24, 48, 4),
                (true, 4.0, 3, 2, 48, 64, 4),
                (false, 4.0, 3, 2, 64, 128, 6),
                (false, 6.0, 3, 1, 128, 160, 9),
                (false, 6.0, 3, 2, 160, 256, 15),
            ],
            num_classes,
            0.2,
        )
    }

    /// torchvision's `efficientnet_v2_m(num_classes=…)` (54,139,356
    /// parameters with 1000 classes).
    pub fn efficientnet_v2_m(num_classes: usize) -> Self {
        Self::v2(
            &[
                (true, 1.0, 3, 1, 24, 24, 3),
                (true, 4.0, 3, 2, 24, 48, 5),
                (true, 4.0, 3, 2, 48, 80, 5),
                (false, 4.0, 3, 2, 80, 160, 7),
                (false, 6.0, 3, 1, 160, 176, 14),
                (false, 6.0, 3, 2, 176, 304, 18),
                (false, 6.0, 3, 1, 304, 512, 5),
            ],
            num_classes,
            0.3,
        )
    }

    /// torchvision's `efficientnet_v2_l(num_classes=…)` (118,515,272
    /// parameters with 1000 classes).
    pub fn efficientnet_v2_l(num_classes: usize) -> Self {
        Self::v2(
            &[
                (true, 1.0, 3, 1, 32, 32, 4),
                (true, 4.0, 3, 2, 32, 64, 7),
                (true, 4.0, 3, 2, 64, 96, 7),
                (false, 4.0, 3, 2, 96, 192, 10),
                (false, 6.0, 3, 1, 192, 224, 19),
                (false, 6.0, 3, 2, 224, 384, 25),
                (false, 6.0, 3, 1, 384, 640, 7),
            ],
            num_classes,
            0.4,
        )
    }

    /// Blocks over all stages (`None` past `usize::MAX`).
    fn total_blocks(&self) -> Option<usize> {
        self.settings
            .iter()
            .try_fold(0usize, |n, r| n.checked_add(r.layers))
    }

    /// Refuses what torchvision refuses or cannot build: no rows, a zero
    /// size, a stride other than 1 or 2, a non-finite, non-positive or
    /// huge expansion ratio, a dropout or stochastic depth outside [0, 1],
    /// rows whose input is not the previous row's output, more than a
    /// million blocks.
    fn validate(&self) -> Result<()> {
        let bad = |msg: String| {
            Err(Error::InvalidArgument {
                op: "EfficientNet",
                msg,
            })
        };
        if self.settings.is_empty() {
            return bad("at least one MBConv row is needed".into());
        }
        if !(0.0..=1.0).contains(&self.dropout) {
            return bad(format!("dropout must lie in [0, 1]: {}", self.dropout));
        }
        if !(0.0..=1.0).contains(&self.stochastic_depth_prob) {
            return bad(format!(
                "stochastic_depth_prob must lie in [0, 1]: {}",
                self.stochastic_depth_prob
            ));
        }
        if self.total_blocks().is_none_or(|n| n > 1_000_000) {
            return bad("more than a million blocks".into());
        }
        if self.in_channels == 0 || self.num_classes == 0 || self.last_channel == Some(0) {
            return bad(format!("every size must be positive: {self:?}"));
        }
        for (i, r) in self.settings.iter().enumerate() {
            if r.input == 0 || r.kernel == 0 || r.out == 0 || r.layers == 0 {
                return bad(format!("row {i}: every size must be positive: {r:?}"));
            }
            if !(1..=2).contains(&r.stride) {
                return bad(format!("row {i}: illegal stride value {}", r.stride));
            }
            if !(r.expand_ratio.is_finite() && r.expand_ratio > 0.0 && r.expand_ratio <= 1e6) {
                return bad(format!(
                    "row {i}: expand_ratio must be positive: {}",
                    r.expand_ratio
                ));
            }
            if i > 0 && r.channels().0 != self.settings[i - 1].channels().1 {
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

/// torchvision's EfficientNet (V2's blocks): `features.0` (3×3/2 conv, BN,
/// SiLU), one `features.N` per stage of MBConv or FusedMBConv blocks
/// `features.N.M` (residual through stochastic depth when the stride is 1
/// and the width unchanged), a last 1×1 conv + BN + SiLU, `avgpool`,
/// `classifier.0` (Dropout), `classifier.1` (Linear). Starts in training
/// mode.
pub struct EfficientNet {
    blocks: Blocks,
    dropout: Dropout,
    fc: Linear,
    checkpointing: bool,
}

impl EfficientNet {
    /// An EfficientNet of `config` initialised as torchvision's (seeded):
    /// every convolution `kaiming_normal_(mode="fan_out")` with bias 0,
    /// every BatchNorm weight 1 and bias 0, `classifier.1` weight uniform
    /// in ±1/√num_classes and bias 0; ready for
    /// [`crate::io::load_state_dict`]. A bad config is an
    /// [`Error::InvalidArgument`].
    pub fn new(
        config: &EfficientNetConfig,
        dtype: DType,
        device: Device,
        seed: u64,
    ) -> Result<EfficientNet> {
        let cfg = config;
        cfg.validate()?;
        let b = Builder {
            c: (dtype, device),
            bn_eps: 1e-3,
            bn_momentum: 0.1,
        };
        let silu = Act::Silu;
        let stem = UnitSpec::new(silu, [cfg.in_channels, cfg.settings[0].channels().0], 3);
        let mut blocks = vec![Block::new(
            "features.0".into(),
            vec![Stage::Unit(b.unit("", stem.stride(2), seed)?)],
            false,
        )];
        let total = cfg.total_blocks().unwrap_or(usize::MAX);
        let mut block_id = 0usize;
        for (n, row) in cfg.settings.iter().enumerate() {
            let (first_in, cout) = row.channels();
            for m in 0..row.layers {
                let (cin, stride) = match m {
                    0 => (first_in, row.stride),
                    _ => (cout, 1),
                };
                let hidden = make_divisible(cin as f64 * row.expand_ratio, 8);
                let s = seed.wrapping_add(10 * (block_id as u64 + 1));
                let mut stages = Vec::new();
                let k = row.kernel;
                let unit = |j: usize, spec: UnitSpec, seed: u64| {
                    Ok::<_, Error>(Stage::Unit(b.unit(&format!("block.{j}"), spec, seed)?))
                };
                match row.kind {
                    MBConvKind::FusedMBConv if hidden != cin => {
                        let expand = UnitSpec::new(silu, [cin, hidden], k).stride(stride);
                        stages.push(unit(0, expand, s)?);
                        stages.push(unit(1, UnitSpec::new(Act::None, [hidden, cout], 1), s + 4)?);
                    }
                    MBConvKind::FusedMBConv => {
                        stages.push(unit(
                            0,
                            UnitSpec::new(silu, [cin, cout], k).stride(stride),
                            s,
                        )?);
                    }
                    MBConvKind::MBConv => {
                        if hidden != cin {
                            stages.push(unit(0, UnitSpec::new(silu, [cin, hidden], 1), s)?);
                        }
                        let dw = UnitSpec::new(silu, [hidden, hidden], k).stride(stride);
                        stages.push(unit(stages.len(), dw.depthwise(), s + 1)?);
                        let name = format!("block.{}", stages.len());
                        let squeeze = (cin / 4).max(1);
                        let gates = (Act::Silu, Gate::Sigmoid);
                        stages.push(Stage::Se(b.se(name, [hidden, squeeze], gates, s + 2)?));
                        let project = UnitSpec::new(Act::None, [hidden, cout], 1);
                        stages.push(unit(stages.len(), project, s + 4)?);
                    }
                }
                let residual = stride == 1 && cin == cout;
                // torchvision: `stochastic_depth_prob * float(stage_block_id)
                // / total_stage_blocks`, in this order.
                let p = cfg.stochastic_depth_prob * block_id as f64 / total as f64;
                let drop_path =
                    StochasticDepth::new("stochastic_depth", p, StochasticDepthMode::Row, s + 5)?;
                blocks.push(Block {
                    name: format!("features.{}.{m}", n + 1),
                    stages,
                    residual,
                    drop_path: Some(drop_path),
                    ends: (m + 1 == row.layers).then(|| format!("features.{}", n + 1)),
                });
                block_id += 1;
            }
        }
        let last_in = cfg.settings[cfg.settings.len() - 1].channels().1;
        let last_out = cfg.last_channel.unwrap_or(4 * last_in);
        let last = UnitSpec::new(silu, [last_in, last_out], 1);
        blocks.push(Block::new(
            format!("features.{}", cfg.settings.len() + 1),
            vec![Stage::Unit(b.unit("", last, seed.wrapping_add(7))?)],
            false,
        ));
        let range = 1.0 / (cfg.num_classes as f64).sqrt();
        let fc = Linear::builder(last_out, cfg.num_classes)
            .name("classifier.1")
            .weight_init(Init::Uniform {
                low: -range,
                high: range,
            })
            .bias_init(Init::zeros())
            .dtype(dtype)
            .seed(seed.wrapping_add(8))
            .build(&device)?;
        Ok(EfficientNet {
            blocks: Blocks(blocks),
            dropout: Dropout::new("classifier.0", cfg.dropout, seed.wrapping_add(9))?,
            fc,
            checkpointing: false,
        })
    }

    /// Runs each block (the stem, every MBConv / FusedMBConv block
    /// `features.N.M`, the last 1×1 convolution) as a checkpointed segment
    /// when `on`: forward keeps only each block's input, backward runs the
    /// block again (with the same stochastic-depth draws); gradients are
    /// unchanged. Off by default.
    pub fn gradient_checkpointing(&mut self, on: bool) {
        self.checkpointing = on;
    }

    /// Whether [`EfficientNet::gradient_checkpointing`] is on.
    pub fn is_gradient_checkpointing(&self) -> bool {
        self.checkpointing
    }

    /// Each MBConv / FusedMBConv block's name and its stochastic-depth
    /// probability (applied only where the block is residual), in order.
    pub fn stochastic_depth_probs(&self) -> Vec<(String, f64)> {
        self.blocks
            .0
            .iter()
            .filter_map(|b| Some((b.name.clone(), b.drop_path.as_ref()?.p())))
            .collect()
    }

    /// Makes each parameter require grad exactly when `want(name)` is true
    /// (names as in [`Module::named_parameters`]); values are kept.
    pub fn set_requires_grad(&mut self, mut want: impl FnMut(&str) -> bool) -> Result<()> {
        let want: &mut dyn FnMut(&str) -> bool = &mut want;
        self.blocks.set_requires_grad(want)?;
        set_linear(&mut self.fc, "classifier.1", want)
    }

    fn parts(&self, part: Part) -> Vec<Named> {
        let mut out = self.blocks.parts(part);
        out.extend(part_of("classifier.1", &self.fc, part));
        out
    }
}

impl FeatureMaps for EfficientNet {
    fn model_name(&self) -> &'static str {
        "EfficientNet"
    }

    /// `features.0`, each block `features.N.M` followed by its stage
    /// `features.N` after the stage's last block, the last 1×1
    /// convolution `features.L`, `avgpool`, torchvision's functional node
    /// `flatten`, `classifier.0`, `classifier.1`.
    fn feature_names(&self) -> Vec<String> {
        let mut names = self.blocks.feature_names();
        names.extend(["classifier.0", "classifier.1"].map(String::from));
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
        h = self.dropout.forward_owned(h)?;
        stop_if!(visit("classifier.0", &h));
        h = self.fc.forward(&h)?;
        stop_if!(visit("classifier.1", &h));
        Ok(Some(h))
    }
}

impl ReplaceHead for EfficientNet {
    fn head_name(&self) -> &str {
        "classifier.1"
    }

    fn num_classes(&self) -> usize {
        self.fc.weight.shape()[0]
    }

    /// A fresh `classifier.1`, initialised as torchvision's EfficientNet
    /// initialises it (weight uniform in ±1/√num_classes, bias zero).
    fn replace_head(&mut self, num_classes: usize, seed: u64) -> Result<()> {
        self.fc = head_like(&self.fc, num_classes, HeadInit::UniformByOutputs, seed)?;
        Ok(())
    }
}

impl Module for EfficientNet {
    walked_module_methods!("EfficientNet");

    fn set_training(&mut self, training: bool) {
        self.blocks.set_training(training);
        self.dropout.set_training(training);
    }

    fn sync_batch_norm(&mut self, sync: Option<&Arc<dyn BatchStatsSync>>) -> usize {
        self.blocks.sync_batch_norm(sync)
    }
}
