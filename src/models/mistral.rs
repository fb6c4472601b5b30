//! A Mistral-style decoder (Llama's family) as Hugging Face's
//! `MistralForCausalLM` (`model.embed_tokens`, `model.layers.N.{
//! input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
//! mlp.{gate,up,down}_proj}`, `model.norm`, `lm_head`): pre-norm blocks with
//! RMSNorm, rotary position embeddings ([`rotary_embedding`]) on queries
//! and keys, grouped-query causal attention (`num_key_value_heads` key and
//! value heads shared by the query heads, never repeated in memory), an
//! optional sliding window, and the SwiGLU MLP ([`Tensor::silu_mul`]). No
//! biases, no dropout. Any size: [`MistralConfig::mistral_7b`] or your own.

use super::checkpoint_block;
use super::transformer::{
    key_mask, leaf_kinds, leaf_params, leaf_set_requires_grad, Leaf, Leaves, LeavesMut, TextInput,
    INITIALIZER_RANGE,
};
use super::Ctx;
use crate::memory::scope;
use crate::nn::{
    rotary_embedding, scaled_dot_product_attention, Embedding, Init, LayerKind, Linear, Module,
    RMSNorm, RotaryOptions, SdpaOptions,
};
use crate::ops::CrossEntropyOptions;
use crate::{DType, Device, Error, Result, Tensor};

/// The shape of a [`Mistral`] (Hugging Face's `MistralConfig` fields).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MistralConfig {
    /// Rows of the token table (and logits per position).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (divides the query heads; equal: multi-head
    /// attention, 1: multi-query).
    pub num_key_value_heads: usize,
    /// Features per head (`hidden_size / num_attention_heads` in
    /// Mistral-7B; any even size).
    pub head_dim: usize,
    /// Longest sequence the model accepts.
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// The rotary embeddings' base (`rope_theta`).
    pub rope_theta: f64,
    /// Keys a query sees at most (itself included), `None` for all
    /// earlier ones (Hugging Face's `sliding_window`).
    pub sliding_window: Option<usize>,
    /// Whether `lm_head` is the token table itself.
    pub tie_word_embeddings: bool,
}

impl MistralConfig {
    /// Mistral-7B v0.1 (7.24B parameters: 32 layers of width 4096, 32
    /// query and 8 key/value heads of 128, MLP 14336, vocabulary 32000,
    /// sliding window 4096).
    pub fn mistral_7b() -> MistralConfig {
        MistralConfig {
            vocab_size: 32000,
            hidden_size: 4096,
            intermediate_size: 14336,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: 8,
            head_dim: 128,
            max_position_embeddings: 32768,
            rms_norm_eps: 1e-5,
            rope_theta: 10_000.0,
            sliding_window: Some(4096),
            tie_word_embeddings: false,
        }
    }

    /// A tiny decoder for tests: vocabulary 64, width 32, 2 layers, 4
    /// query heads sharing 2 key/value heads of 8 features, MLP 48, 32
    /// positions, a sliding window of 5.
    pub fn tiny() -> MistralConfig {
        MistralConfig {
            vocab_size: 64,
            hidden_size: 32,
            intermediate_size: 48,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 8,
            max_position_embeddings: 32,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            sliding_window: Some(5),
            tie_word_embeddings: false,
        }
    }

    /// The number of parameters, in checked arithmetic (`None` past
    /// `usize`).
    pub fn parameter_count(&self) -> Option<usize> {
        let (d, i) = (self.hidden_size, self.intermediate_size);
        let q = self.num_attention_heads.checked_mul(self.head_dim)?;
        let kv = self.num_key_value_heads.checked_mul(self.head_dim)?;
        let attn = d.checked_mul(q.checked_mul(2)?.checked_add(kv.checked_mul(2)?)?)?;
        let mlp = d.checked_mul(i)?.checked_mul(3)?;
        let layer = attn.checked_add(mlp)?.checked_add(d.checked_mul(2)?)?;
        let table = self.vocab_size.checked_mul(d)?;
        let head = if self.tie_word_embeddings { 0 } else { table };
        layer
            .checked_mul(self.num_hidden_layers)?
            .checked_add(table)?
            .checked_add(head)?
            .checked_add(d)
    }

