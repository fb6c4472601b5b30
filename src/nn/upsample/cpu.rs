//! Bilinear interpolation on the CPU, reading the operand through its
//! strides: the per-axis taps (source indices and weights) once per call,
//! then every plane in parallel, each in output order, so results do not
//! depend on the thread count.
//!
//! The arithmetic is PyTorch's CPU kernels' as its x86 build compiles them
//! (GCC contracts `a·b + c·d` into `fma(a, b, c·d)`), in the accumulate
//! type `A` (f32, or f64 for f64):
//!
//! - source index: `(i + ½)·scale − ½` fused, except under
//!   [`InterpCode::Separable`] in f32 (and f16/bf16), where it is a product
//!   then a difference;
//! - [`InterpCode::Separable`] (the generic kernel): the weights rounded to
//!   the element type (`λ1 = T(clamp(src − i0))`, `λ0 = T(1 − λ1)`), then
//!   `t0 = fma(x00, λw0, x01·λw1)`, `t1 = fma(x10, λw0, x11·λw1)`,
//!   `out = fma(t0, λh0, t1·λh1)`;
//! - [`InterpCode::Corners`] (the channels-last kernel): weights
//!   `w_ab = λh_a·λw_b` in `A`, and the four products summed by nested
//!   fused multiply-adds, innermost first, in the order of PyTorch's vector
//!   loop for the channels below [`InterpGeom::lanes`] and of its scalar
//!   tail for the rest: `[2, 3, 1, 0]` (innermost `x2·w2`, then `x3`, `x1`,
//!   `x0`; corners `00, 01, 10, 11` as 0..4) and `[1, 0, 2, 3]` in f32,
//!   f64 and bf16, except f16/bf16's vector order `[3, 2, 1, 0]` and f16's
//!   tail `[0, 1, 2, 3]` (see [`CornerOrder`]: GCC contracts PyTorch's
//!   `Half` and `BFloat16` arithmetic differently);
//! - backward (both kernels): `acc = fma(λh_a·λw_b, g, acc)` per output
//!   and corner `00, 01, 10, 11`, in output order, `λ` unrounded in `A`,
//!   the source index fused.
//!
//! The result is rounded to the element type once.

use super::{InterpCode, InterpGeom};
use crate::dtype::CpuData;
use crate::memory::host::{try_for_overwrite, try_zeroed};
use crate::primitives::parallel;
use crate::{FloatDType, Result, Tensor};
use half::{bf16, f16};
use num_traits::{Float, One, Zero};
use rayon::prelude::*;

/// The accumulate type's operations beyond [`Float`].
pub(crate) trait Acc: Float + Send + Sync + 'static {
    /// `v` converted as C++'s `int64 → float/double` does (to nearest).
    fn of_i64(v: i64) -> Self;
    /// `v` converted to this type (to nearest).
    fn of_f64(v: f64) -> Self;
    /// PyTorch's `floorf(v)`: the floor of `v` as an f32 (an f64 is
    /// rounded to f32 first), as an integer.
    fn floorf(self) -> i64;
}

impl Acc for f32 {
    fn of_i64(v: i64) -> f32 {
        v as f32
    }
    fn of_f64(v: f64) -> f32 {
        v as f32
    }
    fn floorf(self) -> i64 {
        self.floor() as i64
    }
}

impl Acc for f64 {
    fn of_i64(v: i64) -> f64 {
        v as f64
    }
    fn of_f64(v: f64) -> f64 {
        v
    }
    fn floorf(self) -> i64 {
        (self as f32).floor() as i64
    }
}

/// The order in which the four corner products `x_k·w_k` (`k` = 00, 01,
/// 10, 11 as 0..4) are summed: `s = x[o0]·w[o0]`, then `s = fma(x[o1],
/// w[o1], s)`, `fma(x[o2], …)`, `fma(x[o3], …)` for `o = order`.
pub(crate) type CornerOrder = [usize; 4];

/// An element type with its accumulate type and PyTorch's corner orders.
pub(crate) trait Lerp: FloatDType + bytemuck::Zeroable {
    /// The accumulate type.
    type A: Acc;
    /// The corner order of PyTorch's vector loop (channels below `lanes`).
    const VECTOR: CornerOrder;
    /// The corner order of its scalar tail (the other channels).
    const TAIL: CornerOrder;
    /// Widens to the accumulate type (exact).
    fn load(self) -> Self::A;
    /// Rounds from the accumulate type (to nearest even).
    fn store(a: Self::A) -> Self;
}

/// f32/f64: vector `x0·w0 + (x1·w1 + (x2·w2 + x3·w3))` contracted as
/// `fma(x0, w0, fma(x1, w1, fma(x3, w3, x2·w2)))`; scalar `((x0·w0 +
/// x1·w1) + x2·w2) + x3·w3` as `fma(x3, w3, fma(x2, w2, fma(x0, w0,
/// x1·w1)))`.
const WIDE_VECTOR: CornerOrder = [2, 3, 1, 0];
const WIDE_TAIL: CornerOrder = [1, 0, 2, 3];
/// f16/bf16 (widened to f32 first): vector as `fma(x0, w0, fma(x1, w1,
/// fma(x2, w2, x3·w3)))`; f16's scalar tail as `fma(x3, w3, fma(x2, w2,
/// fma(x1, w1, x0·w0)))` (bf16's is f32's).
const HALF_VECTOR: CornerOrder = [3, 2, 1, 0];
const F16_TAIL: CornerOrder = [0, 1, 2, 3];

