//! `torch.nn.MultiheadAttention` (batch-first, `need_weights=False`):
//! input projections by matmul (+ bias), heads split by reshape/permute
//! views, the fused [`scaled_dot_product_attention`], then `out_proj`.

use super::{scaled_dot_product_attention, SdpaOptions};
use crate::memory::scope;
use crate::nn::{Linear, Module};
use crate::rng::Generator;
use crate::{DType, Device, Error, Result, Tensor};

const OP: &str = "multihead_attention";

/// Masking options of [`MultiheadAttention::attention`].
#[derive(Clone, Default)]
pub struct MhaOptions {
    /// Top-left aligned causal mask.
    pub causal: bool,
    /// A float mask added to the scores, or a U8 mask where nonzero means
    /// "may attend" (the SDPA convention, the inverse of PyTorch
    /// `MultiheadAttention`'s boolean mask); shape broadcastable to
    /// `[B, H, Lq, Lk]` (e.g. `[Lq, Lk]`) or `[B·H, Lq, Lk]`.
    pub attn_mask: Option<Tensor>,
}

/// Multi-head attention with PyTorch's parameters: `in_proj_weight`
/// `[3E, E]` (xavier-uniform), `in_proj_bias` `[3E]` (zeros),
/// `out_proj.weight` `[E, E]` (uniform ±1/√E, like `Linear`) and
/// `out_proj.bias` `[E]` (zeros). Saves for backward only what its parts
/// save: the projections' matmuls (input if the weight needs grad, weight if
/// the input does) and the fused attention's lean set (the per-head Q/K/V
/// are views of the projections, so keeping them keeps those storages).
/// Dropout (training mode) on the attention probabilities is drawn from its
/// own Philox generator and replayed, never stored.
#[derive(Clone)]
pub struct MultiheadAttention {
    /// `[3E, E]`: the stacked query, key and value projections.
    pub in_proj_weight: Tensor,
    /// `[3E]`, if any.
    pub in_proj_bias: Option<Tensor>,
    /// The output projection.
    pub out_proj: Linear,
    embed_dim: usize,
    num_heads: usize,
    dropout: f64,
    training: bool,
    generator: Generator,
    name: String,
}

/// Builds a [`MultiheadAttention`]: [`MultiheadAttention::builder`], then
/// the settings that differ from the defaults, then
/// [`build`](MultiheadAttentionBuilder::build).
#[derive(Clone, Debug)]
pub struct MultiheadAttentionBuilder {
    embed_dim: usize,
    num_heads: usize,
    dropout: f64,
    bias: bool,
    dtype: DType,
    seed: u64,
    name: String,
}

impl MultiheadAttentionBuilder {
    /// The layer's name in scopes and reports (default:
    /// `multihead_attention`).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// Dropout probability on the attention probabilities in training mode
    /// (in `[0, 1]`; default: 0).
    pub fn dropout(mut self, p: f64) -> Self {
        self.dropout = p;
        self
    }

    /// Whether the input and output projections have biases (default:
    /// true, as PyTorch).
    pub fn bias(mut self, bias: bool) -> Self {
        self.bias = bias;
        self
    }

    /// The parameters' dtype (default: f32).
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    /// The seed the Philox streams are derived from (default: 0): the input
    /// projection uses `seed`, `out_proj` `seed ^ 0x0a7`, the dropout
    /// generator `seed ^ 0xd50`.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The layer on `device`, in training mode; an error unless `num_heads`
    /// divides `embed_dim` and the dropout is in `[0, 1]`.
    pub fn build(&self, device: &Device) -> Result<MultiheadAttention> {
        let (embed_dim, num_heads, dropout) = (self.embed_dim, self.num_heads, self.dropout);
        let (bias, dtype, device, seed) = (self.bias, self.dtype, *device, self.seed);
        if num_heads == 0 || !embed_dim.is_multiple_of(num_heads) {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: format!("embed_dim {embed_dim} is not divisible by num_heads {num_heads}"),
            });
        }
        if !(0.0..=1.0).contains(&dropout) {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: format!("dropout {dropout} is not in [0, 1]"),
            });
        }
        let e = embed_dim;
        let bound = (6.0 / (e + 3 * e) as f64).sqrt();
        let in_proj_weight = Tensor::rand_range(&[3 * e, e], -bound, bound, dtype, device, seed)?
            .into_parameter()?;
        let in_proj_bias = if bias {
            Some(Tensor::zeros(&[3 * e], dtype, device)?.into_parameter()?)
        } else {
            None
        };
        let mut out_proj = Linear::builder(e, e)
            .name("out_proj")
            .bias(bias)
            .dtype(dtype)
            .seed(seed ^ 0x0a7)
            .build(&device)?;
        if bias {
            out_proj.bias = Some(Tensor::zeros(&[e], dtype, device)?.into_parameter()?);
        }
        Ok(MultiheadAttention {
            in_proj_weight,
            in_proj_bias,
            out_proj,
            embed_dim,
            num_heads,
            dropout,
            training: true,
            generator: Generator::new(seed ^ 0xd50),
            name: self.name.clone(),
        })
    }
}

