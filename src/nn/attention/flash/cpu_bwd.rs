//! Fused attention's backward on the CPU: one task per (batch, key/value
//! head), which packs that head's k and v once in the compute type and
//! walks the query heads of its group in order (one, without GQA), packing
//! each one's q and dO and walking its query bands in order: each band's
//! probabilities rebuilt from the saved `lse`, `dP`, `D_i = Σ_j P_ij dP_ij`
//! (into the caller's `delta`), `dS`, the band's rows of dQ, and its share
//! of dK and dV added into the key/value head's accumulators. A task owns
//! its rows of dK and dV and its group's rows of dQ and `delta`, so the
//! group's contributions are summed in one order on any number of threads.

use super::super::OP;
use super::cpu::{operand, out_shape, product, with_problem, Compute, Operand, Problem, BLOCK_Q};
use super::FlashInputs;
use crate::dtype::stat_dtype;
use crate::memory::host::try_for_overwrite;
use crate::meta::{self, backend, not_on_cuda, Backend};
use crate::primitives::Dense;
use crate::{DType, Error, FloatDType, Result, Tensor, WithDType};
use rayon::prelude::*;
use std::ops::Range;

/// A backward call's operands (the seam checked them).
struct Backward<'a> {
    pub x: &'a FlashInputs<'a>,
    pub d_out: &'a Tensor,
    pub lse: &'a Tensor,
    pub delta: Option<&'a Tensor>,
    pub needs: [bool; 3],
}

/// One task's rows of the outputs (empty where not needed): a key/value
/// head's dK and dV, and dQ and `delta` of its group's query heads.
struct GroupOut<'a, T, C> {
    dq: &'a mut [T],
    dk: &'a mut [T],
    dv: &'a mut [T],
    delta: &'a mut [C],
}

/// One query head's rows of dQ and `delta` (empty where not needed).
struct HeadRows<'a, T, C> {
    dq: &'a mut [T],
    delta: &'a mut [C],
}

/// `v` cut into `parts` equal slices (empty ones when `v` is empty).
fn split<T>(v: &mut [T], parts: usize) -> Vec<&mut [T]> {
    if v.is_empty() || parts == 0 {
        return (0..parts).map(|_| Default::default()).collect();
    }
    let each = v.len() / parts;
    v.chunks_mut(each).collect()
}

/// One head's packed operands in the compute type.
struct Packed<C> {
    q: Vec<C>,
    k: Vec<C>,
    v: Vec<C>,
    go: Vec<C>,
}

/// One head's gradient accumulators in the compute type, and the bands'
/// scratch (reused from band to band).
struct Sums<C> {
    dk: Vec<C>,
    dv: Vec<C>,
    /// `P`, `P'` (or `dP`, then `dS`) and a band of dQ rows.
    bands: [Vec<C>; 3],
}

