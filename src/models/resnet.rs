//! ResNet and ResNeXt as in torchvision (`resnet18` … `resnet152`,
//! `resnext50_32x4d` … `resnext101_64x4d`; v1.5: the stride of a Bottleneck
//! sits on its 3×3 convolution, which ResNeXt groups), with torchvision's
//! state-dict names, plus small configurations for tests.

use super::checkpoint_block;
use super::surgery::{head_like, HeadInit};
use super::{
    batch_norm2d, part_of, set_bn, set_conv, set_linear, square_conv, stop_if,
    walked_module_methods, Ctx, FeatureMaps, Named, Part, ReplaceHead,
};
use crate::memory::scope;
use crate::nn::{
    AdaptiveAvgPool2d, BatchNorm, BatchStatsSync, Conv2d, Linear, MaxPool2d, MaxPool2dOptions,
    Module, ReLU,
};
use crate::{DType, Device, Error, Result, Tensor};
use std::sync::Arc;

/// The residual block of a [`ResNet`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    /// Two 3×3 convolutions (ResNet-18/34); expansion 1.
    Basic,
    /// 1×1, 3×3 (strided), 1×1 convolutions (ResNet-50/101/152); expansion 4.
    Bottleneck,
}

impl BlockKind {
    /// Output channels of a block per channel of its stage's width.
    pub fn expansion(self) -> usize {
        match self {
            BlockKind::Basic => 1,
            BlockKind::Bottleneck => 4,
        }
    }
}

/// The shape of a [`ResNet`]: torchvision's sizes are `base_width` 64,
/// `in_channels` 3 and `num_classes` 1000; a ResNet has `groups` 1 and
/// `width_per_group` 64, a ResNeXt more groups of fewer channels each.
///
/// A Bottleneck of a stage whose width (`planes`) is `base_width · 2^s`
/// has `planes · width_per_group / 64 · groups` channels in its 3×3
/// convolution, which runs in `groups` groups, as torchvision computes it
/// (`int(planes * (base_width / 64.)) * groups`); its output has
/// `4 · planes` channels whatever the groups.
///
/// A fresh ResNet is initialised as torchvision's constructor leaves it:
/// every convolution `kaiming_normal_(mode="fan_out",
/// nonlinearity="relu")`, every BatchNorm weight 1 and bias 0 (with
/// `zero_init_residual`, the last BatchNorm of each block weight 0), `fc`
/// PyTorch's default Linear (uniform in ±1/√in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResNetConfig {
    /// Basic or Bottleneck blocks.
    pub block: BlockKind,
    /// Blocks in `layer1` … `layer4`.
    pub layers: [usize; 4],
    /// Channels of the stem and width of `layer1` (stages double it).
    pub base_width: usize,
    /// Outputs of `fc`.
    pub num_classes: usize,
    /// Channels of the input image.
    pub in_channels: usize,
    /// Whether the last BatchNorm of each residual branch (`bn2` of a
    /// Basic block, `bn3` of a Bottleneck) starts with weight 0, so that
    /// each block starts as the identity (torchvision's
    /// `zero_init_residual`; default false).
    pub zero_init_residual: bool,
    /// Groups of each Bottleneck's 3×3 convolution (torchvision's
    /// `groups`; 1 for a ResNet, 32 or 64 for a ResNeXt). Basic blocks
    /// take only 1.
    pub groups: usize,
    /// Channels per group of a Bottleneck's 3×3 convolution in a stage of
    /// width 64 (torchvision's `width_per_group`; 64 for a ResNet, 4 for
    /// ResNeXt-101 64×4d). Basic blocks take only 64.
    pub width_per_group: usize,
}

impl ResNetConfig {
    /// torchvision's ResNet-18: Basic blocks `[2, 2, 2, 2]`.
    pub fn resnet18(num_classes: usize) -> Self {
        ResNetConfig {
            block: BlockKind::Basic,
            layers: [2, 2, 2, 2],
            base_width: 64,
            num_classes,
            in_channels: 3,
            zero_init_residual: false,
            groups: 1,
            width_per_group: 64,
        }
    }

