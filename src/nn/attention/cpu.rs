//! Attention kernels on the CPU (and their meta form): the row-wise
//! softmax of scaled scores written as `exp(x − lse)` with the row's
//! log-sum-exp (so backward can rebuild the probabilities bit for bit from
//! a saved `lse`), and the softmax backward `scale · P ⊙ (dP − Σ dP ⊙ P)`.
//! Rows are independent. f32 rows are worked in f32 vectors
//! (`cpu_f32.rs`, as PyTorch does); f64, f16 and bf16 rows in f64. The
//! CUDA kernels (`attention.cu`) use the same formulas, in double.

use super::cpu_exp::exp_in_place;
use super::cpu_f32;
use super::{RowLse, ScoreGeom, ScoreSpec, OP};
use crate::dtype::CpuData;
use crate::memory::host::{try_for_overwrite, try_zeroed};
use crate::memory::{with_category, Category};
use crate::meta::{self, backend, not_on_cuda, Backend};
use crate::primitives::{parallel, Dense};
use crate::tensor::Tensor;
use crate::{DType, Error, FloatDType, Result, WithDType};
use rayon::prelude::*;

/// The CPU's logit rule over an f64 additive mask of all scores.
struct Logits<'a> {
    spec: &'a ScoreSpec<'a>,
    mask: Option<&'a [f64]>,
}

impl Logits<'_> {
    /// The logits of score row `row` (`srow`, `lk` scores) into `out`:
    /// `scale·s (+ mask)`, `−∞` above the diagonal when causal. Whole-row
    /// loops (no per-element branch), so they vectorise.
    #[inline(always)]
    fn row<T: FloatDType>(&self, row: usize, srow: &[T], out: &mut [f64]) {
        let g = self.spec.geom;
        for (x, &v) in out.iter_mut().zip(srow) {
            *x = g.scale * WithDType::to_f64(v);
        }
        if let Some(m) = self.mask {
            let m = &m[row * g.lk..(row + 1) * g.lk];
            out.iter_mut().zip(m).for_each(|(x, &m)| *x += m);
        }
        if g.causal {
            out.iter_mut()
                .skip(row % g.lq + 1)
                .for_each(|x| *x = f64::NEG_INFINITY);
        }
    }
}

/// The mask as additive f64 values over all scores (`0`/`−∞` for U8), on
/// the host (uncounted, as any host temporary).
fn additive_mask(mask: &Tensor, scores: &[usize]) -> Result<Vec<f64>> {
    let full = mask.detach().broadcast_to(scores)?;
    let boolean = mask.dtype() == DType::U8;
    Ok(full
        .to_f64_vec()?
        .into_iter()
        .map(|v| match (boolean, v != 0.0) {
            (true, true) => 0.0,
            (true, false) => f64::NEG_INFINITY,
            _ => v,
        })
        .collect())
}

/// Rows of scores one rayon task handles (with one scratch buffer).
const ROWS_PER_TASK: usize = 32;

/// Two rows of scratch: the logits and their exponentials.
struct Scratch<S> {
    x: Vec<S>,
    e: Vec<S>,
}

/// Runs `f(row, output row, extra[row], scratch)` over the rows of `lk`
/// elements of `out`, in tasks of [`ROWS_PER_TASK`] rows (in parallel when
/// large), each with its own scratch rows (uncounted host temporaries).
fn run_rows<T: Send, S: Copy + Default>(
    out: &mut [T],
    lk: usize,
    extra: &mut [f64],
    f: impl Fn(usize, &mut [T], &mut f64, &mut Scratch<S>) + Sync + Send,
) {
    if lk == 0 {
        return;
    }
    let task = |t: usize, o: &mut [T], e: &mut [f64]| {
        let mut sc = Scratch {
            x: vec![S::default(); lk],
            e: vec![S::default(); lk],
        };
        for (i, (row, ex)) in o.chunks_mut(lk).zip(e.iter_mut()).enumerate() {
            f(t * ROWS_PER_TASK + i, row, ex, &mut sc);
        }
    };
    let chunk = lk * ROWS_PER_TASK;
    if parallel(out.len()) {
        out.par_chunks_mut(chunk)
            .zip(extra.par_chunks_mut(ROWS_PER_TASK))
            .enumerate()
            .for_each(|(t, (o, e))| task(t, o, e));
    } else {
        out.chunks_mut(chunk)
            .zip(extra.chunks_mut(ROWS_PER_TASK))
            .enumerate()
            .for_each(|(t, (o, e))| task(t, o, e));
    }
}

