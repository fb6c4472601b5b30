//! The CUDA arms of `cpu::norm` and `cpu::norm_grad`. They take and return
//! what the CPU kernels do (host f64 statistics that the layers round as on
//! the CPU, and tensors of the input's dtype), so every layer saves on CUDA
//! exactly the tensors it saves on the CPU. The small per-statistic and
//! per-parameter vectors cross to and from the device outside the ledger
//! (`cuda::tensor::uncounted`), as their host counterparts are outside it
//! on the CPU; a non-contiguous operand is copied first, as `Workspace`.

use super::norm::{stat_dtype, Geo, GradMode};
use crate::cuda::layers_norm::{self as kern, NormGeom, NormGradMode};
use crate::cuda::{CudaBuffer, CudaDevice};
use crate::tensor::cuda::{adopt, uncounted, wrap};
use crate::tensor::Tensor;
use crate::{DType, Result, WithDType};
use std::ops::Range;
use std::sync::Arc;

/// The launch wrappers' description of `geo`.
fn geom(geo: Geo) -> Result<NormGeom> {
    Ok(match geo {
        Geo::Channel { outer, c, inner } => NormGeom::batch(outer, c, inner),
        Geo::Group {
            n,
            c,
            spatial,
            groups,
        } => NormGeom::group(n, c, spatial, groups)?,
        Geo::Row { rows, len } => NormGeom::row(rows, len),
    })
}

/// The kernels' form of a gradient mode.
fn grad_mode(mode: GradMode) -> NormGradMode {
    match mode {
        GradMode::Centered => NormGradMode::Centered,
        GradMode::Uncentered => NormGradMode::Uncentered,
        GradMode::Affine => NormGradMode::Affine,
    }
}

/// `x` as one whole contiguous buffer; a copy, when one is needed, stays
/// out of the ledger, as the CPU's gather of a view into host values does.
fn dense(x: &Tensor) -> Result<Tensor> {
    crate::tensor::cuda::uncounted(|| crate::tensor::cuda::dense(x))
}

/// The device `x` lives on.
fn device_of(x: &Tensor) -> Result<Arc<CudaDevice>> {
    Ok(x.storage().cuda()?.device().clone())
}

/// Host values as a device buffer of `dtype` (callers run it uncounted:
/// the CPU keeps these as host vectors), converted as the CPU's
/// `WithDType::from_f64`; exact for statistics (already rounded to `dtype`)
/// and parameters (read from `dtype`).
fn host_buffer(dev: &Arc<CudaDevice>, values: &[f64], dtype: DType) -> Result<CudaBuffer> {
    fn typed<T: WithDType>(dev: &Arc<CudaDevice>, values: &[f64]) -> Result<CudaBuffer> {
        let host: Vec<T> = values.iter().map(|v| T::from_f64(*v)).collect();
        CudaBuffer::from_slice(dev, &host)
    }
    match dtype {
        DType::F32 => typed::<f32>(dev, values),
        DType::F64 => typed::<f64>(dev, values),
        DType::F16 => typed::<half::f16>(dev, values),
        DType::BF16 => typed::<half::bf16>(dev, values),
        // `num_batches_tracked` (i64) goes through `write_values` too.
        DType::I64 => typed::<i64>(dev, values),
        DType::U32 => typed::<u32>(dev, values),
        DType::U8 => typed::<u8>(dev, values),
    }
}

/// Per statistic: the unrounded mean and biased variance, read back to the
/// host as `cpu::norm::norm_stats` returns them.
pub(super) fn norm_stats(x: &Tensor, geo: Geo, centered: bool) -> Result<(Vec<f64>, Vec<f64>)> {
    let xd = dense(x)?;
    let xb = xd.storage().cuda()?;
    uncounted(|| {
        let (mean, var) = kern::norm_moments(&xb, &geom(geo)?, centered)?;
        Ok((mean.to_vec::<f64>()?, var.to_vec::<f64>()?))
    })
}

