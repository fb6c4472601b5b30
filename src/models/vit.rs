//! The vision transformer of Hugging Face's `ViTModel` (ViT-B/16 and
//! smaller), with its state-dict names: `embeddings.cls_token`,
//! `embeddings.position_embeddings`,
//! `embeddings.patch_embeddings.projection`,
//! `encoder.layer.N.{attention.attention.{query,key,value},
//! attention.output.dense, intermediate.dense, output.dense,
//! layernorm_before, layernorm_after}`, `layernorm`, `pooler.dense`.

use super::checkpoint_block;
use super::transformer::{
    check_sizes, layer_norm, leaf_kinds, leaf_params, leaf_set_requires_grad, linear, pool,
    FeedForward, Leaf, Leaves, LeavesMut, Param, SelfAttention, INITIALIZER_RANGE,
};
use super::Ctx;
use crate::memory::scope;
use crate::nn::{Conv2d, Init, LayerKind, LayerNorm, Linear, Module};
use crate::{DType, Device, Error, Result, Tensor};

/// The shape of a [`ViT`] (Hugging Face's `ViTConfig` fields).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ViTConfig {
    /// Width of the token vectors.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads (must divide `hidden_size`).
    pub num_attention_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Side of the (square) input image.
    pub image_size: usize,
    /// Side of a patch (must divide `image_size`).
    pub patch_size: usize,
    /// Channels of the input image.
    pub num_channels: usize,
    /// LayerNorm epsilon (1e-12 in Hugging Face's default).
    pub layer_norm_eps: f64,
    /// Whether the model has `pooler.dense` (as `ViTModel` by default).
    pub add_pooling_layer: bool,
}

impl ViTConfig {
    /// ViT-B/16 at 224×224 (`google/vit-base-patch16-224`'s shape).
    pub fn vit_b16() -> ViTConfig {
        ViTConfig {
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            image_size: 224,
            patch_size: 16,
            num_channels: 3,
            layer_norm_eps: 1e-12,
            add_pooling_layer: true,
        }
    }

    /// A tiny ViT for tests: width 16, 2 layers, 2 heads, 16×16 images of
    /// 8×8 patches.
    pub fn tiny() -> ViTConfig {
        ViTConfig {
            hidden_size: 16,
            num_hidden_layers: 2,
            num_attention_heads: 2,
            intermediate_size: 32,
            image_size: 16,
            patch_size: 8,
            ..ViTConfig::vit_b16()
        }
    }

    /// Patches per image.
    pub fn num_patches(&self) -> usize {
        (self.image_size / self.patch_size).pow(2)
    }
}

/// Maps a transformers-5 `ViTModel` state-dict name (transformers 5
/// renamed the encoder: `layers.N.attention.q_proj.weight`,
/// `layers.N.mlp.fc1.bias`, …) to the classic name [`ViT`] uses (that of
/// the published checkpoints: `encoder.layer.N.attention.attention.query.weight`,
/// `encoder.layer.N.intermediate.dense.bias`, …). Other names come back
/// unchanged.
pub fn classic_vit_name(name: &str) -> String {
    let Some((n, tail)) = name
        .strip_prefix("layers.")
        .and_then(|rest| rest.split_once('.'))
    else {
        return name.to_string();
    };
    const RENAMES: [(&str, &str); 6] = [
        ("attention.q_proj.", "attention.attention.query."),
        ("attention.k_proj.", "attention.attention.key."),
        ("attention.v_proj.", "attention.attention.value."),
        ("attention.o_proj.", "attention.output.dense."),
        ("mlp.fc1.", "intermediate.dense."),
        ("mlp.fc2.", "output.dense."),
    ];
    let tail = RENAMES
        .iter()
        .find_map(|(new, old)| tail.strip_prefix(new).map(|t| format!("{old}{t}")))
        .unwrap_or_else(|| tail.to_string());
    format!("encoder.layer.{n}.{tail}")
}

/// One pre-norm encoder layer: `x + attn(ln_before(x))`, then
/// `h + mlp(ln_after(h))`.
#[derive(Clone)]
struct ViTLayer {
    attention: SelfAttention,
    output: Linear,
    mlp: FeedForward,
    layernorm_before: LayerNorm,
    layernorm_after: LayerNorm,
}

