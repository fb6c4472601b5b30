//! Pieces shared by the transformer models ([`super::vit`], [`super::bert`],
//! [`super::gpt2`]): multi-head self-attention on
//! [`scaled_dot_product_attention`], the feed-forward pair, GPT-2's
//! `Conv1D`, a bare learned tensor ([`Param`]), and the bookkeeping that
//! turns a model's list of leaf layers into named parameters, layer kinds
//! and requires-grad switches.

use super::{prefixed, set_slot, Ctx};
use crate::memory::scope;
use crate::nn::{
    scaled_dot_product_attention, Conv2d, Embedding, Init, LayerKind, LayerNorm, Linear, Module,
    RMSNorm, SdpaOptions,
};
use crate::{DType, Device, Error, Result, Tensor};

/// The standard deviation of Hugging Face's normal initialisation
/// (`initializer_range`, 0.02 in the BERT, ViT and GPT-2 configurations):
/// a fresh transformer draws every Linear, Conv1D, patch projection,
/// embedding table and learned token N(0, 0.02²), with biases 0 and
/// LayerNorms weight 1, bias 0, as `_init_weights` does.
pub const INITIALIZER_RANGE: f64 = 0.02;

/// What a text model reads: token ids (I64 or U32 `[B, L]`) or input
/// embeddings (`[B, L, hidden]`, e.g. to differentiate with respect to
/// them).
#[derive(Clone, Copy)]
pub enum TextInput<'a> {
    /// Token ids `[B, L]`, looked up in the word embedding table.
    Ids(&'a Tensor),
    /// Input embeddings `[B, L, hidden]`, used in place of the lookup.
    Embeds(&'a Tensor),
}

/// A layer whose parameter tensors can be replaced in place (to make them
/// require grad or not).
pub(crate) trait Leaf: Module {
    /// Each parameter slot with its name relative to the layer.
    fn slots(&mut self) -> Vec<(String, &mut Tensor)>;
}

fn weight_bias<'a>(w: &'a mut Tensor, b: Option<&'a mut Tensor>) -> Vec<(String, &'a mut Tensor)> {
    let mut v = vec![("weight".to_string(), w)];
    v.extend(b.map(|b| ("bias".to_string(), b)));
    v
}

impl Leaf for Linear {
    fn slots(&mut self) -> Vec<(String, &mut Tensor)> {
        weight_bias(&mut self.weight, self.bias.as_mut())
    }
}

impl Leaf for Conv2d {
    fn slots(&mut self) -> Vec<(String, &mut Tensor)> {
        weight_bias(&mut self.weight, self.bias.as_mut())
    }
}

impl Leaf for LayerNorm {
    fn slots(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut v: Vec<(String, &mut Tensor)> = Vec::new();
        v.extend(self.weight.as_mut().map(|w| ("weight".to_string(), w)));
        v.extend(self.bias.as_mut().map(|b| ("bias".to_string(), b)));
        v
    }
}

impl Leaf for RMSNorm {
    fn slots(&mut self) -> Vec<(String, &mut Tensor)> {
        self.weight
            .as_mut()
            .map(|w| ("weight".to_string(), w))
            .into_iter()
            .collect()
    }
}

impl Leaf for Embedding {
    fn slots(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![("weight".to_string(), &mut self.weight)]
    }
}

/// Leaf layers of a model in state-dict order, each under its prefix.
pub(crate) type Leaves<'a> = Vec<(String, &'a dyn Module)>;
/// [`Leaves`], mutable.
pub(crate) type LeavesMut<'a> = Vec<(String, &'a mut dyn Leaf)>;

/// Named parameters of `leaves`, prefixed.
pub(crate) fn leaf_params(leaves: Leaves) -> Vec<(String, Tensor)> {
    leaves
        .into_iter()
        .flat_map(|(p, m)| prefixed(&p, m.named_parameters()))
        .collect()
}

