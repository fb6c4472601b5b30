//! Normalisation: batch norm (`BatchNorm1d`/`BatchNorm2d`), layer norm,
//! group norm and RMS norm, each one fused op whose backward struct holds
//! typed saved state.
//!
//! Where things are (everything of the family lives in this folder):
//! - `batch_norm.rs`: [`batch_norm`] (forward, running statistics, what it
//!   saves) and its backward;
//! - `row_norms.rs`: [`layer_norm`], [`group_norm`], [`rms_norm`] and their
//!   shared backward;
//! - `sync.rs`: batch norm synchronised over ranks (`SyncBatchNorm`);
//! - `layers.rs`: the modules [`BatchNorm`], [`LayerNorm`], [`GroupNorm`],
//!   [`RMSNorm`] (and their builders);
//! - `cpu.rs`: the CPU kernels (statistics, normalise, input and parameter
//!   gradients); `cuda.rs`: the CUDA glue and launch wrappers; `norm.cu`:
//!   the CUDA kernels;
//! - this file: the geometry all of them share ([`NormGeom`]), the helpers
//!   the ops share, and the dispatch seam (the only code outside `cuda.rs`
//!   that names CUDA).
//!
//! How it computes: statistics (mean, biased variance) in f64, two passes,
//! then rounded once to the statistics dtype (f32, or f64 for f64 inputs:
//! PyTorch's accumulation type); `x̂ = (x − mean)·rstd` and `y = x̂·w + b`
//! in f64, rounded to the input dtype. Backward works from `x̂` (saved, or
//! recomputed from the input under `SaveAll` with the same rounding), so
//! gradients are bit-identical under both save policies. Statistics are
//! tensors on the input's device: on CUDA the moments, the rounded
//! statistics, `rstd`, `scale` and the running statistics' update are
//! computed there with the CPU's formulas and roundings (one `prepare`
//! launch per call), so nothing crosses to the host inside a step.
//!
//! # Saved for backward
//!
//! `n` = input elements, `C` = channels, `R` = rows (elements / `D`), `D` =
//! product of `normalized_shape`, `N·G` = samples × groups; `T` = bytes of
//! the input dtype, `S` = bytes of the statistics dtype. Nothing is saved
//! (no node is recorded) when nothing requires grad. A saved weight or
//! running statistic is a reference: when it is model state (a parameter
//! or buffer, alive anyway) it keeps its own ledger category and its `D·T`
//! / `C·T` terms below cost nothing. The same tensors are saved on CUDA.
//!
//! | op | requires grad | saved for backward (lean) | bytes | why |
//! |---|---|---|---|---|
//! | batch_norm, train | x (± w, b) | `x̂`, `scale = w·invstd` (C) | `n·T + C·S` | `dx = scale·(g − mean(g) − x̂·mean(g·x̂))` |
//! | batch_norm, train | w (± b), not x | `x̂` | `n·T` | `dw = Σ g·x̂` |
//! | batch_norm, eval | x only | nothing when w and running_var are model state (the gradient reads them), else `scale` | 0, else `C·S` | eval mode is an affine map: `dx = scale·g` |
//! | batch_norm, eval | w (± b), not x | `x̂` | `n·T` | `dw = Σ g·x̂`; cheaper than the input plus two C-sized statistics, and immune to later updates of the running statistics |
//! | batch_norm, eval | x and w (± b) | `x̂`, and `scale` unless w and running_var are model state | `n·T` (+ `C·S`) | both of the above |
//! | batch_norm | b only | nothing | 0 | `db = Σ g` |
//! | batch_norm, train, synchronised over ranks (`SyncBatchNorm`) | as above | as above (the statistics are the global ones) | as above | `dx` takes `Σ g` and `Σ g·x̂` over all ranks (one all-reduce of `2C` values); `x̂` is written over once they are taken |
//! | batch_norm under autocast (f16/bf16 input, f32 weights and running statistics) | as above | as above, with `x̂` in the input's dtype (`SaveAll`: the input in its dtype) | `n·T`, `T` = 2 | normalised in f32 on a transient f32 copy of the input, output in the input's dtype, as cuDNN's batch norm under PyTorch's CUDA autocast |
//! | layer_norm | x (± w, b) | `x̂`, rstd (R), w (if affine) | `n·T + R·S + D·T` | `dx = rstd·(g·w − mean(g·w) − x̂·mean(g·w·x̂))` per row |
//! | layer_norm | w (± b), not x | `x̂` | `n·T` | `dw = Σ g·x̂` |
//! | layer_norm | b only | nothing | 0 | `db = Σ g` |
//! | group_norm | x (± w, b) | `x̂`, rstd (N·G), w (if affine) | `n·T + N·G·S + C·T` | as layer norm, per (sample, group) |
//! | group_norm | w (± b), not x | `x̂` | `n·T` | `dw = Σ g·x̂` |
//! | group_norm | b only | nothing | 0 | `db = Σ g` |
//! | rms_norm | x (± w) | `x̂`, rstd (R), w (if affine) | `n·T + R·S + D·T` | `dx = rstd·(g·w − x̂·mean(g·w·x̂))` (no mean subtracted) |
//! | rms_norm | w only | `x̂` | `n·T` | `dw = Σ g·x̂` |
//!
//! Under `SaveAll` each op keeps what PyTorch keeps, and backward
//! recomputes `x̂` (as `Workspace`):
//!
//! | op | saved for backward (SaveAll) | bytes |
//! |---|---|---|
//! | batch_norm | x, w, running_mean, running_var; train mode also `save_mean`, `save_invstd` | `n·T + C·T + 2C·T` (+ `2C·S` in train mode) |
//! | layer_norm | x, w, b, mean, rstd | `n·T + 2D·T + 2R·S` |
//! | group_norm | x, w, mean, rstd | `n·T + C·T + 2·N·G·S` |
//! | rms_norm | x, w, rstd | `n·T + D·T + R·S` |
//!
//! Without affine parameters drop the `w`/`b` terms (batch norm's `scale`
//! is then `invstd`); without running statistics batch norm uses batch
//! statistics in eval mode too.

