//! 2-d pooling kernels over `[planes, H, W]` row-major data (planes = N·C):
//! max pooling (recording the argmax's position inside its window) and
//! average / adaptive average pooling. Written once for every float dtype;
//! planes run in parallel above `PARALLEL_THRESHOLD` output elements, and
//! inside a plane backward accumulates in output order, so gradients are
//! deterministic.

use super::elementwise::gather;
use super::PARALLEL_THRESHOLD;
use crate::dtype::CpuData;
use crate::memory::{with_category, Category};
use crate::meta::{backend, Backend};
use crate::tensor::Tensor;
use crate::{FloatDType, Result, WithDType};
use rayon::prelude::*;

/// The geometry of one 2-d pooling: input `h × w`, output `oh × ow`,
/// window `kh × kw` with stride, padding and dilation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolGeom {
    pub planes: usize,
    pub h: usize,
    pub w: usize,
    pub oh: usize,
    pub ow: usize,
    pub k: [usize; 2],
    pub s: [usize; 2],
    pub p: [usize; 2],
    pub d: [usize; 2],
}

impl PoolGeom {
    /// Input row/column touched by window position `(ki, kj)` of output
    /// `(i, j)`, or `None` when it falls in the padding.
    #[inline(always)]
    fn at(&self, i: usize, j: usize, ki: usize, kj: usize) -> Option<usize> {
        let r = (i * self.s[0] + ki * self.d[0]).checked_sub(self.p[0])?;
        let c = (j * self.s[1] + kj * self.d[1]).checked_sub(self.p[1])?;
        (r < self.h && c < self.w).then_some(r * self.w + c)
    }
}

/// Runs `f(plane, out_chunk, extra_chunk)` for every plane, in parallel
/// when the output is large.
fn per_plane<A: Send, B: Send>(
    out: &mut [A],
    extra: &mut [B],
    plane_out: usize,
    f: impl Fn(usize, &mut [A], &mut [B]) + Sync + Send,
) {
    if plane_out == 0 {
        return;
    }
    if out.len() >= PARALLEL_THRESHOLD {
        out.par_chunks_mut(plane_out)
            .zip(extra.par_chunks_mut(plane_out))
            .enumerate()
            .for_each(|(p, (o, e))| f(p, o, e));
    } else {
        out.chunks_mut(plane_out)
            .zip(extra.chunks_mut(plane_out))
            .enumerate()
            .for_each(|(p, (o, e))| f(p, o, e));
    }
}

/// Same as [`per_plane`] without the extra buffer.
fn per_plane1<A: Send>(out: &mut [A], plane: usize, f: impl Fn(usize, &mut [A]) + Sync + Send) {
    let mut none = vec![(); out.len()];
    per_plane(out, &mut none, plane, |p, o, _| f(p, o));
}

/// A contiguous copy of `x`'s elements (a workspace buffer), or `None`
/// when `x` is already contiguous and can be read in place.
/// The meta output `[planes, h, w]` of a pooling kernel over `x`.
fn meta_plane_out(x: &Tensor, h: usize, w: usize, g: &PoolGeom) -> Result<Tensor> {
    crate::meta::float("pool", x.dtype())?;
    crate::meta::empty(&[g.planes, h, w], x.dtype())
}

fn dense(x: &Tensor) -> Result<Option<CpuData>> {
    if x.is_contiguous() {
        return Ok(None);
    }
    let _ws = with_category(Category::Workspace);
    Ok(Some(gather(x)?))
}

/// Calls `body` with `x`'s elements in row-major order as a typed slice.
fn with_dense<R>(
    x: &Tensor,
    op: &'static str,
    body: impl FnOnce(&CpuData, std::ops::Range<usize>) -> Result<R>,
) -> Result<R> {
    match dense(x)? {
        Some(copy) => {
            let n = copy.len();
            body(&copy, 0..n)
        }
        None => {
            let data = x.storage().cpu()?;
            let range = x
                .layout()
                .contiguous_range()
                .ok_or(crate::Error::InvalidArgument {
                    op,
                    msg: "expected a contiguous tensor".into(),
                })?;
            body(&data, range)
        }
    }
}

