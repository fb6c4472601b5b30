//! The layers of issue #5 written once for every device: attention (SDPA
//! with causal / bool / float masks, dropout, both saving paths,
//! grouped-query heads) and
//! MultiheadAttention, max pooling under both
//! save policies, the mask-keeping activations (clamp, leaky_relu), the
//! saved-value activations, dropout under SaveAll and bilinear
//! interpolation (whose meta-device ledger is also checked against the
//! CPU's). Each runs on the CPU
//! and on CUDA 0 when present for every requires-grad combination and both
//! save policies, comparing outputs, gradients and saved bytes with the
//! CPU's. Without a GPU the CUDA half prints `skipped: no CUDA device`.

mod attention_bound;
mod cuda_common;
mod device_common;

use attention_bound::{
    assert_within_bound, mha_error_bound, sdpa_bounds, sdpa_error_bound, Approx, Rounding,
};
use device_common::{
    check_layer, check_layer_bounded, check_layer_under, fresh_copy, input, tol, FLOATS,
};
use leangrad::autograd::SavePolicy;
use leangrad::nn::{scaled_dot_product_attention as sdpa, Module, SdpaOptions};
use leangrad::{DType, Device, Result, Tensor};

const BOTH: [SavePolicy; 2] = [SavePolicy::Lean, SavePolicy::SaveAll];

/// Attention's relative tolerance: half precision rounds S, P, dP and dS
/// once each on top of cuBLAS's own summation order, and dS = P·(dP − Σ P·dP)
/// cancels, so a 1-ulp flip upstream shows more than in one GEMM (bf16 has
/// 3 fewer mantissa bits than f16). A wrong mask or lse is still O(1) off.
/// An element that cancels below it may also pass within its rounding
/// bound from `attention_bound` (f32 elements of ~1e-3 of the largest
/// differ by a few ulps of the terms they came from).
fn att_tol(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 3.0 * tol(dtype),
        DType::BF16 => 5.0 * tol(dtype),
        _ => tol(dtype),
    }
}

/// `q [b, h, lq, d]`, `k [b, h, lk, d]`, `v [b, h, lk, dv]`.
fn qkv(
    dtype: DType,
    (b, h, lq, lk, d, dv): (usize, usize, usize, usize, usize, usize),
) -> [Tensor; 3] {
    [
        input(&[b, h, lq, d], dtype, 51, -1.0, 1.0),
        input(&[b, h, lk, d], dtype, 52, -1.0, 1.0),
        input(&[b, h, lk, dv], dtype, 53, -1.0, 1.0),
    ]
}

/// SDPA of `t` with `opts`, the mask (if any) a fresh copy on the inputs'
/// device in the run's ledger: attention saves the mask, and `to_device`
/// onto the CPU would share the caller's storage (counted outside the
/// ledger) while CUDA uploads a copy.
fn run_sdpa(t: &[Tensor], opts: &SdpaOptions) -> Result<Tensor> {
    let mut o = opts.clone();
    if let Some(m) = &opts.mask {
        o.mask = Some(fresh_copy(m, t[0].device()));
    }
    sdpa(&t[0], &t[1], &t[2], &o)
}

fn check_sdpa(
    name: &str,
    dtype: DType,
    dims: (usize, usize, usize, usize, usize, usize),
    opts: &SdpaOptions,
) {
    let [q, k, v] = qkv(dtype, dims);
    let what = format!("{name} ({dtype:?})");
    let bound = sdpa_error_bound(opts);
    check_layer_bounded(&what, &BOTH, &[&q, &k, &v], att_tol(dtype), &bound, |t| {
        run_sdpa(t, opts)
    });
}

/// A U8 mask `[lq, lk]` with one fully masked row (its probabilities are 0)
/// and a scattered pattern elsewhere.
fn bool_mask(lq: usize, lk: usize) -> Tensor {
    let m: Vec<u8> = (0..lq * lk)
        .map(|e| u8::from(e / lk != 1 && (e * 7) % 5 != 0))
        .collect();
    Tensor::from_vec(m, &[lq, lk], Device::Cpu).unwrap()
}