fn probs_rows<T: FloatDType>(
    s: &[T],
    lg: &Logits,
    lse_in: Option<&[f64]>,
) -> Result<(CpuData, Vec<f64>)> {
    let spec = lg.spec;
    let lk = spec.geom.lk;
    let rows = s.len().checked_div(lk).unwrap_or(0);
    // f64 scores keep the C library's exp; the others round each value to
    // a narrower type, which a 1-ulp f64 difference almost never changes.
    let exact = T::DTYPE == DType::F64;
    // Every row is written below (a fully masked one with zeros).
    let mut p = try_for_overwrite::<T>(s.len())?;
    let mut lse = try_zeroed::<f64>(rows)?;
    run_rows(&mut p, lk, &mut lse, |r, prow, l, sc| {
        let srow = &s[r * lk..(r + 1) * lk];
        lg.row(r, srow, &mut sc.x);
        let value = match lse_in {
            Some(v) => v[r],
            None => {
                let mx = sc.x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let v = if mx == f64::NEG_INFINITY {
                    mx
                } else {
                    sc.e.iter_mut().zip(&sc.x).for_each(|(e, &x)| *e = x - mx);
                    exp_in_place(&mut sc.e, exact);
                    mx + sc.e.iter().sum::<f64>().ln()
                };
                if spec.lse_f32 {
                    v as f32 as f64
                } else {
                    v
                }
            }
        };
        *l = value;
        if value == f64::NEG_INFINITY {
            prow.fill(T::zero()); // a fully masked row: probabilities 0
            return;
        }
        sc.e.iter_mut()
            .zip(&sc.x)
            .for_each(|(e, &x)| *e = x - value);
        exp_in_place(&mut sc.e, exact);
        for (o, &e) in prow.iter_mut().zip(&sc.e) {
            *o = <T as WithDType>::from_f64(e);
        }
    });
    Ok((T::wrap(p), lse))
}

/// [`probs_rows`] for f32 scores whose `lse` is saved in f32, in f32
/// vectors (`cpu_f32`): the same formula, each additive mask value
/// rounded to f32 as it is added.
fn probs_rows_f32(s: &[f32], lg: &Logits, lse_in: Option<&[f64]>) -> Result<(CpuData, Vec<f64>)> {
    let g = lg.spec.geom;
    let lk = g.lk;
    let rows = s.len().checked_div(lk).unwrap_or(0);
    let mut p = try_for_overwrite::<f32>(s.len())?;
    let mut lse = try_zeroed::<f64>(rows)?;
    run_rows(&mut p, lk, &mut lse, |r, prow, l, sc: &mut Scratch<f32>| {
        let rule = cpu_f32::RowLogits {
            scale: g.scale as f32,
            mask: lg.mask.map(|m| &m[r * lk..(r + 1) * lk]),
            cut: g.causal.then_some(r % g.lq + 1),
        };
        // A saved f32 lse read back as f64 is exact.
        let given = lse_in.map(|v| v[r] as f32);
        let srow = &s[r * lk..(r + 1) * lk];
        *l = f64::from(cpu_f32::probs_row(&rule, srow, prow, &mut sc.x, given));
    });
    Ok((CpuData::F32(p), lse))
}

