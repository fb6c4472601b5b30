//! Fused attention on the CPU (and its meta form): the algorithm of
//! `flash/mod.rs` with a key block as wide as the keys a query block sees, so
//! that the online softmax is exact at once: a band of [`BLOCK_Q`] queries'
//! scores (`64 × lk` compute-type values, the task's own scratch) is all
//! that ever exists, never the `L×L` whole, and the products are the
//! unfused path's (two forward, five backward, by the shared GEMM on
//! operands packed in the compute type from any layout of q, k, v and dO).
//! Forward runs one task per (batch·head, query band), reading key/value
//! head `h / group` for query head `h`; backward one task per (batch,
//! key/value head), which owns that key/value head's rows of dK and dV and
//! its group's rows of dQ, so every sum runs in one order whatever the
//! thread count. Scratch (uncounted host temporaries, as the unfused
//! kernels' rows) is at most `2·64·lk + (lq + lk)·(d + dv)` compute-type
//! values per task.

use super::super::cpu_exp::exp_in_place;
use super::super::cpu_f32;
use super::super::{RowLse, OP};
use super::{FlashGeom, FlashInputs, View4};
use crate::dtype::CpuData;
use crate::memory::host::try_for_overwrite;
use crate::meta::{self, backend, not_on_cuda, Backend};
use crate::nn::dropout::DropoutDraw;
use crate::primitives::gemm_slices;
use crate::tensor::Layout;
use crate::{DType, Error, FloatDType, Result, Tensor, WithDType};
use rayon::prelude::*;
use std::ops::Range;

/// Query rows per band.
pub(super) const BLOCK_Q: usize = 64;

/// The compute type: f32 for f32, f16 and bf16 inputs, f64 for f64 ones.
pub(super) trait Compute: FloatDType {
    /// `x ← e^(x − shift)` over a row (0 for −∞).
    fn exp_shifted(xs: &mut [Self], shift: Self);

    /// A row of logits into its probabilities `e^(x − lse)` with
    /// `lse = max + ln Σ e^(x − max)` rounded as saved (f32 where
    /// `lse_f32`); returns that `lse` (`−∞`, and zero probabilities, for a
    /// fully masked row). `scratch` is reused between rows.
    fn softmax_row(row: &mut [Self], scratch: &mut Vec<Self>, lse_f32: bool) -> f64;
}

impl Compute for f32 {
    fn exp_shifted(xs: &mut [f32], shift: f32) {
        cpu_f32::exp_shifted(xs, shift);
    }

    fn softmax_row(row: &mut [f32], scratch: &mut Vec<f32>, _lse_f32: bool) -> f64 {
        // The unfused kernel's row (its logits already formed): the same
        // probabilities and lse, bit for bit.
        let n = row.len();
        scratch.clear();
        scratch.extend_from_slice(row);
        scratch.resize(2 * n, 0.0);
        let (s, x) = scratch.split_at_mut(n);
        let rule = cpu_f32::RowLogits {
            scale: 1.0,
            mask: None,
            cut: None,
        };
        f64::from(cpu_f32::probs_row(&rule, s, row, x, None))
    }
}

impl Compute for f64 {
    fn exp_shifted(xs: &mut [f64], shift: f64) {
        xs.iter_mut().for_each(|x| *x -= shift);
        exp_in_place(xs, true);
    }

    fn softmax_row(row: &mut [f64], scratch: &mut Vec<f64>, lse_f32: bool) -> f64 {
        let mx = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if mx == f64::NEG_INFINITY {
            row.fill(0.0);
            return mx;
        }
        scratch.clear();
        scratch.extend_from_slice(row);
        Self::exp_shifted(scratch, mx);
        let v = mx + scratch.iter().sum::<f64>().ln();
        let lse = if lse_f32 { v as f32 as f64 } else { v };
        Self::exp_shifted(row, lse);
        lse
    }
}

/// One operand's elements and where they lie.
pub(super) struct Operand<'a, T> {
    data: &'a [T],
    view: View4,
}

