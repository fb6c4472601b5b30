//! Launch wrappers for embedding (`embedding.cu`), optimizer updates
//! (`optim.cu`) and the per-channel sum of conv bias gradients (`conv.cu`).
//! The fused attention softmax is in `layers_attention.rs`.

use super::check::float_suffix;
use super::layers_util::{expect, invalid};
use super::{CudaBuffer, CudaDevice};
use crate::memory::Category;
use crate::Result;

// The fused attention softmax moved to `layers_attention.rs`; its old path
// stays valid.
pub use super::layers_attention::{attention_probs, attention_softmax_grad, AttnMask};

/// Checks host indices against a table of `num` rows, as i64.
fn indices(op: &'static str, idx: &[usize], num: usize) -> Result<Vec<i64>> {
    match idx.iter().find(|&&i| i >= num) {
        Some(&i) => Err(crate::Error::IndexOutOfRange {
            op,
            index: i as i64,
            size: num,
        }),
        None => Ok(idx.iter().map(|&i| i as i64).collect()),
    }
}

/// Embedding lookup: rows `idx` of the contiguous `[num, dim]` table `w`,
/// as a contiguous `[idx.len(), dim]` buffer.
pub fn embedding_forward(
    w: &CudaBuffer,
    num: usize,
    dim: usize,
    idx: &[usize],
) -> Result<CudaBuffer> {
    let op = "cuda embedding";
    let sfx = float_suffix(op, w.dtype())?;
    expect(op, w, w.dtype(), num * dim, w)?;
    let host = indices(op, idx, num)?;
    let mut out = CudaBuffer::alloc(w.device(), w.dtype(), idx.len() * dim)?;
    if !out.is_empty() {
        let d_idx = CudaBuffer::from_slice(w.device(), &host)?;
        let (k, d) = (idx.len() as i64, dim as i64);
        launch!(w.device(), "embedding.cu", format!("embedding_fwd_{sfx}"), CudaDevice::grid_for(idx.len() * dim);
            &k, &d, out.slice_mut(), w.slice(), d_idx.slice())?;
    }
    Ok(out)
}

/// The `[num, dim]` weight gradient from `g` (contiguous `[idx.len(),
/// dim]`): row `idx[k]` gets row `k` of `g` added, in `k` order, except
/// where `idx[k]` is `padding`. Deterministic and bit-identical to the CPU:
/// the positions are grouped by row on the host and one block sums a row.
pub fn embedding_backward(
    g: &CudaBuffer,
    idx: &[usize],
    num: usize,
    dim: usize,
    padding: Option<usize>,
) -> Result<CudaBuffer> {
    let op = "cuda embedding backward";
    let sfx = float_suffix(op, g.dtype())?;
    expect(op, g, g.dtype(), idx.len() * dim, g)?;
    indices(op, idx, num)?;
    let mut gw = CudaBuffer::zeros(g.device(), g.dtype(), num * dim)?;
    // Positions grouped by row (a stable sort keeps k order inside a row).
    let mut order: Vec<usize> = (0..idx.len())
        .filter(|&k| Some(idx[k]) != padding)
        .collect();
    order.sort_by_key(|&k| idx[k]);
    let (mut rows, mut starts) = (Vec::<i64>::new(), Vec::<i64>::new());
    for (q, &k) in order.iter().enumerate() {
        if rows.last() != Some(&(idx[k] as i64)) {
            rows.push(idx[k] as i64);
            starts.push(q as i64);
        }
    }
    starts.push(order.len() as i64);
    if rows.is_empty() || dim == 0 {
        return Ok(gw);
    }
    let pos: Vec<i64> = order.iter().map(|&k| k as i64).collect();
    let dev = g.device();
    let _ws = crate::memory::with_category(Category::Workspace);
    let d_rows = CudaBuffer::from_slice(dev, &rows)?;
    let d_starts = CudaBuffer::from_slice(dev, &starts)?;
    let d_pos = CudaBuffer::from_slice(dev, &pos)?;
    let (used, d) = (rows.len() as i64, dim as i64);
    launch!(dev, "embedding.cu", format!("embedding_bwd_{sfx}"), CudaDevice::grid_per_row(rows.len());
        &used, &d, gw.slice_mut(), g.slice(), d_rows.slice(), d_starts.slice(), d_pos.slice())?;
    Ok(gw)
}

/// How the raw gradient is transformed before an update (`GradTransform`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GradMap {
    /// Used as is.
    Identity,
    /// Multiplied by the factor (rounded to the dtype first).
    Scale(f64),
    /// Clamped to `[-bound, bound]`.
    ClampAbs(f64),
}

impl GradMap {
    fn code(self) -> (i32, f64) {
        match self {
            GradMap::Identity => (0, 0.0),
            GradMap::Scale(s) => (1, s),
            GradMap::ClampAbs(b) => (2, b),
        }
    }
}

/// SGD hyper-parameters (`crate::optim::Sgd`).
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