/// Max pooling: the output and, per output element, the position of the
/// first maximum inside its window (`ki · kw + kj`; a NaN counts as the
/// maximum). A window lying wholly in the padding gives -inf and position 0.
/// The CUDA form of a geometry (same sizes, the kernels' integer type).
fn cuda_geom(g: &PoolGeom) -> crate::cuda::layers_pool::PoolGeom {
    let c = |v: usize| v as i64;
    crate::cuda::layers_pool::PoolGeom {
        planes: c(g.planes),
        h: c(g.h),
        w: c(g.w),
        oh: c(g.oh),
        ow: c(g.ow),
        k: g.k.map(c),
        s: g.s.map(c),
        p: g.p.map(c),
        d: g.d.map(c),
    }
}

/// `x` as a whole-buffer dense CUDA tensor (a Workspace copy of a view).
fn cuda_dense(x: &Tensor) -> Result<Tensor> {
    let _ws = crate::memory::with_category(crate::memory::Category::Workspace);
    crate::tensor::cuda::dense(x)
}

/// Max pooling backward on CUDA from the saved argmax (a tensor on the
/// gradient's device): U8 window positions (lean) or I64 flat in-plane
/// indices (`SaveAll`).
pub(crate) fn max_pool_backward_cuda(
    grad_out: &Tensor,
    arg: &Tensor,
    g: &PoolGeom,
) -> Result<Tensor> {
    use crate::cuda::layers_pool::{max_pool2d_backward, max_pool2d_backward_flat};
    let (dy, arg) = (cuda_dense(grad_out)?, cuda_dense(arg)?);
    let (dy, at, geom) = (dy.storage().cuda()?, arg.storage().cuda()?, cuda_geom(g));
    let out = match arg.dtype() {
        crate::DType::I64 => max_pool2d_backward_flat(&dy, &at, &geom)?,
        _ => max_pool2d_backward(&dy, &at, &geom)?,
    };
    crate::tensor::cuda::wrap(out, &[g.planes, g.h, g.w])
}

/// The CUDA form of an average mode.
fn cuda_avg_mode(mode: AvgMode) -> crate::cuda::layers_pool::AvgPoolMode {
    use crate::cuda::layers_pool::AvgPoolMode;
    match mode {
        AvgMode::Fixed {
            count_include_pad: false,
        } => AvgPoolMode::Fixed,
        AvgMode::Fixed {
            count_include_pad: true,
        } => AvgPoolMode::FixedCountPad,
        AvgMode::Adaptive => AvgPoolMode::Adaptive,
    }
}

/// The argmax's position inside its window for every output of a max pool:
/// host bytes on the CPU (and none on meta), the device buffer the kernel
/// wrote on CUDA. Neither is counted until it becomes a saved tensor, so a
/// frozen input costs nothing and CUDA never reads the positions back.
pub(crate) enum WindowPositions {
    /// Host bytes (CPU; empty on meta).
    Host(Vec<u8>),
    /// A U8 device buffer outside the ledger.
    Device(crate::cuda::CudaBuffer),
}

impl WindowPositions {
    /// The positions as a U8 tensor of `shape` on `device`, counted now.
    pub(crate) fn into_tensor(self, shape: &[usize], device: crate::Device) -> Result<Tensor> {
        match self {
            WindowPositions::Host(v) => Tensor::from_host_vec(v, shape, device),
            WindowPositions::Device(b) => crate::tensor::cuda::adopt(b, shape),
        }
    }

    /// The positions as host bytes (SaveAll's flat indices are built from
    /// them on the host, as on the CPU).
    pub(crate) fn into_host(self) -> Result<Vec<u8>> {
        match self {
            WindowPositions::Host(v) => Ok(v),
            WindowPositions::Device(b) => Ok(b.to_vec::<u8>()?),
        }
    }
}