impl MultiheadAttention {
    /// A builder of a layer with `num_heads` heads over `embed_dim`
    /// features (which they must divide), with PyTorch's defaults (no
    /// dropout, biases), f32, seed 0, named `multihead_attention`.
    pub fn builder(embed_dim: usize, num_heads: usize) -> MultiheadAttentionBuilder {
        MultiheadAttentionBuilder {
            embed_dim,
            num_heads,
            dropout: 0.0,
            bias: true,
            dtype: DType::F32,
            seed: 0,
            name: OP.into(),
        }
    }

    /// `x · W[i·E..(i+1)·E]ᵀ + b[i·E..]` for projection `i` (0 q, 1 k, 2 v).
    fn project(&self, x: &Tensor, i: usize) -> Result<Tensor> {
        let e = self.embed_dim;
        let w = self.in_proj_weight.narrow(0, i * e, e)?;
        let y = x.matmul(&w.t()?)?;
        match &self.in_proj_bias {
            Some(b) => y.add_owned(&b.narrow(0, i * e, e)?),
            None => Ok(y),
        }
    }

    /// `[B, L, E]` → `[B, H, L, E/H]` (a view).
    fn heads(&self, t: &Tensor) -> Result<Tensor> {
        let (b, l) = (t.shape()[0], t.shape()[1]);
        let (h, d) = (self.num_heads, self.embed_dim / self.num_heads);
        t.reshape(&[b, l, h, d])?.permute(&[0, 2, 1, 3])
    }

    fn check_input(&self, x: &Tensor, what: &str) -> Result<()> {
        if x.rank() != 3 || x.shape()[2] != self.embed_dim {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: format!(
                    "{what} must be [B, L, {}], got {:?}",
                    self.embed_dim,
                    x.shape()
                ),
            });
        }
        Ok(())
    }

    /// Attention of `query` `[B, Lq, E]` over `key` `[B, Lk, E]` and
    /// `value` `[B, Lk, E]` (batch first), returning `[B, Lq, E]`. When the
    /// three are the same tensor one `[B, L, 3E]` projection is made.
    pub fn attention(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        opts: &MhaOptions,
    ) -> Result<Tensor> {
        self.check_input(query, "query")?;
        self.check_input(key, "key")?;
        self.check_input(value, "value")?;
        let (b, lq, lk) = (query.shape()[0], query.shape()[1], key.shape()[1]);
        if key.shape()[0] != b || value.shape()[0] != b || value.shape()[1] != lk {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: format!(
                    "query/key/value shapes {:?} {:?} {:?} do not match",
                    query.shape(),
                    key.shape(),
                    value.shape()
                ),
            });
        }
        let _s = scope(self.name.clone());
        let (h, e) = (self.num_heads, self.embed_dim);
        let same = |a: &Tensor, c: &Tensor| {
            a.shares_storage_with(c)
                && a.layout() == c.layout()
                && a.requires_grad() == c.requires_grad()
        };
        let (q, k, v) = if same(query, key) && same(key, value) {
            let w = self.in_proj_weight.t()?;
            let mut y = query.matmul(&w)?;
            if let Some(bias) = &self.in_proj_bias {
                y = y.add_owned(bias)?;
            }
            let y = y
                .reshape(&[b, lq, 3, h, e / h])?
                .permute(&[2, 0, 3, 1, 4])?;
            let part = |i: usize| y.narrow(0, i, 1)?.squeeze(0);
            (part(0)?, part(1)?, part(2)?)
        } else {
            let q = self.heads(&self.project(query, 0)?)?;
            let k = self.heads(&self.project(key, 1)?)?;
            (q, k, self.heads(&self.project(value, 2)?)?)
        };
        let mut sd = SdpaOptions::default().causal(opts.causal);
        if let Some(m) = &opts.attn_mask {
            let m = if m.rank() == 3 && m.shape()[0] == b * h {
                m.detach().reshape(&[b, h, m.shape()[1], m.shape()[2]])?
            } else {
                m.clone()
            };
            sd = sd.mask(m);
        }
        if self.training && self.dropout > 0.0 {
            let (seed, offset) = self.generator.reserve((b * h * lq * lk) as u64);
            sd = sd.dropout(self.dropout, seed, offset);
        }
        let o = scaled_dot_product_attention(&q, &k, &v, &sd)?;
        let o = o.permute(&[0, 2, 1, 3])?.reshape(&[b, lq, e])?;
        self.out_proj.forward(&o)
    }

    /// The number of heads.
    pub fn num_heads(&self) -> usize {
        self.num_heads
    }

    /// The generator dropout masks are drawn from.
    pub fn generator(&self) -> &Generator {
        &self.generator
    }
}

impl Module for MultiheadAttention {
    /// Self-attention: `attention(x, x, x)` with no mask.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.attention(x, x, x, &MhaOptions::default())
    }

    fn parameter_kinds(&self) -> Vec<(String, crate::nn::LayerKind)> {
        crate::nn::parameters_of_kind(self, crate::nn::LayerKind::Linear)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = vec![("in_proj_weight".to_string(), self.in_proj_weight.clone())];
        p.extend(
            self.in_proj_bias
                .clone()
                .map(|b| ("in_proj_bias".to_string(), b)),
        );
        for (n, t) in self.out_proj.named_parameters() {
            p.push((format!("out_proj.{n}"), t));
        }
        p
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}
