//! MobileNetV2 as in torchvision (`mobilenet_v2`), with torchvision's
//! `features.N.conv.M` names and depthwise convolutions, plus small
//! configurations for tests.

use super::checkpoint_block;
use super::surgery::{head_like, HeadInit};
use super::{
    batch_norm2d, part_of, set_bn, set_conv, set_linear, square_conv, stop_if,
    walked_module_methods, Ctx, FeatureMaps, Named, Part, ReplaceHead,
};
use crate::memory::scope;
use crate::nn::{
    AdaptiveAvgPool2d, BatchNorm, BatchStatsSync, Conv2d, Dropout, Init, Linear, Module,
};
use crate::{DType, Device, Error, Result, Tensor};
use std::sync::Arc;

/// One row of the inverted-residual plan: expansion `t`, output channels
/// `c`, repeats `n`, stride of the first repeat `s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvertedResidualSetting {
    /// Expansion ratio of the hidden width.
    pub t: usize,
    /// Output channels.
    pub c: usize,
    /// Blocks in the row.
    pub n: usize,
    /// Stride of the row's first block.
    pub s: usize,
}

/// The shape of a [`MobileNetV2`]; torchvision's is
/// [`MobileNetV2Config::v2`] (width multiplier 1).
#[derive(Clone, Debug, PartialEq)]
pub struct MobileNetV2Config {
    /// Channels of the stem (`features.0`, torchvision: 32).
    pub stem: usize,
    /// The inverted-residual rows (`features.1` … ).
    pub settings: Vec<InvertedResidualSetting>,
    /// Channels of the last 1×1 convolution (torchvision: 1280).
    pub last_channel: usize,
    /// Outputs of `classifier.1`.
    pub num_classes: usize,
    /// Channels of the input image.
    pub in_channels: usize,
    /// Drop probability of `classifier.0` (torchvision: 0.2).
    pub dropout: f64,
}

impl MobileNetV2Config {
    /// torchvision's MobileNetV2 with width multiplier 1.
    pub fn v2(num_classes: usize) -> Self {
        let rows = [
            (1, 16, 1, 1),
            (6, 24, 2, 2),
            (6, 32, 3, 2),
            (6, 64, 4, 2),
            (6, 96, 3, 1),
            (6, 160, 3, 2),
            (6, 320, 1, 1),
        ];
        MobileNetV2Config {
            stem: 32,
            settings: rows
                .iter()
                .map(|&(t, c, n, s)| InvertedResidualSetting { t, c, n, s })
                .collect(),
            last_channel: 1280,
            num_classes,
            in_channels: 3,
            dropout: 0.2,
        }
    }
}

/// A bias-free convolution, its BatchNorm and optionally ReLU6, with names
/// relative to the block.
#[derive(Clone)]
struct Unit {
    conv: Conv2d,
    bn: BatchNorm,
    bn_name: String,
    relu6: Option<String>,
}

/// `features.N`: units in order, plus the residual connection if any.
#[derive(Clone)]
struct Block {
    name: String,
    units: Vec<Unit>,
    residual: bool,
}

/// Conv (`k`×`k`, `stride`, `groups`) + BN (+ ReLU6), named `conv`, `bn`,
/// and the ReLU6 scope `act` (`None`: linear).
#[allow(clippy::too_many_arguments)]
fn unit(
    names: [&str; 2],
    act: Option<&str>,
    io: [usize; 2],
    k: usize,
    stride: usize,
    groups: usize,
    c: Ctx,
    seed: u64,
) -> Result<Unit> {
    Ok(Unit {
        conv: square_conv(names[0], io, k, stride, groups, c, seed)?,
        bn: batch_norm2d(names[1], io[1], c)?,
        bn_name: names[1].to_string(),
        relu6: act.map(str::to_string),
    })
}

