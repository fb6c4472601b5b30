//! Per-element rounding bounds for scaled-dot-product attention and
//! MultiheadAttention (`tests/device_layers.rs`): how far any device's
//! output and gradients can be from the exact ones, to first order in the
//! unit roundoff `u` of the inputs' dtype.
//!
//! Why the devices differ at all: the CPU works the softmax of f32 scores
//! in f32 and CUDA in double (each within the bound below), and cuBLAS
//! and the CPU's gemm add a product's terms in different orders,
//! and where a gradient element cancels (`dS = P∘(dP − D)` sums to zero
//! over a row) the difference is far above `1e-5` of the element while
//! being a few `u` of the terms it came from.
//!
//! Every quantity is an [`Approx`]: its exact value (f64, from the f64
//! inputs) and a bound `e` on |rounded − exact|. A GEMM with `k`-term sums
//! adds `γ_(k+1)·|A|·|B|` (any order, with or without FMA; `+1` for the
//! rounding of a half-precision result computed in f32) and carries its
//! operands' bounds through `e_A·|B| + |A|·e_B`; an elementwise operation
//! adds `u·|result|`; the softmax's own errors (scores, log-sum-exp,
//! subtraction, exp) are bounded relative to `P` (see [`probabilities`]).
//! Both devices are within `e` of the exact value, so within `2e` of each
//! other (the harness's [`crate::device_common::check_layer_bounded`]).
// Each test file that declares this module uses a part of it.
#![allow(dead_code)]

use crate::device_common::unit_roundoff;
use leangrad::nn::{scaled_dot_product_attention as sdpa, SdpaOptions};
use leangrad::{DType, Device, Result, Tensor};

/// An exact value and a bound on how far a device's result is from it.
#[derive(Clone)]
pub struct Approx {
    pub v: Tensor,
    pub e: Tensor,
}

impl Approx {
    /// An input, exact on every device.
    pub fn exact(v: &Tensor) -> Result<Approx> {
        Ok(Approx {
            v: v.clone(),
            e: v.zeros_like()?,
        })
    }

    /// The same view of value and bound.
    fn map(&self, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Approx> {
        Ok(Approx {
            v: f(&self.v)?,
            e: f(&self.e)?,
        })
    }

    /// The last two dims swapped.
    fn t(&self) -> Result<Approx> {
        self.map(|x| x.transpose(-2, -1))
    }
}

/// The arithmetic of one dtype: its unit roundoff.
pub struct Rounding {
    u: f64,
}

impl Rounding {
    pub fn new(dtype: DType) -> Rounding {
        Rounding {
            u: unit_roundoff(dtype),
        }
    }

    /// `γ_n = n·u / (1 − n·u)`.
    fn gamma(&self, n: usize) -> f64 {
        let nu = n as f64 * self.u;
        nu / (1.0 - nu)
    }

    /// `Σ_i a_i · b_i` (batched matmuls, broadcasting) as one sum of
    /// `K = Σ k_i` terms: what one GEMM over concatenated operands does,
    /// and a bound for separate GEMMs whose results are added.
    fn matmuls(&self, pairs: &[(&Approx, &Approx)]) -> Result<Approx> {
        let k: usize = pairs.iter().map(|(a, _)| a.v.shape()[a.v.rank() - 1]).sum();
        let (mut v, mut mag, mut e): (Option<Tensor>, Option<Tensor>, Option<Tensor>) =
            (None, None, None);
        let acc = |s: Option<Tensor>, t: Tensor| -> Result<Option<Tensor>> {
            Ok(Some(match s {
                Some(s) => s.add(&t)?,
                None => t,
            }))
        };
        for (a, b) in pairs {
            let (aa, ab) = (a.v.abs()?, b.v.abs()?);
            v = acc(v, a.v.matmul(&b.v)?)?;
            mag = acc(mag, aa.matmul(&ab)?)?;
            e = acc(e, a.e.matmul(&ab)?.add(&aa.matmul(&b.e)?)?)?;
        }
        let (v, mag, e) = (v.unwrap(), mag.unwrap(), e.unwrap());
        let e = e.add(&mag.mul_scalar(self.gamma(k + 1))?)?;
        Ok(Approx { v, e })
    }

    fn matmul(&self, a: &Approx, b: &Approx) -> Result<Approx> {
        self.matmuls(&[(a, b)])
    }

    /// `a + b` (broadcasting).
    fn add(&self, a: &Approx, b: &Approx) -> Result<Approx> {
        let v = a.v.add(&b.v)?;
        let e = a.e.add(&b.e)?.add(&v.abs()?.mul_scalar(self.u)?)?;
        Ok(Approx { v, e })
    }