// Long rows, short heads: the probabilities are recomputed from the saved
// log-sum-exp whenever q and k are kept anyway (and cheaper than P).
const LONG: (usize, usize, usize, usize, usize, usize) = (2, 3, 9, 13, 3, 5);
// Short rows, wide heads (odd D): P is saved rather than Q and K.
const WIDE: (usize, usize, usize, usize, usize, usize) = (1, 2, 3, 4, 33, 7);

#[test]
fn sdpa_plain_and_causal() {
    for dtype in FLOATS {
        for (shape, dims) in [("long", LONG), ("wide", WIDE)] {
            check_sdpa(
                &format!("sdpa {shape}"),
                dtype,
                dims,
                &SdpaOptions::default(),
            );
            let causal = SdpaOptions::default().causal(true);
            check_sdpa(&format!("sdpa {shape} causal"), dtype, dims, &causal);
        }
        // A scale of its own; rank-3 inputs.
        let [q, k, v] = qkv(dtype, (1, 4, 6, 5, 7, 3));
        let (q, k, v) = (
            q.reshape(&[4, 6, 7]).unwrap(),
            k.reshape(&[4, 5, 7]).unwrap(),
            v.reshape(&[4, 5, 3]).unwrap(),
        );
        let opts = SdpaOptions::default().scale(0.3);
        check_layer_bounded(
            "sdpa rank 3 scaled",
            &BOTH,
            &[&q, &k, &v],
            att_tol(dtype),
            &sdpa_error_bound(&opts),
            |t| run_sdpa(t, &opts),
        );
    }
}

#[test]
fn sdpa_masks() {
    let (_, _, lq, lk, _, _) = LONG;
    for dtype in FLOATS {
        // Bool [lq, lk]: one copy serves every batch and head.
        let opts = SdpaOptions::default().mask(bool_mask(lq, lk));
        check_sdpa("sdpa bool mask", dtype, LONG, &opts);
        let opts = SdpaOptions::default().mask(bool_mask(lq, lk)).causal(true);
        check_sdpa("sdpa bool mask + causal", dtype, LONG, &opts);
        // Float in the inputs' dtype, [b, 1, lq, lk] (varies by batch only).
        let fm = input(&[2, 1, lq, lk], dtype, 61, -2.0, 1.0);
        check_sdpa(
            "sdpa float mask",
            dtype,
            LONG,
            &SdpaOptions::default().mask(fm),
        );
        // An f32 mask on other dtypes (read in f64, as the CPU reads it),
        // broadcast over the rows ([lk]).
        let f32m = input(&[lk], DType::F32, 62, -1.0, 1.0);
        check_sdpa(
            "sdpa f32 row mask",
            dtype,
            LONG,
            &SdpaOptions::default().mask(f32m),
        );
        // The save-P shape with a mask.
        let (_, _, wq, wk, _, _) = WIDE;
        let opts = SdpaOptions::default().mask(bool_mask(wq, wk));
        check_sdpa("sdpa wide bool mask", dtype, WIDE, &opts);
    }
}

#[test]
fn sdpa_dropout() {
    for dtype in FLOATS {
        for (shape, dims) in [("long", LONG), ("wide", WIDE)] {
            let opts = SdpaOptions::default().dropout(0.3, 7, 11);
            check_sdpa(&format!("sdpa {shape} dropout"), dtype, dims, &opts);
        }
        let (_, _, lq, lk, _, _) = LONG;
        let opts = SdpaOptions::default()
            .dropout(0.5, 3, 0)
            .causal(true)
            .mask(bool_mask(lq, lk));
        check_sdpa("sdpa dropout + causal + mask", dtype, LONG, &opts);
    }
}