    /// Sizes positive, heads dividing each other, an even head size, a
    /// positive window, a positive finite base and epsilon.
    pub(crate) fn check(&self) -> Result<()> {
        let sizes = [
            self.vocab_size,
            self.hidden_size,
            self.intermediate_size,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.max_position_embeddings,
            self.head_dim,
            self.sliding_window.unwrap_or(1),
        ];
        let bad = |msg: String| Error::InvalidArgument { op: "Mistral", msg };
        let (h, kv) = (self.num_attention_heads, self.num_key_value_heads);
        if sizes.contains(&0) || !h.is_multiple_of(kv) {
            return Err(bad(format!(
                "sizes must be positive and num_key_value_heads ({kv}) must divide \
                 num_attention_heads ({h}): {self:?}"
            )));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(bad(format!("head_dim {} must be even", self.head_dim)));
        }
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !positive(self.rope_theta) || !positive(self.rms_norm_eps) {
            return Err(bad(format!(
                "rope_theta ({}) and rms_norm_eps ({}) must be positive",
                self.rope_theta, self.rms_norm_eps
            )));
        }
        Ok(())
    }
}

/// A bias-free projection `cin → cout`, N(0, 0.02²) as Hugging Face's
/// `_init_weights`.
fn proj(name: &str, cin: usize, cout: usize, c: Ctx, seed: u64) -> Result<Linear> {
    Linear::builder(cin, cout)
        .name(name)
        .bias(false)
        .weight_init(Init::normal(INITIALIZER_RANGE))
        .dtype(c.0)
        .seed(seed)
        .build(&c.1)
}

/// An RMSNorm over `d` features (weight 1).
fn rms(name: &str, d: usize, eps: f64, c: Ctx) -> Result<RMSNorm> {
    RMSNorm::builder(&[d])
        .name(name)
        .eps(Some(eps))
        .dtype(c.0)
        .build(&c.1)
}

/// What every layer's attention shares: heads, head size, the rotary
/// options and the sliding window.
#[derive(Clone, Copy)]
struct Heads {
    q: usize,
    kv: usize,
    dim: usize,
    rope: RotaryOptions,
}

/// Grouped-query self-attention: `q_proj`, `k_proj`, `v_proj`, rotary
/// embeddings on queries and keys, causal attention, `o_proj`.
#[derive(Clone)]
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    heads: Heads,
}

impl Attention {
    /// `[B, L, width]` → `[B, heads, L, dim]` (a view).
    fn split(x: &Tensor, heads: usize, dim: usize) -> Result<Tensor> {
        let s = x.shape();
        x.reshape(&[s[0], s[1], heads, dim])?.permute(&[0, 2, 1, 3])
    }

    /// The attention output `[B, L, hidden]` of normed `x`, keys limited
    /// by `mask` (U8, broadcastable to `[B, heads, L, L]`) besides the
    /// causal order. Saves the rotated queries and keys and the values
    /// (un-repeated) for attention's backward, what the projections need,
    /// and nothing for the rotations.
    fn forward(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let h = self.heads;
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let q = Self::split(&self.q_proj.forward(x)?, h.q, h.dim)?;
        let k = Self::split(&self.k_proj.forward(x)?, h.kv, h.dim)?;
        let v = Self::split(&self.v_proj.forward(x)?, h.kv, h.dim)?;
        let (q, k) = {
            let _s = scope("rotary_emb");
            (rotary_embedding(&q, h.rope)?, rotary_embedding(&k, h.rope)?)
        };
        let mut opts = SdpaOptions::default().causal(true).gqa(h.q != h.kv);
        if let Some(m) = mask {
            opts = opts.mask(m.clone());
        }
        let o = scaled_dot_product_attention(&q, &k, &v, &opts)?;
        let o = o.permute(&[0, 2, 1, 3])?.reshape(&[b, l, h.q * h.dim])?;
        self.o_proj.forward(&o)
    }
}