mod batch_norm;
mod cpu;
mod cuda;
mod layers;
mod row_norms;
mod sync;

pub use batch_norm::batch_norm;
pub use layers::{
    BatchNorm, BatchNormBuilder, BatchNormOptions, GroupNorm, GroupNormBuilder, LayerNorm,
    LayerNormBuilder, RMSNorm, RMSNormBuilder,
};
pub use row_norms::{group_norm, layer_norm, rms_norm};

use crate::autograd::{may_reuse, needs_grad};
use crate::dtype::stat_dtype;
use crate::memory::host::try_zeroed;
use crate::memory::{uncounted, with_category, Category};
use crate::meta::{backend, Backend};
use crate::{DType, Error, Result, Tensor};

/// How a norm's statistics and affine parameters lie over its contiguous
/// input: the one geometry of the family, used by the CPU kernels, the CUDA
/// launch wrappers and, passed by value, the kernels (`struct NormGeom` in
/// `norm.cu`, same fields in the same order; `usize` is laid out as the
/// kernels' `long long` on 64-bit targets).
///
/// The input is viewed as `[a, s, b]`: statistic `i` covers the `a` runs of
/// `b` contiguous elements starting at `(k·s + i)·b` (`k < a`); element `e`
/// has statistic `(e / b) % s` and affine parameter `(e / lp) % p`.
///
/// | norm | input | a | s | b | p | lp | seg |
/// |---|---|---|---|---|---|---|---|
/// | batch | `[outer, C, inner]` | outer | C | inner | C | inner | inner |
/// | group, G groups | `[N, C, spatial]` | 1 | N·G | C/G·spatial | C | spatial | spatial |
/// | layer / RMS | `[rows, len]` | 1 | rows | len | len | 1 | len |
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NormGeom {
    /// Runs per statistic.
    pub a: usize,
    /// Number of statistics.
    pub s: usize,
    /// Elements per run (contiguous).
    pub b: usize,
    /// Number of affine parameters.
    pub p: usize,
    /// Consecutive elements sharing one parameter.
    pub lp: usize,
    /// Elements per CPU segment: a run that shares one statistic and either
    /// one parameter (`lp`: batch and group norm) or a whole row of
    /// parameters (`b`: layer and RMS norm). The CPU's unit of parallel
    /// work; its weight-gradient partial sums are cut at segment
    /// boundaries, so `seg` fixes their rounding. The kernels ignore it.
    pub seg: usize,
}

