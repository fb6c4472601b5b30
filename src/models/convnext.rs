//! ConvNeXt as in torchvision (`convnext_tiny`, `_small`, `_base`,
//! `_large`), with torchvision's state-dict names: a 4×4/4 patchify stem
//! (`features.0.0` conv, `features.0.1` LayerNorm over channels), stages of
//! ConvNeXt blocks (`features.S.B.block.0` depthwise 7×7, `.block.2`
//! LayerNorm, `.block.3`/`.block.5` the MLP with GELU between,
//! `.layer_scale`, stochastic depth and the residual), downsampling layers
//! between stages (`features.K.0` LayerNorm, `features.K.1` 2×2/2 conv),
//! global average pooling and `classifier.0` LayerNorm, `classifier.2`
//! Linear.
//!
//! Saved for backward per block, beyond what each layer's own table says:
//! nothing. The LayerNorms over channels run on the `[N, H, W, C]` view of
//! the `[N, C, H, W]` maps, as torchvision's `LayerNorm2d` and `Permute`
//! do; the layer scale saves the MLP's output only when `layer_scale`
//! trains (the multiply's rule) and stochastic depth saves nothing (its
//! per-sample draws are replayed).

use super::surgery::{head_like, HeadInit};
use super::transformer::{leaf_kinds, leaf_params, leaf_set_requires_grad, Leaves, LeavesMut};
use super::{checkpoint_block, ran_to_the_end, stop_if, Ctx, FeatureMaps, Param, ReplaceHead};
use crate::memory::scope;
use crate::nn::{
    adaptive_avg_pool2d, Conv2d, Init, LayerKind, LayerNorm, Linear, Module, StochasticDepth,
    StochasticDepthMode,
};
use crate::{DType, Device, Error, Result, Tensor};

/// One stage of a ConvNeXt as torchvision's `CNBlockConfig`: its width,
/// the width the downsampling after it leads to (`None` for the last
/// stage) and its number of blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvNeXtStage {
    /// Channels of the stage's blocks.
    pub channels: usize,
    /// Channels after the downsampling layer that follows, if any.
    pub out_channels: Option<usize>,
    /// Number of blocks.
    pub layers: usize,
}

impl ConvNeXtStage {
    /// A stage from torchvision's `CNBlockConfig(input, out, layers)` order.
    pub fn new(channels: usize, out_channels: Option<usize>, layers: usize) -> Self {
        ConvNeXtStage {
            channels,
            out_channels,
            layers,
        }
    }
}

/// The shape of a ConvNeXt (torchvision's `ConvNeXt` arguments).
#[derive(Clone, Debug, PartialEq)]
pub struct ConvNeXtConfig {
    /// Channels of the input images (torchvision: 3).
    pub in_channels: usize,
    /// The stages in order.
    pub stages: Vec<ConvNeXtStage>,
    /// The largest stochastic-depth probability, reached by the last
    /// block; block `i` of `n` drops with `p · i / (n − 1)`.
    pub stochastic_depth_prob: f64,
    /// The initial value of every `layer_scale` (torchvision: 1e-6).
    pub layer_scale: f64,
    /// Classes of the classifier.
    pub num_classes: usize,
}

impl ConvNeXtConfig {
    fn named(rows: [(usize, Option<usize>, usize); 4], sd: f64, classes: usize) -> Self {
        ConvNeXtConfig {
            in_channels: 3,
            stages: rows
                .iter()
                .map(|&(c, o, n)| ConvNeXtStage::new(c, o, n))
                .collect(),
            stochastic_depth_prob: sd,
            layer_scale: 1e-6,
            num_classes: classes,
        }
    }

    /// torchvision's `convnext_tiny` (28.6 M parameters at 1000 classes).
    pub fn convnext_tiny(num_classes: usize) -> Self {
        let rows = [(96, Some(192), 3), (192, Some(384), 3), (384, Some(768), 9)];
        Self::named(with_last(rows, (768, None, 3)), 0.1, num_classes)
    }

    /// torchvision's `convnext_small` (50.2 M parameters).
    pub fn convnext_small(num_classes: usize) -> Self {
        let rows = [
            (96, Some(192), 3),
            (192, Some(384), 3),
            (384, Some(768), 27),
        ];
        Self::named(with_last(rows, (768, None, 3)), 0.4, num_classes)
    }

