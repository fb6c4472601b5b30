//! Rotary position embeddings (RoPE) as one fused op: each row of the last
//! two dims `[.., L, D]` (a head's queries or keys) rotated pairwise by its
//! position's angles, in Hugging Face's "rotate half" layout (Llama,
//! Mistral, Qwen, GPT-NeoX): feature `i` pairs with `i + D/2`, and
//!
//! ```text
//! out[i]       = x[i]·cos θᵢ − x[i+D/2]·sin θᵢ
//! out[i+D/2]   = x[i+D/2]·cos θᵢ + x[i]·sin θᵢ,   θᵢ = p · base^(−2i/D)
//! ```
//!
//! for the row at position `p = start + row`. The angles are computed as
//! Hugging Face's `*RotaryEmbedding` does, in f32 whatever the tensor's
//! dtype (`inv_freq = 1/base^(2i/D)`, `θ = p·inv_freq`), and its cos and
//! sin rounded to the tensor's dtype; each product and the sum are rounded
//! to the dtype as PyTorch's `q·cos + rotate_half(q)·sin` rounds them, so
//! f16/bf16 results are PyTorch's bits.
//!
//! Backward is the inverse rotation of the output's gradient
//! (`dx = R(−θ)·g`), which needs only the geometry: **nothing is saved**
//! (PyTorch's composition keeps `cos` and `sin`, and `rotate_half`'s
//! concatenation keeps nothing but `q·cos` reads `q`: autograd saves the
//! `cos`/`sin` tables, once per model, and no activation).
//!
//! | op | requires grad | saved for backward | why |
//! |---|---|---|---|
//! | rotary_embedding | x | — (the geometry) | `dx = R(−θ)·g` |
//! | any | nothing | — (no node) | |
//!
//! Files: `cpu.rs` (the CPU kernel and the meta device's arm),
//! `cuda.rs` (launches), `rotary.cu` (the kernel), `tests.rs`.

mod cpu;
mod cuda;
#[cfg(test)]
mod tests;

use super::attention::View4;
use crate::autograd::{attach, needs_grad, BackwardOp};
use crate::meta::{backend, Backend};
use crate::ops::expect_float;
use crate::{Error, Result, Tensor};

const OP: &str = "rotary_embedding";

/// Options of [`rotary_embedding`]: the frequency base and the position of
/// the first row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RotaryOptions {
    /// The base of the frequencies (`rope_theta`; 10000 in Llama and
    /// Mistral-7B v0.1, 1e6 in later Mistral models).
    pub theta: f64,
    /// Position of row 0 (the tokens already in a cache; 0 for a whole
    /// sequence).
    pub start: usize,
}

impl Default for RotaryOptions {
    fn default() -> RotaryOptions {
        RotaryOptions {
            theta: 10_000.0,
            start: 0,
        }
    }
}

impl RotaryOptions {
    /// Sets the frequency base.
    pub fn theta(mut self, theta: f64) -> RotaryOptions {
        self.theta = theta;
        self
    }
    /// Sets the position of the first row.
    pub fn start(mut self, start: usize) -> RotaryOptions {
        self.start = start;
        self
    }
}

/// The geometry of one rotary call, the family's one geometry type: the
/// operand viewed as `[batch, heads, len, dim]` (`x`: where its elements
/// lie), the position of row 0, the base, and the sign of the sines (`+1`
/// forward, `−1` for backward's inverse rotation). `#[repr(C)]` as `struct
/// RotaryGeom` in `rotary.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RotaryGeom {
    /// Entries of the first dim (1 for rank 2).
    pub batch: i64,
    /// Entries of the second dim (1 for ranks 2 and 3).
    pub heads: i64,
    /// Rows (positions) per head.
    pub len: i64,
    /// Features per row (even).
    pub dim: i64,
    /// Where the operand's elements lie.
    pub x: View4,
    /// Position of row 0.
    pub start: i64,
    /// The frequency base.
    pub theta: f64,
    /// `+1` (forward) or `−1` (backward).
    pub sin_sign: f64,
}