    /// torchvision's ResNet-50: Bottleneck blocks `[3, 4, 6, 3]`.
    pub fn resnet50(num_classes: usize) -> Self {
        ResNetConfig {
            block: BlockKind::Bottleneck,
            layers: [3, 4, 6, 3],
            ..ResNetConfig::resnet18(num_classes)
        }
    }

    /// torchvision's ResNet-101: Bottleneck blocks `[3, 4, 23, 3]`
    /// (44,549,160 parameters with 1000 classes).
    pub fn resnet101(num_classes: usize) -> Self {
        ResNetConfig {
            layers: [3, 4, 23, 3],
            ..ResNetConfig::resnet50(num_classes)
        }
    }

    /// torchvision's ResNeXt-101 64×4d (`resnext101_64x4d`): ResNet-101's
    /// blocks with each 3×3 convolution in 64 groups of 4 channels per 64
    /// of stage width (83,455,272 parameters with 1000 classes).
    pub fn resnext101_64x4d(num_classes: usize) -> Self {
        ResNetConfig {
            groups: 64,
            width_per_group: 4,
            ..ResNetConfig::resnet101(num_classes)
        }
    }

    /// The channels of the 3×3 convolution of a block in a stage of width
    /// `planes` (`planes · width_per_group / 64 · groups`, see
    /// [`ResNetConfig`]); `None` on overflow.
    pub fn bottleneck_width(&self, planes: usize) -> Option<usize> {
        planes
            .checked_mul(self.width_per_group)
            .map(|p| p / 64)
            .and_then(|p| p.checked_mul(self.groups))
    }

    /// Checks that the configuration describes a network: every size
    /// positive, Basic blocks only with `groups` 1 and `width_per_group`
    /// 64 (as torchvision's `BasicBlock`), every stage's grouped width at
    /// least one channel per group, and no size overflowing.
    /// [`Error::InvalidArgument`] says what is wrong.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| {
            Err(Error::InvalidArgument {
                op: "ResNet",
                msg: format!("{msg}: {self:?}"),
            })
        };
        if self.base_width == 0
            || self.num_classes == 0
            || self.in_channels == 0
            || self.layers.contains(&0)
            || self.groups == 0
            || self.width_per_group == 0
        {
            return bad("every size must be positive".into());
        }
        if self.block == BlockKind::Basic && (self.groups != 1 || self.width_per_group != 64) {
            return bad("Basic blocks only take groups 1 and width_per_group 64".into());
        }
        for s in 0..4 {
            let planes = self.base_width.checked_mul(1 << s);
            let out = planes.and_then(|p| p.checked_mul(self.block.expansion()));
            match (planes.and_then(|p| self.bottleneck_width(p)), out) {
                (Some(0), _) => {
                    return bad(format!(
                        "layer{}'s grouped width {} · {} / 64 · {} is 0 channels",
                        s + 1,
                        self.base_width << s,
                        self.width_per_group,
                        self.groups
                    ))
                }
                (Some(_), Some(_)) => {}
                _ => return bad(format!("layer{}'s width overflows", s + 1)),
            }
        }
        Ok(())
    }
}

fn conv(
    name: &str,
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
    c: Ctx,
    seed: u64,
) -> Result<Conv2d> {
    square_conv(name, [cin, cout], k, stride, 1, c, seed)
}

/// One convolution of a block: (in, out, kernel, stride, groups).
type ConvShape = (usize, usize, usize, usize, usize);

/// One residual block: `relu(bnN(convN(…)) + identity)`, where identity is
/// the input or `downsample.1(downsample.0(input))`.
#[derive(Clone)]
struct Block {
    name: String,
    convs: Vec<Conv2d>,
    bns: Vec<BatchNorm>,
    downsample: Option<(Conv2d, BatchNorm)>,
}

