//! GPT-2 as Hugging Face's `GPT2Model` (`wte`, `wpe`, `h.N.{ln_1,
//! attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}`, `ln_f`), with
//! the language-model head tied to `wte` (`GPT2LMHeadModel`'s logits,
//! `h · wteᵀ`).

use super::checkpoint_block;
use super::transformer::{
    attend, check_sizes, layer_norm, leaf_kinds, leaf_params, leaf_set_requires_grad, Conv1D, Leaf,
    Leaves, LeavesMut, TextInput, INITIALIZER_RANGE,
};
use super::Ctx;
use crate::memory::scope;
use crate::nn::{Embedding, Init, LayerKind, LayerNorm, Module};
use crate::ops::CrossEntropyOptions;
use crate::{DType, Device, Error, Result, Tensor};

/// The shape of a [`Gpt2`] (Hugging Face's `GPT2Config` fields).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gpt2Config {
    /// Rows of the token table `wte` (and logits per position).
    pub vocab_size: usize,
    /// Longest sequence (rows of `wpe`).
    pub n_positions: usize,
    /// Width of the token vectors.
    pub n_embd: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Attention heads (must divide `n_embd`).
    pub n_head: usize,
    /// Width of the MLP (4·`n_embd` in GPT-2).
    pub n_inner: usize,
    /// LayerNorm epsilon (1e-5).
    pub layer_norm_epsilon: f64,
}

impl Gpt2Config {
    /// GPT-2 small (124M parameters).
    pub fn gpt2_small() -> Gpt2Config {
        Gpt2Config {
            vocab_size: 50257,
            n_positions: 1024,
            n_embd: 768,
            n_layer: 12,
            n_head: 12,
            n_inner: 3072,
            layer_norm_epsilon: 1e-5,
        }
    }

    /// A tiny GPT-2 for tests: vocabulary 50, 16 positions, width 16,
    /// 2 blocks, 2 heads, MLP width 32.
    pub fn tiny() -> Gpt2Config {
        Gpt2Config {
            vocab_size: 50,
            n_positions: 16,
            n_embd: 16,
            n_layer: 2,
            n_head: 2,
            n_inner: 32,
            layer_norm_epsilon: 1e-5,
        }
    }
}

/// One pre-norm block: `x + c_proj(attn(c_attn(ln_1(x))))`, then
/// `h + mlp.c_proj(gelu_new(mlp.c_fc(ln_2(h))))`.
#[derive(Clone)]
struct Block {
    ln_1: LayerNorm,
    c_attn: Conv1D,
    attn_proj: Conv1D,
    ln_2: LayerNorm,
    c_fc: Conv1D,
    mlp_proj: Conv1D,
    heads: usize,
}

