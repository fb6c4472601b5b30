//! The convolutions written once for every device: conv2d (grouped,
//! strided, dilated, of views) with its bias gradient, conv_transpose2d
//! with and without bias and the ConvTranspose2d module, each on the CPU and
//! on CUDA 0 when present for every requires-grad combination and both save
//! policies, comparing outputs, gradients and saved bytes with the CPU's;
//! the CUDA weight gradient's split sums (default and large budget) against
//! the CPU; and the rounding bound the comparisons accept,
//! checked on the CPU. Without a GPU the CUDA half prints `skipped: no CUDA
//! device`.

mod attention_bound;
mod cuda_common;
mod device_common;

use attention_bound::assert_within_bound;

use cuda_common::cpu_rand;
use device_common::{check_multilinear, input, FLOATS};
use leangrad::cuda::with_conv_tf32;
use leangrad::memory::{Category, Ledger};
use leangrad::nn::{
    conv1d, conv2d, conv_transpose2d, Conv1dOptions, Conv2dOptions, ConvTranspose2d,
    ConvTranspose2dOptions, Module,
};
use leangrad::nn::{with_conv_workspace, LARGE_WORKSPACE_BYTES};
use leangrad::{DType, Device, Result, Tensor};

#[test]
fn conv2d_layer_and_bias_grad() {
    let grouped = Conv2dOptions {
        groups: 2,
        ..Conv2dOptions::default()
    };
    let strided = Conv2dOptions {
        stride: [2, 1],
        padding: [1, 2],
        dilation: [1, 2],
        groups: 2,
    };
    for dtype in FLOATS {
        let x = input(&[3, 4, 7, 6], dtype, 31, -1.0, 1.0);
        let w = input(&[6, 2, 3, 2], dtype, 32, -0.5, 0.5);
        let b = input(&[6], dtype, 33, -0.5, 0.5);
        // cuBLAS and the CPU's gemm sum in different orders: an element
        // that cancels (a weight gradient of 75 terms) differs by more
        // than 1e-5 of itself, within the sums' rounding bound.
        for (name, opts) in [("conv2d", grouped), ("conv2d strided", strided)] {
            check_multilinear(name, &[&x, &w, &b], |t| {
                conv2d(&t[0], &t[1], Some(&t[2]), &opts)
            });
            // The input as a permuted view (a dense copy on the way in).
            let xt = x.transpose(2, 3).unwrap();
            check_multilinear(&format!("{name} of a view"), &[&xt, &w], |t| {
                conv2d(&t[0].transpose(2, 3)?, &t[1], None, &opts)
            });
        }
    }
}

const FULL: ConvTranspose2dOptions = ConvTranspose2dOptions {
    stride: [2, 3],
    padding: [1, 0],
    output_padding: [1, 2],
    dilation: [1, 2],
    groups: 2,
};

#[test]
fn conv_transpose2d_layer() {
    let plain = ConvTranspose2dOptions::default();
    let full = FULL;
    // cuBLAS and the CPU's gemm sum the taps' products in different
    // orders: outputs that cancel differ within the sums' rounding bound.
    for dtype in FLOATS {
        let x = input(&[2, 4, 5, 3], dtype, 81, -1.0, 1.0);
        // [cin, cout/groups, kh, kw]: cout = 6 with 2 groups, 3 ungrouped.
        let w2 = input(&[4, 3, 3, 2], dtype, 82, -0.5, 0.5);
        let b6 = input(&[6], dtype, 83, -0.5, 0.5);
        let b3 = input(&[3], dtype, 84, -0.5, 0.5);
        check_multilinear("conv_transpose2d bias", &[&x, &w2, &b3], |t| {
            conv_transpose2d(&t[0], &t[1], Some(&t[2]), &plain)
        });
        check_multilinear("conv_transpose2d no bias", &[&x, &w2], |t| {
            conv_transpose2d(&t[0], &t[1], None, &plain)
        });
        check_multilinear(
            "conv_transpose2d grouped strided bias",
            &[&x, &w2, &b6],
            |t| conv_transpose2d(&t[0], &t[1], Some(&t[2]), &full),
        );
        // A permuted input view and a bias view.
        let xt = x.transpose(2, 3).unwrap();
        let bb = input(&[12], dtype, 85, -0.5, 0.5);
        check_multilinear("conv_transpose2d of views", &[&xt, &w2, &bb], |t| {
            let b = t[2].narrow(0, 3, 6)?;
            conv_transpose2d(&t[0].transpose(2, 3)?, &t[1], Some(&b), &full)
        });
        // The module, its weight and bias given as the layer's inputs (so
        // they are fresh copies in each run's ledger, as the weight is saved
        // for the input's gradient, and their gradients are checked too).
        check_multilinear("ConvTranspose2d module", &[&x, &w2, &b6], |t| {
            let mut m = ConvTranspose2d::builder(4, 6, [3, 2])
                .name("up")
                .options(full)
                .dtype(t[0].dtype())
                .seed(9)
                .build(&t[0].device())?;
            m.weight = t[1].clone();
            m.bias = Some(t[2].clone());
            m.forward(&t[0])
        });
    }
}