impl Block {
    fn new(
        cfg: &ResNetConfig,
        name: String,
        io: [usize; 3],
        stride: usize,
        c: Ctx,
        seed: u64,
    ) -> Result<Block> {
        let [cin, width, cout] = io;
        let g = cfg.groups;
        let shapes: Vec<ConvShape> = match cfg.block {
            BlockKind::Basic => vec![(cin, width, 3, stride, 1), (width, width, 3, 1, 1)],
            BlockKind::Bottleneck => vec![
                (cin, width, 1, 1, 1),
                (width, width, 3, stride, g),
                (width, cout, 1, 1, 1),
            ],
        };
        let mut convs = Vec::new();
        let mut bns = Vec::new();
        for (i, &(a, b, k, s, g)) in shapes.iter().enumerate() {
            let name = format!("conv{}", i + 1);
            convs.push(square_conv(&name, [a, b], k, s, g, c, seed + i as u64)?);
            bns.push(batch_norm2d(&format!("bn{}", i + 1), b, c)?);
        }
        if let (true, Some(last)) = (cfg.zero_init_residual, bns.last_mut()) {
            last.weight = Some(Tensor::zeros(&[cout], c.0, c.1)?.into_parameter()?);
        }
        let downsample = if stride != 1 || cin != cout {
            Some((
                conv("0", cin, cout, 1, stride, c, seed + 7)?,
                batch_norm2d("1", cout, c)?,
            ))
        } else {
            None
        };
        Ok(Block {
            name,
            convs,
            bns,
            downsample,
        })
    }

    /// The block on an input handed over: each norm, relu and the residual
    /// add write over a buffer nothing else holds (buffer reuse), and `x`
    /// itself becomes the identity.
    fn forward(&self, x: Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        let last = self.convs.len() - 1;
        let mut h: Option<Tensor> = None;
        for (i, (cv, b)) in self.convs.iter().zip(&self.bns).enumerate() {
            let conv = cv.forward(h.as_ref().unwrap_or(&x))?;
            // Inside the branch the norm's kernel applies the ReLU too
            // (where it can), as an in-place ReLU after `b.forward_owned`.
            h = Some(match i < last {
                true => b.forward_relu_owned(conv)?,
                false => b.forward_owned(conv)?,
            });
        }
        let h = h.ok_or_else(|| Error::InvalidArgument {
            op: "ResNet block",
            msg: format!("{} has no convolutions", self.name),
        })?;
        let identity = match &self.downsample {
            Some((cv, b)) => {
                let _d = scope("downsample");
                b.forward_owned(cv.forward(&x)?)?
            }
            None => x,
        };
        // An in-place ReLU after `h.add_owned(&identity)`, in one kernel
        // where the device has one.
        h.add_relu_owned(&identity)
    }

    fn parts(&self, part: Part) -> Vec<Named> {
        let of = |p: &str, m: &dyn Module| part_of(p, m, part);
        let mut out = Vec::new();
        for (i, (cv, b)) in self.convs.iter().zip(&self.bns).enumerate() {
            out.extend(of(&format!("{}.conv{}", self.name, i + 1), cv));
            out.extend(of(&format!("{}.bn{}", self.name, i + 1), b));
        }
        if let Some((cv, b)) = &self.downsample {
            out.extend(of(&format!("{}.downsample.0", self.name), cv));
            out.extend(of(&format!("{}.downsample.1", self.name), b));
        }
        out
    }
}

/// torchvision's ResNet: `conv1` (7×7/2) → `bn1` → `relu` → `maxpool`
/// (3×3/2, pad 1) → `layer1` … `layer4` → `avgpool` (adaptive 1×1) →
/// flatten → `fc`. Convolutions have no bias. Starts in training mode.
pub struct ResNet {
    config: ResNetConfig,
    conv1: Conv2d,
    bn1: BatchNorm,
    maxpool: MaxPool2d,
    stages: Vec<Vec<Block>>,
    avgpool: AdaptiveAvgPool2d,
    fc: Linear,
    checkpointing: bool,
}