pub(crate) fn max_pool_forward(x: &Tensor, g: &PoolGeom) -> Result<(Tensor, WindowPositions)> {
    match backend("max_pool2d", &[x])? {
        // No positions on meta: the caller sizes its saved tensors by shape.
        Backend::Meta => {
            let out = meta_plane_out(x, g.oh, g.ow, g)?;
            return Ok((out, WindowPositions::Host(Vec::new())));
        }
        Backend::Cuda(_) => {
            let x = cuda_dense(x)?;
            // The positions stay on the device, uncounted like the CPU's
            // host vector; the output is counted as usual.
            let (y, pos) = crate::tensor::cuda::uncounted(|| {
                crate::cuda::layers_pool::max_pool2d_forward(&*x.storage().cuda()?, &cuda_geom(g))
            })?;
            let y = crate::tensor::cuda::adopt(y, &[g.planes, g.oh, g.ow])?;
            return Ok((y, WindowPositions::Device(pos)));
        }
        Backend::Cpu => {}
    }
    let n_out = g.planes * g.oh * g.ow;
    let mut pos = vec![0u8; n_out];
    let out = with_dense(x, "max_pool2d", |data, r| {
        fn go<T: FloatDType>(x: &[T], g: &PoolGeom, pos: &mut [u8]) -> CpuData {
            let mut out = vec![T::neg_infinity(); pos.len()];
            per_plane(&mut out, pos, g.oh * g.ow, |p, o, ps| {
                let plane = &x[p * g.h * g.w..(p + 1) * g.h * g.w];
                for i in 0..g.oh {
                    for j in 0..g.ow {
                        let (mut best, mut at) = (T::neg_infinity(), 0usize);
                        let mut found = false;
                        for ki in 0..g.k[0] {
                            for kj in 0..g.k[1] {
                                let Some(o) = g.at(i, j, ki, kj) else {
                                    continue;
                                };
                                let v = plane[o];
                                if !found || v > best || (v.is_nan() && !best.is_nan()) {
                                    (best, at, found) = (v, ki * g.k[1] + kj, true);
                                }
                            }
                        }
                        o[i * g.ow + j] = best;
                        ps[i * g.ow + j] = at as u8;
                    }
                }
            });
            T::wrap(out)
        }
        Ok(crate::match_float_data!(data, "max_pool2d", v => go(&v[r], g, &mut pos)))
    })?;
    let out = Tensor::from_cpu_data(out, &[g.planes, g.oh, g.ow])?;
    Ok((out, WindowPositions::Host(pos)))
}

/// Flat in-plane input indices (`row · W + col`, -1 for an empty window) of
/// the window positions `pos`: what PyTorch keeps as its i64 indices.
pub(crate) fn window_to_flat(pos: &[u8], g: &PoolGeom) -> Vec<i64> {
    let plane = g.oh * g.ow;
    pos.iter()
        .enumerate()
        .map(|(e, &q)| {
            let (i, j) = ((e % plane) / g.ow, e % g.ow);
            let (ki, kj) = (q as usize / g.k[1], q as usize % g.k[1]);
            g.at(i, j, ki, kj).map_or(-1, |o| o as i64)
        })
        .collect()
}