/// Layer kinds of `leaves`' parameters, prefixed.
pub(crate) fn leaf_kinds(leaves: Leaves) -> Vec<(String, LayerKind)> {
    leaves
        .into_iter()
        .flat_map(|(p, m)| {
            m.parameter_kinds()
                .into_iter()
                .map(move |(n, k)| (format!("{p}.{n}"), k))
        })
        .collect()
}

/// Makes each parameter of `leaves` require grad exactly when `want(name)`.
pub(crate) fn leaf_set_requires_grad(
    leaves: LeavesMut,
    want: &mut dyn FnMut(&str) -> bool,
) -> Result<()> {
    for (p, leaf) in leaves {
        for (n, slot) in leaf.slots() {
            set_slot(slot, &format!("{p}.{n}"), want)?;
        }
    }
    Ok(())
}

/// A learned tensor used as is (ViT's `cls_token`, `position_embeddings`);
/// its [`LayerKind`] is `Other`. Saves nothing itself.
#[derive(Clone)]
pub struct Param {
    /// The value (a parameter).
    pub value: Tensor,
    name: String,
}

impl Param {
    /// A parameter of `shape` drawn from N(0, 0.02²) (seeded; on the meta
    /// device a data-less tensor of the same shape, nothing drawn). Hugging
    /// Face's ViT truncates this normal at ±2, i.e. ±100σ: the same
    /// distribution in practice.
    pub fn new(name: &str, shape: &[usize], c: Ctx, seed: u64) -> Result<Param> {
        let value = Init::normal(INITIALIZER_RANGE)
            .tensor_for("Param", shape, None, c, seed)?
            .into_parameter()?;
        Ok(Param {
            value,
            name: name.to_string(),
        })
    }
}

impl Param {
    /// A parameter of `shape` with every element `value` (ConvNeXt's
    /// `layer_scale`, `1e-6`); nothing is drawn.
    pub fn constant(name: &str, shape: &[usize], value: f64, c: Ctx) -> Result<Param> {
        let value = Init::Constant(value)
            .tensor_for("Param", shape, None, c, 0)?
            .into_parameter()?;
        Ok(Param {
            value,
            name: name.to_string(),
        })
    }
}

impl Module for Param {
    /// Returns the parameter itself; the argument is ignored.
    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        Ok(self.value.clone())
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![(self.name.clone(), self.value.clone())]
    }
}

impl Leaf for Param {
    fn slots(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![(self.name.clone(), &mut self.value)]
    }
}

/// GPT-2's `Conv1D`: `y = x·W + b` with the weight stored `[in, out]`
/// (transposed with respect to [`Linear`]). Saves the input only if the
/// weight needs grad, the weight (a parameter, no extra bytes) only if the
/// input does; nothing for the bias.
#[derive(Clone)]
pub struct Conv1D {
    /// `[in_features, out_features]`.
    pub weight: Tensor,
    /// `[out_features]`.
    pub bias: Tensor,
    name: String,
}

/// Builds a [`Conv1D`]: [`Conv1D::builder`], then the settings that
/// differ from the defaults, then [`build`](Conv1DBuilder::build).
#[derive(Clone, Debug)]
pub struct Conv1DBuilder {
    nx: usize,
    nf: usize,
    dtype: DType,
    seed: u64,
    name: String,
    weight_init: Init,
}

impl Conv1D {
    /// A builder of a layer from `nx` to `nf` features, f32, seed 0, named
    /// `conv1d`, weight N(0, 0.02²).
    pub fn builder(nx: usize, nf: usize) -> Conv1DBuilder {
        Conv1DBuilder {
            nx,
            nf,
            dtype: DType::F32,
            seed: 0,
            name: "conv1d".into(),
            weight_init: Init::normal(INITIALIZER_RANGE),
        }
    }
}

impl Conv1DBuilder {
    /// The layer's name in scopes and reports (default: `conv1d`).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// The parameters' dtype (default: f32).
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    /// The seed of the Philox normal stream the weight is drawn from
    /// (default: 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// How the weight is drawn (default: N(0, 0.02²), as GPT-2's
    /// `_init_weights`; its residual projections `c_proj` use a smaller
    /// standard deviation).
    pub fn weight_init(mut self, init: Init) -> Self {
        self.weight_init = init;
        self
    }