    /// torchvision's `convnext_base` (88.6 M parameters).
    pub fn convnext_base(num_classes: usize) -> Self {
        let rows = [
            (128, Some(256), 3),
            (256, Some(512), 3),
            (512, Some(1024), 27),
        ];
        Self::named(with_last(rows, (1024, None, 3)), 0.5, num_classes)
    }

    /// torchvision's `convnext_large` (197.8 M parameters).
    pub fn convnext_large(num_classes: usize) -> Self {
        let rows = [
            (192, Some(384), 3),
            (384, Some(768), 3),
            (768, Some(1536), 27),
        ];
        Self::named(with_last(rows, (1536, None, 3)), 0.5, num_classes)
    }

    /// Channels reaching the classifier.
    fn last_channels(&self) -> usize {
        let last = self.stages[self.stages.len() - 1];
        last.out_channels.unwrap_or(last.channels)
    }

    fn validate(&self) -> Result<()> {
        let bad = |msg: String| {
            Err(Error::InvalidArgument {
                op: "ConvNeXt",
                msg,
            })
        };
        if self.stages.is_empty() {
            return bad("the stage list is empty".into());
        }
        if self.in_channels == 0 || self.num_classes == 0 {
            return bad("in_channels and num_classes must be positive".into());
        }
        if !(0.0..=1.0).contains(&self.stochastic_depth_prob) {
            return bad(format!(
                "stochastic_depth_prob {} is not in [0, 1]",
                self.stochastic_depth_prob
            ));
        }
        if !self.layer_scale.is_finite() {
            return bad(format!("layer_scale {} is not finite", self.layer_scale));
        }
        for (i, s) in self.stages.iter().enumerate() {
            if s.channels == 0 || s.out_channels == Some(0) {
                return bad(format!("stage {i} has zero channels"));
            }
            if let Some(next) = self.stages.get(i + 1) {
                let reaching = s.out_channels.unwrap_or(s.channels);
                if reaching != next.channels {
                    return bad(format!(
                        "stage {i} leads to {reaching} channels but stage {} takes {}",
                        i + 1,
                        next.channels
                    ));
                }
            }
        }
        if self.stages.iter().all(|s| s.layers == 0) {
            return bad("no stage has a block".into());
        }
        Ok(())
    }
}

fn with_last(
    rows: [(usize, Option<usize>, usize); 3],
    last: (usize, Option<usize>, usize),
) -> [(usize, Option<usize>, usize); 4] {
    [rows[0], rows[1], rows[2], last]
}

/// torchvision's `LayerNorm2d` at `name` (eps 1e-6).
fn layer_norm(name: &str, channels: usize, c: Ctx) -> Result<LayerNorm> {
    LayerNorm::builder(&[channels])
        .name(name)
        .eps(1e-6)
        .dtype(c.0)
        .build(&c.1)
}

/// A convolution with a bias, initialised as torchvision's ConvNeXt:
/// weight N(0, 0.02²) (its `trunc_normal_` cuts at ±2, i.e. ±100σ), bias 0.
fn conv(name: &str, io: [usize; 2], k: usize, groups: usize, c: Ctx, seed: u64) -> Result<Conv2d> {
    let (stride, padding) = if groups == 1 { (k, 0) } else { (1, k / 2) };
    Conv2d::builder(io[0], io[1], k)
        .name(name)
        .stride(stride)
        .padding(padding)
        .groups(groups)
        .bias(true)
        .weight_init(Init::normal(0.02))
        .bias_init(Init::zeros())
        .dtype(c.0)
        .seed(seed)
        .build(&c.1)
}

/// A Linear layer initialised as torchvision's ConvNeXt (weight N(0,
/// 0.02²), bias 0).
fn linear(name: &str, io: [usize; 2], c: Ctx, seed: u64) -> Result<Linear> {
    Linear::builder(io[0], io[1])
        .name(name)
        .weight_init(Init::normal(0.02))
        .bias_init(Init::zeros())
        .dtype(c.0)
        .seed(seed)
        .build(&c.1)
}