impl ViTLayer {
    fn new(cfg: &ViTConfig, c: Ctx, seed: u64) -> Result<ViTLayer> {
        let (d, eps) = (cfg.hidden_size, cfg.layer_norm_eps);
        Ok(ViTLayer {
            attention: SelfAttention::new(d, cfg.num_attention_heads, c, seed)?,
            output: linear("dense", d, d, c, seed.wrapping_add(3))?,
            mlp: FeedForward::new(d, cfg.intermediate_size, c, seed.wrapping_add(4))?,
            layernorm_before: layer_norm("layernorm_before", d, eps, c)?,
            layernorm_after: layer_norm("layernorm_after", d, eps, c)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let normed = self.layernorm_before.forward(x)?;
        let a = {
            let _s = scope("attention");
            let ctx = {
                let _a = scope("attention");
                self.attention.forward(&normed, None)?
            };
            let _o = scope("output");
            self.output.forward(&ctx)?
        };
        // The residual sums write over the projections' outputs (buffer reuse).
        let h = a.add_owned(x)?;
        self.mlp
            .forward(&self.layernorm_after.forward(&h)?)?
            .add_owned(&h)
    }

    fn leaves(&self, p: &str) -> Leaves<'_> {
        let mut v = self.attention.leaves(&format!("{p}.attention.attention"));
        v.push((format!("{p}.attention.output.dense"), &self.output));
        v.push((format!("{p}.intermediate.dense"), &self.mlp.intermediate));
        v.push((format!("{p}.output.dense"), &self.mlp.output));
        v.push((format!("{p}.layernorm_before"), &self.layernorm_before));
        v.push((format!("{p}.layernorm_after"), &self.layernorm_after));
        v
    }

    fn leaves_mut(&mut self, p: &str) -> LeavesMut<'_> {
        let mut v = self
            .attention
            .leaves_mut(&format!("{p}.attention.attention"));
        v.push((format!("{p}.attention.output.dense"), &mut self.output));
        v.push((
            format!("{p}.intermediate.dense"),
            &mut self.mlp.intermediate,
        ));
        v.push((format!("{p}.output.dense"), &mut self.mlp.output));
        v.push((format!("{p}.layernorm_before"), &mut self.layernorm_before));
        v.push((format!("{p}.layernorm_after"), &mut self.layernorm_after));
        v
    }
}

/// Hugging Face's `ViTModel`: patch projection (a `patch_size`-strided
/// convolution), `[CLS]` token, learned position embeddings, pre-norm
/// encoder layers, final `layernorm`, optional tanh pooler on `[CLS]`.
/// No dropout (Hugging Face's probabilities are 0 by default).
pub struct ViT {
    config: ViTConfig,
    cls_token: Param,
    position_embeddings: Param,
    projection: Conv2d,
    layers: Vec<ViTLayer>,
    layernorm: LayerNorm,
    pooler: Option<Linear>,
    checkpointing: bool,
}

impl ViT {
    /// Loads a Hugging Face `ViTModel` state dict in one call, whichever
    /// transformers version wrote it: the classic names, or transformers 5's
    /// `layers.N.attention.q_proj…` (mapped by [`classic_vit_name`]); then as
    /// [`crate::io::load_state_dict`] (every name, shape and dtype checked).
    pub fn load_hf_state_dict(
        &self,
        tensors: &std::collections::BTreeMap<String, Tensor>,
        options: crate::io::LoadOptions,
    ) -> Result<crate::io::LoadReport> {
        let mapped = tensors
            .iter()
            .map(|(n, t)| (classic_vit_name(n), t.clone()))
            .collect();
        crate::io::load_state_dict(self, &mapped, options)
    }

    /// A ViT of `config`, initialised as Hugging Face's `_init_weights`
    /// (every weight and learned token N(0, 0.02²), biases 0, LayerNorms
    /// 1 and 0; seeded), ready for [`crate::io::load_state_dict`].
    pub fn new(config: ViTConfig, dtype: DType, device: Device, seed: u64) -> Result<ViT> {
        let cfg = config;
        let d = cfg.hidden_size;
        let sizes = [
            cfg.num_hidden_layers,
            cfg.intermediate_size,
            cfg.num_channels,
        ];
        check_sizes("ViT", &sizes, d, cfg.num_attention_heads)?;
        if cfg.patch_size == 0 || !cfg.image_size.is_multiple_of(cfg.patch_size) {
            return Err(Error::InvalidArgument {
                op: "ViT",
                msg: format!(
                    "patch {} must divide image {}",
                    cfg.patch_size, cfg.image_size
                ),
            });
        }
        let c = (dtype, device);
        let p = cfg.patch_size;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| ViTLayer::new(&cfg, c, seed.wrapping_add(100 * (i as u64 + 1))))
            .collect::<Result<_>>()?;
        let tokens = cfg.num_patches() + 1;
        Ok(ViT {
            config,
            cls_token: Param::new("cls_token", &[1, 1, d], c, seed)?,
            position_embeddings: Param::new("position_embeddings", &[1, tokens, d], c, seed + 1)?,
            projection: Conv2d::builder(cfg.num_channels, d, p)
                .name("projection")
                .stride(p)
                .weight_init(Init::normal(INITIALIZER_RANGE))
                .bias_init(Init::zeros())
                .dtype(dtype)
                .seed(seed + 2)
                .build(&device)?,
            layers,
            layernorm: layer_norm("layernorm", d, cfg.layer_norm_eps, c)?,
            pooler: cfg
                .add_pooling_layer
                .then(|| linear("dense", d, d, c, seed.wrapping_add(7)))
                .transpose()?,
            checkpointing: false,
        })
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> ViTConfig {
        self.config
    }