impl<T: FloatDType> Operand<'_, T> {
    /// Rows `rows` (all `cols` columns) of head `(b, h)` into `dst`, dense
    /// and converted to the compute type.
    pub(super) fn pack<C: Compute>(
        &self,
        (b, h): (usize, usize),
        rows: Range<usize>,
        cols: usize,
        dst: &mut Vec<C>,
    ) {
        dst.clear();
        for r in rows {
            let at = self.view.at(b, h, r, 0);
            let step = self.view.col as isize;
            dst.extend((0..cols).map(|c| {
                let i = (at as isize + c as isize * step) as usize;
                C::from_f64(WithDType::to_f64(self.data[i]))
            }));
        }
    }
}

/// The mask as additive compute-type values (U8: `0` or `−∞`) in the mask's
/// own shape, read through its broadcast view.
struct AddMask<C> {
    add: Vec<C>,
    view: View4,
}

impl<C: Compute> AddMask<C> {
    /// Reads `mask` (uncounted host values) and its broadcast to `scores`.
    fn of(mask: &Tensor, scores: &[usize]) -> Result<AddMask<C>> {
        let boolean = mask.dtype() == DType::U8;
        let add = mask
            .to_f64_vec()?
            .into_iter()
            .map(|v| match (boolean, v != 0.0) {
                (true, true) => C::zero(),
                (true, false) => C::neg_infinity(),
                _ => C::from_f64(v),
            })
            .collect();
        let full = Layout::contiguous(mask.shape()).broadcast_to(scores)?;
        Ok(AddMask {
            add,
            view: View4::of(full.strides(), 0),
        })
    }
}

/// Everything a task reads: the operands, mask, geometry and dropout.
pub(super) struct Problem<'a, T, C> {
    pub q: Operand<'a, T>,
    pub k: Operand<'a, T>,
    pub v: Operand<'a, T>,
    mask: Option<AddMask<C>>,
    pub geom: FlashGeom,
    draw: Option<DropoutDraw>,
}

impl<T: FloatDType, C: Compute> Problem<'_, T, C> {
    /// The key/value head query head `(b, h)` reads: `(b, h / group)`.
    pub(super) fn kv(&self, (b, h): (usize, usize)) -> (usize, usize) {
        (b, h / self.geom.group())
    }

    /// The keys query block `qs` sees: all, or up to its last query when
    /// causal.
    pub(super) fn key_end(&self, qs: &Range<usize>) -> usize {
        let lk = self.geom.score.lk;
        if self.geom.score.causal {
            lk.min(qs.end)
        } else {
            lk
        }
    }

    /// `s ← scale·s + mask` over the tile of queries `qs` by keys `ks` of
    /// head `(b, h)`, `−∞` above the diagonal when causal.
    pub(super) fn logits(
        &self,
        (b, h): (usize, usize),
        qs: &Range<usize>,
        ks: &Range<usize>,
        s: &mut [C],
    ) {
        let g = self.geom.score;
        let scale = C::from_f64(g.scale);
        for (i, row) in qs.clone().zip(s.chunks_mut(ks.len())) {
            row.iter_mut().for_each(|x| *x = *x * scale);
            if let Some(m) = &self.mask {
                for (j, x) in ks.clone().zip(row.iter_mut()) {
                    *x = *x + m.add[m.view.at(b, h, i, j)];
                }
            }
            if g.causal && ks.end > i + 1 {
                row[(i + 1).saturating_sub(ks.start)..]
                    .iter_mut()
                    .for_each(|x| *x = C::neg_infinity());
            }
        }
    }

    /// Applies the dropout draw to the tile (`keep·scale` or 0).
    pub(super) fn drop_tile(
        &self,
        (b, h): (usize, usize),
        qs: &Range<usize>,
        ks: &Range<usize>,
        t: &mut [C],
    ) {
        let Some(draw) = self.draw else { return };
        let g = self.geom;
        let scale = C::from_f64(draw.scale());
        for (i, row) in qs.clone().zip(t.chunks_mut(ks.len())) {
            let base = ((b * g.heads + h) * g.score.lq + i) * g.score.lk;
            for (j, x) in ks.clone().zip(row.iter_mut()) {
                *x = if draw.keep(base + j) {
                    *x * scale
                } else {
                    C::zero()
                };
            }
        }
    }

    /// The scores of queries `qs` (packed `qb`) against keys `ks` (packed
    /// `kb`) into `s`: `qb·kbᵀ`.
    pub(super) fn scores(
        &self,
        qb: &[C],
        kb: &[C],
        (m, n): (usize, usize),
        s: &mut [C],
    ) -> Result<()> {
        product(
            s,
            (m, n, self.geom.d),
            (qb, self.geom.d, 1),
            (kb, 1, self.geom.d),
            false,
        )
    }
}