/// `norm` over the channels of `[N, C, H, W]` maps: on the `[N, H, W, C]`
/// view, the result viewed back as `[N, C, H, W]` (torchvision's
/// `LayerNorm2d`).
fn channels_norm(norm: &LayerNorm, x: &Tensor) -> Result<Tensor> {
    norm.forward(&x.permute(&[0, 2, 3, 1])?)?
        .permute(&[0, 3, 1, 2])
}

/// torchvision's `CNBlock`: `x + stochastic_depth(layer_scale ·
/// block(x))`.
#[derive(Clone)]
struct Block {
    name: String,
    dwconv: Conv2d,
    norm: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    layer_scale: Param,
    drop: StochasticDepth,
}

impl Block {
    fn new(
        name: &str,
        dim: usize,
        cfg: &ConvNeXtConfig,
        sd: f64,
        c: Ctx,
        seed: u64,
    ) -> Result<Self> {
        let n = |s: &str| format!("{name}.{s}");
        Ok(Block {
            name: name.to_string(),
            dwconv: conv(&n("block.0"), [dim, dim], 7, dim, c, seed)?,
            norm: layer_norm(&n("block.2"), dim, c)?,
            fc1: linear(&n("block.3"), [dim, 4 * dim], c, seed + 1)?,
            fc2: linear(&n("block.5"), [4 * dim, dim], c, seed + 2)?,
            layer_scale: Param::constant("layer_scale", &[dim, 1, 1], cfg.layer_scale, c)?,
            drop: StochasticDepth::new(
                &n("stochastic_depth"),
                sd,
                StochasticDepthMode::Row,
                seed + 3,
            )?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.dwconv.forward(x)?;
        let h = self.norm.forward(&h.permute(&[0, 2, 3, 1])?)?;
        let h = self.fc1.forward(&h)?;
        let h = {
            let _s = scope(format!("{}.block.4", self.name));
            h.gelu_owned(false)?
        };
        let h = self.fc2.forward(&h)?.permute(&[0, 3, 1, 2])?;
        let h = {
            let _s = scope(self.name.clone());
            self.layer_scale.value.mul(&h)?
        };
        let h = self.drop.forward_owned(h)?;
        let _s = scope(self.name.clone());
        h.add_owned(x)
    }

    fn leaves(&self) -> Leaves<'_> {
        vec![
            (self.name.clone(), &self.layer_scale),
            (self.dwconv.name().to_string(), &self.dwconv),
            (self.norm_name(), &self.norm),
            (format!("{}.block.3", self.name), &self.fc1),
            (format!("{}.block.5", self.name), &self.fc2),
        ]
    }

    fn leaves_mut(&mut self) -> LeavesMut<'_> {
        let norm = self.norm_name();
        vec![
            (self.name.clone(), &mut self.layer_scale),
            (self.dwconv.name().to_string(), &mut self.dwconv),
            (norm, &mut self.norm),
            (format!("{}.block.3", self.name), &mut self.fc1),
            (format!("{}.block.5", self.name), &mut self.fc2),
        ]
    }

    fn norm_name(&self) -> String {
        format!("{}.block.2", self.name)
    }
}

/// A `features.K` entry: the stem, a stage of blocks or a downsampling
/// layer. The stem and downsampling are a conv and a channel LayerNorm in
/// torchvision's order (stem: conv then norm; downsampling: norm then
/// conv).
#[derive(Clone)]
enum Feature {
    Stem { conv: Conv2d, norm: LayerNorm },
    Stage(Vec<Block>),
    Down { norm: LayerNorm, conv: Conv2d },
}

impl Feature {
    fn forward(&self, x: &Tensor, checkpointing: bool) -> Result<Tensor> {
        match self {
            Feature::Stem { conv, norm } => channels_norm(norm, &conv.forward(x)?),
            Feature::Down { norm, conv } => conv.forward(&channels_norm(norm, x)?),
            Feature::Stage(blocks) => {
                let mut h = x.clone();
                for b in blocks {
                    h = match checkpointing {
                        true => checkpoint_block(b, &[&h], |b, xs| b.forward(&xs[0]))?,
                        false => b.forward(&h)?,
                    };
                }
                Ok(h)
            }
        }
    }