fn leaf(t: &Tensor) -> Tensor {
    t.clone().set_requires_grad(true).unwrap()
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

/// Backpropagates `sum(y · gy)` and returns the gradients of `leaves`.
fn grads(y: &Tensor, gy: &Tensor, leaves: &[&Tensor]) -> Vec<Vec<f64>> {
    y.mul(gy).unwrap().sum_all().unwrap().backward().unwrap();
    leaves.iter().map(|l| vals(&l.grad().unwrap())).collect()
}

/// The CUDA convolutions are implicit GEMMs that hold the CPU's column
/// buffer of Workspace (one item's im2col columns capped by the budget of
/// `nn::with_conv_workspace`, so the ledgers match), and the weight
/// gradient splits a long reduction into ranges summed into partial sums
/// kept there (several ranges one after another into each where the budget
/// holds fewer sums than ranges; the buffer grown to hold them): every way
/// gives the CPU's output, input, weight and bias gradients, in every
/// float dtype (f64 included), for a short batch (few splits) and a long
/// one (many); a strided 1-d convolution too.
#[test]
fn conv_matches_the_cpu_with_and_without_split_sums() {
    let _dev = cuda_or_skip!("conv");
    let on_cuda = |t: &Tensor| t.to_device(Device::Cuda(0)).unwrap();
    let assert_close = cuda_common::assert_close;
    let opts = Conv2dOptions {
        stride: [2, 1],
        padding: [1, 1],
        dilation: [1, 2],
        groups: 2,
    };
    for dtype in cuda_common::FLOATS {
        let t = cuda_common::tol(dtype) * 8.0;
        // [3, 4, 7, 8] → [3, 6, 4, 8]: 96 positions, at most 12 splits;
        // [4, 4, 40, 16] → [4, 6, 20, 16]: 1,280 positions, up to 128.
        for (xs, seed) in [([3, 4, 7, 8], 16), ([4, 4, 40, 16], 26)] {
            let x = cpu_rand(&xs, -1.0, 1.0, dtype, seed);
            let w = cpu_rand(&[6, 2, 3, 2], -1.0, 1.0, dtype, seed + 1);
            let b = cpu_rand(&[6], -1.0, 1.0, dtype, seed + 2);
            let (xl, wl, bl) = (leaf(&x), leaf(&w), leaf(&b));
            let yc = conv2d(&xl, &wl, Some(&bl), &opts).unwrap();
            let gy = cpu_rand(yc.shape(), -1.0, 1.0, dtype, seed + 3);
            let want = grads(&yc, &gy, &[&xl, &wl, &bl]);
            // One item's columns: [cin·kh·kw, oh·ow]; the smallest buffer is
            // three column rows (longer than a group's 12 rows here).
            let l = yc.shape()[2] * yc.shape()[3];
            let elem = dtype.size_in_bytes();
            for budget in [1, 40 * l, LARGE_WORKSPACE_BYTES] {
                let _ws = with_conv_workspace(budget);
                let (xd, wd, bd) = (leaf(&on_cuda(&x)), leaf(&on_cuda(&w)), leaf(&on_cuda(&b)));
                let ledger = Ledger::new();
                let entered = ledger.enter();
                let y = conv2d(&xd, &wd, Some(&bd), &opts).unwrap();
                let got = grads(&y, &on_cuda(&gy), &[&xd, &wd, &bd]);
                drop(entered);
                let peak = ledger.peak_in(Device::Cuda(0), Category::Workspace);
                let what = format!("{dtype:?} {xs:?} budget {budget}");
                let buffer = (24 * l).min((budget / elem).max(3 * l.max(12))) * elem;
                // A weight gradient holds at least its split's partial
                // sums: 528 blocks / 2 tiles (2 groups of one tile) = 264
                // ranges wanted, 2 positions each at least, summed into as
                // many 6·12 partial sums (f32 for the half types) as the
                // budget holds, with a counter per tile and slot where a
                // slot takes several ranges one after another.
                let positions = yc.shape()[0] * l;
                let sums = 6 * 12 * elem.max(4);
                let splits = 264.min(positions / 2);
                let slots = splits.min(budget / (sums + 2 * 4));
                let room = match splits > 1 && slots > 0 {
                    true if splits > slots => slots * (sums + 2 * 4),
                    true => slots * sums,
                    false => 0,
                };
                assert_eq!(peak, buffer.max(room.div_ceil(elem) * elem), "{what}");
                assert_close(&format!("conv y {what}"), &vals(&y), &vals(&yc), t);
                assert_close(&format!("conv dx {what}"), &got[0], &want[0], t);
                assert_close(&format!("conv dw {what}"), &got[1], &want[1], t);
                assert_close(&format!("conv db {what}"), &got[2], &want[2], t);
            }
        }
        // 1-d
        let x1 = cpu_rand(&[2, 3, 10], -1.0, 1.0, dtype, 20);
        let w1 = cpu_rand(&[4, 3, 3], -1.0, 1.0, dtype, 21);
        let o1 = Conv1dOptions {
            stride: 2,
            padding: 1,
            dilation: 1,
            groups: 1,
        };
        let y1 = conv1d(&x1, &w1, None, &o1).unwrap();
        let y = conv1d(&on_cuda(&x1), &on_cuda(&w1), None, &o1).unwrap();
        assert_close("conv1d y", &vals(&y), &vals(&y1), t);
    }
}

/// The CUDA input gradient of a strided convolution runs one dense product
/// per stride phase of the input with only the taps that reach it, or,
/// for few input channels, one product with the phases as rows: every
/// layout gives the CPU's gradient. ResNet's 7×7 stride-2 stem on 3
/// channels (phases as rows), a 1×1 stride-2 downsample (three of four
/// phases reached by no tap: zeros), stride 2 with dilation 2 (one phase
/// only), a kernel as long as its stride, a stride beyond the kernel with
/// padding, unequal strides on a grouped layer (phases as rows, per
/// group), and a transposed convolution to 3 channels with bias (its
/// forward is this kernel; phases as rows).
#[test]
fn strided_input_gradients_match_the_cpu_in_every_phase() {
    let _dev = cuda_or_skip!("conv");
    // Strict f32 (the stem's 12 phase rows would take TF32 tiles), so that
    // f32 is held to f32's tolerance.
    let _strict = with_conv_tf32(false);
    let on_cuda = |t: &Tensor| t.to_device(Device::Cuda(0)).unwrap();
    let opts = |stride, padding, dilation, groups| Conv2dOptions {
        stride,
        padding,
        dilation,
        groups,
    };
    let cases = [
        (
            "stem 7x7 s2",
            [2, 3, 17, 15],
            [8, 3, 7, 7],
            opts([2, 2], [3, 3], [1, 1], 1),
        ),
        (
            "1x1 s2",
            [2, 4, 9, 8],
            [6, 4, 1, 1],
            opts([2, 2], [0, 0], [1, 1], 1),
        ),
        (
            "s2 d2",
            [2, 4, 11, 10],
            [5, 4, 3, 3],
            opts([2, 2], [2, 1], [2, 2], 1),
        ),
        (
            "3x3 s3",
            [1, 2, 12, 9],
            [4, 2, 3, 3],
            opts([3, 3], [0, 0], [1, 1], 1),
        ),
        (
            "2x2 s4 padded",
            [2, 3, 13, 11],
            [4, 3, 2, 2],
            opts([4, 4], [1, 2], [1, 1], 1),
        ),
        (
            "s3x2 grouped",
            [2, 6, 14, 9],
            [6, 2, 4, 3],
            opts([3, 2], [1, 1], [1, 1], 3),
        ),
    ];
    for dtype in [DType::F32, DType::F64] {
        let t = cuda_common::tol(dtype) * 8.0;
        for (name, xs, ws, o) in cases {
            let x = cpu_rand(&xs, -1.0, 1.0, dtype, 41);
            let w = cpu_rand(&ws, -1.0, 1.0, dtype, 42);
            let (xl, wl) = (leaf(&x), leaf(&w));
            let yc = conv2d(&xl, &wl, None, &o).unwrap();
            let gy = cpu_rand(yc.shape(), -1.0, 1.0, dtype, 43);
            let want = grads(&yc, &gy, &[&xl]);
            let xd = leaf(&on_cuda(&x));
            let y = conv2d(&xd, &on_cuda(&w), None, &o).unwrap();
            let got = grads(&y, &on_cuda(&gy), &[&xd]);
            let what = format!("{name} {dtype:?}");
            cuda_common::assert_close(&format!("dx {what}"), &got[0], &want[0], t);
        }
        let up = ConvTranspose2dOptions {
            stride: [2, 2],
            padding: [1, 1],
            output_padding: [1, 0],
            ..ConvTranspose2dOptions::default()
        };
        let x = cpu_rand(&[2, 5, 6, 7], -1.0, 1.0, dtype, 44);
        let w = cpu_rand(&[5, 3, 4, 3], -1.0, 1.0, dtype, 45);
        let b = cpu_rand(&[3], -1.0, 1.0, dtype, 46);
        let want = conv_transpose2d(&x, &w, Some(&b), &up).unwrap();
        let got = conv_transpose2d(&on_cuda(&x), &on_cuda(&w), Some(&on_cuda(&b)), &up).unwrap();
        assert_eq!(got.shape(), want.shape());
        let what = format!("conv_transpose2d to 3 channels {dtype:?}");
        cuda_common::assert_close(&what, &vals(&got), &vals(&want), t);
    }
}

/// Convolution tiles of 16 rows or more run on tensor cores: always for
/// f16 and bf16 (exact products, f32 sums), and for f32 with TF32 on
/// (`cuda::with_conv_tf32`, the default; the `conv_*_tf32` kernels: every operand rounded to
/// TF32, relative error at most 2⁻¹¹). Each output, input gradient and
/// weight gradient is within (e + K·2⁻²⁴)·Σ|a·b| + u·|exact| of the exact
/// value, checked per element against f64 (e = 2⁻¹⁰ for TF32, 0 for the
/// half types; u the output's unit roundoff); and TF32's rounding really
/// happens (somewhere an error above f32's 2⁻¹⁶·Σ|a·b|). Forward and
/// weight gradient on 64-, 32- and 16-row tiles, the input gradient per
/// phase and with the phases as rows.
#[test]
fn tensor_core_convolutions_are_within_their_bound() {
    let _dev = cuda_or_skip!("conv");
    let on_cuda = |t: &Tensor| t.to_device(Device::Cuda(0)).unwrap();
    let f64s = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
    let o = |stride, padding| Conv2dOptions {
        stride: [stride; 2],
        padding: [padding; 2],
        ..Conv2dOptions::default()
    };
    let tall = |padding| Conv2dOptions {
        padding,
        groups: 4,
        ..Conv2dOptions::default()
    };
    let cases = [
        (
            "64 rows, per-phase 32",
            [2, 24, 10, 9],
            [64, 24, 3, 3],
            o(2, 1),
        ),
        ("32 rows, 16", [2, 16, 9, 11], [32, 16, 3, 3], o(1, 1)),
        (
            "16 rows, phases as rows",
            [3, 4, 12, 10],
            [16, 4, 5, 5],
            o(2, 2),
        ),
        // 128-row tiles (more than 64 rows in 512 tiles or more): 80 input
        // channels per group (a forward of uniform steps, an input gradient
        // of tabled ones), then 72 (the other way round).
        (
            "128 rows, 1x1",
            [2, 320, 64, 64],
            [288, 80, 1, 1],
            tall([0, 0]),
        ),
        (
            "128 rows, 3x1",
            [2, 288, 64, 64],
            [320, 72, 3, 1],
            tall([1, 0]),
        ),
    ];
    for (dtype, tf32, unit) in [
        (DType::F32, true, 2f64.powi(-24)),
        (DType::F16, false, 2f64.powi(-11)),
        (DType::BF16, false, 2f64.powi(-8)),
    ] {
        let _tf32 = with_conv_tf32(tf32);
        for (name, xs, ws, opts) in cases {
            let x = cpu_rand(&xs, -1.0, 1.0, dtype, 51);
            let w = cpu_rand(&ws, -1.0, 1.0, dtype, 52);
            let y0 = conv2d(&x, &w, None, &opts).unwrap();
            let gy = cpu_rand(y0.shape(), -1.0, 1.0, dtype, 53);
            // Exact (f64) results, and the same products of absolute values.
            let exact = |x: &Tensor, w: &Tensor, gy: &Tensor| {
                let (xl, wl) = (leaf(&f64s(x)), leaf(&f64s(w)));
                let y = conv2d(&xl, &wl, None, &opts).unwrap();
                let mut out = vec![vals(&y)];
                out.extend(grads(&y, &f64s(gy), &[&xl, &wl]));
                out
            };
            let want = exact(&x, &w, &gy);
            let sums = exact(&x.abs().unwrap(), &w.abs().unwrap(), &gy.abs().unwrap());
            let (xd, wd) = (leaf(&on_cuda(&x)), leaf(&on_cuda(&w)));
            let y = conv2d(&xd, &wd, None, &opts).unwrap();
            let mut got = vec![vals(&y)];
            got.extend(grads(&y, &on_cuda(&gy), &[&xd, &wd]));
            let n = xs[0] * y.shape()[2] * y.shape()[3];
            let k = [ws[1] * ws[2] * ws[3], ws[0] * ws[2] * ws[3], n];
            for (j, part) in ["y", "dx", "dw"].into_iter().enumerate() {
                let e = if tf32 { 2f64.powi(-10) } else { 0.0 };
                let per = e + k[j] as f64 * 2f64.powi(-24);
                let mut largest = 0f64;
                let parts = got[j].iter().zip(&want[j]).zip(&sums[j]);
                for (i, ((g, w), s)) in parts.enumerate() {
                    let err = (g - w).abs();
                    let bound = per * s + unit * w.abs() + 1e-30;
                    let what = format!("{dtype:?} {name} {part}[{i}]");
                    assert!(err <= bound, "{what}: {g} vs {w} (Σ|a·b| {s})");
                    largest = largest.max(err / s.max(1e-30));
                }
                // Rounding errors of a long sum average out below what
                // this detects (the 128-row cases' weight gradients sum
                // 8,192 positions): checked where the sums are shorter.
                if tf32 && k[j] <= 4096 {
                    let what = format!("{name} {part}: TF32 not applied ({largest:e})");
                    assert!(largest > 2f64.powi(-16), "{what}");
                }
            }
        }
    }
}

/// The rounding bound the checks above accept differences within (CPU only,
/// so it runs without a GPU): it holds for the CPU's own f32 results against
/// the exact (f64) ones and stays small next to the values (at most 1e-4 of
/// the largest), so a missing term — off by the size of a term — could not
/// pass as rounding.
#[test]
fn rounding_bound_holds_and_stays_small() {
    use device_common::{multilinear_bound, output_and_grads};
    let check = |name: &str, inputs: &[&Tensor], f: &dyn Fn(&[Tensor]) -> Result<Tensor>| {
        let bound = multilinear_bound(f);
        let x: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
        let out_shape = f(&x).unwrap().shape().to_vec();
        let gy = Tensor::rand_range(&out_shape, -1.0, 1.0, DType::F32, Device::Cpu, 99).unwrap();
        let got = output_and_grads(&x, &gy, f).unwrap();
        let x64: Vec<Tensor> = x.iter().map(|t| t.to_dtype(DType::F64).unwrap()).collect();
        let g64 = gy.to_dtype(DType::F64).unwrap();
        let exact = output_and_grads(&x64, &g64, f).unwrap();
        let bounds = bound(DType::F32, &x64, &g64).unwrap();
        for (j, ((g, e), b)) in got.iter().zip(&exact).zip(&bounds).enumerate() {
            let (g, e, b) = (vals(g), vals(e), vals(b));
            assert_within_bound(name, j, &g, &e, &b);
        }
    };
    let x = input(&[2, 4, 5, 3], DType::F32, 81, -1.0, 1.0);
    let w = input(&[4, 3, 3, 2], DType::F32, 82, -0.5, 0.5);
    let b = input(&[6], DType::F32, 83, -0.5, 0.5);
    check("conv_transpose2d", &[&x, &w, &b], &|t| {
        conv_transpose2d(&t[0], &t[1], Some(&t[2]), &FULL)
    });
}