/// One decoder layer: `x + o_proj(attn(input_layernorm(x)))`, then `h +
/// down_proj(silu(gate_proj(n)) · up_proj(n))` with `n =
/// post_attention_layernorm(h)`.
#[derive(Clone)]
struct Layer {
    input_layernorm: RMSNorm,
    self_attn: Attention,
    post_attention_layernorm: RMSNorm,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Layer {
    fn new(cfg: &MistralConfig, heads: Heads, c: Ctx, seed: u64) -> Result<Layer> {
        let (d, i, eps) = (cfg.hidden_size, cfg.intermediate_size, cfg.rms_norm_eps);
        let (q, kv) = (heads.q * heads.dim, heads.kv * heads.dim);
        Ok(Layer {
            input_layernorm: rms("input_layernorm", d, eps, c)?,
            self_attn: Attention {
                q_proj: proj("q_proj", d, q, c, seed)?,
                k_proj: proj("k_proj", d, kv, c, seed.wrapping_add(1))?,
                v_proj: proj("v_proj", d, kv, c, seed.wrapping_add(2))?,
                o_proj: proj("o_proj", q, d, c, seed.wrapping_add(3))?,
                heads,
            },
            post_attention_layernorm: rms("post_attention_layernorm", d, eps, c)?,
            gate_proj: proj("gate_proj", d, i, c, seed.wrapping_add(4))?,
            up_proj: proj("up_proj", d, i, c, seed.wrapping_add(5))?,
            down_proj: proj("down_proj", i, d, c, seed.wrapping_add(6))?,
        })
    }

    fn forward(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let normed = self.input_layernorm.forward(x)?;
        let a = {
            let _s = scope("self_attn");
            self.self_attn.forward(&normed, mask)?
        };
        // The residual sums write over the projections' outputs.
        let h = a.add_owned(x)?;
        let normed = self.post_attention_layernorm.forward(&h)?;
        let m = {
            let _s = scope("mlp");
            let gate = self.gate_proj.forward(&normed)?;
            let up = self.up_proj.forward(&normed)?;
            self.down_proj.forward(&gate.silu_mul(&up)?)?
        };
        m.add_owned(&h)
    }

    /// The layer's leaves in Hugging Face's order (attention, MLP, then the
    /// two norms, as `MistralDecoderLayer` registers them).
    fn leaves(&self, p: &str) -> Leaves<'_> {
        let a = &self.self_attn;
        vec![
            (format!("{p}.self_attn.q_proj"), &a.q_proj as &dyn Module),
            (format!("{p}.self_attn.k_proj"), &a.k_proj),
            (format!("{p}.self_attn.v_proj"), &a.v_proj),
            (format!("{p}.self_attn.o_proj"), &a.o_proj),
            (format!("{p}.mlp.gate_proj"), &self.gate_proj),
            (format!("{p}.mlp.up_proj"), &self.up_proj),
            (format!("{p}.mlp.down_proj"), &self.down_proj),
            (format!("{p}.input_layernorm"), &self.input_layernorm),
            (
                format!("{p}.post_attention_layernorm"),
                &self.post_attention_layernorm,
            ),
        ]
    }

    fn leaves_mut(&mut self, p: &str) -> LeavesMut<'_> {
        let a = &mut self.self_attn;
        vec![
            (
                format!("{p}.self_attn.q_proj"),
                &mut a.q_proj as &mut dyn Leaf,
            ),
            (format!("{p}.self_attn.k_proj"), &mut a.k_proj),
            (format!("{p}.self_attn.v_proj"), &mut a.v_proj),
            (format!("{p}.self_attn.o_proj"), &mut a.o_proj),
            (format!("{p}.mlp.gate_proj"), &mut self.gate_proj),
            (format!("{p}.mlp.up_proj"), &mut self.up_proj),
            (format!("{p}.mlp.down_proj"), &mut self.down_proj),
            (format!("{p}.input_layernorm"), &mut self.input_layernorm),
            (
                format!("{p}.post_attention_layernorm"),
                &mut self.post_attention_layernorm,
            ),
        ]
    }
}