impl NormGeom {
    /// Batch norm over `[outer, c, inner]`: one statistic per channel.
    pub fn batch(outer: usize, c: usize, inner: usize) -> NormGeom {
        NormGeom {
            a: outer,
            s: c,
            b: inner,
            p: c,
            lp: inner,
            seg: inner,
        }
    }

    /// Group norm over `[n, c, spatial]` in `groups` groups of channels (an
    /// error unless `groups` divides `c`): one statistic per (sample, group).
    pub fn group(n: usize, c: usize, spatial: usize, groups: usize) -> Result<NormGeom> {
        if groups == 0 || !c.is_multiple_of(groups) {
            return Err(Error::InvalidArgument {
                op: "group_norm",
                msg: format!("{groups} groups do not divide {c} channels"),
            });
        }
        Ok(NormGeom {
            a: 1,
            s: n * groups,
            b: c / groups * spatial,
            p: c,
            lp: spatial,
            seg: spatial,
        })
    }

    /// Layer / RMS norm over `rows` rows of `len`: one statistic per row,
    /// one parameter per position in the row.
    pub fn row(rows: usize, len: usize) -> NormGeom {
        NormGeom {
            a: 1,
            s: rows,
            b: len,
            p: len,
            lp: 1,
            seg: len,
        }
    }

    /// Elements of the input.
    pub fn numel(&self) -> usize {
        self.a * self.s * self.b
    }

    /// Number of statistics.
    pub fn nstat(&self) -> usize {
        self.s
    }

    /// Number of affine parameters.
    pub fn nparam(&self) -> usize {
        self.p
    }

    /// Elements per statistic.
    pub fn count(&self) -> usize {
        self.a * self.b
    }
}

/// What the input gradient's formula subtracts (`scale` per statistic, `w`
/// per parameter, 1 when absent).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum GradMode {
    /// `scale·(g·w − mean(g·w) − x̂·mean(g·w·x̂))` (batch/layer/group norm).
    Centered,
    /// `scale·(g·w − x̂·mean(g·w·x̂))` (RMS norm).
    Uncentered,
    /// `scale·g·w`: an affine map (batch norm in eval mode); no `x̂`.
    Affine,
}

/// Weight (`Σ g·x̂`) and bias (`Σ g`) gradients, when wanted.
type ParamGrads = (Option<Tensor>, Option<Tensor>);

// ---- helpers the ops share ----

/// Checks an optional parameter (or running statistic) against `shape`
/// and `x`'s dtype and device; its values stay where they are.
fn check_param(op: &'static str, p: Option<&Tensor>, shape: &[usize], x: &Tensor) -> Result<()> {
    let Some(p) = p else { return Ok(()) };
    if p.shape() != shape {
        return Err(Error::ShapeMismatch {
            op,
            lhs: shape.to_vec(),
            rhs: p.shape().to_vec(),
        });
    }
    if p.dtype() != x.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            expected: x.dtype(),
            got: p.dtype(),
        });
    }
    if p.device() != x.device() {
        return Err(Error::DeviceMismatch {
            op,
            lhs: x.device(),
            rhs: p.device(),
        });
    }
    Ok(())
}

/// Which of the input, weight and bias (if given) need a gradient now.
fn optional_needs(x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>) -> [bool; 3] {
    let [nx] = needs_grad([x]);
    let on = |t: Option<&Tensor>| t.is_some_and(|t| needs_grad([t])[0]);
    [nx, on(w), on(b)]
}

/// The op's inputs in gradient order: the input, then the weight and bias if given.
fn inputs_of<'a>(x: &'a Tensor, w: Option<&'a Tensor>, b: Option<&'a Tensor>) -> Vec<&'a Tensor> {
    std::iter::once(x).chain(w).chain(b).collect()
}