/// k or v `[B, Hkv, L, F]` repeated to `[B, Hkv·group, L, F]`
/// (`repeat_interleave` over the heads): the bounds' reference only.
fn repeat_kv(t: &Tensor, group: usize) -> Result<Tensor> {
    let s = t.shape();
    t.unsqueeze(2)?
        .broadcast_to(&[s[0], s[1], group, s[2], s[3]])?
        .reshape(&[s[0], s[1] * group, s[2], s[3]])
}

/// `[B, H, L, F]` summed over each group of `group` consecutive heads.
fn sum_groups(t: &Tensor, group: usize) -> Result<Tensor> {
    let s = t.shape();
    t.reshape(&[s[0], s[1] / group, group, s[2], s[3]])?
        .sum(&[2], false)
}

/// The rounding bounds of grouped-query attention (`group` query heads per
/// key/value head; inputs `[B, L, H, F]` viewed as `[B, H, L, F]` when
/// `permuted`): those of attention on k and v repeated, with dK's and dV's
/// summed over each group and taken `group` times, as each device sums the
/// group's `group·Lq` terms in one accumulator (`γ_(group·n) ≈ group·γ_n`).
fn gqa_error_bound(
    opts: &SdpaOptions,
    group: usize,
    permuted: bool,
) -> impl Fn(DType, &[Tensor], &Tensor) -> Result<Vec<Tensor>> + '_ {
    move |dtype, x, gy| {
        let heads = |t: &Tensor| {
            if permuted {
                t.permute(&[0, 2, 1, 3])
            } else {
                Ok(t.clone())
            }
        };
        let plain = opts.clone().gqa(false);
        let (q, k, v) = (heads(&x[0])?, heads(&x[1])?, heads(&x[2])?);
        let (k, v) = (repeat_kv(&k, group)?, repeat_kv(&v, group)?);
        let [q, k, v, g] = [&q, &k, &v, gy].map(Approx::exact);
        let r = Rounding::new(dtype);
        let [out, dq, dk, dv] = sdpa_bounds(&r, &q?, &k?, &v?, &g?, &plain)?;
        let widen = |e: &Tensor| sum_groups(e, group)?.mul_scalar(group as f64);
        Ok(vec![
            out.e,
            heads(&dq.e)?,
            heads(&widen(&dk.e)?)?,
            heads(&widen(&dv.e)?)?,
        ])
    }
}

/// Grouped-query attention (`enable_gqa`: 4 query heads on 2 key/value
/// heads, or on 1) on every device against the CPU, every requires-grad
/// combination under both policies: outputs, gradients and saved bytes (K
/// and V saved un-repeated on every device), causal, a U8 mask with a fully
/// masked row, dropout, and head-split views of `[B, L, H, D]` inputs.
#[test]
fn sdpa_grouped_query_heads() {
    let (b, h, lq, lk, d, dv) = (2, 4, 9, 13, 3, 5);
    for dtype in FLOATS {
        let cases = [
            (2, false, SdpaOptions::default().causal(true)),
            (
                1,
                true,
                SdpaOptions::default()
                    .mask(bool_mask(lq, lk))
                    .dropout(0.3, 7, 11),
            ),
            (
                2,
                true,
                SdpaOptions::default().dropout(0.5, 3, 0).causal(true),
            ),
        ];
        for (hkv, permuted, opts) in cases {
            let opts = opts.gqa(true);
            let shape = |hs: usize, l: usize, f: usize| {
                if permuted {
                    [b, l, hs, f]
                } else {
                    [b, hs, l, f]
                }
            };
            let q = input(&shape(h, lq, d), dtype, 51, -1.0, 1.0);
            let k = input(&shape(hkv, lk, d), dtype, 52, -1.0, 1.0);
            let v = input(&shape(hkv, lk, dv), dtype, 53, -1.0, 1.0);
            let what = format!("sdpa gqa {h}/{hkv} permuted {permuted} ({dtype:?})");
            let bound = gqa_error_bound(&opts, h / hkv, permuted);
            check_layer_bounded(&what, &BOTH, &[&q, &k, &v], att_tol(dtype), &bound, |t| {
                if !permuted {
                    return run_sdpa(t, &opts);
                }
                let views = t
                    .iter()
                    .map(|x| x.permute(&[0, 2, 1, 3]))
                    .collect::<Result<Vec<_>>>()?;
                run_sdpa(&views, &opts)
            });
        }
    }
}

