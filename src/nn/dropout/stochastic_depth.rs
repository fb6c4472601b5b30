//! Stochastic depth (`torchvision.ops.stochastic_depth`, Huang et al.
//! 2016): a residual branch is dropped for whole samples (`Row`) or for the
//! whole batch (`Batch`), and kept ones are scaled by `1/(1−p)`. The
//! per-sample keep bits are drawn like dropout's (`rng::dropout_keep` over a
//! reserved (seed, offset) range) so that backward replays them. What it
//! saves is in the family's table (`dropout/mod.rs`).

use super::{check_p, dropout_apply, DropoutDraw};
use crate::autograd::{
    attach, may_reuse, needs_grad, save_policy, BackwardOp, SavePolicy, SavedTensor,
};
use crate::memory::scope;
use crate::nn::Module;
use crate::ops::expect_float;
use crate::rng::Generator;
use crate::{Error, Result, Tensor};

const OP: &str = "stochastic_depth";

/// Whether [`stochastic_depth`] drops whole samples or the whole batch
/// (torchvision's `mode="row"` and `mode="batch"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StochasticDepthMode {
    /// One keep draw per sample (the first dimension).
    Row,
    /// One keep draw for the whole input.
    Batch,
}

impl StochasticDepthMode {
    /// The shape of the noise that multiplies an input of `shape`:
    /// `[N, 1, …]` or `[1, 1, …]`.
    fn noise_shape(self, shape: &[usize]) -> Vec<usize> {
        let mut s = vec![1; shape.len()];
        if self == StochasticDepthMode::Row {
            s[0] = shape[0];
        }
        s
    }
}

/// The noise `[N, 1, …]` (or all ones but the value): `1/(1−p)` rounded in
/// `dtype` where the draw keeps the sample, else 0, on the input's device.
fn noise(x: &Tensor, mode: StochasticDepthMode, draw: DropoutDraw) -> Result<Tensor> {
    let shape = mode.noise_shape(x.shape());
    let ones = Tensor::ones(&shape, x.dtype(), x.device())?;
    dropout_apply(&ones, draw)
}

/// Backward of stochastic depth: `g · noise`, the noise replayed from the
/// draw (lean) or kept (`SaveAll`).
struct StochasticDepthBackward {
    mode: StochasticDepthMode,
    draw: DropoutDraw,
    saved: Option<SavedTensor>,
}

impl BackwardOp for StochasticDepthBackward {
    fn name(&self) -> &'static str {
        OP
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let noise = match &self.saved {
            Some(s) => s.get()?.clone(),
            None => noise(&g, self.mode, self.draw)?,
        };
        // Backward runs without recording; `g` is written over when
        // nothing else holds it.
        let gi = if may_reuse(&g) && g.is_contiguous() {
            g.mul_(&noise)?;
            g
        } else {
            g.mul(&noise)?
        };
        Ok(vec![Some(gi)])
    }
}

/// Stochastic depth with an explicit draw (training behaviour): sample `i`
/// (`Row`) or the whole input (`Batch`) is kept iff
/// `rng::dropout_keep(seed, offset, i, p)`, kept values are multiplied by
/// `1/(1−p)` rounded in the input's dtype, dropped ones are 0 (`p = 1`:
/// everything). `p = 0` returns `x` itself. The input needs at least one
/// dimension. Saves nothing for backward (the draw is replayed); under
/// `SaveAll` the noise PyTorch keeps (`N` elements, or 1).
pub fn stochastic_depth(
    x: &Tensor,
    p: f64,
    mode: StochasticDepthMode,
    seed: u64,
    offset: u64,
) -> Result<Tensor> {
    check_p(p)?;
    expect_float(OP, x)?;
    if x.shape().is_empty() {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: "the input is a scalar; stochastic depth needs a batch dimension".into(),
        });
    }
    if p == 0.0 {
        return Ok(x.clone());
    }
    let draw = DropoutDraw { seed, offset, p };
    let noise = noise(x, mode, draw)?;
    let out = x.detach().mul(&noise)?;
    let [needs] = needs_grad([x]);
    if !needs {
        return Ok(out);
    }
    let saved = match save_policy() {
        SavePolicy::Lean => None,
        SavePolicy::SaveAll => Some(SavedTensor::new(&noise, OP)),
    };
    Ok(attach(
        out,
        &[x],
        StochasticDepthBackward { mode, draw, saved },
    ))
}

/// `torchvision.ops.StochasticDepth(p, mode)`: in training mode each
/// forward reserves a fresh range of its own Philox [`Generator`] (one
/// counter per sample, or one) and applies [`stochastic_depth`]; in
/// evaluation mode (or for `p = 0`) it is the identity and records nothing.
/// Saves nothing for backward (`SaveAll`: the noise, `N` elements). No
/// parameters.
#[derive(Clone)]
pub struct StochasticDepth {
    p: f64,
    mode: StochasticDepthMode,
    training: bool,
    generator: Generator,
    name: String,
}

impl StochasticDepth {
    /// A stochastic-depth layer dropping with probability `p` (in `[0, 1]`,
    /// else an error) per `mode`, drawing from a generator seeded with
    /// `seed`; starts in training mode.
    pub fn new(name: &str, p: f64, mode: StochasticDepthMode, seed: u64) -> Result<Self> {
        check_p(p)?;
        Ok(StochasticDepth {
            p,
            mode,
            training: true,
            generator: Generator::new(seed),
            name: name.to_string(),
        })
    }

    /// The drop probability.
    pub fn p(&self) -> f64 {
        self.p
    }

    /// Whether samples or the whole batch are dropped.
    pub fn mode(&self) -> StochasticDepthMode {
        self.mode
    }

    /// Whether the layer is in training mode.
    pub fn is_training(&self) -> bool {
        self.training
    }
}

impl Module for StochasticDepth {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.training || self.p == 0.0 {
            expect_float(OP, x)?;
            return Ok(x.clone());
        }
        let _s = scope(self.name.clone());
        let draws = match self.mode {
            StochasticDepthMode::Row => x.shape().first().copied().unwrap_or(1),
            StochasticDepthMode::Batch => 1,
        };
        let (seed, offset) = self.generator.reserve(draws as u64);
        stochastic_depth(x, self.p, self.mode, seed, offset)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}