    fn leaves(&self) -> Leaves<'_> {
        match self {
            Feature::Stem { conv, norm } | Feature::Down { norm, conv } => {
                let (c, n): (&dyn Module, &dyn Module) = (conv, norm);
                let mut v = vec![(conv.name().to_string(), c), (norm_name(norm), n)];
                // State-dict order is torchvision's: the stem's conv first,
                // the downsampling's norm first.
                if matches!(self, Feature::Down { .. }) {
                    v.reverse();
                }
                v
            }
            Feature::Stage(blocks) => blocks.iter().flat_map(Block::leaves).collect(),
        }
    }

    fn leaves_mut(&mut self) -> LeavesMut<'_> {
        let down = matches!(self, Feature::Down { .. });
        match self {
            Feature::Stem { conv, norm } | Feature::Down { norm, conv } => {
                let names = (conv.name().to_string(), norm_name(norm));
                let mut v: LeavesMut = vec![(names.0, conv), (names.1, norm)];
                if down {
                    v.reverse();
                }
                v
            }
            Feature::Stage(blocks) => blocks.iter_mut().flat_map(Block::leaves_mut).collect(),
        }
    }
}

/// A LayerNorm's full name (its scope name, the prefix of its parameters).
fn norm_name(norm: &LayerNorm) -> String {
    norm.name().to_string()
}

/// torchvision's ConvNeXt. Starts in training mode (stochastic depth
/// active where its probability is above 0).
pub struct ConvNeXt {
    features: Vec<Feature>,
    head_norm: LayerNorm,
    head: Linear,
    checkpointing: bool,
}

impl ConvNeXt {
    /// A ConvNeXt of `config` initialised as torchvision's (seeded): every
    /// convolution and Linear weight N(0, 0.02²) with bias 0, every
    /// LayerNorm weight 1 and bias 0, every `layer_scale` the config's
    /// value; ready for [`crate::io::load_state_dict`]. A bad config is an
    /// [`Error::InvalidArgument`].
    pub fn new(config: &ConvNeXtConfig, dtype: DType, device: Device, seed: u64) -> Result<Self> {
        let cfg = config;
        cfg.validate()?;
        let c = (dtype, device);
        let first = cfg.stages[0].channels;
        let mut features = vec![Feature::Stem {
            conv: conv("features.0.0", [cfg.in_channels, first], 4, 1, c, seed)?,
            norm: layer_norm("features.0.1", first, c)?,
        }];
        let total: usize = cfg.stages.iter().map(|s| s.layers).sum();
        let mut block_id = 0;
        for stage in &cfg.stages {
            let k = features.len();
            let mut blocks = Vec::with_capacity(stage.layers);
            for b in 0..stage.layers {
                // torchvision's `p · id / (total − 1)`; a single block
                // (0/0 there) is given 0 here rather than NaN.
                let sd = match total {
                    1 => 0.0,
                    _ => cfg.stochastic_depth_prob * block_id as f64 / (total - 1) as f64,
                };
                let s = seed.wrapping_add(10 * (block_id as u64 + 1));
                blocks.push(Block::new(
                    &format!("features.{k}.{b}"),
                    stage.channels,
                    cfg,
                    sd,
                    c,
                    s,
                )?);
                block_id += 1;
            }
            features.push(Feature::Stage(blocks));
            if let Some(out) = stage.out_channels {
                let k = features.len();
                let s = seed.wrapping_add(5 + 10 * block_id as u64);
                features.push(Feature::Down {
                    norm: layer_norm(&format!("features.{k}.0"), stage.channels, c)?,
                    conv: conv(
                        &format!("features.{k}.1"),
                        [stage.channels, out],
                        2,
                        1,
                        c,
                        s,
                    )?,
                });
            }
        }
        let last = cfg.last_channels();
        Ok(ConvNeXt {
            features,
            head_norm: layer_norm("classifier.0", last, c)?,
            head: linear(
                "classifier.2",
                [last, cfg.num_classes],
                c,
                seed.wrapping_add(7),
            )?,
            checkpointing: false,
        })
    }