impl Lerp for f32 {
    type A = f32;
    const VECTOR: CornerOrder = WIDE_VECTOR;
    const TAIL: CornerOrder = WIDE_TAIL;
    fn load(self) -> f32 {
        self
    }
    fn store(a: f32) -> f32 {
        a
    }
}

impl Lerp for f64 {
    type A = f64;
    const VECTOR: CornerOrder = WIDE_VECTOR;
    const TAIL: CornerOrder = WIDE_TAIL;
    fn load(self) -> f64 {
        self
    }
    fn store(a: f64) -> f64 {
        a
    }
}

impl Lerp for f16 {
    type A = f32;
    const VECTOR: CornerOrder = HALF_VECTOR;
    const TAIL: CornerOrder = F16_TAIL;
    fn load(self) -> f32 {
        self.to_f32()
    }
    fn store(a: f32) -> f16 {
        f16::from_f32(a)
    }
}

impl Lerp for bf16 {
    type A = f32;
    const VECTOR: CornerOrder = HALF_VECTOR;
    const TAIL: CornerOrder = WIDE_TAIL;
    fn load(self) -> f32 {
        self.to_f32()
    }
    fn store(a: f32) -> bf16 {
        bf16::from_f32(a)
    }
}

/// One output position's two source positions along an axis and their
/// weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Tap<A> {
    /// The lower source position.
    pub i0: usize,
    /// The upper one (`i0` at the last position).
    pub i1: usize,
    /// The lower one's weight.
    pub l0: A,
    /// The upper one's weight.
    pub l1: A,
}

/// Output `o`'s tap along an axis of `len` inputs and `out` outputs
/// (PyTorch's `compute_source_index_and_lambda`): the source index from
/// `scale` (fused or not, see the module doc), and, with `round`, the
/// weights rounded to the element type `T` as its generic kernel stores
/// them.
pub(crate) fn tap<T: Lerp>(
    o: usize,
    len: usize,
    out: usize,
    scale: T::A,
    align: bool,
    fused: bool,
    round: bool,
) -> Tap<T::A> {
    let (zero, one) = (T::A::zero(), T::A::one());
    if len == out {
        return Tap {
            i0: o,
            i1: o,
            l0: one,
            l1: zero,
        };
    }
    let real = if align {
        scale * T::A::of_i64(o as i64)
    } else {
        let half = T::A::of_f64(0.5);
        let d = T::A::of_i64(o as i64) + half;
        let s = if fused {
            scale.mul_add(d, -half)
        } else {
            scale * d - half
        };
        if s < zero {
            zero
        } else {
            s
        }
    };
    let i0 = real.floorf().min(len as i64 - 1);
    let d = real - T::A::of_i64(i0);
    let d = if d < zero { zero } else { d };
    let mut l1 = if one < d { one } else { d };
    let rounded = |v: T::A| if round { T::store(v).load() } else { v };
    l1 = rounded(l1);
    let l0 = rounded(one - l1);
    let i0 = i0.max(0) as usize;
    Tap {
        i0,
        i1: i0 + usize::from(i0 + 1 < len),
        l0,
        l1,
    }
}

/// Every output position's tap along one axis.
fn taps<T: Lerp>(
    len: i64,
    out: i64,
    scale: f64,
    align: bool,
    fused: bool,
    round: bool,
) -> Vec<Tap<T::A>> {
    let scale = T::A::of_f64(scale);
    (0..out as usize)
        .map(|o| tap::<T>(o, len as usize, out as usize, scale, align, fused, round))
        .collect()
}

/// Whether the forward's source index is fused (all but the generic
/// kernel in f32, f16 and bf16).
pub(crate) fn forward_fused<T: Lerp>(g: &InterpGeom) -> bool {
    g.code() == InterpCode::Corners || std::mem::size_of::<T::A>() == 8
}

/// The four corner products summed in `order` (see [`CornerOrder`]).
#[inline(always)]
pub(crate) fn corner_sum<A: Acc>(x: [A; 4], w: [A; 4], order: CornerOrder) -> A {
    let [a, b, c, d] = order;
    let s = x[a] * w[a];
    let s = x[b].mul_add(w[b], s);
    let s = x[c].mul_add(w[c], s);
    x[d].mul_add(w[d], s)
}

/// The generic kernel's value from the four inputs and the taps' rounded
/// weights.
#[inline(always)]
pub(crate) fn separable<A: Acc>(x: [A; 4], row: &Tap<A>, col: &Tap<A>) -> A {
    let t0 = x[0].mul_add(col.l0, x[1] * col.l1);
    let t1 = x[2].mul_add(col.l0, x[3] * col.l1);
    t0.mul_add(row.l0, t1 * row.l1)
}