/// MultiheadAttention with its parameters as the layer's inputs:
/// `t = [x, (kv,) in_proj_weight, in_proj_bias, out_proj.weight,
/// out_proj.bias]`, built on the inputs' device with the same seed.
fn mha(t: &[Tensor], cross: bool, dropout: f64, opts: &leangrad::nn::MhaOptions) -> Result<Tensor> {
    let (e, heads) = (t[0].shape()[2], 3);
    let mut m = leangrad::nn::MultiheadAttention::builder(e, heads)
        .name("mha")
        .dropout(dropout)
        .dtype(t[0].dtype())
        .seed(5)
        .build(&t[0].device())?;
    let p = if cross { 2 } else { 1 };
    m.in_proj_weight = t[p].clone();
    m.in_proj_bias = Some(t[p + 1].clone());
    m.out_proj.weight = t[p + 2].clone();
    m.out_proj.bias = Some(t[p + 3].clone());
    if cross {
        m.attention(&t[0], &t[1], &t[1], opts)
    } else {
        m.forward(&t[0])
    }
}

#[test]
fn multihead_attention() {
    let e = 9;
    for dtype in FLOATS {
        let x = input(&[2, 5, e], dtype, 71, -1.0, 1.0);
        let kv = input(&[2, 7, e], dtype, 72, -1.0, 1.0);
        let w = input(&[3 * e, e], dtype, 73, -0.4, 0.4);
        let b = input(&[3 * e], dtype, 74, -0.2, 0.2);
        let ow = input(&[e, e], dtype, 75, -0.4, 0.4);
        let ob = input(&[e], dtype, 76, -0.2, 0.2);
        let none = leangrad::nn::MhaOptions::default();
        let t = att_tol(dtype);
        let inputs = [&x, &w, &b, &ow, &ob];
        let bound = mha_error_bound(3, false, 0.0, 5);
        check_layer_bounded("mha self", &BOTH, &inputs, t, &bound, |t| {
            mha(t, false, 0.0, &none)
        });
        let bound = mha_error_bound(3, false, 0.25, 5);
        check_layer_bounded("mha self dropout", &BOTH, &inputs, t, &bound, |t| {
            mha(t, false, 0.25, &none)
        });
        let causal = leangrad::nn::MhaOptions {
            causal: true,
            attn_mask: None,
        };
        check_layer_bounded(
            "mha cross causal",
            &BOTH,
            &[&x, &kv, &w, &b, &ow, &ob],
            t,
            &mha_error_bound(3, true, 0.0, 5),
            |t| mha(t, true, 0.0, &causal),
        );
    }
}

#[test]
fn max_pool2d_both_policies() {
    use leangrad::nn::{max_pool2d, MaxPool2dOptions};
    let overlapping = MaxPool2dOptions {
        kernel: [3, 2],
        stride: Some([2, 1]),
        padding: [1, 1],
        dilation: [1, 2],
        ceil_mode: false,
    };
    let ceil = MaxPool2dOptions {
        kernel: [2, 3],
        stride: Some([2, 2]),
        padding: [0, 1],
        dilation: [1, 1],
        ceil_mode: true,
    };
    for dtype in FLOATS {
        let x = input(&[2, 3, 7, 6], dtype, 41, -1.0, 1.0);
        check_layer("max_pool2d overlapping", &[&x], |t| {
            max_pool2d(&t[0], &overlapping)
        });
        check_layer("max_pool2d ceil", &[&x], |t| max_pool2d(&t[0], &ceil));
        // Ties (one input the max of several windows, accumulated in order).
        let flat = Tensor::full(&[1, 2, 5, 5], 0.5, dtype, Device::Cpu).unwrap();
        check_layer("max_pool2d ties", &[&flat], |t| {
            max_pool2d(&t[0], &overlapping)
        });
        let xt = x.transpose(2, 3).unwrap();
        check_layer("max_pool2d of a view", &[&xt], |t| max_pool2d(&t[0], &ceil));
    }
}

