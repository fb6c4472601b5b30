//! What an update is, as data shared by the CPU update (`kernels.rs`) and
//! the CUDA kernels (`cuda.rs`): the gradient transform, the hyper-parameters
//! of each built-in rule, the fixed summation order of gradient norms, and
//! one parameter's update ready to run.

use crate::Tensor;

/// What is done to each gradient element before the update (clipping).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GradTransform {
    /// The gradient as it is.
    Identity,
    /// Multiplied by a factor (norm clipping), converted to the element type.
    Scale(f64),
    /// Limited to `[-c, c]` (value clipping; NaN passes through).
    ClampAbs(f64),
}

/// How many interleaved lanes [`sum_of_squares`](super::kernels::sum_of_squares) adds a gradient's squares
/// in: with `L = min(n, NORM_LANES)` lanes, lane `k` sums the elements
/// `i ≡ k (mod L)` in increasing `i`; the lanes, zero-padded to a power of
/// two `P`, are then added as a pairwise tree (level `s = P/2, …, 1`:
/// `lane[k] += lane[k + s]` for `k < s`). One fixed order that a GPU runs in
/// parallel and the CPU reproduces exactly.
pub const NORM_LANES: usize = 16384;

/// An update rule as data: what a device kernel needs to run
/// [`Algorithm::update`](crate::optim::Algorithm::update) bit-identically.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UpdateRule {
    /// [`crate::optim::Sgd`]'s update.
    Sgd(SgdParams),
    /// [`crate::optim::Adam`]'s update (Adam and AdamW).
    Adam(AdamParams),
}

/// SGD hyper-parameters ([`crate::optim::Sgd`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdParams {
    /// Learning rate.
    pub lr: f64,
    /// Momentum (0: no buffer).
    pub momentum: f64,
    /// Dampening of the momentum.
    pub dampening: f64,
    /// L2 weight decay.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// Ascend instead of descend.
    pub maximize: bool,
}

/// Adam / AdamW hyper-parameters ([`crate::optim::Adam`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamParams {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Weight decay (L2, or decoupled for AdamW).
    pub weight_decay: f64,
    /// AdamW: decay the parameter instead of adding to the gradient.
    pub decoupled_weight_decay: bool,
    /// Keep the running maximum of the second moment.
    pub amsgrad: bool,
    /// Ascend instead of descend.
    pub maximize: bool,
}

/// One parameter's update, ready to run: what [`apply_update`] takes.
pub(crate) struct PendingUpdate {
    /// The parameter (updated in place).
    pub param: Tensor,
    /// Its gradient.
    pub grad: Tensor,
    /// The gradient transform (clipping).
    pub transform: GradTransform,
    /// The parameter's update count, 1 on the first.
    pub step: u64,
    /// How its state tensors hold the state.
    pub format: super::StateFormat,
    /// Its state tensors.
    pub state: Vec<Tensor>,
}