/// torchvision's MobileNetV2: `features.0` (3×3/2 conv, BN, ReLU6),
/// inverted residuals `features.1…` (`conv.0` 1×1 expansion unless t = 1,
/// depthwise 3×3, linear 1×1 projection and BN; residual when the stride is
/// 1 and the width unchanged), a last 1×1 conv + BN + ReLU6, global average
/// pool, `classifier.0` (Dropout), `classifier.1` (Linear). Starts in
/// training mode.
pub struct MobileNetV2 {
    blocks: Vec<Block>,
    avgpool: AdaptiveAvgPool2d,
    dropout: Dropout,
    fc: Linear,
    checkpointing: bool,
}

impl MobileNetV2 {
    /// A MobileNetV2 of `config` initialised as torchvision's (seeded):
    /// every convolution `kaiming_normal_(mode="fan_out")` (gain √2), every
    /// BatchNorm weight 1 and bias 0, `classifier.1` weight N(0, 0.01²) and
    /// bias 0; ready for [`crate::io::load_state_dict`].
    pub fn new(
        config: &MobileNetV2Config,
        dtype: DType,
        device: Device,
        seed: u64,
    ) -> Result<MobileNetV2> {
        let cfg = config;
        let bad = cfg
            .settings
            .iter()
            .any(|r| r.t == 0 || r.c == 0 || r.n == 0 || r.s == 0);
        if bad
            || cfg.stem == 0
            || cfg.last_channel == 0
            || cfg.num_classes == 0
            || cfg.in_channels == 0
        {
            return Err(Error::InvalidArgument {
                op: "MobileNetV2",
                msg: format!("every size must be positive: {cfg:?}"),
            });
        }
        let c = (dtype, device);
        let stem = unit(
            ["0", "1"],
            Some("2"),
            [cfg.in_channels, cfg.stem],
            3,
            2,
            1,
            c,
            seed,
        )?;
        let mut blocks = vec![Block {
            name: "features.0".into(),
            units: vec![stem],
            residual: false,
        }];
        let mut cin = cfg.stem;
        for row in &cfg.settings {
            for i in 0..row.n {
                let stride = if i == 0 { row.s } else { 1 };
                let hidden = cin * row.t;
                let s = seed.wrapping_add(10 * blocks.len() as u64);
                let mut units = Vec::new();
                if row.t != 1 {
                    units.push(unit(
                        ["conv.0.0", "conv.0.1"],
                        Some("conv.0.2"),
                        [cin, hidden],
                        1,
                        1,
                        1,
                        c,
                        s,
                    )?);
                }
                let j = units.len();
                let (dw, bn, act) = (
                    format!("conv.{j}.0"),
                    format!("conv.{j}.1"),
                    format!("conv.{j}.2"),
                );
                units.push(unit(
                    [&dw, &bn],
                    Some(&act),
                    [hidden, hidden],
                    3,
                    stride,
                    hidden,
                    c,
                    s + 1,
                )?);
                let (pw, bn) = (format!("conv.{}", j + 1), format!("conv.{}", j + 2));
                units.push(unit([&pw, &bn], None, [hidden, row.c], 1, 1, 1, c, s + 2)?);
                let residual = stride == 1 && cin == row.c;
                blocks.push(Block {
                    name: format!("features.{}", blocks.len()),
                    units,
                    residual,
                });
                cin = row.c;
            }
        }
        let last = unit(
            ["0", "1"],
            Some("2"),
            [cin, cfg.last_channel],
            1,
            1,
            1,
            c,
            seed.wrapping_add(7),
        )?;
        blocks.push(Block {
            name: format!("features.{}", blocks.len()),
            units: vec![last],
            residual: false,
        });
        Ok(MobileNetV2 {
            blocks,
            avgpool: AdaptiveAvgPool2d::new("avgpool", [1, 1]),
            dropout: Dropout::new("classifier.0", cfg.dropout, seed.wrapping_add(8))?,
            fc: Linear::builder(cfg.last_channel, cfg.num_classes)
                .name("classifier.1")
                .weight_init(Init::normal(0.01))
                .bias_init(Init::zeros())
                .dtype(dtype)
                .seed(seed.wrapping_add(9))
                .build(&device)?,
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

    /// Whether [`MobileNetV2::gradient_checkpointing`] is on.
    pub fn is_gradient_checkpointing(&self) -> bool {
        self.checkpointing
    }

    /// Makes each parameter require grad exactly when `want(name)` is true
    /// (names as in [`Module::named_parameters`]); values are kept.
    pub fn set_requires_grad(&mut self, mut want: impl FnMut(&str) -> bool) -> Result<()> {
        let want: &mut dyn FnMut(&str) -> bool = &mut want;
        for block in &mut self.blocks {
            for u in &mut block.units {
                let conv_name = format!("{}.{}", block.name, u.conv.name());
                set_conv(&mut u.conv, &conv_name, want)?;
                let bn_name = format!("{}.{}", block.name, u.bn_name);
                set_bn(&mut u.bn, &bn_name, want)?;
            }
        }
        set_linear(&mut self.fc, "classifier.1", want)
    }

    fn parts(&self, part: Part) -> Vec<Named> {
        let of = |p: &str, m: &dyn Module| part_of(p, m, part);
        let mut out = Vec::new();
        for block in &self.blocks {
            for u in &block.units {
                out.extend(of(&format!("{}.{}", block.name, u.conv.name()), &u.conv));
                out.extend(of(&format!("{}.{}", block.name, u.bn_name), &u.bn));
            }
        }
        out.extend(of("classifier.1", &self.fc));
        out
    }
}

impl Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        let mut h = x.clone();
        for u in &self.units {
            // The norm writes over the convolution's output (buffer reuse).
            h = u.bn.forward_owned(u.conv.forward(&h)?)?;
            if let Some(act) = &u.relu6 {
                let _a = scope(act.clone());
                h = h.clamp(0.0, 6.0)?;
            }
        }
        if self.residual {
            h = h.add_owned(x)?;
        }
        Ok(h)
    }
}

impl FeatureMaps for MobileNetV2 {
    fn model_name(&self) -> &'static str {
        "MobileNetV2"
    }