    /// The layer on `device`: weight as [`Conv1DBuilder::weight_init`]
    /// says and zero bias, as GPT-2 initialises (on the meta device
    /// nothing is drawn).
    pub fn build(&self, device: &Device) -> Result<Conv1D> {
        let c = (self.dtype, *device);
        let shape = [self.nx, self.nf];
        let weight = (self.weight_init)
            .tensor_for("Conv1D", &shape, None, c, self.seed)?
            .into_parameter()?;
        let bias = Tensor::zeros(&[self.nf], c.0, c.1)?.into_parameter()?;
        Ok(Conv1D {
            weight,
            bias,
            name: self.name.clone(),
        })
    }
}

impl Module for Conv1D {
    /// `x·W + b` for `x` `[…, in_features]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        x.matmul(&self.weight)?.add_owned(&self.bias)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![
            ("weight".to_string(), self.weight.clone()),
            ("bias".to_string(), self.bias.clone()),
        ]
    }

    fn parameter_kinds(&self) -> Vec<(String, LayerKind)> {
        crate::nn::parameters_of_kind(self, LayerKind::Linear)
    }
}

impl Leaf for Conv1D {
    fn slots(&mut self) -> Vec<(String, &mut Tensor)> {
        weight_bias(&mut self.weight, Some(&mut self.bias))
    }
}

/// A LayerNorm over the last `dim` features.
pub(crate) fn layer_norm(name: &str, dim: usize, eps: f64, c: Ctx) -> Result<LayerNorm> {
    LayerNorm::builder(&[dim])
        .name(name)
        .eps(eps)
        .dtype(c.0)
        .build(&c.1)
}

/// A biased Linear layer `cin → cout`, weight N(0, 0.02²) and bias 0 as
/// Hugging Face initialises them.
pub(crate) fn linear(name: &str, cin: usize, cout: usize, c: Ctx, seed: u64) -> Result<Linear> {
    Linear::builder(cin, cout)
        .name(name)
        .weight_init(Init::normal(INITIALIZER_RANGE))
        .bias_init(Init::zeros())
        .dtype(c.0)
        .seed(seed)
        .build(&c.1)
}

/// Checks that `heads` divides `hidden` and every size is positive.
pub(crate) fn check_sizes(
    op: &'static str,
    sizes: &[usize],
    hidden: usize,
    heads: usize,
) -> Result<()> {
    if sizes.contains(&0) || heads == 0 || !hidden.is_multiple_of(heads) {
        return Err(Error::InvalidArgument {
            op,
            msg: format!(
                "sizes must be positive and heads ({heads}) must divide hidden ({hidden})"
            ),
        });
    }
    Ok(())
}

/// `[B, L, D]` → `[B, H, L, D/H]` (a view).
fn split_heads(x: &Tensor, heads: usize) -> Result<Tensor> {
    let s = x.shape();
    x.reshape(&[s[0], s[1], heads, s[2] / heads])?
        .permute(&[0, 2, 1, 3])
}

/// A padding mask `[B, L]` (1 = attend, 0 = padding; any dtype) as the
/// U8 key mask `[B, 1, 1, L]` of [`scaled_dot_product_attention`].
pub(crate) fn key_mask(mask: &Tensor, batch: usize, len: usize) -> Result<Tensor> {
    if mask.shape() != [batch, len] {
        return Err(Error::ShapeMismatch {
            op: "attention_mask",
            lhs: vec![batch, len],
            rhs: mask.shape().to_vec(),
        });
    }
    mask.detach()
        .to_dtype(DType::U8)?
        .reshape(&[batch, 1, 1, len])
}