    /// Runs each encoder layer as a checkpointed segment when `on` (Hugging Face's
    /// `gradient_checkpointing_enable()`): forward keeps only each encoder layer's
    /// input, backward runs the encoder layer again; gradients are unchanged, one
    /// more forward of the encoder layers is the cost. Off by default.
    pub fn gradient_checkpointing(&mut self, on: bool) {
        self.checkpointing = on;
    }

    /// Whether [`ViT::gradient_checkpointing`] is on.
    pub fn is_gradient_checkpointing(&self) -> bool {
        self.checkpointing
    }

    /// The last hidden state `[N, patches + 1, hidden]` of images
    /// `[N, num_channels, image_size, image_size]` and, with a pooler, the
    /// pooled `[CLS]` vector `[N, hidden]`.
    pub fn encode(&self, images: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        let cfg = &self.config;
        let s = images.shape();
        if s.len() != 4
            || s[1] != cfg.num_channels
            || s[2] != cfg.image_size
            || s[3] != cfg.image_size
        {
            return Err(Error::ShapeMismatch {
                op: "ViT",
                lhs: vec![0, cfg.num_channels, cfg.image_size, cfg.image_size],
                rhs: s.to_vec(),
            });
        }
        let (n, d) = (s[0], cfg.hidden_size);
        let mut h = {
            let _s = scope("embeddings");
            let patches = {
                let _p = scope("patch_embeddings");
                self.projection
                    .forward(images)?
                    .flatten(2, -1)?
                    .transpose(1, 2)?
            };
            let cls = self.cls_token.value.broadcast_to(&[n, 1, d])?;
            Tensor::cat(&[&cls, &patches], 1)?.add(&self.position_embeddings.value)?
        };
        {
            let _e = scope("encoder");
            for (i, layer) in self.layers.iter().enumerate() {
                let _l = scope(format!("layer.{i}"));
                h = match self.checkpointing {
                    true => checkpoint_block(layer, &[&h], |l, xs| l.forward(&xs[0]))?,
                    false => layer.forward(&h)?,
                };
            }
        }
        let h = self.layernorm.forward(&h)?;
        let pooled = self.pooler.as_ref().map(|p| pool(p, &h)).transpose()?;
        Ok((h, pooled))
    }

    /// Makes each parameter require grad exactly when `want(name)` is true
    /// (state-dict names); values are kept. Frozen layers then save only
    /// what the remaining gradients need.
    pub fn set_requires_grad(&mut self, mut want: impl FnMut(&str) -> bool) -> Result<()> {
        leaf_set_requires_grad(self.leaves_mut(), &mut want)
    }

    fn leaves(&self) -> Leaves<'_> {
        let mut v: Leaves = vec![
            ("embeddings".into(), &self.cls_token),
            ("embeddings".into(), &self.position_embeddings),
            (
                "embeddings.patch_embeddings.projection".into(),
                &self.projection,
            ),
        ];
        for (i, l) in self.layers.iter().enumerate() {
            v.extend(l.leaves(&format!("encoder.layer.{i}")));
        }
        v.push(("layernorm".into(), &self.layernorm));
        v.extend(
            self.pooler
                .as_ref()
                .map(|p| ("pooler.dense".into(), p as &dyn Module)),
        );
        v
    }

    fn leaves_mut(&mut self) -> LeavesMut<'_> {
        let mut v: LeavesMut = vec![
            ("embeddings".into(), &mut self.cls_token as &mut dyn Leaf),
            ("embeddings".into(), &mut self.position_embeddings),
            (
                "embeddings.patch_embeddings.projection".into(),
                &mut self.projection,
            ),
        ];
        for (i, l) in self.layers.iter_mut().enumerate() {
            v.extend(l.leaves_mut(&format!("encoder.layer.{i}")));
        }
        v.push(("layernorm".into(), &mut self.layernorm));
        v.extend(
            self.pooler
                .as_mut()
                .map(|p| ("pooler.dense".into(), p as &mut dyn Leaf)),
        );
        v
    }
}

impl Module for ViT {
    /// The last hidden state `[N, patches + 1, hidden]` of images `[N, C, H, W]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.encode(x)?.0)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        leaf_params(self.leaves())
    }

    fn parameter_kinds(&self) -> Vec<(String, LayerKind)> {
        leaf_kinds(self.leaves())
    }
}