/// The forward on typed storage `src` (read through `g.x`): a new
/// contiguous `[N, C, oh, ow]` buffer.
fn forward_data<T: Lerp>(src: &[T], g: &InterpGeom) -> Result<Vec<T>> {
    let align = g.align_corners != 0;
    let corners = g.code() == InterpCode::Corners;
    let fused = forward_fused::<T>(g);
    let rows = taps::<T>(g.h, g.oh, g.scale_h, align, fused, !corners);
    let cols = taps::<T>(g.w, g.ow, g.scale_w, align, fused, !corners);
    let plane = (g.oh * g.ow) as usize;
    let channels = g.channels as usize;
    let mut out = try_for_overwrite::<T>(g.output_len())?;
    let v = g.x;
    let one_plane = |p: usize, o: &mut [T]| {
        let (n, c) = (p / channels, p % channels);
        let order = if (c as i64) < g.lanes {
            T::VECTOR
        } else {
            T::TAIL
        };
        let at = |r: usize, col: usize| src[v.at(n, c, r, col)].load();
        for (row, o) in rows.iter().zip(o.chunks_mut(cols.len())) {
            for (col, o) in cols.iter().zip(o.iter_mut()) {
                let x = [
                    at(row.i0, col.i0),
                    at(row.i0, col.i1),
                    at(row.i1, col.i0),
                    at(row.i1, col.i1),
                ];
                let y = if corners {
                    let w = [
                        row.l0 * col.l0,
                        row.l0 * col.l1,
                        row.l1 * col.l0,
                        row.l1 * col.l1,
                    ];
                    corner_sum(x, w, order)
                } else {
                    separable(x, row, col)
                };
                *o = T::store(y);
            }
        }
    };
    if plane == 0 {
        return Ok(out);
    }
    if parallel(out.len()) {
        out.par_chunks_mut(plane)
            .enumerate()
            .for_each(|(p, o)| one_plane(p, o));
    } else {
        out.chunks_mut(plane)
            .enumerate()
            .for_each(|(p, o)| one_plane(p, o));
    }
    Ok(out)
}

/// The input gradient from the output's gradient `src` (typed storage read
/// through `g.x`): a new contiguous `[N, C, H, W]` buffer, each plane
/// accumulated in `A` in output order, then rounded.
fn backward_data<T: Lerp>(src: &[T], g: &InterpGeom) -> Result<Vec<T>> {
    let align = g.align_corners != 0;
    let rows = taps::<T>(g.h, g.oh, g.scale_h, align, true, false);
    let cols = taps::<T>(g.w, g.ow, g.scale_w, align, true, false);
    let (w, plane) = (g.w as usize, (g.h * g.w) as usize);
    let channels = g.channels as usize;
    let mut out = try_zeroed::<T>(g.input_len())?;
    let v = g.x;
    let one_plane = |p: usize, o: &mut [T], acc: &mut Vec<T::A>| {
        let (n, c) = (p / channels, p % channels);
        acc.clear();
        acc.resize(plane, T::A::zero());
        for (i, row) in rows.iter().enumerate() {
            for (j, col) in cols.iter().enumerate() {
                let gv = src[v.at(n, c, i, j)].load();
                for (r, lh) in [(row.i0, row.l0), (row.i1, row.l1)] {
                    for (k, lw) in [(col.i0, col.l0), (col.i1, col.l1)] {
                        let a = &mut acc[r * w + k];
                        *a = (lh * lw).mul_add(gv, *a);
                    }
                }
            }
        }
        for (o, &a) in o.iter_mut().zip(acc.iter()) {
            *o = T::store(a);
        }
    };
    if plane == 0 {
        return Ok(out);
    }
    if parallel(g.output_len()) {
        out.par_chunks_mut(plane)
            .enumerate()
            .for_each_init(Vec::new, |acc, (p, o)| one_plane(p, o, acc));
    } else {
        let mut acc = Vec::new();
        out.chunks_mut(plane)
            .enumerate()
            .for_each(|(p, o)| one_plane(p, o, &mut acc));
    }
    Ok(out)
}

/// [`super::forward`] on the CPU.
pub(super) fn forward(x: &Tensor, g: &InterpGeom) -> Result<Tensor> {
    let data = x.storage().cpu()?;
    let out = crate::match_float_data!(&*data, super::OP, v => {
        fn wrap<T: Lerp>(v: &[T], g: &InterpGeom) -> Result<CpuData> {
            Ok(T::wrap(forward_data(v, g)?))
        }
        wrap(v, g)?
    });
    drop(data);
    Tensor::from_cpu_data(out, &g.output_shape())
}

/// [`super::backward`] on the CPU.
pub(super) fn backward(grad: &Tensor, g: &InterpGeom) -> Result<Tensor> {
    let data = grad.storage().cpu()?;
    let out = crate::match_float_data!(&*data, super::OP, v => {
        fn wrap<T: Lerp>(v: &[T], g: &InterpGeom) -> Result<CpuData> {
            Ok(T::wrap(backward_data(v, g)?))
        }
        wrap(v, g)?
    });
    drop(data);
    Tensor::from_cpu_data(out, &g.input_shape())
}