/// Where each output element's gradient goes.
pub(crate) enum ArgSource<'a> {
    /// Positions inside the window (u8).
    Window(&'a [u8]),
    /// Flat in-plane input indices (i64, -1 for none).
    Flat(&'a [i64]),
}

/// Backward of max pooling: `grad_out` (`[planes, oh, ow]`, any layout)
/// scattered onto a zero `[planes, h, w]` gradient at the recorded argmax,
/// accumulating in output order within each plane.
pub(crate) fn max_pool_backward(grad_out: &Tensor, arg: ArgSource, g: &PoolGeom) -> Result<Tensor> {
    match backend("max_pool2d", &[grad_out])? {
        Backend::Meta => return meta_plane_out(grad_out, g.h, g.w, g),
        Backend::Cuda(n) => match arg {
            ArgSource::Window(pos) => {
                let pos = crate::tensor::cuda::uncounted(|| {
                    crate::tensor::cuda::upload(&CpuData::U8(pos.to_vec()), &[pos.len()], n)
                })?;
                return max_pool_backward_cuda(grad_out, &pos, g);
            }
            ArgSource::Flat(idx) => {
                let idx = crate::tensor::cuda::uncounted(|| {
                    crate::tensor::cuda::upload(&CpuData::I64(idx.to_vec()), &[idx.len()], n)
                })?;
                return max_pool_backward_cuda(grad_out, &idx, g);
            }
        },
        Backend::Cpu => {}
    }
    let data = with_dense(grad_out, "max_pool2d", |data, r| {
        fn go<T: FloatDType>(gs: &[T], arg: &ArgSource, g: &PoolGeom) -> CpuData {
            let mut gi = vec![T::zero(); g.planes * g.h * g.w];
            per_plane1(&mut gi, g.h * g.w, |p, gp| {
                let base = p * g.oh * g.ow;
                for e in 0..g.oh * g.ow {
                    let to = match arg {
                        ArgSource::Window(pos) => {
                            let q = pos[base + e] as usize;
                            g.at(e / g.ow, e % g.ow, q / g.k[1], q % g.k[1])
                        }
                        ArgSource::Flat(idx) => usize::try_from(idx[base + e]).ok(),
                    };
                    if let Some(o) = to {
                        gp[o] = gp[o] + gs[base + e];
                    }
                }
            });
            T::wrap(gi)
        }
        Ok(crate::match_float_data!(data, "max_pool2d", v => go(&v[r], &arg, g)))
    })?;
    Tensor::from_cpu_data(data, &[g.planes, g.h, g.w])
}

/// How average pooling windows and divisors are formed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum AvgMode {
    /// Fixed windows (`k`, `s`, `p` of the geometry); padding counts toward
    /// the divisor when `count_include_pad`.
    Fixed { count_include_pad: bool },
    /// Adaptive: row window `floor(i·H/oh) .. ceil((i+1)·H/oh)`, likewise columns.
    Adaptive,
}

/// The input rows and columns (half-open ranges) of output `(i, j)` and its divisor.
#[inline(always)]
fn avg_window(g: &PoolGeom, mode: AvgMode, i: usize, j: usize) -> ([usize; 4], f64) {
    match mode {
        AvgMode::Adaptive => {
            let (r0, r1) = (i * g.h / g.oh, ((i + 1) * g.h).div_ceil(g.oh));
            let (c0, c1) = (j * g.w / g.ow, ((j + 1) * g.w).div_ceil(g.ow));
            ([r0, r1, c0, c1], ((r1 - r0) * (c1 - c0)) as f64)
        }
        AvgMode::Fixed { count_include_pad } => {
            let r0 = (i * g.s[0]) as isize - g.p[0] as isize;
            let c0 = (j * g.s[1]) as isize - g.p[1] as isize;
            let r1 = (r0 + g.k[0] as isize).min((g.h + g.p[0]) as isize);
            let c1 = (c0 + g.k[1] as isize).min((g.w + g.p[1]) as isize);
            let padded = ((r1 - r0) * (c1 - c0)) as f64;
            let (r0, c0) = (r0.max(0) as usize, c0.max(0) as usize);
            let (r1, c1) = ((r1 as usize).min(g.h), (c1 as usize).min(g.w));
            let inside = (r1.saturating_sub(r0) * c1.saturating_sub(c0)) as f64;
            let div = if count_include_pad { padded } else { inside };
            ([r0, r1.max(r0), c0, c1.max(c0)], div)
        }
    }
}