/// `dst (m×n) = a·b` or `+= a·b` (a `(m×k)`, b `(k×n)` through their
/// (row, column) strides), one thread; `k = 0` gives zeros.
pub(super) fn product<C: Compute>(
    dst: &mut [C],
    (m, n, k): (usize, usize, usize),
    a: (&[C], usize, usize),
    b: (&[C], usize, usize),
    accumulate: bool,
) -> Result<()> {
    if k == 0 {
        if !accumulate {
            dst.fill(C::zero());
        }
        return Ok(());
    }
    gemm_slices(dst, (m, n, k), a, b, (accumulate, false))
}

/// The probabilities of a band of logits `s` (rows of `n`) in place, with
/// each row's `lse` (see [`Compute::softmax_row`]): backward rebuilds the
/// same probabilities from the saved `lse`.
fn band_probs<C: Compute>(s: &mut [C], n: usize, lse: &mut [f64], lse_f32: bool) {
    if n == 0 {
        lse.fill(f64::NEG_INFINITY); // no key to attend to
        return;
    }
    let mut scratch = Vec::with_capacity(2 * n);
    for (row, l) in s.chunks_mut(n).zip(lse.iter_mut()) {
        *l = C::softmax_row(row, &mut scratch, lse_f32);
    }
}

/// One forward task: query block `qs` of head `(b, h)` against every key
/// it sees at once (a band of `|qs| × lk` scores in the task's scratch);
/// writes its output rows `out` and their `lse`.
fn forward_block<T: FloatDType, C: Compute>(
    p: &Problem<T, C>,
    bh: (usize, usize),
    qs: Range<usize>,
    out: &mut [T],
    lse: &mut [f64],
    lse_f32: bool,
) -> Result<()> {
    let (d, dv) = (p.geom.d, p.geom.dv);
    let (m, n) = (qs.len(), p.key_end(&qs));
    let (mut qb, mut kb, mut vb) = (Vec::new(), Vec::new(), Vec::new());
    p.q.pack(bh, qs.clone(), d, &mut qb);
    p.k.pack(p.kv(bh), 0..n, d, &mut kb);
    p.v.pack(p.kv(bh), 0..n, dv, &mut vb);
    let mut s = vec![C::zero(); m * n];
    let ks = 0..n;
    p.scores(&qb, &kb, (m, n), &mut s)?;
    p.logits(bh, &qs, &ks, &mut s);
    band_probs(&mut s, n, lse, lse_f32);
    p.drop_tile(bh, &qs, &ks, &mut s);
    let mut acc = vec![C::zero(); m * dv];
    product(&mut acc, (m, dv, n), (&s, n, 1), (&vb, dv, 1), false)?;
    for (o, &a) in out.iter_mut().zip(&acc) {
        *o = T::from_f64(WithDType::to_f64(a));
    }
    Ok(())
}

/// The storage of `t` as a slice of `T` (checked), and its view.
pub(super) fn operand<'g, T: FloatDType>(data: &'g CpuData, t: &Tensor) -> Result<Operand<'g, T>> {
    let data = data.as_slice::<T>().ok_or_else(|| Error::DTypeMismatch {
        op: OP,
        expected: T::DTYPE,
        got: t.dtype(),
    })?;
    Ok(Operand {
        data,
        view: View4::of(t.layout().strides(), t.layout().offset()),
    })
}