/// Gradients in the order of [`inputs_of`] (`present`: weight, bias given).
fn grads_of(
    gx: Option<Tensor>,
    gw: Option<Tensor>,
    gb: Option<Tensor>,
    present: [bool; 2],
) -> Vec<Option<Tensor>> {
    let mut v = vec![gx];
    if present[0] {
        v.push(gw);
    }
    if present[1] {
        v.push(gb);
    }
    v
}

/// Recomputes `x̂` from the input and the statistics tensors (SaveAll's
/// backward), counted as workspace.
fn recompute_xhat(
    x: &Tensor,
    geo: NormGeom,
    mean: Option<&Tensor>,
    rstd: &Tensor,
) -> Result<Tensor> {
    let _ws = with_category(Category::Workspace);
    let only_xhat = Normalize {
        mean,
        rstd,
        w: None,
        b: None,
        want_y: false,
        want_xhat: true,
        y_over_x: false,
    };
    let (_, xh) = normalize(x, geo, &only_xhat)?;
    xh.ok_or_else(|| Error::Backward("norm: x̂ not computed".into()))
}

/// Checks that `g` matches `like` in shape and dtype.
fn check_like(op: &'static str, g: &Tensor, like: &[usize], dtype: DType) -> Result<()> {
    if g.shape() != like {
        return Err(Error::ShapeMismatch {
            op,
            lhs: like.to_vec(),
            rhs: g.shape().to_vec(),
        });
    }
    if g.dtype() != dtype {
        return Err(Error::DTypeMismatch {
            op,
            expected: dtype,
            got: g.dtype(),
        });
    }
    Ok(())
}

// ---- the dispatch seam: one match per kernel, CPU / meta / CUDA ----
//
// Statistics are tensors on the input's device: host tensors on the CPU,
// device buffers on CUDA (so that nothing crosses to the host inside a
// step), data-less tensors on meta. Those a call only uses on the way
// (moments, rounded statistics) are made outside the ledger on every
// device, as host vectors would be; those saved for backward are counted.

/// Per statistic: the mean (0 when not `centered`) and the biased variance
/// (the mean square when not `centered`), unrounded, as f64 tensors `[s]`
/// on `x`'s device, outside the ledger.
fn norm_stats(x: &Tensor, geo: NormGeom, centered: bool) -> Result<(Tensor, Tensor)> {
    match backend("norm", &[x])? {
        Backend::Cpu => cpu::norm_stats(x, geo, centered),
        Backend::Meta => uncounted(|| {
            let stat = || Tensor::new_meta(&[geo.nstat()], DType::F64);
            Ok((stat()?, stat()?))
        }),
        Backend::Cuda(_) => cuda::norm_stats(x, geo, centered),
    }
}

/// Where [`prepare`] reads each statistic's mean and variance.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum StatSource {
    /// The batch's unrounded f64 moments ([`norm_stats`]).
    Moments,
    /// Batch norm's running statistics, in the input dtype (eval mode).
    Running,
}

/// Batch norm's running statistics, updated in place from the batch's
/// unrounded moments: `r ← (1 − momentum)·r + momentum·m` (the variance's
/// moment times `unbias`), rounded to their dtype.
#[derive(Clone, Copy)]
struct RunningUpdate<'a> {
    mean: &'a Tensor,
    var: &'a Tensor,
    momentum: f64,
    unbias: f64,
    /// `num_batches_tracked` (i64, one element), incremented by 1.
    counter: Option<&'a Tensor>,
}

/// What one norm call derives per statistic from its mean and variance, in
/// one pass (one launch on CUDA): the mean and `rstd = 1/√(var + eps)`
/// rounded to the statistics dtype, and `scale = w·rstd` (rounded again);
/// each only if wanted.
#[derive(Clone, Copy)]
struct Prep<'a> {
    source: StatSource,
    /// Per-statistic means (`None`: 0).
    mean: Option<&'a Tensor>,
    /// Per-statistic variances.
    var: &'a Tensor,
    eps: f64,
    /// The input's dtype (the statistics are in [`stat_dtype`] of it).
    dtype: DType,
    update: Option<RunningUpdate<'a>>,
    want_mean: bool,
    want_rstd: bool,
    want_scale: bool,
    /// The scale's weight per statistic (`None`: 1).
    weight: Option<&'a Tensor>,
}

