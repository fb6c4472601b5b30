//! Launch wrappers for 2-d pooling (`pool.cu`) over contiguous
//! `[planes, h, w]` data (planes = N·C), as `cpu::pool`: max pooling saving
//! a u8 in-window argmax (`ki·kw + kj`), average and adaptive average
//! pooling. Backward kernels gather, so gradients are deterministic.

use super::check::float_suffix;
use super::layers_util::{expect, invalid};
use super::{CudaBuffer, CudaDevice};
use crate::{DType, Result};
use cudarc::driver::DeviceRepr;

/// The geometry of one 2-d pooling: input `h × w`, output `oh × ow`,
/// window `k` with stride `s`, padding `p` and dilation `d` (row, column).
/// Laid out as `struct PoolGeo` in `kernels/pool.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolGeom {
    /// Number of planes (N·C).
    pub planes: i64,
    /// Input height.
    pub h: i64,
    /// Input width.
    pub w: i64,
    /// Output height.
    pub oh: i64,
    /// Output width.
    pub ow: i64,
    /// Window size.
    pub k: [i64; 2],
    /// Stride.
    pub s: [i64; 2],
    /// Padding.
    pub p: [i64; 2],
    /// Dilation.
    pub d: [i64; 2],
}

// SAFETY: a plain `repr(C)` struct of i64s, laid out as `struct PoolGeo`.
unsafe impl DeviceRepr for PoolGeom {}

impl PoolGeom {
    /// The geometry of a fixed-window pooling (output size computed with
    /// floor division, as PyTorch without `ceil_mode`). Errors on a zero
    /// window or stride, padding above half the window, or an empty output.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        planes: usize,
        h: usize,
        w: usize,
        k: [usize; 2],
        s: [usize; 2],
        p: [usize; 2],
        d: [usize; 2],
    ) -> Result<PoolGeom> {
        let op = "cuda pool2d";
        if k.contains(&0) || s.contains(&0) || d.contains(&0) {
            return Err(invalid(
                op,
                format!("window {k:?}, stride {s:?}, dilation {d:?}"),
            ));
        }
        if p[0] * 2 > k[0] || p[1] * 2 > k[1] {
            return Err(invalid(
                op,
                format!("padding {p:?} above half the window {k:?}"),
            ));
        }
        if k[0] * k[1] > 256 {
            return Err(invalid(
                op,
                format!("window {k:?} over 256 positions (u8 index)"),
            ));
        }
        let out = |len: usize, a: usize| {
            let span = d[a] * (k[a] - 1) + 1;
            (len + 2 * p[a]).checked_sub(span).map(|v| v / s[a] + 1)
        };
        let (Some(oh), Some(ow)) = (out(h, 0), out(w, 1)) else {
            return Err(invalid(
                op,
                format!("window {k:?} larger than the input {h}×{w}"),
            ));
        };
        let c = |v: usize| v as i64;
        Ok(PoolGeom {
            planes: c(planes),
            h: c(h),
            w: c(w),
            oh: c(oh),
            ow: c(ow),
            k: k.map(c),
            s: s.map(c),
            p: p.map(c),
            d: d.map(c),
        })
    }

    /// The geometry of an adaptive pooling from `h × w` to `oh × ow`.
    pub fn adaptive(planes: usize, h: usize, w: usize, oh: usize, ow: usize) -> Result<PoolGeom> {
        if oh == 0 || ow == 0 || h == 0 || w == 0 {
            return Err(invalid(
                "cuda adaptive_avg_pool2d",
                format!("{h}×{w} to {oh}×{ow}"),
            ));
        }
        let c = |v: usize| v as i64;
        Ok(PoolGeom {
            planes: c(planes),
            h: c(h),
            w: c(w),
            oh: c(oh),
            ow: c(ow),
            k: [1, 1],
            s: [1, 1],
            p: [0, 0],
            d: [1, 1],
        })
    }

    /// Elements of the input.
    pub fn input_len(&self) -> usize {
        (self.planes * self.h * self.w) as usize
    }

    /// Elements of the output.
    pub fn output_len(&self) -> usize {
        (self.planes * self.oh * self.ow) as usize
    }
}

/// How average pooling forms its windows and divisors (`cpu::pool::AvgMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AvgPoolMode {
    /// Fixed windows; the divisor counts only the input elements inside.
    Fixed,
    /// Fixed windows; padding counts toward the divisor.
    FixedCountPad,
    /// Adaptive windows `floor(i·H/oh) .. ceil((i+1)·H/oh)`.
    Adaptive,
}

impl AvgPoolMode {
    fn code(self) -> i32 {
        match self {
            AvgPoolMode::Fixed => 0,
            AvgPoolMode::FixedCountPad => 1,
            AvgPoolMode::Adaptive => 2,
        }
    }
}