/// Runs `f` with the problem of `x` in the storage type `T` and compute
/// type `C`.
pub(super) fn with_problem<T: FloatDType, C: Compute, R>(
    x: &FlashInputs,
    f: impl FnOnce(&Problem<T, C>) -> Result<R>,
) -> Result<R> {
    let (gq, gk, gv) = (
        x.q.storage().cpu()?,
        x.k.storage().cpu()?,
        x.v.storage().cpu()?,
    );
    let mask = x.mask.map(|m| AddMask::of(m, x.scores)).transpose()?;
    let p = Problem {
        q: operand(&gq, x.q)?,
        k: operand(&gk, x.k)?,
        v: operand(&gv, x.v)?,
        mask,
        geom: x.geom,
        draw: x.draw,
    };
    f(&p)
}

/// The output's shape: q's with the last dim `dv`.
pub(super) fn out_shape(x: &FlashInputs) -> Vec<usize> {
    let mut s = x.q.shape().to_vec();
    if let Some(last) = s.last_mut() {
        *last = x.geom.dv;
    }
    s
}

fn forward_typed<T: FloatDType, C: Compute>(x: &FlashInputs) -> Result<(Tensor, RowLse)> {
    let g = x.geom;
    let (lq, dv, rows) = (g.score.lq, g.dv, g.rows());
    // q's rows by v's width: a size no input has, checked before it allocates.
    let mut out = try_for_overwrite::<T>(crate::tensor::checked_numel(OP, &out_shape(x))?)?;
    let mut lse = vec![0.0f64; rows];
    if rows > 0 && dv > 0 {
        with_problem::<T, C, _>(x, |p| {
            out.par_chunks_mut(lq * dv)
                .zip(lse.par_chunks_mut(lq))
                .enumerate()
                .try_for_each(|(bh, (o, l))| {
                    let head = (bh / g.heads, bh % g.heads);
                    o.par_chunks_mut(BLOCK_Q * dv)
                        .zip(l.par_chunks_mut(BLOCK_Q))
                        .enumerate()
                        .try_for_each(|(qb, (o, l))| {
                            let q0 = qb * BLOCK_Q;
                            forward_block(p, head, q0..q0 + l.len(), o, l, x.lse_f32)
                        })
                })
        })?;
    } else if rows > 0 {
        // dv = 0: an empty output; the lse still follows the scores.
        with_problem::<T, C, _>(x, |p| {
            lse.par_chunks_mut(lq).enumerate().try_for_each(|(bh, l)| {
                let head = (bh / g.heads, bh % g.heads);
                l.chunks_mut(BLOCK_Q).enumerate().try_for_each(|(qb, l)| {
                    let q0 = qb * BLOCK_Q;
                    forward_block(p, head, q0..q0 + l.len(), &mut [], l, x.lse_f32)
                })
            })
        })?;
    }
    let out = Tensor::from_cpu_data(T::wrap(out), &out_shape(x))?;
    Ok((out, RowLse::Host(lse)))
}

/// Forward on the CPU (meta: shapes only): see `flash::forward`.
pub(super) fn forward(x: &FlashInputs) -> Result<(Tensor, RowLse)> {
    match backend(OP, &[x.q, x.k, x.v])? {
        Backend::Meta => {
            let out = meta::empty(&out_shape(x), x.q.dtype())?;
            return Ok((out, RowLse::Meta(x.geom.rows())));
        }
        Backend::Cuda(n) => return Err(not_on_cuda(OP, n)),
        Backend::Cpu => {}
    }
    match x.q.dtype() {
        DType::F32 => forward_typed::<f32, f32>(x),
        DType::F64 => forward_typed::<f64, f64>(x),
        DType::F16 => forward_typed::<half::f16, f32>(x),
        DType::BF16 => forward_typed::<half::bf16, f32>(x),
        dtype => Err(Error::UnsupportedDType { op: OP, dtype }),
    }
}