/// [`prepare`]'s outputs, as wanted: tensors `[s]` of the statistics dtype
/// on the input's device, outside the ledger.
struct Prepared {
    mean: Option<Tensor>,
    rstd: Option<Tensor>,
    scale: Option<Tensor>,
}

/// Runs `p`: the derived statistics, and the running statistics' update.
fn prepare(p: &Prep<'_>) -> Result<Prepared> {
    let mut operands: Vec<&Tensor> = vec![p.var];
    operands.extend(p.mean);
    operands.extend(p.weight);
    if let Some(u) = &p.update {
        operands.extend([u.mean, u.var]);
        operands.extend(u.counter);
    }
    check_prep(p)?;
    match backend("norm", &operands)? {
        Backend::Cpu => cpu::prepare(p),
        Backend::Meta => {
            if let Some(u) = &p.update {
                for t in [u.mean, u.var].into_iter().chain(u.counter) {
                    crate::meta::touch(t);
                }
            }
            let s = [p.var.numel()];
            let out = |want: bool| {
                want.then(|| uncounted(|| Tensor::new_meta(&s, stat_dtype(p.dtype))))
                    .transpose()
            };
            Ok(Prepared {
                mean: out(p.want_mean)?,
                rstd: out(p.want_rstd)?,
                scale: out(p.want_scale)?,
            })
        }
        Backend::Cuda(_) => cuda::prepare(p),
    }
}

/// Checks [`prepare`]'s operands: dtypes by source, one length, the
/// running statistics contiguous, the counter a single i64.
fn check_prep(p: &Prep<'_>) -> Result<()> {
    const OP: &str = "norm statistics";
    let s = p.var.numel();
    let src = match p.source {
        StatSource::Moments => DType::F64,
        StatSource::Running => p.dtype,
    };
    let bad = |msg: String| Err(Error::InvalidArgument { op: OP, msg });
    for t in std::iter::once(p.var).chain(p.mean) {
        if t.dtype() != src || t.numel() != s {
            return bad(format!(
                "statistics of {:?} × {s} expected, got {:?} {:?}",
                src,
                t.dtype(),
                t.shape()
            ));
        }
    }
    let mut state: Vec<&Tensor> = p.weight.into_iter().collect();
    if let Some(u) = &p.update {
        if p.source != StatSource::Moments {
            return bad("running statistics are updated from batch moments only".into());
        }
        state.extend([u.mean, u.var]);
        if let Some(c) = u.counter {
            if c.dtype() != DType::I64 || c.numel() != 1 || c.layout().contiguous_range().is_none()
            {
                return bad(format!(
                    "num_batches_tracked must be one i64, got {:?} {:?}",
                    c.dtype(),
                    c.shape()
                ));
            }
        }
    }
    for t in state {
        if t.dtype() != p.dtype || t.numel() != s || t.layout().contiguous_range().is_none() {
            return bad(format!(
                "per-channel state of {:?} × {s}, contiguous, expected, got {:?} {:?}",
                p.dtype,
                t.dtype(),
                t.shape()
            ));
        }
    }
    Ok(())
}

/// `w·rstd` per statistic (`rstd` already in the statistics dtype; `w`
/// absent: `rstd` itself), rounded to the statistics dtype, as a new
/// tensor counted under the current category (batch norm saves it).
fn scale_tensor(w: Option<&Tensor>, rstd: &Tensor) -> Result<Tensor> {
    let operands: Vec<&Tensor> = std::iter::once(rstd).chain(w).collect();
    if let Some(w) = w {
        if w.numel() != rstd.numel() || stat_dtype(w.dtype()) != rstd.dtype() {
            return Err(Error::InvalidArgument {
                op: "batch_norm",
                msg: format!(
                    "weight {:?} {:?} does not match statistics {:?} {:?}",
                    w.dtype(),
                    w.shape(),
                    rstd.dtype(),
                    rstd.shape()
                ),
            });
        }
    }
    match backend("batch_norm", &operands)? {
        Backend::Cpu => cpu::scale_tensor(w, rstd),
        Backend::Meta => Tensor::new_meta(rstd.shape(), rstd.dtype()),
        Backend::Cuda(_) => cuda::scale_tensor(w, rstd),
    }
}