impl ResNet {
    /// A ResNet of `config` initialised as torchvision's (see
    /// [`ResNetConfig`]; seeded), ready for [`crate::io::load_state_dict`].
    /// A configuration [`ResNetConfig::validate`] refuses is
    /// [`Error::InvalidArgument`], before anything is allocated.
    pub fn new(config: ResNetConfig, dtype: DType, device: Device, seed: u64) -> Result<ResNet> {
        let cfg = config;
        cfg.validate()?;
        let c = (dtype, device);
        let w = cfg.base_width;
        let exp = cfg.block.expansion();
        let conv1 = conv("conv1", cfg.in_channels, w, 7, 2, c, seed)?;
        let mut pool = MaxPool2dOptions::new([3, 3]);
        pool.stride = Some([2, 2]);
        pool.padding = [1, 1];
        let mut cin = w;
        let mut stages = Vec::new();
        for (s, &n) in cfg.layers.iter().enumerate() {
            let planes = w << s;
            // Validated: positive and without overflow.
            let width = cfg.bottleneck_width(planes).unwrap_or(planes);
            let mut blocks = Vec::new();
            for i in 0..n {
                let stride = if s > 0 && i == 0 { 2 } else { 1 };
                let name = format!("layer{}.{i}", s + 1);
                let bseed = seed.wrapping_add(1000 * (s as u64 + 1) + 10 * i as u64);
                blocks.push(Block::new(
                    &cfg,
                    name,
                    [cin, width, planes * exp],
                    stride,
                    c,
                    bseed,
                )?);
                cin = planes * exp;
            }
            stages.push(blocks);
        }
        Ok(ResNet {
            config,
            conv1,
            bn1: batch_norm2d("bn1", w, c)?,
            maxpool: MaxPool2d::new("maxpool", pool),
            stages,
            avgpool: AdaptiveAvgPool2d::new("avgpool", [1, 1]),
            fc: Linear::builder(cin, cfg.num_classes)
                .name("fc")
                .dtype(dtype)
                .seed(seed.wrapping_add(9))
                .build(&device)?,
            checkpointing: false,
        })
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> ResNetConfig {
        self.config
    }

    /// Runs each residual block as a checkpointed segment when `on` (Hugging Face's
    /// `gradient_checkpointing_enable()`): forward keeps only each residual block's
    /// input, backward runs the residual block again; gradients are unchanged, one
    /// more forward of the residual blocks is the cost. Off by default.
    pub fn gradient_checkpointing(&mut self, on: bool) {
        self.checkpointing = on;
    }

    /// Whether [`ResNet::gradient_checkpointing`] is on.
    pub fn is_gradient_checkpointing(&self) -> bool {
        self.checkpointing
    }

    /// Makes each parameter require grad exactly when `want(name)` is true
    /// (names as in [`Module::named_parameters`]); values are kept, so this
    /// works before or after loading weights. Freeze all:
    /// `set_requires_grad(|_| false)`; train only the head:
    /// `set_requires_grad(|n| n.starts_with("fc."))`.
    pub fn set_requires_grad(&mut self, mut want: impl FnMut(&str) -> bool) -> Result<()> {
        let want: &mut dyn FnMut(&str) -> bool = &mut want;
        set_conv(&mut self.conv1, "conv1", want)?;
        set_bn(&mut self.bn1, "bn1", want)?;
        for block in self.stages.iter_mut().flatten() {
            for (i, (cv, b)) in block.convs.iter_mut().zip(&mut block.bns).enumerate() {
                set_conv(cv, &format!("{}.conv{}", block.name, i + 1), want)?;
                set_bn(b, &format!("{}.bn{}", block.name, i + 1), want)?;
            }
            if let Some((cv, b)) = &mut block.downsample {
                set_conv(cv, &format!("{}.downsample.0", block.name), want)?;
                set_bn(b, &format!("{}.downsample.1", block.name), want)?;
            }
        }
        set_linear(&mut self.fc, "fc", want)
    }

    fn parts(&self, part: Part) -> Vec<Named> {
        let of = |p: &str, m: &dyn Module| part_of(p, m, part);
        let mut out = of("conv1", &self.conv1);
        out.extend(of("bn1", &self.bn1));
        for block in self.stages.iter().flatten() {
            out.extend(block.parts(part));
        }
        out.extend(of("fc", &self.fc));
        out
    }
}

impl FeatureMaps for ResNet {
    fn model_name(&self) -> &'static str {
        "ResNet"
    }