/// Multi-head attention of `q`, `k`, `v` `[B, L, D]` → `[B, L, D]`,
/// heads merged back, with an optional U8 key mask `[B, 1, 1, L]`. Saves
/// what [`scaled_dot_product_attention`] saves; the head split/merge views
/// save shapes only (the merge copies once).
pub(crate) fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    heads: usize,
    causal: bool,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    let s = q.shape().to_vec();
    let (q, k, v) = (
        split_heads(q, heads)?,
        split_heads(k, heads)?,
        split_heads(v, heads)?,
    );
    let mut opts = SdpaOptions::default().causal(causal);
    if let Some(m) = mask {
        opts = opts.mask(m.clone());
    }
    let o = scaled_dot_product_attention(&q, &k, &v, &opts)?;
    o.permute(&[0, 2, 1, 3])?.reshape(&s)
}

/// BERT/ViT self-attention: separate `query`, `key`, `value` projections
/// then bidirectional attention; returns the merged context `[B, L, D]`
/// (the output projection belongs to the caller's `output.dense`).
#[derive(Clone)]
pub(crate) struct SelfAttention {
    pub(crate) query: Linear,
    pub(crate) key: Linear,
    pub(crate) value: Linear,
    heads: usize,
}

impl SelfAttention {
    /// Projections `hidden → hidden` for `heads` heads.
    pub(crate) fn new(hidden: usize, heads: usize, c: Ctx, seed: u64) -> Result<SelfAttention> {
        Ok(SelfAttention {
            query: linear("query", hidden, hidden, c, seed)?,
            key: linear("key", hidden, hidden, c, seed.wrapping_add(1))?,
            value: linear("value", hidden, hidden, c, seed.wrapping_add(2))?,
            heads,
        })
    }

    /// The attention context of `x` `[B, L, D]`, keys masked by `mask`
    /// (see [`key_mask`]).
    pub(crate) fn forward(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let (q, k, v) = (
            self.query.forward(x)?,
            self.key.forward(x)?,
            self.value.forward(x)?,
        );
        attend(&q, &k, &v, self.heads, false, mask)
    }

    /// `query`, `key`, `value` under `p`.
    pub(crate) fn leaves(&self, p: &str) -> Leaves<'_> {
        vec![
            (format!("{p}.query"), &self.query as &dyn Module),
            (format!("{p}.key"), &self.key),
            (format!("{p}.value"), &self.value),
        ]
    }

    /// [`SelfAttention::leaves`], mutable.
    pub(crate) fn leaves_mut(&mut self, p: &str) -> LeavesMut<'_> {
        vec![
            (format!("{p}.query"), &mut self.query as &mut dyn Leaf),
            (format!("{p}.key"), &mut self.key),
            (format!("{p}.value"), &mut self.value),
        ]
    }
}

/// The `intermediate.dense` → GELU → `output.dense` pair of BERT and ViT
/// (exact, erf-based GELU; it saves its input).
#[derive(Clone)]
pub(crate) struct FeedForward {
    pub(crate) intermediate: Linear,
    pub(crate) output: Linear,
}

impl FeedForward {
    /// `hidden → inner → hidden`.
    pub(crate) fn new(hidden: usize, inner: usize, c: Ctx, seed: u64) -> Result<FeedForward> {
        Ok(FeedForward {
            intermediate: linear("dense", hidden, inner, c, seed)?,
            output: linear("dense", inner, hidden, c, seed.wrapping_add(1))?,
        })
    }

    /// `output.dense(gelu(intermediate.dense(x)))`, each in its scope.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = {
            let _s = scope("intermediate");
            // Written over the projection's output where no gradient
            // flows (a frozen prefix); otherwise GELU keeps its input.
            self.intermediate.forward(x)?.gelu_owned(false)?
        };
        let _s = scope("output");
        self.output.forward(&h)
    }
}

/// `x[:, 0]` → `dense` → tanh: BERT's and ViT's pooler (tanh saves its
/// output).
pub(crate) fn pool(dense: &Linear, h: &Tensor) -> Result<Tensor> {
    let _s = scope("pooler");
    let first = h.narrow(1, 0, 1)?.squeeze(1)?;
    dense.forward(&first)?.tanh_owned()
}