/// `cpu::norm::normalize` on CUDA: `y` and/or `x̂` as new contiguous tensors
/// counted under the current category, as the CPU's.
#[allow(clippy::too_many_arguments)]
pub(super) fn normalize(
    x: &Tensor,
    geo: Geo,
    mean: &[f64],
    rstd: &[f64],
    w: Option<&[f64]>,
    b: Option<&[f64]>,
    want_y: bool,
    want_xhat: bool,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let xd = dense(x)?;
    let (y, xh) = {
        let xb = xd.storage().cuda()?;
        let (dev, dt) = (xb.device().clone(), x.dtype());
        // Statistics, parameters and the kernel's 1-element stand-ins are
        // host-side values on the CPU; the outputs are adopted below.
        uncounted(|| {
            if x.numel() == 0 {
                let none = |want: bool| want.then(|| CudaBuffer::alloc(&dev, dt, 0)).transpose();
                return Ok((none(want_y)?, none(want_xhat)?));
            }
            let sd = stat_dtype(dt);
            let (mb, rb) = (host_buffer(&dev, mean, sd)?, host_buffer(&dev, rstd, sd)?);
            let wb = w.map(|v| host_buffer(&dev, v, dt)).transpose()?;
            let bb = b.map(|v| host_buffer(&dev, v, dt)).transpose()?;
            let g = geom(geo)?;
            kern::norm_forward(
                &xb,
                &g,
                &mb,
                &rb,
                wb.as_ref(),
                bb.as_ref(),
                want_y,
                want_xhat,
            )
        })?
    };
    let own = |t: Option<CudaBuffer>| t.map(|t| adopt(t, x.shape())).transpose();
    Ok((own(y)?, own(xh)?))
}

/// `cpu::norm_grad::input_grad` on CUDA from the saved `x̂` (checked by the
/// caller against `g`), `scale` per statistic and `w` per parameter.
pub(super) fn input_grad(
    g: &Tensor,
    xhat: Option<&Tensor>,
    geo: Geo,
    mode: GradMode,
    scale: &[f64],
    w: Option<&[f64]>,
) -> Result<Tensor> {
    let gd = dense(g)?;
    let xd = xhat.map(dense).transpose()?;
    let dev = device_of(&gd)?;
    let (sb, wb) = uncounted(|| {
        let sb = host_buffer(&dev, scale, stat_dtype(g.dtype()))?;
        Ok((sb, w.map(|v| host_buffer(&dev, v, g.dtype())).transpose()?))
    })?;
    let dx = {
        let gb = gd.storage().cuda()?;
        let xg = xd.as_ref().map(|t| t.storage().cuda()).transpose()?;
        let geo = geom(geo)?;
        kern::norm_input_grad_saved(&gb, xg.as_deref(), &geo, &sb, wb.as_ref(), grad_mode(mode))?
    };
    wrap(dx, g.shape())
}

/// `cpu::norm_grad::param_grads` on CUDA: `Σ g·x̂` (when `xhat` is given)
/// and `Σ g` (when `want_b`) as tensors of `g`'s dtype shaped `shape`.
pub(super) fn param_grads(
    g: &Tensor,
    xhat: Option<&Tensor>,
    geo: Geo,
    want_b: bool,
    shape: &[usize],
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let gd = dense(g)?;
    let xd = xhat.map(dense).transpose()?;
    let (dw, db) = {
        let gb = gd.storage().cuda()?;
        let xg = xd.as_ref().map(|t| t.storage().cuda()).transpose()?;
        // The kernel's 1-element stand-ins are not tensor memory; the
        // gradients are adopted into the ledger below, as the CPU's.
        uncounted(|| kern::norm_param_grads_saved(&gb, xg.as_deref(), &geom(geo)?, want_b))?
    };
    let own = |t: Option<CudaBuffer>| t.map(|t| adopt(t, shape)).transpose();
    Ok((own(dw)?, own(db)?))
}

/// `cpu::norm::write_values` on CUDA: overwrites elements `range` of `t`'s
/// buffer with `values` rounded to its dtype (bumps its version).
pub(super) fn write_values(t: &Tensor, range: Range<usize>, values: &[f64]) -> Result<()> {
    let dev = device_of(t)?;
    let src = uncounted(|| host_buffer(&dev, values, t.dtype()))?;
    t.storage()
        .cuda_mut()?
        .copy_range_from(range.start, &src, 0, range.len())
}