    /// `conv1`, `bn1`, `relu`, `maxpool`, each block (`layer1.0`, …) and
    /// stage (`layer1` … `layer4`, its last block's output), `avgpool`,
    /// `flatten`, `fc`.
    fn feature_names(&self) -> Vec<String> {
        let mut names: Vec<String> = ["conv1", "bn1", "relu", "maxpool"].map(String::from).into();
        for (s, stage) in self.stages.iter().enumerate() {
            names.extend(stage.iter().map(|b| b.name.clone()));
            names.push(format!("layer{}", s + 1));
        }
        names.extend(["avgpool", "flatten", "fc"].map(String::from));
        names
    }

    fn walk(
        &self,
        x: &Tensor,
        visit: &mut dyn FnMut(&str, &Tensor) -> bool,
    ) -> Result<Option<Tensor>> {
        // One binding reassigned, so each layer's input is freed as soon
        // as its output exists (as a chain of calls would).
        // Each layer that can write over its input does (buffer reuse): the
        // input is handed over (`forward_owned`) unless the visitor kept it.
        let mut h = self.conv1.forward(x)?;
        stop_if!(visit("conv1", &h));
        h = self.bn1.forward_owned(h)?;
        stop_if!(visit("bn1", &h));
        h = {
            let _s = scope("relu");
            ReLU { inplace: true }.forward_owned(h)?
        };
        stop_if!(visit("relu", &h));
        h = self.maxpool.forward(&h)?;
        stop_if!(visit("maxpool", &h));
        for (s, stage) in self.stages.iter().enumerate() {
            for block in stage {
                h = match self.checkpointing {
                    true => checkpoint_block(block, &[&h], |b, xs| b.forward(xs[0].clone()))?,
                    false => block.forward(h)?,
                };
                stop_if!(visit(&block.name, &h));
            }
            stop_if!(visit(STAGES[s], &h));
        }
        h = self.avgpool.forward(&h)?;
        stop_if!(visit("avgpool", &h));
        h = h.flatten(1, -1)?;
        stop_if!(visit("flatten", &h));
        h = self.fc.forward(&h)?;
        stop_if!(visit("fc", &h));
        Ok(Some(h))
    }
}

const STAGES: [&str; 4] = ["layer1", "layer2", "layer3", "layer4"];

impl ReplaceHead for ResNet {
    fn head_name(&self) -> &str {
        "fc"
    }

    fn num_classes(&self) -> usize {
        self.config.num_classes
    }

    /// A fresh `fc`, initialised as torchvision's ResNet leaves it
    /// (PyTorch's default: uniform in ±1/√in).
    fn replace_head(&mut self, num_classes: usize, seed: u64) -> Result<()> {
        self.fc = head_like(&self.fc, num_classes, HeadInit::Default, seed)?;
        self.config.num_classes = num_classes;
        Ok(())
    }
}

impl Module for ResNet {
    walked_module_methods!("ResNet");

    fn set_training(&mut self, training: bool) {
        self.bn1.set_training(training);
        for block in self.stages.iter_mut().flatten() {
            for b in &mut block.bns {
                b.set_training(training);
            }
            if let Some((_, b)) = &mut block.downsample {
                b.set_training(training);
            }
        }
    }

    fn sync_batch_norm(&mut self, sync: Option<&Arc<dyn BatchStatsSync>>) -> usize {
        let mut n = self.bn1.sync_batch_norm(sync);
        for block in self.stages.iter_mut().flatten() {
            for b in &mut block.bns {
                n += b.sync_batch_norm(sync);
            }
            if let Some((_, b)) = &mut block.downsample {
                n += b.sync_batch_norm(sync);
            }
        }
        n
    }
}