    /// `a − b` (broadcasting).
    fn sub(&self, a: &Approx, b: &Approx) -> Result<Approx> {
        let v = a.v.sub(&b.v)?;
        let e = a.e.add(&b.e)?.add(&v.abs()?.mul_scalar(self.u)?)?;
        Ok(Approx { v, e })
    }

    /// `a ∘ b` (broadcasting).
    fn mul(&self, a: &Approx, b: &Approx) -> Result<Approx> {
        let v = a.v.mul(&b.v)?;
        let e =
            a.e.mul(&b.v.abs()?)?
                .add(&a.v.abs()?.mul(&b.e)?)?
                .add(&v.abs()?.mul_scalar(self.u)?)?;
        Ok(Approx { v, e })
    }

    /// `s · a` for a scalar `s`.
    fn scale(&self, a: &Approx, s: f64) -> Result<Approx> {
        let v = a.v.mul_scalar(s)?;
        let e =
            a.e.mul_scalar(s.abs())?
                .add(&v.abs()?.mul_scalar(self.u)?)?;
        Ok(Approx { v, e })
    }

    /// The sum over `dim` (kept) of `n` terms.
    fn sum(&self, a: &Approx, dim: isize) -> Result<Approx> {
        let d = if dim < 0 {
            dim + a.v.rank() as isize
        } else {
            dim
        };
        let n = a.v.shape()[d as usize];
        let v = a.v.sum(&[dim], true)?;
        let e =
            a.e.sum(&[dim], true)?
                .add(&a.v.abs()?.sum(&[dim], true)?.mul_scalar(self.gamma(n))?)?;
        Ok(Approx { v, e })
    }
}

/// `I` of size `n` broadcast to `[batch.., n, n]`: attention over it gives
/// the probabilities themselves, with attention's own masking rules.
fn identity(batch: &[usize], n: usize) -> Result<Tensor> {
    let eye: Vec<f64> = (0..n * n)
        .map(|e| if e / n == e % n { 1.0 } else { 0.0 })
        .collect();
    let shape: Vec<usize> = batch.iter().copied().chain([n, n]).collect();
    Tensor::from_f64_slice(&eye, &[n, n], DType::F64, Device::Cpu)?.broadcast_to(&shape)
}

/// The probabilities `P` (before dropout) and `P'` (after) with their
/// bounds. With scores `S` within `e_S` (the GEMM `Q·Kᵀ`, its scaling and
/// the float mask's addition), `lse_i = log Σ_j exp S_ij` is within
/// `max_j e_S + γ_(Lk+1) + u·|lse|` (the row sum's own rounding is relative,
/// an absolute error in its log; `lse` is stored rounded), and
/// `P = exp(S − lse)` within `P·(e_S + e_lse + u·|S − lse| + 3u)`
/// (subtraction, exp to 2 ulp, the result's rounding), `|S − lse| = |ln P|`.
/// Dropout scales kept entries by `1/(1 − p)`, one more rounding.
fn probabilities(
    r: &Rounding,
    q: &Approx,
    k: &Approx,
    opts: &SdpaOptions,
) -> Result<(Approx, Approx)> {
    let rank = q.v.rank();
    let (lk, d) = (k.v.shape()[rank - 2], q.v.shape()[rank - 1]);
    let scale = opts.scale.unwrap_or(1.0 / (d as f64).sqrt());
    let s0 = r.matmul(q, &k.t()?)?;
    let mut s_abs = s0.v.abs()?.mul_scalar(scale)?;
    if let Some(m) = opts.mask.as_ref().filter(|m| m.dtype().is_float()) {
        s_abs = s_abs.add(&m.to_dtype(DType::F64)?.abs()?)?;
    }
    // The scaling's and the mask addition's roundings, at most u·|S| each.
    let e_s = s0.e.mul_scalar(scale)?.add(&s_abs.mul_scalar(2.0 * r.u)?)?;
    let batch = &q.v.shape()[..rank - 2];
    let eye = identity(batch, lk)?;
    let plain = SdpaOptions {
        dropout_p: 0.0,
        ..opts.clone()
    };
    let p = sdpa(&q.v, &k.v, &eye, &plain)?;
    let lse_abs = s_abs.max(-1, true)?.add_scalar((lk as f64).ln())?;
    let e_lse = e_s
        .max(-1, true)?
        .add(&lse_abs.mul_scalar(r.u)?)?
        .add_scalar(r.gamma(lk + 1))?;
    let ln_p = p.clamp(1e-300, 1.0)?.log()?.abs()?;
    let rel = e_s
        .add(&e_lse)?
        .add(&ln_p.mul_scalar(r.u)?)?
        .add_scalar(3.0 * r.u)?;
    let p = Approx {
        e: p.mul(&rel)?,
        v: p,
    };
    if opts.dropout_p == 0.0 {
        return Ok((p.clone(), p));
    }
    let dropped = sdpa(&q.v, &k.v, &eye, opts)?;
    // The kept entries' factor 1/(1 − p), 0 where dropped.
    let factor = dropped.div(&p.v.clamp(1e-300, f64::INFINITY)?)?;
    let e = p.e.mul(&factor)?.add(&dropped.abs()?.mul_scalar(r.u)?)?;
    Ok((p, Approx { v: dropped, e }))
}

/// Attention's output and the gradients of `sum(out · dout)` with respect
/// to `q`, `k`, `v`, each with its bound (the inputs' own bounds carried
/// through, for MultiheadAttention's projections).
pub fn sdpa_bounds(
    r: &Rounding,
    q: &Approx,
    k: &Approx,
    v: &Approx,
    dout: &Approx,
    opts: &SdpaOptions,
) -> Result<[Approx; 4]> {
    let d = q.v.shape()[q.v.rank() - 1];
    let scale = opts.scale.unwrap_or(1.0 / (d as f64).sqrt());
    let (p, dropped) = probabilities(r, q, k, opts)?;
    let out = r.matmul(&dropped, v)?;
    // dP' = dO·Vᵀ, then dropout's factor (1/(1 − p) or 0) as in forward.
    let dpd = r.matmul(dout, &v.t()?)?;
    let dp = if opts.dropout_p == 0.0 {
        dpd
    } else {
        let factor = dropped.v.div(&p.v.clamp(1e-300, f64::INFINITY)?)?;
        let v = dpd.v.mul(&factor)?;
        let e = dpd.e.mul(&factor)?.add(&v.abs()?.mul_scalar(r.u)?)?;
        Approx { v, e }
    };
    // dS = scale · P∘(dP − D), D = Σ_j P∘dP.
    let dsum = r.sum(&r.mul(&p, &dp)?, -1)?;
    let ds = r.scale(&r.mul(&p, &r.sub(&dp, &dsum)?)?, scale)?;
    let dq = r.matmul(&ds, k)?;
    let dk = r.matmul(&ds.t()?, q)?;
    let dv = r.matmul(&dropped.t()?, dout)?;
    Ok([out, dq, dk, dv])
}

/// [`sdpa_bounds`] of exact inputs, as the harness's `ErrorBound`: the
/// bounds of the output and of the gradients of `q`, `k`, `v`.
pub fn sdpa_error_bound(
    opts: &SdpaOptions,
) -> impl Fn(DType, &[Tensor], &Tensor) -> Result<Vec<Tensor>> + '_ {
    move |dtype, x, gy| {
        let r = Rounding::new(dtype);
        let [q, k, v, g] = [&x[0], &x[1], &x[2], gy].map(Approx::exact);
        let all = sdpa_bounds(&r, &q?, &k?, &v?, &g?, opts)?;
        Ok(all.into_iter().map(|a| a.e).collect())
    }
}