/// Max pooling forward of contiguous `x` (`[planes, h, w]`): the output and
/// the U8 in-window position of each output's maximum.
pub fn max_pool2d_forward(x: &CudaBuffer, g: &PoolGeom) -> Result<(CudaBuffer, CudaBuffer)> {
    let op = "cuda max_pool2d";
    let sfx = float_suffix(op, x.dtype())?;
    expect(op, x, x.dtype(), g.input_len(), x)?;
    let n = g.output_len();
    let mut y = CudaBuffer::alloc(x.device(), x.dtype(), n)?;
    let mut pos = CudaBuffer::alloc(x.device(), DType::U8, n)?;
    if n > 0 {
        launch!(x.device(), "pool.cu", format!("max_pool2d_fwd_{sfx}"), CudaDevice::grid_for(n);
            g, y.slice_mut(), pos.slice_mut(), x.slice())?;
    }
    Ok((y, pos))
}

/// Max pooling backward: the `[planes, h, w]` input gradient, each output's
/// gradient routed to the input its saved position `pos` names.
pub fn max_pool2d_backward(dy: &CudaBuffer, pos: &CudaBuffer, g: &PoolGeom) -> Result<CudaBuffer> {
    let op = "cuda max_pool2d backward";
    let sfx = float_suffix(op, dy.dtype())?;
    expect(op, dy, dy.dtype(), g.output_len(), dy)?;
    expect(op, pos, DType::U8, g.output_len(), dy)?;
    let n = g.input_len();
    let mut dx = CudaBuffer::alloc(dy.device(), dy.dtype(), n)?;
    if n > 0 {
        launch!(dy.device(), "pool.cu", format!("max_pool2d_bwd_{sfx}"), CudaDevice::grid_for(n);
            g, dx.slice_mut(), dy.slice(), pos.slice())?;
    }
    Ok(dx)
}

/// Max pooling backward from flat in-plane input indices (`row · w + col`,
/// what `SaveAll` keeps as I64, as PyTorch): the `[planes, h, w]` input
/// gradient, each input summing, in output order, the output gradients that
/// name it (a gather: deterministic, no atomics).
pub fn max_pool2d_backward_flat(
    dy: &CudaBuffer,
    idx: &CudaBuffer,
    g: &PoolGeom,
) -> Result<CudaBuffer> {
    let op = "cuda max_pool2d backward";
    let sfx = float_suffix(op, dy.dtype())?;
    expect(op, dy, dy.dtype(), g.output_len(), dy)?;
    expect(op, idx, DType::I64, g.output_len(), dy)?;
    let n = g.input_len();
    let mut dx = CudaBuffer::alloc(dy.device(), dy.dtype(), n)?;
    if n > 0 {
        // Parameters: (PoolGeo g, T* dx, const T* dy, const i64* idx).
        launch!(dy.device(), "pool.cu", format!("max_pool2d_bwd_flat_{sfx}"), CudaDevice::grid_for(n);
            g, dx.slice_mut(), dy.slice(), idx.slice())?;
    }
    Ok(dx)
}

/// Average (or adaptive average) pooling forward of contiguous `x`; window
/// sums in f64, divided by the mode's divisor.
pub fn avg_pool2d_forward(x: &CudaBuffer, g: &PoolGeom, mode: AvgPoolMode) -> Result<CudaBuffer> {
    let op = "cuda avg_pool2d";
    let sfx = float_suffix(op, x.dtype())?;
    expect(op, x, x.dtype(), g.input_len(), x)?;
    let n = g.output_len();
    let mut y = CudaBuffer::alloc(x.device(), x.dtype(), n)?;
    if n > 0 {
        let code = mode.code();
        launch!(x.device(), "pool.cu", format!("avg_pool2d_fwd_{sfx}"), CudaDevice::grid_for(n);
            g, &code, y.slice_mut(), x.slice())?;
    }
    Ok(y)
}

/// Average pooling backward: each output's gradient divided by its divisor
/// and added to every input of its window.
pub fn avg_pool2d_backward(dy: &CudaBuffer, g: &PoolGeom, mode: AvgPoolMode) -> Result<CudaBuffer> {
    let op = "cuda avg_pool2d backward";
    let sfx = float_suffix(op, dy.dtype())?;
    expect(op, dy, dy.dtype(), g.output_len(), dy)?;
    let n = g.input_len();
    let mut dx = CudaBuffer::alloc(dy.device(), dy.dtype(), n)?;
    if n > 0 {
        let code = mode.code();
        launch!(dy.device(), "pool.cu", format!("avg_pool2d_bwd_{sfx}"), CudaDevice::grid_for(n);
            g, &code, dx.slice_mut(), dy.slice())?;
    }
    Ok(dx)
}