impl RotaryGeom {
    /// Rows of all heads: `batch·heads·len`.
    pub fn rows(&self) -> usize {
        (self.batch * self.heads * self.len) as usize
    }

    /// Half the feature size: the rotated pairs per row.
    pub fn half(&self) -> usize {
        (self.dim / 2) as usize
    }

    /// Elements of the (contiguous) result.
    pub fn numel(&self) -> usize {
        self.rows() * self.dim as usize
    }
}

/// The geometry of `t` (rank 2 to 4, last dim even), read in place.
fn geometry(t: &Tensor, opts: RotaryOptions, sin_sign: f64) -> Result<RotaryGeom> {
    let shape = t.shape();
    let rank = shape.len();
    let bad = |msg: String| Error::InvalidArgument { op: OP, msg };
    if !(2..=4).contains(&rank) {
        return Err(bad(format!(
            "expects [.., length, features] of rank 2 to 4, got {shape:?}"
        )));
    }
    let dim = shape[rank - 1];
    if !dim.is_multiple_of(2) {
        return Err(bad(format!(
            "the feature size {dim} must be even (features i and i + D/2 are rotated together)"
        )));
    }
    if !(opts.theta.is_finite() && opts.theta > 0.0) {
        return Err(bad(format!(
            "theta must be positive and finite, got {}",
            opts.theta
        )));
    }
    let len = shape[rank - 2];
    // Positions are f32 in Hugging Face's angles: exact below 2^24.
    if opts.start.checked_add(len).is_none_or(|end| end > 1 << 24) {
        return Err(bad(format!(
            "positions {}..{}+{len} reach past 2^24, where f32 stops holding them exactly",
            opts.start, opts.start
        )));
    }
    let mut dims = [1usize; 4];
    let mut strides = [0usize; 4];
    dims[4 - rank..].copy_from_slice(shape);
    strides[4 - rank..].copy_from_slice(t.layout().strides());
    let s = |i: usize| strides[i] as i64;
    Ok(RotaryGeom {
        batch: dims[0] as i64,
        heads: dims[1] as i64,
        len: len as i64,
        dim: dim as i64,
        x: View4 {
            offset: t.layout().offset() as i64,
            batch: s(0),
            head: s(1),
            row: s(2),
            col: s(3),
        },
        start: opts.start as i64,
        theta: opts.theta,
        sin_sign,
    })
}

/// The rotation of `t` by `g`'s angles into a new contiguous tensor of
/// `t`'s shape, on any device.
fn rotate(t: &Tensor, g: &RotaryGeom) -> Result<Tensor> {
    match backend(OP, &[t])? {
        Backend::Meta => crate::meta::empty(t.shape(), t.dtype()),
        Backend::Cpu => cpu::rotate(t, g),
        Backend::Cuda(_) => cuda::rotate(t, g),
    }
}

/// Backward of [`rotary_embedding`]: the inverse rotation, from the
/// geometry alone.
struct RotaryBackward {
    opts: RotaryOptions,
}

impl BackwardOp for RotaryBackward {
    fn name(&self) -> &'static str {
        OP
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let geom = geometry(&g, self.opts, -1.0)?;
        Ok(vec![Some(rotate(&g, &geom)?)])
    }
}

/// Rotary position embedding of `x` `[.., L, D]` (rank 2 to 4, any layout,
/// `D` even; typically a `[B, heads, L, head_dim]` view of a projection):
/// row `r` of each head rotated by position `opts.start + r`'s angles in
/// Hugging Face's rotate-half layout (see the module doc), as a new
/// contiguous tensor. Saves nothing for backward.
pub fn rotary_embedding(x: &Tensor, opts: RotaryOptions) -> Result<Tensor> {
    expect_float(OP, x)?;
    let geom = geometry(x, opts, 1.0)?;
    let out = rotate(x, &geom)?;
    let [needs] = needs_grad([x]);
    if !needs {
        return Ok(out);
    }
    Ok(attach(out, &[x], RotaryBackward { opts }))
}