/// Bilinear interpolation (both of PyTorch's formulas, both
/// `align_corners`, a scale factor, a 1×1 input, a transposed view) on
/// every device; the meta device's ledger equals the CPU's.
#[test]
fn interpolate_bilinear_every_device() {
    use leangrad::nn::{interpolate_bilinear, interpolate_bilinear_scale};
    for dtype in FLOATS {
        let x = input(&[2, 5, 4, 3], dtype, 43, -1.0, 1.0);
        check_layer("interpolate small", &[&x], |t| {
            interpolate_bilinear(&t[0], [7, 9], false)
        });
        check_layer("interpolate wide align_corners", &[&x], |t| {
            interpolate_bilinear(&t[0], [2, 130], true)
        });
        check_layer("interpolate scale factor", &[&x], |t| {
            interpolate_bilinear_scale(&t[0], [1.5, 2.5], false)
        });
        let xt = x.transpose(2, 3).unwrap();
        check_layer("interpolate of a view", &[&xt], |t| {
            interpolate_bilinear(&t[0], [3, 127], false)
        });
        let pooled = input(&[2, 4, 1, 1], dtype, 44, -1.0, 1.0);
        check_layer("interpolate 1x1", &[&pooled], |t| {
            interpolate_bilinear(&t[0], [5, 6], false)
        });
    }
    let ledger_of = |dev: Device| {
        let ledger = leangrad::memory::Ledger::new();
        let _g = ledger.enter();
        let x = Tensor::zeros(&[2, 5, 4, 3], DType::F32, dev)
            .unwrap()
            .set_requires_grad(true)
            .unwrap();
        let y = interpolate_bilinear(&x, [3, 127], false).unwrap();
        let saved = ledger.live_in(dev, leangrad::memory::Category::Saved);
        let gy = Tensor::zeros(y.shape(), DType::F32, dev).unwrap();
        leangrad::autograd::backward_with(&y, Some(gy), &mut leangrad::autograd::CollectGrads)
            .unwrap();
        (saved, ledger.peak(dev), x.grad().unwrap().shape().to_vec())
    };
    assert_eq!(ledger_of(Device::Meta), ledger_of(Device::Cpu));
}

#[test]
fn mask_keeping_activations() {
    for dtype in FLOATS {
        // 77 elements: a partial last mask word; exact boundary values too.
        let x = input(&[7, 11], dtype, 91, -1.5, 1.5);
        check_layer("clamp", &[&x], |t| t[0].clamp(-0.5, 0.75));
        check_layer("clamp of a transpose", &[&x], |t| {
            t[0].t()?.clamp(-1.0, 0.0)
        });
        // The output saved by the next op (a product keeps both operands).
        check_layer("clamp then product", &[&x], |t| {
            let y = t[0].clamp(-0.5, 0.5)?;
            y.mul(&y)
        });
        // The source saved by another op too: the lean mask hands over to it.
        check_layer("clamp beside a product", &[&x], |t| {
            t[0].clamp(-0.5, 0.5)?.add(&t[0].mul(&t[0])?)
        });
        check_layer("LeakyReLU module", &[&x], |t| {
            leangrad::nn::LeakyReLU {
                negative_slope: 0.2,
            }
            .forward(&t[0])
        });
        check_layer("leaky_relu beside a product", &[&x], |t| {
            t[0].leaky_relu(0.05)?.add(&t[0].mul(&t[0])?)
        });
    }
}