/// The probabilities `P = exp(x − lse)` for scores `s` `[.., lq, lk]` (a
/// fresh GEMM output) and the per-row `lse` (rounded to the saved
/// precision, `−∞` for fully masked rows whose probabilities are 0). With
/// `lse_in` (a saved `lse` tensor), the same formula with that `lse`: bit
/// for bit forward's probabilities (and the returned lse is `lse_in`'s).
/// The mask's dense form is a Workspace temporary.
pub(super) fn attention_probs(
    s: &Tensor,
    spec: &ScoreSpec,
    lse_in: Option<&Tensor>,
) -> Result<(Tensor, RowLse)> {
    match backend(OP, &[s])? {
        Backend::Meta => {
            // One (unread) lse per row: its length sizes the saved lse.
            let rows = s.numel().checked_div(spec.geom.lk).unwrap_or(0);
            let p = meta::empty(s.shape(), s.dtype())?;
            return Ok((p, RowLse::Meta(rows)));
        }
        Backend::Cuda(n) => return Err(not_on_cuda(OP, n)),
        Backend::Cpu => {}
    }
    let mask = match spec.mask {
        Some(m) => {
            let _ws = with_category(Category::Workspace);
            Some(additive_mask(m, spec.scores)?)
        }
        None => None,
    };
    let lse_in = lse_in.map(Tensor::small_values).transpose()?;
    let logits = Logits {
        spec,
        mask: mask.as_deref(),
    };
    let dense = Dense::new(s)?;
    let (data, range) = dense.parts();
    let (p, lse) = match data {
        CpuData::F32(v) if spec.lse_f32 => probs_rows_f32(&v[range], &logits, lse_in.as_deref())?,
        _ => crate::match_float_data!(data, OP, v =>
            probs_rows(&v[range], &logits, lse_in.as_deref())?),
    };
    Ok((Tensor::from_cpu_data(p, s.shape())?, RowLse::Host(lse)))
}

fn grad_rows<T: FloatDType>(p: &[T], dp: &[T], geom: ScoreGeom) -> Result<CpuData> {
    let (lk, scale) = (geom.lk, geom.scale);
    let rows = p.len().checked_div(lk).unwrap_or(0);
    let mut ds = try_for_overwrite::<T>(p.len())?;
    let mut unused = try_zeroed::<f64>(rows)?;
    run_rows(
        &mut ds,
        lk,
        &mut unused,
        |r, out, _, _: &mut Scratch<f64>| {
            let (pr, dr) = (&p[r * lk..(r + 1) * lk], &dp[r * lk..(r + 1) * lk]);
            let dot: f64 = pr
                .iter()
                .zip(dr)
                .map(|(a, b)| WithDType::to_f64(*a) * WithDType::to_f64(*b))
                .sum();
            for ((o, a), b) in out.iter_mut().zip(pr).zip(dr) {
                *o = <T as WithDType>::from_f64(
                    scale * WithDType::to_f64(*a) * (WithDType::to_f64(*b) - dot),
                );
            }
        },
    );
    Ok(T::wrap(ds))
}

/// [`grad_rows`] for f32 in f32 vectors (`cpu_f32`), the dot product in f64.
fn grad_rows_f32(p: &[f32], dp: &[f32], geom: ScoreGeom) -> Result<CpuData> {
    let lk = geom.lk;
    let rows = p.len().checked_div(lk).unwrap_or(0);
    let mut ds = try_for_overwrite::<f32>(p.len())?;
    let mut unused = try_zeroed::<f64>(rows)?;
    run_rows(
        &mut ds,
        lk,
        &mut unused,
        |r, out, _, _: &mut Scratch<f32>| {
            let span = r * lk..(r + 1) * lk;
            cpu_f32::grad_row(geom.scale as f32, &p[span.clone()], &dp[span], out);
        },
    );
    Ok(CpuData::F32(ds))
}

/// The gradient of the scaled scores `Q·Kᵀ`: `scale · P ⊙ (dP − Σ_j dP ⊙ P)`
/// per row of `lk` elements (any layouts, same shape and dtype: the seam
/// checked).
pub(super) fn attention_softmax_grad(p: &Tensor, dp: &Tensor, geom: ScoreGeom) -> Result<Tensor> {
    match backend(OP, &[p, dp])? {
        Backend::Meta => return meta::empty(p.shape(), p.dtype()),
        Backend::Cuda(n) => return Err(not_on_cuda(OP, n)),
        Backend::Cpu => {}
    }
    let (dpn, ddn) = (Dense::new(p)?, Dense::new(dp)?);
    let ((pd, pr), (dd, dr)) = (dpn.parts(), ddn.parts());
    if let (CpuData::F32(pv), CpuData::F32(dv)) = (pd, dd) {
        let out = grad_rows_f32(&pv[pr], &dv[dr], geom)?;
        return Tensor::from_cpu_data(out, p.shape());
    }
    let out: CpuData = crate::match_float_data!(pd, OP, v => {
        let g = dd.as_slice().ok_or_else(|| Error::Backward("attention: dtype".into()))?;
        grad_rows(&v[pr], &g[dr], geom)?
    });
    Tensor::from_cpu_data(out, p.shape())
}