/// A Mistral-style decoder with its language-model head (see the module
/// doc). Built from a [`MistralConfig`]; parameters named as Hugging
/// Face's `MistralForCausalLM` state dict.
pub struct Mistral {
    config: MistralConfig,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: RMSNorm,
    /// `None` when tied to `embed_tokens`.
    lm_head: Option<Linear>,
    checkpointing: bool,
}

impl Mistral {
    /// A decoder of `config`, initialised as Hugging Face's
    /// `_init_weights` (projections and the token table N(0, 0.02²),
    /// RMSNorm weights 1; seeded), ready for
    /// [`crate::io::load_state_dict`].
    pub fn new(config: MistralConfig, dtype: DType, device: Device, seed: u64) -> Result<Mistral> {
        let cfg = config;
        cfg.check()?;
        let c = (dtype, device);
        let heads = Heads {
            q: cfg.num_attention_heads,
            kv: cfg.num_key_value_heads,
            dim: cfg.head_dim,
            rope: RotaryOptions::default().theta(cfg.rope_theta),
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| Layer::new(&cfg, heads, c, seed.wrapping_add(100 * (i as u64 + 1))))
            .collect::<Result<_>>()?;
        let lm_head = match cfg.tie_word_embeddings {
            true => None,
            false => Some(proj(
                "lm_head",
                cfg.hidden_size,
                cfg.vocab_size,
                c,
                seed.wrapping_add(1),
            )?),
        };
        Ok(Mistral {
            config,
            embed_tokens: Embedding::builder(cfg.vocab_size, cfg.hidden_size)
                .name("embed_tokens")
                .weight_init(Init::normal(INITIALIZER_RANGE))
                .dtype(dtype)
                .seed(seed)
                .build(&device)?,
            layers,
            norm: rms("norm", cfg.hidden_size, cfg.rms_norm_eps, c)?,
            lm_head,
            checkpointing: false,
        })
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> MistralConfig {
        self.config
    }

    /// Runs each layer as a checkpointed segment when `on` (Hugging
    /// Face's `gradient_checkpointing_enable()`): forward keeps each
    /// layer's input, backward runs the layer again. Off by default.
    pub fn gradient_checkpointing(&mut self, on: bool) {
        self.checkpointing = on;
    }

    /// The keys each query may not see beyond the causal order: the
    /// sliding window (for sequences longer than it) and the padding of
    /// `attention_mask` `[B, L]` (1 = token, 0 = padding), as one U8 mask
    /// broadcastable to `[B, heads, L, L]`, or `None` when neither limits
    /// anything.
    fn mask(
        &self,
        batch: usize,
        len: usize,
        attention_mask: Option<&Tensor>,
    ) -> Result<Option<Tensor>> {
        let device = self.embed_tokens.weight.device();
        let window = self.config.sliding_window.filter(|&w| w < len);
        let window = match window {
            None => None,
            // Query i sees keys j with i − j < w (the causal flag removes
            // j > i): `i < j + w`, built where the model lives.
            Some(w) => {
                let i = Tensor::arange(len, DType::F64, device)?.reshape(&[len, 1])?;
                let j = Tensor::arange(len, DType::F64, device)?
                    .add_scalar(w as f64)?
                    .reshape(&[1, len])?;
                Some(i.lt(&j)?.reshape(&[1, 1, len, len])?)
            }
        };
        let padding = attention_mask
            .map(|m| key_mask(m, batch, len))
            .transpose()?;
        match (window, padding) {
            // Both: the window's entries where the key is a token, else 0.
            (Some(w), Some(p)) => {
                let zero = Tensor::zeros(&[], DType::U8, device)?;
                Ok(Some(Tensor::where_cond(&p, &w, &zero)?))
            }
            (w, p) => Ok(w.or(p)),
        }
    }

    /// The final hidden state `[B, L, hidden]` (after `model.norm`), keys
    /// limited by `attention_mask` (`[B, L]`, 1 = token, 0 = padding).
    pub fn hidden(&self, input: TextInput, attention_mask: Option<&Tensor>) -> Result<Tensor> {
        let x = match input {
            TextInput::Ids(ids) => {
                // The table scopes itself: `model.embed_tokens`.
                let _s = scope("model");
                self.embed_tokens.forward(ids)?
            }
            TextInput::Embeds(e) => e.clone(),
        };
        let s = x.shape().to_vec();
        let cfg = &self.config;
        if s.len() != 3 || s[2] != cfg.hidden_size || s[1] > cfg.max_position_embeddings {
            return Err(Error::ShapeMismatch {
                op: "Mistral",
                lhs: vec![0, cfg.max_position_embeddings, cfg.hidden_size],
                rhs: s,
            });
        }
        let mask = self.mask(s[0], s[1], attention_mask)?;
        let mut h = x;
        for (i, layer) in self.layers.iter().enumerate() {
            let _s = scope(format!("model.layers.{i}"));
            h = match (self.checkpointing, &mask) {
                (true, None) => checkpoint_block(layer, &[&h], |l, xs| l.forward(&xs[0], None))?,
                (true, Some(m)) => {
                    checkpoint_block(layer, &[&h, m], |l, xs| l.forward(&xs[0], Some(&xs[1])))?
                }
                (false, m) => layer.forward(&h, m.as_ref())?,
            };
        }
        let _s = scope("model");
        self.norm.forward(&h)
    }

    /// The head's weight `[vocab, hidden]` (the token table when tied).
    fn head_weight(&self) -> &Tensor {
        match &self.lm_head {
            Some(l) => &l.weight,
            None => &self.embed_tokens.weight,
        }
    }

    /// Logits `[B, L, vocab]`.
    pub fn logits(&self, input: TextInput, attention_mask: Option<&Tensor>) -> Result<Tensor> {
        let h = self.hidden(input, attention_mask)?;
        let _s = scope("lm_head");
        h.matmul(&self.head_weight().t()?)
    }

    /// The cross-entropy of the logits against `targets` (`[B·L]`, I64)
    /// without the logits: the head and the loss in one
    /// [`Tensor::linear_cross_entropy`], which holds at most a chunk of the
    /// `[B·L, vocab]` logits at a time.
    pub fn lm_loss(
        &self,
        input: TextInput,
        targets: &Tensor,
        opts: CrossEntropyOptions,
    ) -> Result<Tensor> {
        let h = self.hidden(input, None)?;
        let s = h.shape().to_vec();
        let _s = scope("lm_head");
        h.reshape(&[s[0] * s[1], s[2]])?.linear_cross_entropy(
            self.head_weight(),
            None,
            targets,
            opts,
        )
    }

    /// Makes each parameter require grad exactly when `want(name)` is true
    /// (state-dict names); values are kept.
    pub fn set_requires_grad(&mut self, mut want: impl FnMut(&str) -> bool) -> Result<()> {
        leaf_set_requires_grad(self.leaves_mut(), &mut want)
    }

    fn leaves(&self) -> Leaves<'_> {
        let mut v: Leaves = vec![("model.embed_tokens".into(), &self.embed_tokens)];
        for (i, l) in self.layers.iter().enumerate() {
            v.extend(l.leaves(&format!("model.layers.{i}")));
        }
        v.push(("model.norm".into(), &self.norm));
        if let Some(h) = &self.lm_head {
            v.push(("lm_head".into(), h));
        }
        v
    }

    fn leaves_mut(&mut self) -> LeavesMut<'_> {
        let mut v: LeavesMut = vec![(
            "model.embed_tokens".into(),
            &mut self.embed_tokens as &mut dyn Leaf,
        )];
        for (i, l) in self.layers.iter_mut().enumerate() {
            v.extend(l.leaves_mut(&format!("model.layers.{i}")));
        }
        v.push(("model.norm".into(), &mut self.norm));
        if let Some(h) = &mut self.lm_head {
            v.push(("lm_head".into(), h));
        }
        v
    }
}

impl Module for Mistral {
    /// Logits `[B, L, vocab]` of token ids `[B, L]` (I64 or U32).
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.logits(TextInput::Ids(ids), None)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        leaf_params(self.leaves())
    }

    fn parameter_kinds(&self) -> Vec<(String, LayerKind)> {
        leaf_kinds(self.leaves())
    }
}