#[test]
fn dropout_under_save_all() {
    let all = [SavePolicy::SaveAll];
    for dtype in FLOATS {
        let x = input(&[9, 13], dtype, 95, -1.0, 1.0);
        check_layer_under("dropout SaveAll", &all, &[&x], |t| {
            leangrad::nn::dropout(&t[0], 0.4, 21, 3)
        });
        check_layer_under("dropout SaveAll of a view", &all, &[&x], |t| {
            leangrad::nn::dropout(&t[0].t()?, 0.2, 4, 100)
        });
        check_layer("Dropout module", &[&x], |t| {
            leangrad::nn::Dropout::new("drop", 0.3, 77)?.forward(&t[0])
        });
    }
}

/// The activations that save a value (GELU, SiLU, Hardswish, Hardsigmoid, Mish:
/// the input; Sigmoid, Tanh: the output). Their backwards are the elementwise gradient kernels
/// `GeluB`, `SiluB`, `SigmoidB`, `TanhB` of `src/ops/unary.rs`, on CUDA
/// `lg_binary` in kernels/elementwise.cu, which rounds half types after
/// every operation as the CPU does.
#[test]
fn saved_value_activations() {
    use leangrad::nn::{Hardsigmoid, Hardswish, Mish, SiLU, Sigmoid, Tanh, GELU};
    for dtype in FLOATS {
        let x = input(&[5, 17], dtype, 97, -2.0, 2.0);
        check_layer("GELU", &[&x], |t| {
            GELU { approximate: false }.forward(&t[0])
        });
        check_layer("GELU tanh", &[&x], |t| {
            GELU { approximate: true }.forward(&t[0])
        });
        check_layer("SiLU", &[&x], |t| SiLU {}.forward(&t[0]));
        check_layer("Sigmoid", &[&x], |t| Sigmoid {}.forward(&t[0]));
        check_layer("Tanh", &[&x], |t| Tanh {}.forward(&t[0]));
        // Over [-5, 5]: both flat sides, both kinks' neighbourhoods and the
        // curved middle.
        let wide = input(&[5, 17], dtype, 98, -5.0, 5.0);
        check_layer("Hardswish", &[&wide], |t| Hardswish {}.forward(&t[0]));
        check_layer("Hardsigmoid", &[&wide], |t| Hardsigmoid {}.forward(&t[0]));
        check_layer("Mish", &[&wide], |t| Mish {}.forward(&t[0]));
    }
}

/// The shapes above reach both of attention's lean saving paths (checked
/// on the CPU, the reference the devices are compared with). The inputs
/// are fresh leaves in the run's ledger, so those attention keeps count as
/// Saved too: LONG with q, k, v requiring grad keeps q, k, v and the f32
/// lse (rows = 2·3·9) instead of P (2·3·9·13); WIDE keeps P (1·2·3·4)
/// alone when only v requires grad, and P with k and v when only q does.
#[test]
fn sdpa_shapes_cover_both_saving_paths() {
    let f = |t: &[Tensor]| run_sdpa(t, &SdpaOptions::default());
    let saved = |dims, requires: &[bool]| {
        let [q, k, v] = qkv(DType::F32, dims);
        device_common::layer_run(Device::Cpu, SavePolicy::Lean, &[&q, &k, &v], requires, &f).saved
    };
    // f32 elements of q, k, v: LONG (2, 3, 9, 13, 3, 5), WIDE (1, 2, 3, 4, 33, 7).
    let (lq, lk, lv) = (2 * 3 * 9 * 3, 2 * 3 * 13 * 3, 2 * 3 * 13 * 5);
    let (wk, wv) = (2 * 4 * 33, 2 * 4 * 7);
    assert_eq!(saved(LONG, &[true, true, true]), (lq + lk + lv + 54) * 4);
    assert_eq!(saved(WIDE, &[false, false, true]), 24 * 4);
    assert_eq!(saved(WIDE, &[true, false, false]), (wk + wv + 24) * 4);
    // SaveAll keeps P and its inputs in every case, and where the fused
    // kernels run (LONG) also the lse they read.
    let [q, k, v] = qkv(DType::F32, LONG);
    let all = device_common::layer_run(
        Device::Cpu,
        SavePolicy::SaveAll,
        &[&q, &k, &v],
        &[true; 3],
        &f,
    );
    assert_eq!(all.saved, (lq + lk + lv + 702 + 54) * 4);
}