/// Average pooling forward: each output is its window's sum (in f64)
/// divided by the window's divisor.
pub(crate) fn avg_pool_forward(x: &Tensor, g: &PoolGeom, mode: AvgMode) -> Result<Tensor> {
    match backend("avg_pool2d", &[x])? {
        Backend::Meta => return meta_plane_out(x, g.oh, g.ow, g),
        Backend::Cuda(_) => {
            let x = cuda_dense(x)?;
            let y = crate::cuda::layers_pool::avg_pool2d_forward(
                &*x.storage().cuda()?,
                &cuda_geom(g),
                cuda_avg_mode(mode),
            )?;
            return crate::tensor::cuda::wrap(y, &[g.planes, g.oh, g.ow]);
        }
        Backend::Cpu => {}
    }
    let data = with_dense(x, "avg_pool2d", |data, r| {
        fn go<T: FloatDType>(x: &[T], g: &PoolGeom, mode: AvgMode) -> CpuData {
            let mut out = vec![T::zero(); g.planes * g.oh * g.ow];
            per_plane1(&mut out, g.oh * g.ow, |p, o| {
                let plane = &x[p * g.h * g.w..(p + 1) * g.h * g.w];
                for i in 0..g.oh {
                    for j in 0..g.ow {
                        let ([r0, r1, c0, c1], div) = avg_window(g, mode, i, j);
                        let mut sum = 0.0f64;
                        for rr in r0..r1 {
                            for cc in c0..c1 {
                                sum += plane[rr * g.w + cc].to_f64();
                            }
                        }
                        o[i * g.ow + j] = <T as WithDType>::from_f64(sum / div);
                    }
                }
            });
            T::wrap(out)
        }
        Ok(crate::match_float_data!(data, "avg_pool2d", v => go(&v[r], g, mode)))
    })?;
    Tensor::from_cpu_data(data, &[g.planes, g.oh, g.ow])
}

/// Average pooling backward: each output's gradient divided by its divisor
/// (in f64) and added to every input of its window, in output order.
pub(crate) fn avg_pool_backward(grad_out: &Tensor, g: &PoolGeom, mode: AvgMode) -> Result<Tensor> {
    match backend("avg_pool2d", &[grad_out])? {
        Backend::Meta => return meta_plane_out(grad_out, g.h, g.w, g),
        Backend::Cuda(_) => {
            let dy = cuda_dense(grad_out)?;
            let dx = crate::cuda::layers_pool::avg_pool2d_backward(
                &*dy.storage().cuda()?,
                &cuda_geom(g),
                cuda_avg_mode(mode),
            )?;
            return crate::tensor::cuda::wrap(dx, &[g.planes, g.h, g.w]);
        }
        Backend::Cpu => {}
    }
    let data = with_dense(grad_out, "avg_pool2d", |data, r| {
        fn go<T: FloatDType>(gs: &[T], g: &PoolGeom, mode: AvgMode) -> CpuData {
            let mut gi = vec![T::zero(); g.planes * g.h * g.w];
            per_plane1(&mut gi, g.h * g.w, |p, gp| {
                let base = p * g.oh * g.ow;
                for i in 0..g.oh {
                    for j in 0..g.ow {
                        let ([r0, r1, c0, c1], div) = avg_window(g, mode, i, j);
                        let share: T =
                            <T as WithDType>::from_f64(gs[base + i * g.ow + j].to_f64() / div);
                        for rr in r0..r1 {
                            for cc in c0..c1 {
                                let o = rr * g.w + cc;
                                gp[o] = gp[o] + share;
                            }
                        }
                    }
                }
            });
            T::wrap(gi)
        }
        Ok(crate::match_float_data!(data, "avg_pool2d", v => go(&v[r], g, mode)))
    })?;
    Tensor::from_cpu_data(data, &[g.planes, g.h, g.w])
}