/// What [`normalize`] computes from the statistics: `x̂ = (x − mean)·rstd`
/// per statistic, and `y = x̂·w + b` per parameter (`w`, `b` defaulting to
/// 1 and 0), each only if wanted.
#[derive(Clone, Copy)]
pub(super) struct Normalize<'a> {
    /// Per-statistic means (statistics dtype; `None`: 0).
    pub mean: Option<&'a Tensor>,
    /// Per-statistic reciprocal standard deviations (statistics dtype).
    pub rstd: &'a Tensor,
    /// Per-parameter weights (`None`: 1).
    pub w: Option<&'a Tensor>,
    /// Per-parameter biases (`None`: 0).
    pub b: Option<&'a Tensor>,
    /// Whether `y` is computed.
    pub want_y: bool,
    /// Whether `x̂` is computed.
    pub want_xhat: bool,
    /// Whether `y` (wanted) is written over `x`'s storage, which nothing
    /// else holds ([`crate::Tensor::is_exclusive`]); the returned `y`
    /// shares it.
    pub y_over_x: bool,
}

/// `x̂` and/or `y` as `n` says; (y, x̂) as requested, new contiguous tensors
/// of `x`'s dtype counted under the current category (`y` sharing `x`'s
/// storage when `n.y_over_x`).
fn normalize(
    x: &Tensor,
    geo: NormGeom,
    n: &Normalize<'_>,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    if n.y_over_x && !(n.want_y && x.is_exclusive()) {
        return Err(Error::Backward(
            "norm: y can be written over x only when y is wanted and nothing else holds x".into(),
        ));
    }
    let operands: Vec<&Tensor> = [Some(x), n.mean, Some(n.rstd), n.w, n.b]
        .into_iter()
        .flatten()
        .collect();
    match backend("norm", &operands)? {
        Backend::Cpu => cpu::normalize(x, geo, n),
        Backend::Meta => {
            crate::meta::float("norm", x.dtype())?;
            let out = |want: bool| {
                want.then(|| crate::meta::empty(x.shape(), x.dtype()))
                    .transpose()
            };
            let y = if n.y_over_x {
                crate::meta::touch(x);
                Some(x.detach())
            } else {
                out(n.want_y)?
            };
            Ok((y, out(n.want_xhat)?))
        }
        Backend::Cuda(_) => cuda::normalize(x, geo, n),
    }
}

/// [`normalize`] with `y` written over `x` and ReLU applied in the same
/// pass, where the device has that kernel (CUDA): `x̂` when wanted and the
/// packed mask of `y > 0`, uncounted until it is taken. `None` elsewhere
/// (the caller normalises, then runs ReLU).
fn normalize_relu(
    x: &Tensor,
    geo: NormGeom,
    n: &Normalize<'_>,
) -> Result<Option<(Option<Tensor>, ReluMask)>> {
    if !(n.y_over_x && n.want_y && x.is_exclusive()) {
        return Err(Error::Backward(
            "norm + relu: y is written over x, which nothing else may hold".into(),
        ));
    }
    let operands: Vec<&Tensor> = [Some(x), n.mean, Some(n.rstd), n.w, n.b]
        .into_iter()
        .flatten()
        .collect();
    match backend("norm", &operands)? {
        Backend::Cpu | Backend::Meta => Ok(None),
        Backend::Cuda(_) => {
            let (xhat, bits) = cuda::normalize_relu(x, geo, n)?;
            Ok(Some((xhat, ReluMask(bits))))
        }
    }
}

/// The packed mask of a fused norm + ReLU's positives ([`normalize_relu`]),
/// outside the ledger until taken.
pub(super) struct ReluMask(cuda::ReluBits);

impl ReluMask {
    /// The mask as a U32 tensor of `ceil(n/32)` words, counted now.
    fn into_tensor(self) -> Result<Tensor> {
        self.0.into_tensor()
    }
}