/// The rounding bounds the attention checks accept
/// differences within (CPU only, so it runs without a GPU): each holds for
/// the CPU's own f32 results against the exact (f64) ones, and each stays
/// small next to the values (at most 1e-4 of the largest), so a wrong
/// mask, lse or a missing term — off by the size of a term — could not
/// pass as rounding.
#[test]
fn rounding_bounds_hold_and_stay_small() {
    use device_common::{output_and_grads, ErrorBound};
    let check = |name: &str,
                 inputs: &[&Tensor],
                 bound: ErrorBound,
                 f: &dyn Fn(&[Tensor]) -> Result<Tensor>| {
        let x: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
        let out_shape = f(&x).unwrap().shape().to_vec();
        let gy = Tensor::rand_range(&out_shape, -1.0, 1.0, DType::F32, Device::Cpu, 99).unwrap();
        let got = output_and_grads(&x, &gy, f).unwrap();
        let x64: Vec<Tensor> = x.iter().map(|t| t.to_dtype(DType::F64).unwrap()).collect();
        let g64 = gy.to_dtype(DType::F64).unwrap();
        let exact = output_and_grads(&x64, &g64, f).unwrap();
        let bounds = bound(DType::F32, &x64, &g64).unwrap();
        for (j, ((g, e), b)) in got.iter().zip(&exact).zip(&bounds).enumerate() {
            let (g, e, b) = (
                g.to_f64_vec().unwrap(),
                e.to_f64_vec().unwrap(),
                b.to_f64_vec().unwrap(),
            );
            // Measured: at most 4.2e-5 (MultiheadAttention's input gradient).
            assert_within_bound(name, j, &g, &e, &b);
        }
    };
    let [q, k, v] = qkv(DType::F32, LONG);
    let (_, _, lq, lk, _, _) = LONG;
    for opts in [
        SdpaOptions::default().causal(true),
        SdpaOptions::default().mask(input(&[lk], DType::F32, 62, -1.0, 1.0)),
        SdpaOptions::default()
            .dropout(0.5, 3, 0)
            .mask(bool_mask(lq, lk)),
    ] {
        let bound = sdpa_error_bound(&opts);
        check("sdpa", &[&q, &k, &v], &bound, &|t| run_sdpa(t, &opts));
    }
    let e = 9;
    let mha_in = [
        input(&[2, 5, e], DType::F32, 71, -1.0, 1.0),
        input(&[2, 7, e], DType::F32, 72, -1.0, 1.0),
        input(&[3 * e, e], DType::F32, 73, -0.4, 0.4),
        input(&[3 * e], DType::F32, 74, -0.2, 0.2),
        input(&[e, e], DType::F32, 75, -0.4, 0.4),
        input(&[e], DType::F32, 76, -0.2, 0.2),
    ];
    let causal = leangrad::nn::MhaOptions {
        causal: true,
        attn_mask: None,
    };
    let all: Vec<&Tensor> = mha_in.iter().collect();
    let bound = mha_error_bound(3, true, 0.0, 5);
    check("mha cross causal", &all, &bound, &|t| {
        mha(t, true, 0.0, &causal)
    });
    let bound = mha_error_bound(3, false, 0.25, 5);
    let self_in = [all[0], all[2], all[3], all[4], all[5]];
    let none = leangrad::nn::MhaOptions::default();
    check("mha self dropout", &self_in, &bound, &|t| {
        mha(t, false, 0.25, &none)
    });
}