/// MultiheadAttention's layout: `[B, L, E]` ↔ `[B, H, L, E/H]`.
fn heads(a: &Approx, h: usize) -> Result<Approx> {
    a.map(|t| {
        let (b, l, e) = (t.shape()[0], t.shape()[1], t.shape()[2]);
        t.reshape(&[b, l, h, e / h])?.permute(&[0, 2, 1, 3])
    })
}

fn merge(a: &Approx) -> Result<Approx> {
    a.map(|t| {
        let (b, h, l, d) = (t.shape()[0], t.shape()[1], t.shape()[2], t.shape()[3]);
        t.permute(&[0, 2, 1, 3])?.reshape(&[b, l, h * d])
    })
}

/// `[B, L, E]` as `[B·L, E]`.
fn rows(a: &Approx) -> Result<Approx> {
    a.map(|t| t.reshape(&[t.shape()[0] * t.shape()[1], t.shape()[2]]))
}

/// The harness's `ErrorBound` of MultiheadAttention (bias, `heads` heads)
/// with inputs `[x, (kv,) in_proj_weight, in_proj_bias, out_proj.weight,
/// out_proj.bias]`: projections `x·W_iᵀ + b_i`, attention (dropout `p`
/// drawn from a module made with `seed`, as the layer under test draws
/// it), `o·W_oᵀ + b_o`, and the gradients of all of them.
pub fn mha_error_bound(
    heads_n: usize,
    causal: bool,
    dropout: f64,
    seed: u64,
) -> impl Fn(DType, &[Tensor], &Tensor) -> Result<Vec<Tensor>> {
    move |dtype, x, gy| {
        let r = Rounding::new(dtype);
        let cross = x.len() == 6;
        let t = x.iter().map(Approx::exact).collect::<Result<Vec<_>>>()?;
        let g = Approx::exact(gy)?;
        let p = if cross { 2 } else { 1 };
        let (src_q, src_kv) = (&t[0], &t[p - 1]);
        let (w, b, ow, ob) = (&t[p], &t[p + 1], &t[p + 2], &t[p + 3]);
        let e = ow.v.shape()[0];
        let part = |a: &Approx, i: usize| a.map(|t| t.narrow(0, i * e, e));
        let (w_i, b_i) = (
            [part(w, 0)?, part(w, 1)?, part(w, 2)?],
            [part(b, 0)?, part(b, 1)?, part(b, 2)?],
        );
        let project = |s: &Approx, i: usize| -> Result<Approx> {
            heads(&r.add(&r.matmul(s, &w_i[i].t()?)?, &b_i[i])?, heads_n)
        };
        let (q, k, v) = (project(src_q, 0)?, project(src_kv, 1)?, project(src_kv, 2)?);
        let mut opts = SdpaOptions::default().causal(causal);
        if dropout > 0.0 {
            let (bq, lq, lk) = (src_q.v.shape()[0], src_q.v.shape()[1], src_kv.v.shape()[1]);
            let m = leangrad::nn::MultiheadAttention::builder(e, heads_n)
                .name("mha")
                .dropout(dropout)
                .dtype(DType::F64)
                .seed(seed)
                .build(&Device::Cpu)?;
            let (s, o) = m.generator().reserve((bq * heads_n * lq * lk) as u64);
            opts = opts.dropout(dropout, s, o);
        }
        let dout = heads(&r.matmul(&g, ow)?, heads_n)?;
        let [o, dq, dk, dv] = sdpa_bounds(&r, &q, &k, &v, &dout, &opts)?;
        let o = merge(&o)?;
        let out = r.add(&r.matmul(&o, &ow.t()?)?, ob)?;
        let (dq, dk, dv) = (merge(&dq)?, merge(&dk)?, merge(&dv)?);
        // The input gradients: one GEMM over the concatenated projections
        // on the self-attention path, separate ones added on the other.
        let mut grads = Vec::new();
        let (wq, wk, wv) = (&w_i[0], &w_i[1], &w_i[2]);
        if cross {
            grads.push(r.matmul(&dq, wq)?);
            grads.push(r.matmuls(&[(&dk, wk), (&dv, wv)])?);
        } else {
            grads.push(r.matmuls(&[(&dq, wq), (&dk, wk), (&dv, wv)])?);
        }
        let (xq, xkv) = (rows(src_q)?, rows(src_kv)?);
        let dw = [
            r.matmul(&rows(&dq)?.t()?, &xq)?,
            r.matmul(&rows(&dk)?.t()?, &xkv)?,
            r.matmul(&rows(&dv)?.t()?, &xkv)?,
        ];
        let db = [
            r.sum(&rows(&dq)?, 0)?,
            r.sum(&rows(&dk)?, 0)?,
            r.sum(&rows(&dv)?, 0)?,
        ];
        let cat = |a: &[Approx; 3], squeeze: bool| -> Result<Tensor> {
            let es: Vec<Tensor> = a
                .iter()
                .map(|x| {
                    if squeeze {
                        x.e.reshape(&[e])
                    } else {
                        Ok(x.e.clone())
                    }
                })
                .collect::<Result<_>>()?;
            Tensor::cat(&es.iter().collect::<Vec<_>>(), 0)
        };
        let gr = rows(&g)?;
        let dow = r.matmul(&gr.t()?, &rows(&o)?)?;
        let dob = r.sum(&gr, 0)?;
        let mut bounds = vec![out.e];
        bounds.extend(grads.into_iter().map(|a| a.e));
        bounds.push(cat(&dw, false)?);
        bounds.push(cat(&db, true)?);
        bounds.push(dow.e);
        bounds.push(dob.e.reshape(&[e])?);
        Ok(bounds)
    }
}

/// Asserts every element of `got` is within `bound` of `exact` (all f64
/// values of output or gradient `j` of the layer `name`), and that the
/// largest bound stays within `1e-4` of the largest exact value, so a bound
/// that holds only because it is huge fails.
pub fn assert_within_bound(name: &str, j: usize, got: &[f64], exact: &[f64], bound: &[f64]) {
    let big = exact.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let worst = bound.iter().fold(0.0f64, |m, v| m.max(*v));
    for i in 0..got.len() {
        assert!(
            (got[i] - exact[i]).abs() <= bound[i],
            "{name} [{j}] element {i}: {} vs exact {} beyond {}",
            got[i],
            exact[i],
            bound[i]
        );
    }
    assert!(
        worst <= 1e-4 * big,
        "{name} [{j}]: bound {worst:e} vs largest value {big:e}"
    );
}