    /// Runs each ConvNeXt block as a checkpointed segment when `on`:
    /// forward keeps only each block's input, backward runs the block
    /// again (stochastic depth replays its draws); gradients are unchanged.
    /// Off by default.
    pub fn gradient_checkpointing(&mut self, on: bool) {
        self.checkpointing = on;
    }

    /// Whether [`ConvNeXt::gradient_checkpointing`] is on.
    pub fn is_gradient_checkpointing(&self) -> bool {
        self.checkpointing
    }

    /// Makes each parameter require grad exactly when `want(name)` is true
    /// (names as in [`Module::named_parameters`]); values are kept.
    pub fn set_requires_grad(&mut self, mut want: impl FnMut(&str) -> bool) -> Result<()> {
        leaf_set_requires_grad(self.leaves_mut(), &mut want)
    }

    fn leaves(&self) -> Leaves<'_> {
        let mut v: Leaves = self.features.iter().flat_map(Feature::leaves).collect();
        v.push(("classifier.0".into(), &self.head_norm));
        v.push(("classifier.2".into(), &self.head));
        v
    }

    fn leaves_mut(&mut self) -> LeavesMut<'_> {
        let mut v: LeavesMut = self
            .features
            .iter_mut()
            .flat_map(Feature::leaves_mut)
            .collect();
        v.push(("classifier.0".into(), &mut self.head_norm));
        v.push(("classifier.2".into(), &mut self.head));
        v
    }

    fn blocks_mut(&mut self) -> impl Iterator<Item = &mut Block> {
        self.features.iter_mut().flat_map(|f| match f {
            Feature::Stage(blocks) => blocks.as_mut_slice(),
            _ => &mut [],
        })
    }
}

impl FeatureMaps for ConvNeXt {
    fn model_name(&self) -> &'static str {
        "ConvNeXt"
    }

    /// `features.0` … `features.7` (the stem, each stage, each
    /// downsampling), `avgpool`, then `classifier.0` … `classifier.2`
    /// (torchvision's `create_feature_extractor` names).
    fn feature_names(&self) -> Vec<String> {
        let mut names: Vec<String> = (0..self.features.len())
            .map(|k| format!("features.{k}"))
            .collect();
        names.extend(["avgpool", "classifier.0", "classifier.1", "classifier.2"].map(String::from));
        names
    }

    fn walk(
        &self,
        x: &Tensor,
        visit: &mut dyn FnMut(&str, &Tensor) -> bool,
    ) -> Result<Option<Tensor>> {
        let mut h = x.clone();
        for (k, f) in self.features.iter().enumerate() {
            let name = format!("features.{k}");
            h = f.forward(&h, self.checkpointing)?;
            stop_if!(visit(&name, &h));
        }
        h = {
            let _s = scope("avgpool".to_string());
            adaptive_avg_pool2d(&h, [1, 1])?
        };
        stop_if!(visit("avgpool", &h));
        h = channels_norm(&self.head_norm, &h)?;
        stop_if!(visit("classifier.0", &h));
        h = h.flatten(1, -1)?;
        stop_if!(visit("classifier.1", &h));
        h = self.head.forward(&h)?;
        stop_if!(visit("classifier.2", &h));
        Ok(Some(h))
    }
}

impl ReplaceHead for ConvNeXt {
    fn head_name(&self) -> &str {
        "classifier.2"
    }

    fn num_classes(&self) -> usize {
        self.head.weight.shape()[0]
    }

    /// A fresh `classifier.2`, initialised as torchvision's ConvNeXt
    /// initialises it (weight normal with std 0.02, bias zero).
    fn replace_head(&mut self, num_classes: usize, seed: u64) -> Result<()> {
        self.head = head_like(&self.head, num_classes, HeadInit::Normal(0.02), seed)?;
        Ok(())
    }
}

impl Module for ConvNeXt {
    /// Class scores `[n, num_classes]` of images `[n, in_channels, h, w]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let out = self.walk(x, &mut |_, _| false)?;
        ran_to_the_end(out, "ConvNeXt")
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        leaf_params(self.leaves())
    }

    fn parameter_kinds(&self) -> Vec<(String, LayerKind)> {
        leaf_kinds(self.leaves())
    }

    fn set_training(&mut self, training: bool) {
        for b in self.blocks_mut() {
            b.drop.set_training(training);
        }
    }
}