impl<T: FloatDType, C: Compute> Problem<'_, T, C> {
    /// The probabilities of queries `qs` against keys `0..n` into `s`, from
    /// the saved `lse` (0 for a row whose `lse` is −∞).
    fn band(
        &self,
        bh: (usize, usize),
        pk: &Packed<C>,
        (qs, n): (&Range<usize>, usize),
        lse: &[C],
        s: &mut Vec<C>,
    ) -> Result<()> {
        let d = self.geom.d;
        s.resize(qs.len() * n, C::zero());
        let q = &pk.q[qs.start * d..qs.end * d];
        self.scores(q, &pk.k[..n * d], (qs.len(), n), s)?;
        self.logits(bh, qs, &(0..n), s);
        for (row, &l) in s.chunks_mut(n.max(1)).zip(&lse[qs.clone()]) {
            if l == C::neg_infinity() {
                row.fill(C::zero());
            } else {
                C::exp_shifted(row, l);
            }
        }
        Ok(())
    }

    /// `dS = scale·P ⊙ (dP − D)` of a band into `dp` (which holds `dP`),
    /// with `D_i = Σ_j P_ij dP_ij` (summed in f64, rounded to the compute
    /// type) written to `delta`.
    fn band_ds(&self, s: &[C], dp: &mut [C], n: usize, delta: &mut [C]) {
        let scale = C::from_f64(self.geom.score.scale);
        for ((dr, pr), di) in dp
            .chunks_mut(n.max(1))
            .zip(s.chunks(n.max(1)))
            .zip(delta.iter_mut())
        {
            let sum: f64 = pr
                .iter()
                .zip(dr.iter())
                .map(|(&a, &b)| WithDType::to_f64(a * b))
                .sum();
            *di = C::from_f64(sum);
            for (x, &p) in dr.iter_mut().zip(pr) {
                *x = scale * p * (*x - *di);
            }
        }
    }

    /// One query band's share of the head's gradients: `dV += P'ᵀ·dO`,
    /// and where q or k needs grad `dQ` rows `= dS·K`, `dK += dSᵀ·Q`.
    #[allow(clippy::too_many_arguments)]
    fn band_backward(
        &self,
        bh: (usize, usize),
        pk: &Packed<C>,
        qs: &Range<usize>,
        lse: &[C],
        needs: [bool; 3],
        out: &mut HeadRows<T, C>,
        sums: &mut Sums<C>,
    ) -> Result<()> {
        let (d, dv) = (self.geom.d, self.geom.dv);
        let (m, n) = (qs.len(), self.key_end(qs));
        let [nq, nk, nv] = needs;
        let [s, dp, dq] = &mut sums.bands;
        self.band(bh, pk, (qs, n), lse, s)?;
        let go = &pk.go[qs.start * dv..qs.end * dv];
        if nv {
            dp.clone_from(s);
            self.drop_tile(bh, qs, &(0..n), dp);
            product(
                &mut sums.dv[..n * dv],
                (n, dv, m),
                (dp, 1, n),
                (go, dv, 1),
                true,
            )?;
        }
        if !(nq || nk) {
            return Ok(());
        }
        dp.resize(m * n, C::zero());
        product(dp, (m, n, dv), (go, dv, 1), (&pk.v[..n * dv], 1, dv), false)?;
        self.drop_tile(bh, qs, &(0..n), dp);
        self.band_ds(s, dp, n, &mut out.delta[qs.clone()]);
        if nq {
            dq.resize(m * d, C::zero());
            product(dq, (m, d, n), (dp, n, 1), (&pk.k[..n * d], d, 1), false)?;
            store(&mut out.dq[qs.start * d..qs.end * d], dq);
        }
        if nk {
            let q = &pk.q[qs.start * d..qs.end * d];
            product(
                &mut sums.dk[..n * d],
                (n, d, m),
                (dp, 1, n),
                (q, d, 1),
                true,
            )?;
        }
        Ok(())
    }

    /// One task's gradients into `out`: key/value head `kv = (b, j)` of
    /// batch entry `b` and its group's query heads `j·group ..
    /// (j + 1)·group`, in order, with their `lse` rows (`group·lq`).
    fn group_backward(
        &self,
        kv: (usize, usize),
        go: &Operand<T>,
        lse: &[C],
        needs: [bool; 3],
        out: GroupOut<T, C>,
    ) -> Result<()> {
        let g = self.geom;
        let (lq, lk, d, dv, group) = (g.score.lq, g.score.lk, g.d, g.dv, g.group());
        let [nq, nk, nv] = needs;
        let mut pk = Packed {
            q: Vec::new(),
            k: Vec::new(),
            v: Vec::new(),
            go: Vec::new(),
        };
        // K and V once for the whole group: read in place, never repeated.
        self.k.pack(kv, 0..lk, d, &mut pk.k);
        if nq || nk {
            self.v.pack(kv, 0..lk, dv, &mut pk.v);
        }
        let mut sums = Sums {
            dk: vec![C::zero(); if nk { lk * d } else { 0 }],
            dv: vec![C::zero(); if nv { lk * dv } else { 0 }],
            bands: [Vec::new(), Vec::new(), Vec::new()],
        };
        let rows = split(out.dq, group)
            .into_iter()
            .zip(split(out.delta, group));
        for (i, (dq, delta)) in rows.enumerate() {
            let bh = (kv.0, kv.1 * group + i);
            self.q.pack(bh, 0..lq, d, &mut pk.q);
            go.pack(bh, 0..lq, dv, &mut pk.go);
            let lse = &lse[i * lq..(i + 1) * lq];
            let mut head = HeadRows { dq, delta };
            for q0 in (0..lq).step_by(BLOCK_Q) {
                let qs = q0..(q0 + BLOCK_Q).min(lq);
                self.band_backward(bh, &pk, &qs, lse, needs, &mut head, &mut sums)?;
            }
        }
        store(out.dk, &sums.dk);
        store(out.dv, &sums.dv);
        Ok(())
    }
}

/// Converts compute-type values into the outputs' type.
fn store<T: FloatDType, C: Compute>(dst: &mut [T], src: &[C]) {
    for (o, &v) in dst.iter_mut().zip(src) {
        *o = T::from_f64(WithDType::to_f64(v));
    }
}