    /// `features.0` … `features.N` (the stem, each inverted residual, the
    /// last 1×1 convolution), then torchvision's functional nodes
    /// `adaptive_avg_pool2d` and `flatten`, `classifier.0` (Dropout),
    /// `classifier.1`.
    fn feature_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.blocks.iter().map(|b| b.name.clone()).collect();
        names.extend(
            [
                "adaptive_avg_pool2d",
                "flatten",
                "classifier.0",
                "classifier.1",
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
        h = self.avgpool.forward(&h)?;
        stop_if!(visit("adaptive_avg_pool2d", &h));
        h = h.flatten(1, -1)?;
        stop_if!(visit("flatten", &h));
        h = self.dropout.forward_owned(h)?;
        stop_if!(visit("classifier.0", &h));
        h = self.fc.forward(&h)?;
        stop_if!(visit("classifier.1", &h));
        Ok(Some(h))
    }
}

impl ReplaceHead for MobileNetV2 {
    fn head_name(&self) -> &str {
        "classifier.1"
    }

    fn num_classes(&self) -> usize {
        self.fc.weight.shape()[0]
    }

    /// A fresh `classifier.1`, initialised as torchvision's MobileNetV2
    /// initialises it (weight normal with std 0.01, bias zero).
    fn replace_head(&mut self, num_classes: usize, seed: u64) -> Result<()> {
        self.fc = head_like(&self.fc, num_classes, HeadInit::Normal(0.01), seed)?;
        Ok(())
    }
}

impl Module for MobileNetV2 {
    walked_module_methods!("MobileNetV2");

    fn set_training(&mut self, training: bool) {
        for block in &mut self.blocks {
            for u in &mut block.units {
                u.bn.set_training(training);
            }
        }
        self.dropout.set_training(training);
    }

    fn sync_batch_norm(&mut self, sync: Option<&Arc<dyn BatchStatsSync>>) -> usize {
        let units = self.blocks.iter_mut().flat_map(|b| b.units.iter_mut());
        units.map(|u| u.bn.sync_batch_norm(sync)).sum()
    }
}
