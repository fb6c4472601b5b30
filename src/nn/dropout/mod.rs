//! Dropout whose mask is replayed, not stored: forward draws element `i`'s
//! keep-bit as `rng::dropout_keep(seed, offset, i, p)` from a reserved
//! (seed, offset) range, and backward recomputes the same bits from those
//! two numbers. Kept elements are scaled by `1/(1−p)` in the tensor's dtype.
//! The same draw serves attention's dropout on its probabilities
//! (`DropoutDraw`, `dropout_apply`, `dropout_apply_mask`, `dropout_mask`).
//!
//! Saved for backward, for an input of `n` elements:
//!
//! | op | requires grad | saved for backward | why |
//! |---|---|---|---|
//! | `dropout` (lean), train, `0 < p ≤ 1` | input | nothing: (seed, offset, p) | the keep mask is replayed through `rng::dropout_keep` |
//! | `dropout` (`SaveAll`), train, `0 < p ≤ 1` | input | the keep mask, U8: `n` bytes | what PyTorch keeps |
//! | `dropout`, eval or `p = 0` | input | — (returns the input itself) | identity |
//! | `stochastic_depth` (lean), train, `0 < p ≤ 1` | input | nothing: (seed, offset, p) | the per-sample keep draws are replayed |
//! | `stochastic_depth` (`SaveAll`), train, `0 < p ≤ 1` | input | the noise, `N` elements (`Row`) or 1 (`Batch`) | what PyTorch's `input * noise` keeps |
//! | any | nothing | — (no node) | |
//!
//! Both policies give bit-identical gradients (the same mask, the same
//! product rounded in the dtype). On CUDA the replay runs the same Philox
//! keep rule on the device (`dropout.cu`).

mod cpu;
mod cuda;
mod stochastic_depth;
#[cfg(test)]
mod tests;

pub use stochastic_depth::{stochastic_depth, StochasticDepth, StochasticDepthMode};

use super::Module;
use crate::autograd::{
    attach, may_reuse, needs_grad, save_policy, BackwardOp, SavePolicy, SavedTensor,
};
use crate::memory::scope;
use crate::meta::{backend, backend_of, Backend};
use crate::ops::expect_float;
use crate::rng::{dropout_keep, Generator};
use crate::{Device, Error, Result, Tensor};

/// The (seed, offset) of a dropout draw and its drop probability.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct DropoutDraw {
    pub seed: u64,
    pub offset: u64,
    pub p: f64,
}

impl DropoutDraw {
    /// Whether element `i` is kept.
    #[inline(always)]
    pub fn keep(&self, i: usize) -> bool {
        dropout_keep(self.seed, self.offset, i as u64, self.p)
    }

    /// The factor kept elements are scaled by: `1/(1-p)` (0 for `p = 1`,
    /// where nothing is kept).
    pub fn scale(&self) -> f64 {
        if self.p >= 1.0 {
            0.0
        } else {
            1.0 / (1.0 - self.p)
        }
    }
}

// The dispatch seam: one small function per kernel, the only place here
// (besides cuda.rs) that names CUDA.

/// Forward (and lean backward): the elements of `x` (any layout) kept by
/// `draw` scaled by `1/(1-p)`, the others zero, as a new contiguous tensor.
pub(crate) fn dropout_apply(x: &Tensor, draw: DropoutDraw) -> Result<Tensor> {
    match backend("dropout", &[x])? {
        Backend::Cpu | Backend::Meta => cpu::apply(x, draw),
        Backend::Cuda(_) => cuda::apply(x, draw),
    }
}

/// The keep-mask of `draw` over a tensor of `shape` as a U8 tensor on
/// `device` (1 = kept): what PyTorch keeps for backward.
/// [`dropout_apply`] written over `x` when buffer reuse is on and nothing
/// else holds it; else a new tensor. The same values either way.
fn dropout_apply_owned(x: Tensor, draw: DropoutDraw) -> Result<Tensor> {
    if !may_reuse(&x) {
        return dropout_apply(&x, draw);
    }
    dropout_apply_in_place(&x, draw)?;
    Ok(x)
}

/// [`dropout_apply`] written over `x`, which the caller checked is
/// exclusive ([`may_reuse`]).
fn dropout_apply_in_place(x: &Tensor, draw: DropoutDraw) -> Result<()> {
    match backend("dropout", &[x])? {
        Backend::Cpu | Backend::Meta => cpu::apply_in_place(x, draw),
        Backend::Cuda(_) => cuda::apply_in_place(x, draw),
    }
}

pub(crate) fn dropout_mask(shape: &[usize], draw: DropoutDraw, device: Device) -> Result<Tensor> {
    match backend_of("dropout", device)? {
        Backend::Cpu | Backend::Meta => cpu::mask(shape, draw, device),
        Backend::Cuda(n) => cuda::mask(shape, draw, n),
    }
}

