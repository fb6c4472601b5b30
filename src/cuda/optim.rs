//! Launch wrappers for the optimizer updates and gradient norms of
//! `kernels/optim.cu`: SGD and Adam/AdamW in place, with clipping fused
//! into the read of the gradient, and the f64 sum of squares that norm
//! clipping needs. Each computes exactly what `src/optim` computes on the
//! CPU, operation by operation and in the same order, so the parameters
//! come out bit-identical.

use super::check::{float_suffix, input};
use super::layers_util::{expect, invalid};
use super::{CudaBuffer, CudaDevice, Strided};
use crate::optim::kernels::NORM_LANES;
use crate::Result;
use cudarc::driver::LaunchConfig;

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

/// The parameter and gradient of one update: `n` parameter elements,
/// contiguous from element `offset` of `param`, and the gradient read
/// through `layout` (any strides, `n` elements in row-major order).
pub struct UpdateArgs<'a> {
    /// The parameter's buffer (written in place).
    pub param: &'a mut CudaBuffer,
    /// The parameter's first element in its buffer.
    pub offset: usize,
    /// The gradient's buffer.
    pub grad: &'a CudaBuffer,
    /// The gradient's layout in its buffer.
    pub layout: Strided,
    /// The gradient transform (clipping).
    pub map: GradMap,
}

impl UpdateArgs<'_> {
    /// Checks dtypes, devices and extents; returns the element count.
    fn check(&self, op: &'static str) -> Result<usize> {
        let n = self.layout.numel();
        input(op, self.grad, self.param.dtype(), &self.layout, self.param)?;
        if self.offset + n > self.param.len() {
            return Err(invalid(
                op,
                format!(
                    "{n} parameter elements from {} in a buffer of {}",
                    self.offset,
                    self.param.len()
                ),
            ));
        }
        Ok(n)
    }
}

/// One SGD step in place (`step` is 1 on the first update); `buf` is the
/// momentum buffer, whole and contiguous (required when momentum ≠ 0, and
/// used whenever given, as the CPU uses a state slice).
/// Allocates nothing. Bit-identical to the CPU update.
pub fn sgd_step(
    a: UpdateArgs<'_>,
    buf: Option<&mut CudaBuffer>,
    step: u64,
    hp: &SgdParams,
) -> Result<()> {
    let op = "cuda SGD";
    let sfx = float_suffix(op, a.param.dtype())?;
    let n = a.check(op)?;
    if hp.momentum != 0.0 && buf.is_none() {
        return Err(invalid(op, "momentum without a momentum buffer"));
    }
    if let Some(b) = &buf {
        expect(op, b, a.param.dtype(), n, a.param)?;
    }
    if n == 0 {
        return Ok(());
    }
    // As on the CPU, a given buffer is used (the optimizer gives one
    // exactly when momentum ≠ 0).
    let has_buf = i32::from(buf.is_some());
    let (n64, off, (gm, gp)) = (n as i64, a.offset as i64, a.map.code());
    let flags = [
        i32::from(hp.nesterov),
        i32::from(hp.maximize),
        // The CPU's test: the buffer starts as the gradient on update 1.
        i32::from(step == 1),
        has_buf,
    ];
    let gl = a.layout.coalesced();
    let dev = a.param.device().clone();
    let name = format!("sgd_{sfx}");
    match buf {
        Some(b) => launch!(&dev, "optim.cu", name, CudaDevice::grid_for(n);
            &n64, &hp.lr, &hp.momentum, &hp.dampening, &hp.weight_decay, &flags[0], &flags[1],
            &flags[2], &flags[3], &gm, &gp, a.param.slice_mut(), &off, a.grad.slice(), &gl,
            b.slice_mut()),
        // No buffer: the kernel never touches its `buf` argument, so the
        // gradient's pointer stands in (no placeholder allocation).
        None => launch!(&dev, "optim.cu", name, CudaDevice::grid_for(n);
            &n64, &hp.lr, &hp.momentum, &hp.dampening, &hp.weight_decay, &flags[0], &flags[1],
            &flags[2], &flags[3], &gm, &gp, a.param.slice_mut(), &off, a.grad.slice(), &gl,
            a.grad.slice()),
    }
}