/// One SGD step in place on contiguous `param` from `grad` (same length and
/// dtype); `buf` is the momentum buffer (required when momentum ≠ 0);
/// `step` is 1 on the first update. Bit-identical to the CPU update.
pub fn sgd_update(
    param: &mut CudaBuffer,
    grad: &CudaBuffer,
    buf: Option<&mut CudaBuffer>,
    step: u64,
    hp: &SgdParams,
    map: GradMap,
) -> Result<()> {
    let op = "cuda SGD";
    let sfx = float_suffix(op, param.dtype())?;
    let n = param.len();
    expect(op, grad, param.dtype(), n, param)?;
    if hp.momentum != 0.0 && buf.is_none() {
        return Err(invalid(op, "momentum without a momentum buffer"));
    }
    let mut spare = CudaBuffer::alloc_in(param.device(), param.dtype(), 1, Category::Workspace)?;
    let has_buf = i32::from(buf.is_some() && hp.momentum != 0.0);
    let b = match buf {
        Some(b) => {
            expect(op, b, param.dtype(), n, param)?;
            b
        }
        None => &mut spare,
    };
    if n == 0 {
        return Ok(());
    }
    let (n64, (gm, gp)) = (n as i64, map.code());
    let flags = [
        i32::from(hp.nesterov),
        i32::from(hp.maximize),
        i32::from(step <= 1),
        has_buf,
    ];
    let dev = param.device().clone();
    launch!(&dev, "optim.cu", format!("sgd_{sfx}"), CudaDevice::grid_for(n);
        &n64, &hp.lr, &hp.momentum, &hp.dampening, &hp.weight_decay, &flags[0], &flags[1],
        &flags[2], &flags[3], &gm, &gp, param.slice_mut(), grad.slice(), b.slice_mut())
}

/// Adam / AdamW hyper-parameters (`crate::optim::Adam`).
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

/// One Adam step (`step` ≥ 1) in place on contiguous `param` with moments
/// `m`, `v` and, for amsgrad, `vmax` (all of `param`'s length and dtype).
/// Bit-identical to the CPU update.
#[allow(clippy::too_many_arguments)]
pub fn adam_update(
    param: &mut CudaBuffer,
    grad: &CudaBuffer,
    m: &mut CudaBuffer,
    v: &mut CudaBuffer,
    vmax: Option<&mut CudaBuffer>,
    step: u64,
    hp: &AdamParams,
    map: GradMap,
) -> Result<()> {
    let op = "cuda Adam";
    let sfx = float_suffix(op, param.dtype())?;
    let n = param.len();
    for b in [grad, &*m, &*v] {
        expect(op, b, param.dtype(), n, param)?;
    }
    if hp.amsgrad && vmax.is_none() {
        return Err(invalid(op, "amsgrad without a max buffer"));
    }
    let mut spare = CudaBuffer::alloc_in(param.device(), param.dtype(), 1, Category::Workspace)?;
    let vm = match vmax {
        Some(b) => {
            expect(op, b, param.dtype(), n, param)?;
            b
        }
        None => &mut spare,
    };
    if n == 0 {
        return Ok(());
    }
    let t = step.max(1) as f64;
    let neg_step = -(hp.lr / (1.0 - hp.beta1.powf(t)));
    let bc2_sqrt = (1.0 - hp.beta2.powf(t)).sqrt();
    let weight = 1.0 - hp.beta1;
    let shrink = 1.0 - hp.lr * hp.weight_decay;
    let decay = hp.weight_decay != 0.0;
    let flags = [
        i32::from(decay && !hp.decoupled_weight_decay),
        i32::from(decay && hp.decoupled_weight_decay),
        i32::from(hp.maximize),
        i32::from(hp.amsgrad),
    ];
    let (n64, (gm, gp)) = (n as i64, map.code());
    let dev = param.device().clone();
    launch!(&dev, "optim.cu", format!("adam_{sfx}"), CudaDevice::grid_for(n);
        &n64, &neg_step, &bc2_sqrt, &hp.eps, &weight, &hp.beta2, &hp.weight_decay, &shrink,
        &flags[0], &flags[1], &flags[2], &flags[3], &gm, &gp, param.slice_mut(), grad.slice(),
        m.slice_mut(), v.slice_mut(), vm.slice_mut())
}

/// Per channel of `gy` (`[n, c, l]`): the sum over `n` and `l` in f64 (the
/// bias gradient), in `gy`'s dtype.
pub fn channel_sum(gy: &CudaBuffer, n: usize, c: usize, l: usize) -> Result<CudaBuffer> {
    let op = "cuda channel_sum";
    let sfx = float_suffix(op, gy.dtype())?;
    expect(op, gy, gy.dtype(), n * c * l, gy)?;
    let mut out = CudaBuffer::alloc(gy.device(), gy.dtype(), c)?;
    if c > 0 {
        let (n64, c64, l64) = (n as i64, c as i64, l as i64);
        launch!(gy.device(), "conv.cu", format!("channel_sum_{sfx}"), CudaDevice::grid_per_row(c);
            &n64, &c64, &l64, out.slice_mut(), gy.slice())?;
    }
    Ok(out)
}
