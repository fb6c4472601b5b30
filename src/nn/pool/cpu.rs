//! 2-d pooling kernels over `[planes, H, W]` row-major data (planes = N·C):
//! max pooling (recording the argmax's position inside its window) and
//! average / adaptive average pooling. Written once for every float dtype;
//! planes run in parallel above `PARALLEL_THRESHOLD` output elements (and
//! more than one thread), and
//! inside a plane backward accumulates in output order, so gradients are
//! deterministic.

use super::{AvgMode, PoolGeom, WindowPositions};
use crate::dtype::CpuData;
use crate::memory::host::{try_filled, try_zeroed};
use crate::memory::{with_category, Category};
use crate::meta::{backend, not_on_cuda, Backend};
use crate::primitives::{gather, parallel};
use crate::tensor::Tensor;
use crate::{Error, FloatDType, Result, WithDType};
use rayon::prelude::*;

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
    if parallel(out.len()) {
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

/// The meta output `[planes, h, w]` of a pooling kernel over `x`.
fn meta_plane_out(x: &Tensor, h: usize, w: usize, g: &PoolGeom) -> Result<Tensor> {
    crate::meta::float("pool", x.dtype())?;
    crate::meta::empty(&[g.planes, h, w], x.dtype())
}

/// A contiguous copy of `x`'s elements (a workspace buffer), or `None`
/// when `x` is already contiguous and can be read in place.
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
                .ok_or(Error::InvalidArgument {
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
pub(crate) fn max_pool_forward(x: &Tensor, g: &PoolGeom) -> Result<(Tensor, WindowPositions)> {
    match backend("max_pool2d", &[x])? {
        // No positions on meta: the caller sizes its saved tensors by shape.
        Backend::Meta => {
            let out = meta_plane_out(x, g.oh, g.ow, g)?;
            return Ok((out, WindowPositions::Host(Vec::new())));
        }
        Backend::Cuda(n) => return Err(not_on_cuda("max_pool2d", n)),
        Backend::Cpu => {}
    }
    let n_out = g.planes * g.oh * g.ow;
    let mut pos = try_zeroed::<u8>(n_out)?;
    let out = with_dense(x, "max_pool2d", |data, r| {
        fn go<T: FloatDType>(x: &[T], g: &PoolGeom, pos: &mut [u8]) -> Result<CpuData> {
            let mut out = try_filled(pos.len(), T::neg_infinity())?;
            // The window positions inside the input, per output row and
            // column: the taps `g.at` would not skip, in the same order.
            let rows: Vec<_> = (0..g.oh).map(|i| g.taps(0, i)).collect();
            let cols: Vec<_> = (0..g.ow).map(|j| g.taps(1, j)).collect();
            // The columns whose windows lie wholly inside the input (one
            // contiguous run) take the tap-major path below.
            let full = |j: &usize| cols[*j] == (0..g.k[1]);
            let inner_lo = (0..g.ow).find(full).unwrap_or(g.ow);
            let inner_hi = (inner_lo..g.ow).find(|j| !full(j)).unwrap_or(g.ow);
            // Per output row, the taps of the run in window order: (input
            // row tap, window position, first column in the input row).
            let row_taps: Vec<Vec<(usize, u8, usize)>> = rows
                .iter()
                .map(|r| {
                    let per_row = |ki: usize| {
                        (0..g.k[1]).map(move |kj| {
                            let start = (inner_lo * g.s[1] + kj * g.d[1]).saturating_sub(g.p[1]);
                            (ki, (ki * g.k[1] + kj) as u8, start)
                        })
                    };
                    r.clone().flat_map(per_row).collect()
                })
                .collect();
            // With a column stride above 1 each input row is copied phase
            // by phase (columns `q, q + s, q + 2s, …` for each `q < s`), so
            // every tap of the run reads a contiguous slice and the loops
            // below run on vectors. `phase_at[q]`: where phase `q` starts.
            let s1 = g.s[1];
            let phase_at: Vec<usize> = (0..s1)
                .scan(0, |at, q| {
                    let start = *at;
                    *at += g.w.saturating_sub(q).div_ceil(s1);
                    Some(start)
                })
                .collect();
            per_plane(&mut out, pos, g.oh * g.ow, |p, o, ps| {
                let plane = &x[p * g.h * g.w..(p + 1) * g.h * g.w];
                let mut hits = vec![0u32; inner_hi - inner_lo];
                let mut phased = Vec::new();
                if s1 > 1 && inner_lo < inner_hi {
                    phased = vec![T::zero(); plane.len()];
                    for (dst, row) in phased.chunks_mut(g.w).zip(plane.chunks(g.w)) {
                        for (q, &at) in phase_at.iter().enumerate() {
                            let cols = row[q.min(row.len())..].iter().step_by(s1);
                            for (d, &v) in dst[at..].iter_mut().zip(cols) {
                                *d = v;
                            }
                        }
                    }
                }
                let by_phase: &[T] = if s1 > 1 { &phased } else { plane };
                let input_row = |i: usize, ki: usize| {
                    let r = i * g.s[0] + ki * g.d[0] - g.p[0];
                    &plane[r * g.w..(r + 1) * g.w]
                };
                // One window, tap by tap: the first tap, then each larger
                // one (or the first NaN): the first maximum.
                let window = |i: usize, j: usize| {
                    let (mut best, mut at) = (T::neg_infinity(), 0usize);
                    let mut found = false;
                    for ki in rows[i].clone() {
                        let row = input_row(i, ki);
                        for kj in cols[j].clone() {
                            let v = row[j * g.s[1] + kj * g.d[1] - g.p[1]];
                            if !found || v > best || (v.is_nan() && !best.is_nan()) {
                                (best, at, found) = (v, ki * g.k[1] + kj, true);
                            }
                        }
                    }
                    (best, at as u8)
                };
                for (i, (o, ps)) in o.chunks_mut(g.ow).zip(ps.chunks_mut(g.ow)).enumerate() {
                    for (j, (o, ps)) in o.iter_mut().zip(ps.iter_mut()).enumerate() {
                        if !(inner_lo..inner_hi).contains(&j) {
                            (*o, *ps) = window(i, j);
                        }
                    }
                    if inner_lo == inner_hi || rows[i].is_empty() {
                        continue;
                    }
                    let (o, ps) = (&mut o[inner_lo..inner_hi], &mut ps[inner_lo..inner_hi]);
                    // Each tap over the whole run (its columns' inputs,
                    // contiguous by phase), branch-free: first the maxima, then per output
                    // a bit per tap equal to its maximum; the lowest set bit is
                    // the first maximum, the window rule's position unless a
                    // NaN is present. A run with a NaN (or a window of more
                    // than 32 taps) takes the window rule.
                    let taps = &row_taps[i];
                    let run = o.len();
                    let strided = |ki: usize, start: usize| {
                        let r = i * g.s[0] + ki * g.d[0] - g.p[0];
                        let at = r * g.w + phase_at[start % s1] + start / s1;
                        by_phase[at..at + run].iter().copied()
                    };
                    let mut nan = taps.len() > 32;
                    for (n, &(ki, _, start)) in taps.iter().enumerate() {
                        let vals = strided(ki, start);
                        if n == 0 {
                            o.iter_mut().zip(vals).for_each(|(o, v)| *o = v);
                        } else {
                            o.iter_mut()
                                .zip(vals)
                                .for_each(|(o, v)| *o = if v > *o { v } else { *o });
                        }
                        nan |= strided(ki, start).fold(false, |a, v| a | v.is_nan());
                    }
                    if nan {
                        for (j, (o, ps)) in o.iter_mut().zip(ps.iter_mut()).enumerate() {
                            (*o, *ps) = window(i, inner_lo + j);
                        }
                        continue;
                    }
                    let hits = &mut hits[..o.len()];
                    hits.fill(0);
                    for (n, &(ki, _, start)) in taps.iter().enumerate() {
                        for ((h, o), v) in hits.iter_mut().zip(o.iter()).zip(strided(ki, start)) {
                            *h |= u32::from(v == *o) << n;
                        }
                    }
                    for (ps, h) in ps.iter_mut().zip(hits.iter()) {
                        *ps = taps[(h.trailing_zeros() as usize).min(taps.len() - 1)].1;
                    }
                }
            });
            Ok(T::wrap(out))
        }
        Ok(crate::match_float_data!(data, "max_pool2d", v => go(&v[r], g, &mut pos)?))
    })?;
    let out = Tensor::from_cpu_data(out, &[g.planes, g.oh, g.ow])?;
    Ok((out, WindowPositions::Host(pos)))
}

/// Where each output element's gradient goes.
enum ArgSource<'a> {
    /// Positions inside the window (u8).
    Window(&'a [u8]),
    /// Flat in-plane input indices (i64, -1 for none).
    Flat(&'a [i64]),
}

/// Backward of max pooling: `grad_out` (`[planes, oh, ow]`, any layout)
/// scattered onto a zero `[planes, h, w]` gradient at the argmax saved in
/// `arg` (U8 window positions, or with `flat` I64 flat in-plane indices),
/// accumulating in output order within each plane.
pub(crate) fn max_pool_backward(
    grad_out: &Tensor,
    arg: &Tensor,
    flat: bool,
    g: &PoolGeom,
) -> Result<Tensor> {
    match backend("max_pool2d", &[grad_out])? {
        // No positions to read on meta: the output has the input's shape.
        Backend::Meta => return meta_plane_out(grad_out, g.h, g.w, g),
        Backend::Cuda(n) => return Err(not_on_cuda("max_pool2d", n)),
        Backend::Cpu => {}
    }
    let saved = arg.storage().cpu()?;
    let n_out = g.planes * g.oh * g.ow;
    let arg = match (flat, saved.as_slice::<i64>(), saved.as_slice::<u8>()) {
        (true, Some(idx), _) if idx.len() >= n_out => ArgSource::Flat(idx),
        (false, _, Some(pos)) if pos.len() >= n_out => ArgSource::Window(pos),
        _ => {
            return Err(Error::Backward(
                "max_pool2d: saved indices do not match".into(),
            ))
        }
    };
    let data = with_dense(grad_out, "max_pool2d", |data, r| {
        fn go<T: FloatDType>(gs: &[T], arg: &ArgSource, g: &PoolGeom) -> Result<CpuData> {
            let mut gi = try_zeroed::<T>(g.planes * g.h * g.w)?;
            // Window position → (row, column) tap, looked up rather than
            // divided per output.
            let taps: Vec<(usize, usize)> = (0..g.k[0] * g.k[1])
                .map(|q| (q / g.k[1], q % g.k[1]))
                .collect();
            per_plane1(&mut gi, g.h * g.w, |p, gp| {
                let base = p * g.oh * g.ow;
                let gs = &gs[base..base + g.oh * g.ow];
                match arg {
                    ArgSource::Window(pos) => {
                        let pos = &pos[base..base + g.oh * g.ow];
                        for (i, (gs, pos)) in gs.chunks(g.ow).zip(pos.chunks(g.ow)).enumerate() {
                            for (j, (&v, &q)) in gs.iter().zip(pos).enumerate() {
                                let (ki, kj) = taps.get(usize::from(q)).copied().unwrap_or((0, 0));
                                if let Some(o) = g.at(i, j, ki, kj) {
                                    gp[o] = gp[o] + v;
                                }
                            }
                        }
                    }
                    ArgSource::Flat(idx) => {
                        for (&v, &at) in gs.iter().zip(&idx[base..]) {
                            if let Ok(o) = usize::try_from(at) {
                                gp[o] = gp[o] + v;
                            }
                        }
                    }
                }
            });
            Ok(T::wrap(gi))
        }
        Ok(crate::match_float_data!(data, "max_pool2d", v => go(&v[r], &arg, g)?))
    })?;
    Tensor::from_cpu_data(data, &[g.planes, g.h, g.w])
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
        Backend::Cuda(n) => return Err(not_on_cuda("avg_pool2d", n)),
        Backend::Cpu => {}
    }
    let data = with_dense(x, "avg_pool2d", |data, r| {
        fn go<T: FloatDType>(x: &[T], g: &PoolGeom, mode: AvgMode) -> Result<CpuData> {
            let mut out = try_zeroed::<T>(g.planes * g.oh * g.ow)?;
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
            Ok(T::wrap(out))
        }
        Ok(crate::match_float_data!(data, "avg_pool2d", v => go(&v[r], g, mode)?))
    })?;
    Tensor::from_cpu_data(data, &[g.planes, g.oh, g.ow])
}

/// Average pooling backward: each output's gradient divided by its divisor
/// (in f64) and added to every input of its window, in output order.
pub(crate) fn avg_pool_backward(grad_out: &Tensor, g: &PoolGeom, mode: AvgMode) -> Result<Tensor> {
    match backend("avg_pool2d", &[grad_out])? {
        Backend::Meta => return meta_plane_out(grad_out, g.h, g.w, g),
        Backend::Cuda(n) => return Err(not_on_cuda("avg_pool2d", n)),
        Backend::Cpu => {}
    }
    let data = with_dense(grad_out, "avg_pool2d", |data, r| {
        fn go<T: FloatDType>(gs: &[T], g: &PoolGeom, mode: AvgMode) -> Result<CpuData> {
            let mut gi = try_zeroed::<T>(g.planes * g.h * g.w)?;
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
            Ok(T::wrap(gi))
        }
        Ok(crate::match_float_data!(data, "avg_pool2d", v => go(&v[r], g, mode)?))
    })?;
    Tensor::from_cpu_data(data, &[g.planes, g.h, g.w])
}

#[cfg(test)]
mod tests {
    use super::{max_pool_forward, PoolGeom, WindowPositions};
    use crate::{Device, Tensor};

    /// Outputs and positions of the per-window rule: taps in row-major
    /// window order, the first one taken, a later one when larger or the
    /// first NaN.
    fn naive(x: &[f32], g: &PoolGeom) -> (Vec<f32>, Vec<u8>) {
        let (mut out, mut pos) = (Vec::new(), Vec::new());
        for p in 0..g.planes {
            for i in 0..g.oh {
                for j in 0..g.ow {
                    let (mut best, mut at, mut found) = (f32::NEG_INFINITY, 0, false);
                    for ki in 0..g.k[0] {
                        for kj in 0..g.k[1] {
                            if let Some(o) = g.at(i, j, ki, kj) {
                                let v = x[p * g.h * g.w + o];
                                if !found || v > best || (v.is_nan() && !best.is_nan()) {
                                    (best, at, found) = (v, ki * g.k[1] + kj, true);
                                }
                            }
                        }
                    }
                    out.push(best);
                    pos.push(at as u8);
                }
            }
        }
        (out, pos)
    }

    /// The tap-major loop over wholly inside columns gives the per-window
    /// rule's values and positions bit for bit, with ties, NaNs and -inf.
    #[test]
    fn inner_columns_match_the_window_rule() {
        let geoms = [
            // (h, w, k, s, p, d)
            (12, 13, [3, 3], [2, 2], [1, 1], [1, 1]),
            (9, 16, [2, 2], [2, 2], [0, 0], [1, 1]),
            (10, 11, [3, 2], [1, 3], [1, 0], [2, 1]),
            (7, 20, [2, 3], [2, 1], [0, 1], [1, 2]),
            (3, 3, [3, 3], [1, 1], [1, 1], [1, 1]),
        ];
        for (h, w, k, s, p, d) in geoms {
            let out_len = |n: usize, a: usize| (n + 2 * p[a] - d[a] * (k[a] - 1) - 1) / s[a] + 1;
            let g = PoolGeom {
                planes: 3,
                h,
                w,
                oh: out_len(h, 0),
                ow: out_len(w, 1),
                k,
                s,
                p,
                d,
            };
            let x: Vec<f32> = (0..3 * h * w)
                .map(|i| match (i * 7919) % 23 {
                    0 => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    v => (v % 5) as f32,
                })
                .collect();
            let t = Tensor::from_vec(x.clone(), &[3, h, w], Device::Cpu).unwrap();
            let (y, pos) = max_pool_forward(&t, &g).unwrap();
            let WindowPositions::Host(pos) = pos else {
                panic!("host positions expected")
            };
            let (want, want_pos) = naive(&x, &g);
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&y.to_vec::<f32>().unwrap()), bits(&want), "{g:?}");
            assert_eq!(pos, want_pos, "{g:?}");
        }
    }
}