impl Block {
    fn new(cfg: &Gpt2Config, c: Ctx, seed: u64) -> Result<Block> {
        let (d, eps) = (cfg.n_embd, cfg.layer_norm_epsilon);
        // The residual projections, scaled by 1/√(2·n_layer) (two residual
        // additions per block), as GPT-2's `_init_weights`.
        let proj = Init::normal(INITIALIZER_RANGE / (2.0 * cfg.n_layer as f64).sqrt());
        Ok(Block {
            ln_1: layer_norm("ln_1", d, eps, c)?,
            c_attn: Conv1D::builder(d, 3 * d)
                .name("c_attn")
                .dtype(c.0)
                .seed(seed)
                .build(&c.1)?,
            attn_proj: Conv1D::builder(d, d)
                .name("c_proj")
                .weight_init(proj)
                .dtype(c.0)
                .seed(seed.wrapping_add(1))
                .build(&c.1)?,
            ln_2: layer_norm("ln_2", d, eps, c)?,
            c_fc: Conv1D::builder(d, cfg.n_inner)
                .name("c_fc")
                .dtype(c.0)
                .seed(seed.wrapping_add(2))
                .build(&c.1)?,
            mlp_proj: Conv1D::builder(cfg.n_inner, d)
                .name("c_proj")
                .weight_init(proj)
                .dtype(c.0)
                .seed(seed.wrapping_add(3))
                .build(&c.1)?,
            heads: cfg.n_head,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let d = x.shape()[2];
        let normed = self.ln_1.forward(x)?;
        let a = {
            let _s = scope("attn");
            let qkv = self.c_attn.forward(&normed)?;
            let part = |i: usize| qkv.narrow(2, i * d, d);
            let ctx = attend(&part(0)?, &part(1)?, &part(2)?, self.heads, true, None)?;
            self.attn_proj.forward(&ctx)?
        };
        // The residual sums write over the projections' outputs (buffer reuse).
        let h = a.add_owned(x)?;
        let normed = self.ln_2.forward(&h)?;
        let m = {
            let _s = scope("mlp");
            let inner = self.c_fc.forward(&normed)?.gelu_owned(true)?;
            self.mlp_proj.forward(&inner)?
        };
        m.add_owned(&h)
    }

    fn leaves(&self, p: &str) -> Leaves<'_> {
        vec![
            (format!("{p}.ln_1"), &self.ln_1 as &dyn Module),
            (format!("{p}.attn.c_attn"), &self.c_attn),
            (format!("{p}.attn.c_proj"), &self.attn_proj),
            (format!("{p}.ln_2"), &self.ln_2),
            (format!("{p}.mlp.c_fc"), &self.c_fc),
            (format!("{p}.mlp.c_proj"), &self.mlp_proj),
        ]
    }

    fn leaves_mut(&mut self, p: &str) -> LeavesMut<'_> {
        vec![
            (format!("{p}.ln_1"), &mut self.ln_1 as &mut dyn Leaf),
            (format!("{p}.attn.c_attn"), &mut self.c_attn),
            (format!("{p}.attn.c_proj"), &mut self.attn_proj),
            (format!("{p}.ln_2"), &mut self.ln_2),
            (format!("{p}.mlp.c_fc"), &mut self.c_fc),
            (format!("{p}.mlp.c_proj"), &mut self.mlp_proj),
        ]
    }
}

/// GPT-2: token (`wte`) + position (`wpe`, a view: nothing saved)
/// embeddings, pre-norm blocks with causal attention and `gelu_new` (tanh
/// GELU, saves its input), `ln_f`, and logits `h · wteᵀ` (saves `h` when
/// `wte` needs grad). No dropout.
pub struct Gpt2 {
    config: Gpt2Config,
    wte: Embedding,
    wpe: Embedding,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    checkpointing: bool,
}