/// Backward from a stored byte mask (a U8 tensor made by [`dropout_mask`]):
/// `g · scale` where the mask is set, else 0.
pub(crate) fn dropout_apply_mask(g: &Tensor, mask: &Tensor, scale: f64) -> Result<Tensor> {
    match backend("dropout", &[g, mask])? {
        Backend::Cpu | Backend::Meta => cpu::apply_mask(g, mask, scale),
        Backend::Cuda(_) => cuda::apply_mask(g, mask, scale),
    }
}

/// Checks `0 <= p <= 1`.
fn check_p(p: f64) -> Result<()> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            op: "dropout",
            msg: format!("drop probability {p} is not in [0, 1]"),
        })
    }
}

/// Backward of dropout: saves only (seed, offset, p) and replays the mask;
/// under `SaveAll`, a U8 mask of one byte per element.
struct DropoutBackward {
    draw: DropoutDraw,
    mask: Option<SavedTensor>,
}

impl BackwardOp for DropoutBackward {
    fn name(&self) -> &'static str {
        "dropout"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let gi = match &self.mask {
            None => dropout_apply_owned(g, self.draw)?,
            Some(mask) => dropout_apply_mask(&g, mask.get()?, self.draw.scale())?,
        };
        Ok(vec![Some(gi)])
    }
}

/// Dropout with an explicit draw: element `i` (row-major) is kept iff
/// `rng::dropout_keep(seed, offset, i, p)`, and kept elements are scaled by
/// `1/(1-p)`; `p = 1` zeroes everything. Always applies (training
/// behaviour); `p = 0` returns `x` itself and records nothing. Saves nothing
/// for backward (the mask is replayed from (seed, offset)); under `SaveAll`
/// the mask as U8, one byte per element, like PyTorch.
pub fn dropout(x: &Tensor, p: f64, seed: u64, offset: u64) -> Result<Tensor> {
    dropout_reusing(x.clone(), p, (seed, offset), false)
}

/// [`dropout`] of an input the caller hands over: written over it when
/// buffer reuse is on and nothing else holds it (dropout never saves its
/// input). The same values, gradients and saved bytes.
pub fn dropout_owned(x: Tensor, p: f64, seed: u64, offset: u64) -> Result<Tensor> {
    dropout_reusing(x, p, (seed, offset), true)
}

fn dropout_reusing(x: Tensor, p: f64, (seed, offset): (u64, u64), owned: bool) -> Result<Tensor> {
    check_p(p)?;
    expect_float("dropout", &x)?;
    if p == 0.0 {
        return Ok(x);
    }
    let draw = DropoutDraw { seed, offset, p };
    let [needs] = needs_grad([&x]);
    let out = if owned && may_reuse(&x) {
        dropout_apply_in_place(&x, draw)?;
        x.detach()
    } else {
        dropout_apply(&x, draw)?
    };
    let x = &x;
    if !needs {
        return Ok(out);
    }
    let mask = match save_policy() {
        SavePolicy::Lean => None,
        SavePolicy::SaveAll => {
            let t = dropout_mask(x.shape(), draw, x.device())?;
            Some(SavedTensor::new(&t, "dropout"))
        }
    };
    Ok(attach(out, &[x], DropoutBackward { draw, mask }))
}

/// `torch.nn.Dropout(p)`: in training mode each forward reserves a fresh
/// range of its own Philox [`Generator`] and applies [`dropout`] with it;
/// in evaluation mode (or for `p = 0`) it is the identity and records
/// nothing. Saves no bytes for backward (`SaveAll`: one byte per element).
/// No parameters.
#[derive(Clone)]
pub struct Dropout {
    p: f64,
    training: bool,
    generator: Generator,
    name: String,
}

impl Dropout {
    /// A dropout layer with drop probability `p` (in `[0, 1]`, else an
    /// error) drawing from a generator seeded with `seed`; starts in
    /// training mode.
    pub fn new(name: &str, p: f64, seed: u64) -> Result<Dropout> {
        check_p(p)?;
        Ok(Dropout {
            p,
            training: true,
            generator: Generator::new(seed),
            name: name.to_string(),
        })
    }

    /// The drop probability.
    pub fn p(&self) -> f64 {
        self.p
    }

    /// Whether the layer is in training mode.
    pub fn is_training(&self) -> bool {
        self.training
    }

    /// The generator the masks are drawn from.
    pub fn generator(&self) -> &Generator {
        &self.generator
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.training || self.p == 0.0 {
            expect_float("dropout", x)?;
            return Ok(x.clone());
        }
        let _s = scope(self.name.clone());
        let (seed, offset) = self.generator.reserve(x.numel() as u64);
        dropout(x, self.p, seed, offset)
    }

    /// As `forward`, writing over `x` when nothing else holds it and buffer
    /// reuse is on.
    fn forward_owned(&self, x: Tensor) -> Result<Tensor> {
        if !self.training || self.p == 0.0 {
            expect_float("dropout", &x)?;
            return Ok(x);
        }
        let _s = scope(self.name.clone());
        let (seed, offset) = self.generator.reserve(x.numel() as u64);
        dropout_owned(x, self.p, seed, offset)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}