impl Backward<'_> {
    /// The gradients for storage type `T` and compute type `C` (the lse's
    /// and delta's type).
    fn run<T: FloatDType, C: Compute>(&self) -> Result<[Option<Tensor>; 3]> {
        let x = self.x;
        let g = x.geom;
        let (lq, lk, d, dv) = (g.score.lq, g.score.lk, g.d, g.dv);
        let heads = g.batch * g.heads;
        // One task per key/value head: it owns that head's dK, dV rows.
        let tasks = g.batch * g.kv_heads;
        let [nq, nk, nv] = self.needs;
        let alloc = |need: bool, n: usize| -> Result<Vec<T>> {
            // Every element is written (a head's rows are all stored).
            if need {
                try_for_overwrite::<T>(n)
            } else {
                Ok(Vec::new())
            }
        };
        let mut dq = alloc(nq, heads * lq * d)?;
        let mut dk = alloc(nk, tasks * lk * d)?;
        let mut dvv = alloc(nv, tasks * lk * dv)?;
        let lse_dense = Dense::new(self.lse)?;
        let (lse_data, lse_range) = lse_dense.parts();
        let lse = lse_data
            .as_slice::<C>()
            .map(|s| &s[lse_range])
            .ok_or_else(|| Error::Backward(format!("{OP}: the saved lse's dtype")))?;
        let mut delta_guard = match self.delta {
            Some(t) if nq || nk => Some((t.storage().cpu_mut()?, t.layout().contiguous_range())),
            _ => None,
        };
        let delta: &mut [C] = match &mut delta_guard {
            Some((data, Some(r))) if r.len() == g.rows() => data
                .as_mut_slice::<C>()
                .map(|s| &mut s[r.clone()])
                .ok_or_else(|| Error::Backward(format!("{OP}: the delta buffer's dtype")))?,
            Some(_) => return Err(Error::Backward(format!("{OP}: the delta buffer's shape"))),
            None if nq || nk => return Err(Error::Backward(format!("{OP}: no delta buffer"))),
            None => &mut [],
        };
        let go_guard = self.d_out.storage().cpu()?;
        let parts = split(&mut dq, tasks)
            .into_iter()
            .zip(split(&mut dk, tasks))
            .zip(split(&mut dvv, tasks))
            .zip(split(delta, tasks))
            .map(|(((dq, dk), dv), delta)| GroupOut { dq, dk, dv, delta })
            .collect::<Vec<_>>();
        let span = g.group() * lq;
        with_problem::<T, C, _>(x, |p| {
            let go = operand::<T>(&go_guard, self.d_out)?;
            parts.into_par_iter().enumerate().try_for_each(|(t, out)| {
                let kv = (t / g.kv_heads, t % g.kv_heads);
                let lse = &lse[t * span..(t + 1) * span];
                p.group_backward(kv, &go, lse, self.needs, out)
            })
        })?;
        drop(delta_guard);
        let wrap = |need: bool, v: Vec<T>, shape: &[usize]| -> Result<Option<Tensor>> {
            need.then(|| Tensor::from_cpu_data(T::wrap(v), shape))
                .transpose()
        };
        Ok([
            wrap(nq, dq, x.q.shape())?,
            wrap(nk, dk, x.k.shape())?,
            wrap(nv, dvv, x.v.shape())?,
        ])
    }
}

/// Backward on the CPU (meta: shapes only): see `flash::backward`.
pub(super) fn backward(
    x: &FlashInputs,
    d_out: &Tensor,
    lse: &Tensor,
    delta: Option<&Tensor>,
    needs: [bool; 3],
) -> Result<[Option<Tensor>; 3]> {
    let shapes = [x.q.shape(), x.k.shape(), x.v.shape()];
    match backend(OP, &[x.q, d_out, lse])? {
        Backend::Meta => {
            let mut out: [Option<Tensor>; 3] = [None, None, None];
            for (o, (need, shape)) in out.iter_mut().zip(needs.iter().zip(shapes)) {
                if *need {
                    *o = Some(meta::empty(shape, x.q.dtype())?);
                }
            }
            return Ok(out);
        }
        Backend::Cuda(n) => return Err(not_on_cuda(OP, n)),
        Backend::Cpu => {}
    }
    if d_out.dtype() != x.q.dtype() || d_out.shape() != out_shape(x) {
        return Err(Error::Backward(format!(
            "{OP}: the output gradient does not match"
        )));
    }
    if lse.numel() != x.geom.rows() || lse.dtype() != stat_dtype(x.q.dtype()) {
        return Err(Error::Backward(format!(
            "{OP}: the saved lse does not match"
        )));
    }
    let b = Backward {
        x,
        d_out,
        lse,
        delta,
        needs,
    };
    match x.q.dtype() {
        DType::F32 => b.run::<f32, f32>(),
        DType::F64 => b.run::<f64, f64>(),
        DType::F16 => b.run::<half::f16, f32>(),
        DType::BF16 => b.run::<half::bf16, f32>(),
        dtype => Err(Error::UnsupportedDType { op: OP, dtype }),
    }
}