impl Gpt2 {
    /// A GPT-2 of `config`, initialised as Hugging Face's `_init_weights`
    /// (`wte`, `wpe`, `c_attn`, `c_fc` N(0, 0.02²); both `c_proj` N(0,
    /// (0.02/√(2·n_layer))²); biases 0; LayerNorms 1 and 0; seeded), ready
    /// for [`crate::io::load_state_dict`].
    pub fn new(config: Gpt2Config, dtype: DType, device: Device, seed: u64) -> Result<Gpt2> {
        let cfg = config;
        let d = cfg.n_embd;
        let sizes = [cfg.vocab_size, cfg.n_positions, cfg.n_layer, cfg.n_inner];
        check_sizes("Gpt2", &sizes, d, cfg.n_head)?;
        let c = (dtype, device);
        let blocks = (0..cfg.n_layer)
            .map(|i| Block::new(&cfg, c, seed.wrapping_add(100 * (i as u64 + 1))))
            .collect::<Result<_>>()?;
        Ok(Gpt2 {
            config,
            wte: Embedding::builder(cfg.vocab_size, d)
                .name("wte")
                .weight_init(Init::normal(INITIALIZER_RANGE))
                .dtype(dtype)
                .seed(seed)
                .build(&device)?,
            wpe: Embedding::builder(cfg.n_positions, d)
                .name("wpe")
                .weight_init(Init::normal(INITIALIZER_RANGE))
                .dtype(dtype)
                .seed(seed + 1)
                .build(&device)?,
            blocks,
            ln_f: layer_norm("ln_f", d, cfg.layer_norm_epsilon, c)?,
            checkpointing: false,
        })
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> Gpt2Config {
        self.config
    }

    /// Runs each block as a checkpointed segment when `on` (Hugging Face's
    /// `gradient_checkpointing_enable()`): forward keeps only each block's
    /// input, backward runs the block again; gradients are unchanged, one
    /// more forward of the blocks is the cost. Off by default.
    pub fn gradient_checkpointing(&mut self, on: bool) {
        self.checkpointing = on;
    }

    /// Whether [`Gpt2::gradient_checkpointing`] is on.
    pub fn is_gradient_checkpointing(&self) -> bool {
        self.checkpointing
    }

    /// The final hidden state `[B, L, n_embd]` (after `ln_f`).
    pub fn hidden(&self, input: TextInput) -> Result<Tensor> {
        let x = match input {
            TextInput::Ids(ids) => self.wte.forward(ids)?,
            TextInput::Embeds(e) => e.clone(),
        };
        let s = x.shape().to_vec();
        if s.len() != 3 || s[2] != self.config.n_embd || s[1] > self.config.n_positions {
            return Err(Error::ShapeMismatch {
                op: "Gpt2",
                lhs: vec![0, self.config.n_positions, self.config.n_embd],
                rhs: s,
            });
        }
        let pos = {
            let _s = scope("wpe");
            self.wpe.weight.narrow(0, 0, s[1])?
        };
        let mut h = x.add(&pos)?;
        for (i, block) in self.blocks.iter().enumerate() {
            let _s = scope(format!("h.{i}"));
            h = match self.checkpointing {
                true => checkpoint_block(block, &[&h], |b, xs| b.forward(&xs[0]))?,
                false => block.forward(&h)?,
            };
        }
        self.ln_f.forward(&h)
    }

    /// Logits `[B, L, vocab]` through the head tied to `wte`.
    pub fn logits(&self, input: TextInput) -> Result<Tensor> {
        let h = self.hidden(input)?;
        let _s = scope("lm_head");
        h.matmul(&self.wte.weight.t()?)
    }

    /// The cross-entropy of the next-token logits against `targets`
    /// (`[B·L]`, I64) without the logits: the tied head and the loss in one
    /// [`Tensor::linear_cross_entropy`], which holds at most a chunk of the
    /// `[B·L, vocab]` logits at a time. Equals `cross_entropy` of
    /// [`Gpt2::logits`] reshaped to `[B·L, vocab]`.
    pub fn lm_loss(
        &self,
        input: TextInput,
        targets: &Tensor,
        opts: CrossEntropyOptions,
    ) -> Result<Tensor> {
        let h = self.hidden(input)?;
        let s = h.shape().to_vec();
        let _s = scope("lm_head");
        h.reshape(&[s[0] * s[1], s[2]])?
            .linear_cross_entropy(&self.wte.weight, None, targets, opts)
    }

    /// Logits of token ids `[B, L]` (I64 or U32).
    pub fn forward_ids(&self, ids: &Tensor) -> Result<Tensor> {
        self.logits(TextInput::Ids(ids))
    }

    /// Logits of input embeddings `[B, L, n_embd]` (in place of `wte`).
    pub fn forward_embeds(&self, embeds: &Tensor) -> Result<Tensor> {
        self.logits(TextInput::Embeds(embeds))
    }

    /// Makes each parameter require grad exactly when `want(name)` is true
    /// (state-dict names); values are kept. Frozen layers then save only
    /// what the remaining gradients need.
    pub fn set_requires_grad(&mut self, mut want: impl FnMut(&str) -> bool) -> Result<()> {
        leaf_set_requires_grad(self.leaves_mut(), &mut want)
    }

    fn leaves(&self) -> Leaves<'_> {
        let mut v: Leaves = vec![("wte".into(), &self.wte), ("wpe".into(), &self.wpe)];
        for (i, b) in self.blocks.iter().enumerate() {
            v.extend(b.leaves(&format!("h.{i}")));
        }
        v.push(("ln_f".into(), &self.ln_f));
        v
    }

    fn leaves_mut(&mut self) -> LeavesMut<'_> {
        let mut v: LeavesMut = vec![
            ("wte".into(), &mut self.wte as &mut dyn Leaf),
            ("wpe".into(), &mut self.wpe),
        ];
        for (i, b) in self.blocks.iter_mut().enumerate() {
            v.extend(b.leaves_mut(&format!("h.{i}")));
        }
        v.push(("ln_f".into(), &mut self.ln_f));
        v
    }
}

impl Module for Gpt2 {
    /// Logits `[B, L, vocab]` of token ids `[B, L]` (I64).
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.forward_ids(ids)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        leaf_params(self.leaves())
    }

    fn parameter_kinds(&self) -> Vec<(String, LayerKind)> {
        leaf_kinds(self.leaves())
    }
}