/// Parameter gradients: `Σ g·x̂` (when `xhat` is given) and `Σ g` (when
/// `want_b`) per affine parameter, summed in f64 in a fixed order and
/// rounded once to `g`'s dtype, shaped `shape`, on `g`'s device.
fn param_grads(
    g: &Tensor,
    xhat: Option<&Tensor>,
    geo: NormGeom,
    want_b: bool,
    shape: &[usize],
) -> Result<ParamGrads> {
    if let Some(xh) = xhat {
        check_like("norm_backward", xh, g.shape(), g.dtype())?;
    }
    let with_xhat: Vec<&Tensor> = std::iter::once(g).chain(xhat).collect();
    let (gw, gb) = match backend("norm_backward", &with_xhat)? {
        Backend::Cpu => cpu::param_sums(g, xhat, geo, want_b)?,
        Backend::Meta => {
            let np = geo.nparam();
            let zeros = || try_zeroed::<f64>(np);
            (
                xhat.map(|_| zeros()).transpose()?,
                want_b.then(zeros).transpose()?,
            )
        }
        Backend::Cuda(_) => return cuda::param_grads(g, xhat, geo, want_b, shape),
    };
    let wrap = |v: Option<Vec<f64>>| {
        v.map(|v| Tensor::from_host_f64(&v, shape, g.dtype(), g.device()))
            .transpose()
    };
    Ok((wrap(gw)?, wrap(gb)?))
}

/// Per statistic `(Σ g, Σ g·x̂)` in f64 on the CPU, in the order the CPU's
/// input gradient sums them (`None` on other devices, which sum on their
/// own): batch norm's weight and bias gradients and its input gradient's
/// means are these sums, so one pass over `g` and `x̂` serves all three.
fn stat_sums(g: &Tensor, xhat: &Tensor, geo: NormGeom) -> Result<Option<Vec<(f64, f64)>>> {
    check_like("norm_backward", xhat, g.shape(), g.dtype())?;
    match backend("norm_backward", &[g, xhat])? {
        Backend::Cpu => Ok(Some(cpu::stat_sums(g, xhat, geo)?)),
        Backend::Meta | Backend::Cuda(_) => Ok(None),
    }
}

/// The input gradient's per-statistic `scale` (statistics dtype) and
/// per-parameter `w` (input dtype; 1 when absent).
#[derive(Clone, Copy)]
struct GradScale<'a> {
    scale: &'a Tensor,
    w: Option<&'a Tensor>,
}

/// The input gradient, with `scale` per statistic and `w` per parameter
/// (1 when absent); `xhat` is needed unless `mode` is `Affine`. Written
/// over `g` when buffer reuse is on and nothing else holds `g`. `sums`:
/// [`stat_sums`] of this `g` and `xhat` when already computed and `w` is
/// absent (the CPU then skips its own pass; other devices ignore it).
fn input_grad(
    g: Tensor,
    xhat: Option<&Tensor>,
    geo: NormGeom,
    mode: GradMode,
    by: GradScale<'_>,
    sums: Option<&[(f64, f64)]>,
) -> Result<Tensor> {
    let sums = sums.filter(|_| by.w.is_none());
    if let Some(xh) = xhat {
        check_like("norm_backward", xh, g.shape(), g.dtype())?;
    } else if mode != GradMode::Affine {
        return Err(Error::Backward("norm: x̂ missing".into()));
    }
    let over_g = may_reuse(&g);
    let operands: Vec<&Tensor> = [Some(&g), xhat, Some(by.scale), by.w]
        .into_iter()
        .flatten()
        .collect();
    let backend = backend("norm_backward", &operands)?;
    if over_g {
        match backend {
            Backend::Cpu => cpu::input_grad_in_place(&g, xhat, geo, mode, by, sums)?,
            Backend::Meta => {
                crate::meta::float("norm_backward", g.dtype())?;
                crate::meta::touch(&g);
            }
            Backend::Cuda(_) => cuda::input_grad_in_place(&g, xhat, geo, mode, by)?,
        }
        return Ok(g);
    }
    match backend {
        Backend::Cpu => cpu::input_grad(&g, xhat, geo, mode, by, sums),
        Backend::Meta => {
            crate::meta::float("norm_backward", g.dtype())?;
            crate::meta::empty(g.shape(), g.dtype())
        }
        Backend::Cuda(_) => cuda::input_grad(&g, xhat, geo, mode, by),
    }
}