/// One Adam step (`step` ≥ 1, as on the CPU) in place with moments `m`,
/// `v` and, for amsgrad, `vmax` (used whenever given, as the CPU uses a
/// third state slice; whole contiguous buffers of the parameter's length
/// and dtype). Allocates nothing. Bit-identical to the CPU update.
pub fn adam_step(
    a: UpdateArgs<'_>,
    m: &mut CudaBuffer,
    v: &mut CudaBuffer,
    vmax: Option<&mut CudaBuffer>,
    step: u64,
    hp: &AdamParams,
) -> Result<()> {
    let op = "cuda Adam";
    let sfx = float_suffix(op, a.param.dtype())?;
    let n = a.check(op)?;
    for b in [&*m, &*v] {
        expect(op, b, a.param.dtype(), n, a.param)?;
    }
    if hp.amsgrad && vmax.is_none() {
        return Err(invalid(op, "amsgrad without a max buffer"));
    }
    if let Some(b) = &vmax {
        expect(op, b, a.param.dtype(), n, a.param)?;
    }
    if n == 0 {
        return Ok(());
    }
    // The step constants exactly as `Adam::update` computes them on the host.
    let t = step as f64;
    let neg_step = -(hp.lr / (1.0 - hp.beta1.powf(t)));
    let bc2_sqrt = (1.0 - hp.beta2.powf(t)).sqrt();
    let weight = 1.0 - hp.beta1;
    let shrink = 1.0 - hp.lr * hp.weight_decay;
    let decay = hp.weight_decay != 0.0;
    let flags = [
        i32::from(decay && !hp.decoupled_weight_decay),
        i32::from(decay && hp.decoupled_weight_decay),
        i32::from(hp.maximize),
        // As on the CPU, a given max buffer is used (the optimizer gives
        // one exactly with amsgrad).
        i32::from(vmax.is_some()),
    ];
    let (n64, off, (gm, gp)) = (n as i64, a.offset as i64, a.map.code());
    let gl = a.layout.coalesced();
    let dev = a.param.device().clone();
    let name = format!("adam_{sfx}");
    match vmax {
        Some(vm) => launch!(&dev, "optim.cu", name, CudaDevice::grid_for(n);
            &n64, &neg_step, &bc2_sqrt, &hp.eps, &weight, &hp.beta2, &hp.weight_decay, &shrink,
            &flags[0], &flags[1], &flags[2], &flags[3], &gm, &gp, a.param.slice_mut(), &off,
            a.grad.slice(), &gl, m.slice_mut(), v.slice_mut(), vm.slice_mut()),
        // Without amsgrad the kernel never touches `vmax`: the gradient's
        // pointer stands in (no placeholder allocation).
        None => launch!(&dev, "optim.cu", name, CudaDevice::grid_for(n);
            &n64, &neg_step, &bc2_sqrt, &hp.eps, &weight, &hp.beta2, &hp.weight_decay, &shrink,
            &flags[0], &flags[1], &flags[2], &flags[3], &gm, &gp, a.param.slice_mut(), &off,
            a.grad.slice(), &gl, m.slice_mut(), v.slice_mut(), a.grad.slice()),
    }
}

/// The whole contiguous `param`, its contiguous gradient and `map`.
fn whole<'a>(
    param: &'a mut CudaBuffer,
    grad: &'a CudaBuffer,
    map: GradMap,
) -> Result<UpdateArgs<'a>> {
    let layout = Strided::contiguous(&[param.len()])?;
    Ok(UpdateArgs {
        param,
        offset: 0,
        grad,
        layout,
        map,
    })
}

/// [`sgd_step`] on the whole contiguous `param` from a contiguous `grad`.
pub fn sgd_update(
    param: &mut CudaBuffer,
    grad: &CudaBuffer,
    buf: Option<&mut CudaBuffer>,
    step: u64,
    hp: &SgdParams,
    map: GradMap,
) -> Result<()> {
    sgd_step(whole(param, grad, map)?, buf, step, hp)
}

/// [`adam_step`] on the whole contiguous `param` from a contiguous `grad`.
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
    adam_step(whole(param, grad, map)?, m, v, vmax, step, hp)
}

/// The sum of squares of the elements `layout` reads from `g`, in f64 and
/// in the CPU's order (`crate::optim::kernels::sum_of_squares`): lane `k`
/// of `min(n, NORM_LANES)` sums the `i ≡ k` elements in increasing `i`,
/// then the lanes (zero-padded to a power of two) are added as a pairwise
/// tree. Its two small f64 buffers are scratch, outside the ledger (the
/// CPU's lanes are host memory); reading the result back synchronizes.
pub fn sum_of_squares(g: &CudaBuffer, layout: &Strided) -> Result<f64> {
    let op = "cuda sum_of_squares";
    let sfx = float_suffix(op, g.dtype())?;
    input(op, g, g.dtype(), layout, g)?;
    let n = layout.numel();
    if n == 0 {
        return Ok(0.0);
    }
    let lanes = n.min(NORM_LANES);
    let pow2 = lanes.next_power_of_two();
    let (n64, l64, p64) = (n as i64, lanes as i64, pow2 as i64);
    let gl = layout.coalesced();
    let dev = g.device().clone();
    super::tensor::uncounted(|| {
        // Zeros: lanes..pow2 are the tree's padding.
        let mut part = CudaBuffer::zeros(&dev, crate::DType::F64, pow2)?;
        let mut total = CudaBuffer::alloc(&dev, crate::DType::F64, 1)?;
        launch!(&dev, "optim.cu", format!("sumsq_lanes_{sfx}"), CudaDevice::grid_for(lanes);
            &n64, &l64, g.slice(), &gl, part.slice_mut())?;
        let one_block = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(&dev, "optim.cu", "sumsq_tree", one_block;
            &p64, part.slice_mut(), total.slice_mut())?;
        let host = total.to_vec::<f64>()?;
        host.first()
            .copied()
            .ok_or_else(|| invalid(op, "no total read back"))
    })
}

/// A new contiguous buffer of the elements `layout` reads from `g`, each
/// limited to `[-bound, bound]` in the dtype (NaN passes through): what
/// `Tensor::clamp(-bound, bound)` computes, for `clip_grad_value` on CUDA.
/// The output is counted under the current category, as clamp's is.
pub fn clamp_abs(g: &CudaBuffer, layout: &Strided, bound: f64) -> Result<CudaBuffer> {
    let op = "cuda clamp_abs";
    let sfx = float_suffix(op, g.dtype())?;
    input(op, g, g.dtype(), layout, g)?;
    let n = layout.numel();
    let mut out = CudaBuffer::alloc(g.device(), g.dtype(), n)?;
    if n > 0 {
        let n64 = n as i64;
        let gl = layout.coalesced();
        launch!(g.device(), "optim.cu", format!("clamp_abs_{sfx}"), CudaDevice::grid_for(n);
            &n64, &bound, out.slice_mut(), g.slice(), &gl)?;
    }
    Ok(out)
}
