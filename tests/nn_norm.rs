//! Normalisation layers: forward against naive f64 loops, running
//! statistics, gradcheck, lean-vs-SaveAll saved bytes, and errors.
mod common;
use common::*;
use leangrad::nn::{
    batch_norm, group_norm, layer_norm, rms_norm, BatchNorm, BatchNormOptions, GroupNorm,
    LayerNorm, Module, RMSNorm,
};
use leangrad::{DType, Device, Result, Tensor};

fn f32s(shape: &[usize], seed: u64) -> Tensor {
    Tensor::rand_range(shape, -1.0, 1.0, DType::F32, Device::Cpu, seed).unwrap()
}

fn t64(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_f64_slice(v, shape, DType::F64, Device::Cpu).unwrap()
}

/// Naive normalisation of `x` viewed as `[outer, groups_of(len)]`: each
/// statistic covers the elements `idx(s)`; returns x̂.
fn naive_norm(x: &[f64], sets: &[Vec<usize>], eps: f64, centered: bool) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for set in sets {
        let n = set.len() as f64;
        let mean = if centered {
            set.iter().map(|&i| x[i]).sum::<f64>() / n
        } else {
            0.0
        };
        let var = set.iter().map(|&i| (x[i] - mean).powi(2)).sum::<f64>() / n;
        for &i in set {
            out[i] = (x[i] - mean) / (var + eps).sqrt();
        }
    }
    out
}

/// Index sets of batch norm over `[n, c, inner]`, per channel.
fn channel_sets(n: usize, c: usize, inner: usize) -> Vec<Vec<usize>> {
    (0..c)
        .map(|ch| {
            (0..n)
                .flat_map(|i| (0..inner).map(move |j| (i * c + ch) * inner + j))
                .collect()
        })
        .collect()
}

/// Index sets of contiguous rows of `len`.
fn row_sets(total: usize, len: usize) -> Vec<Vec<usize>> {
    (0..total / len)
        .map(|r| (r * len..(r + 1) * len).collect())
        .collect()
}

#[test]
fn batch_norm_forward_matches_naive_loops() {
    for shape in [vec![5, 3], vec![4, 3, 6], vec![2, 3, 4, 5]] {
        let x = rand64(&shape, 1);
        let (w, b) = (rand64(&[3], 2), rand64(&[3], 3));
        let inner: usize = shape[2..].iter().product();
        let xs = x.to_f64_vec().unwrap();
        let xh = naive_norm(&xs, &channel_sets(shape[0], 3, inner), 1e-5, true);
        let (wv, bv) = (w.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
        let want: Vec<f64> = (0..xs.len())
            .map(|i| xh[i] * wv[(i / inner) % 3] + bv[(i / inner) % 3])
            .collect();
        let y = batch_norm(&x, None, None, Some(&w), Some(&b), true, 0.1, 1e-5).unwrap();
        assert_close(&y.to_f64_vec().unwrap(), &want, 1e-12);
        // eval: an affine map with the running statistics
        let (rm, rv) = (rand64(&[3], 4), rand64_in(&[3], 0.5, 2.0, 5));
        let y = batch_norm(
            &x,
            Some(&rm),
            Some(&rv),
            Some(&w),
            Some(&b),
            false,
            0.1,
            1e-3,
        )
        .unwrap();
        let (m, v) = (rm.to_f64_vec().unwrap(), rv.to_f64_vec().unwrap());
        let want: Vec<f64> = (0..xs.len())
            .map(|i| {
                let c = (i / inner) % 3;
                (xs[i] - m[c]) / (v[c] + 1e-3).sqrt() * wv[c] + bv[c]
            })
            .collect();
        assert_close(&y.to_f64_vec().unwrap(), &want, 1e-12);
    }
}

#[test]
fn layer_group_rms_forward_match_naive_loops() {
    let x = rand64(&[2, 3, 4], 6);
    let xs = x.to_f64_vec().unwrap();
    let (w, b) = (rand64(&[3, 4], 7), rand64(&[3, 4], 8));
    let (wv, bv) = (w.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
    let xh = naive_norm(&xs, &row_sets(24, 12), 1e-5, true);
    let want: Vec<f64> = (0..24).map(|i| xh[i] * wv[i % 12] + bv[i % 12]).collect();
    let y = layer_norm(&x, &[3, 4], Some(&w), Some(&b), 1e-5).unwrap();
    assert_close(&y.to_f64_vec().unwrap(), &want, 1e-12);

    let xh = naive_norm(&xs, &row_sets(24, 4), 1e-6, false);
    let w4 = rand64(&[4], 9);
    let w4v = w4.to_f64_vec().unwrap();
    let want: Vec<f64> = (0..24).map(|i| xh[i] * w4v[i % 4]).collect();
    let y = rms_norm(&x, &[4], Some(&w4), Some(1e-6)).unwrap();
    assert_close(&y.to_f64_vec().unwrap(), &want, 1e-12);
    let y = rms_norm(&x, &[4], None, None).unwrap();
    let xh = naive_norm(&xs, &row_sets(24, 4), f64::EPSILON, false);
    assert_close(&y.to_f64_vec().unwrap(), &xh, 1e-12);

    // group norm: [2, 6, 3] in 3 groups of 2 channels (6 elements each)
    let x = rand64(&[2, 6, 3], 10);
    let xs = x.to_f64_vec().unwrap();
    let (w, b) = (rand64(&[6], 11), rand64(&[6], 12));
    let (wv, bv) = (w.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
    let xh = naive_norm(&xs, &row_sets(36, 6), 1e-5, true);
    let want: Vec<f64> = (0..36)
        .map(|i| xh[i] * wv[(i / 3) % 6] + bv[(i / 3) % 6])
        .collect();
    let y = group_norm(&x, 3, Some(&w), Some(&b), 1e-5).unwrap();
    assert_close(&y.to_f64_vec().unwrap(), &want, 1e-12);
}

fn buffers(m: &BatchNorm) -> (Vec<f64>, Vec<f64>, f64) {
    let b = m.named_buffers();
    (
        b[0].1.to_f64_vec().unwrap(),
        b[1].1.to_f64_vec().unwrap(),
        b[2].1.to_scalar().unwrap(),
    )
}

#[test]
fn running_statistics_after_two_train_steps() {
    // channel 0: [1,2,3,4] then [0,0,2,2]; channel 1: constant 3 then [1,3,1,3]
    let x1 = t64(&[1., 3., 2., 3., 3., 3., 4., 3.], &[4, 2]);
    let x2 = t64(&[0., 1., 0., 3., 2., 1., 2., 3.], &[4, 2]);
    // batch means: (2.5, 3), (1, 2); unbiased variances: (5/3, 0), (4/3, 4/3)
    for (momentum, rm_want, rv_want) in [
        (
            Some(0.1),
            [0.9 * 0.25 + 0.1, 0.9 * 0.3 + 0.2],
            [0.9 * (0.9 + 0.5 / 3.0) + 0.4 / 3.0, 0.9 * 0.9 + 0.4 / 3.0],
        ),
        (None, [1.75, 2.5], [1.5, 2.0 / 3.0]),
    ] {
        let opts = BatchNormOptions {
            momentum,
            ..Default::default()
        };
        let m = BatchNorm::builder(2)
            .name("bn")
            .options(opts)
            .dtype(DType::F64)
            .build1d(&Device::Cpu)
            .unwrap();
        m.forward(&x1).unwrap();
        m.forward(&x2).unwrap();
        let (rm, rv, n) = buffers(&m);
        assert_close(&rm, &rm_want, 1e-14);
        assert_close(&rv, &rv_want, 1e-14);
        assert_eq!(n, 2.0);
    }
    // eval uses (and does not change) the running statistics
    let mut m = BatchNorm::builder(2)
        .name("bn")
        .dtype(DType::F64)
        .build1d(&Device::Cpu)
        .unwrap();
    m.forward(&x1).unwrap();
    m.set_training(false);
    let before = buffers(&m);
    let y = m.forward(&x2).unwrap().to_f64_vec().unwrap();
    assert_eq!(buffers(&m), before);
    let want: Vec<f64> = (0..8)
        .map(|i| {
            let c = i % 2;
            (x2.to_f64_vec().unwrap()[i] - before.0[c]) / (before.1[c] + 1e-5).sqrt()
        })
        .collect();
    assert_close(&y, &want, 1e-14);
}

/// Batch norm with fresh running statistics (mean 0.2, var 1.5) made inside.
fn bn(t: &[Tensor], train: bool, eps: f64) -> Result<Tensor> {
    let c = t[0].shape()[1];
    let rm = Tensor::full(&[c], 0.2, t[0].dtype(), Device::Cpu)?;
    let rv = Tensor::full(&[c], 1.5, t[0].dtype(), Device::Cpu)?;
    batch_norm(
        &t[0],
        Some(&rm),
        Some(&rv),
        t.get(1),
        t.get(2),
        train,
        0.1,
        eps,
    )
}

#[test]
fn gradcheck_every_layer_train_and_eval() {
    for shape in [vec![4, 3], vec![3, 3, 4], vec![2, 3, 2, 3]] {
        let (x, w, b) = (rand64(&shape, 20), rand64(&[3], 21), rand64(&[3], 22));
        for train in [true, false] {
            check(|t| bn(t, train, 1e-5), &[x.clone(), w.clone(), b.clone()]);
            check(|t| bn(t, train, 1e-5), std::slice::from_ref(&x));
        }
        check(
            |t| batch_norm(&t[0], None, None, Some(&t[1]), None, true, 0.1, 1e-5),
            &[x.clone(), w.clone()],
        );
    }
    let x = rand64(&[2, 3, 4], 23);
    let (w, b) = (rand64(&[3, 4], 24), rand64(&[3, 4], 25));
    check(
        |t| layer_norm(&t[0], &[3, 4], Some(&t[1]), Some(&t[2]), 1e-5),
        &[x.clone(), w.clone(), b.clone()],
    );
    check(
        |t| layer_norm(&t[0], &[4], None, None, 1e-5),
        std::slice::from_ref(&x),
    );
    let w4 = rand64(&[4], 26);
    check(
        |t| rms_norm(&t[0], &[4], Some(&t[1]), Some(1e-6)),
        &[x.clone(), w4],
    );
    check(
        |t| rms_norm(&t[0], &[3, 4], None, None),
        std::slice::from_ref(&x),
    );
    let x = rand64(&[2, 6, 3], 27);
    let (w, b) = (rand64(&[6], 28), rand64(&[6], 29));
    check(
        |t| group_norm(&t[0], 3, Some(&t[1]), Some(&t[2]), 1e-5),
        &[x.clone(), w, b],
    );
    check(
        |t| group_norm(&t[0], 2, None, None, 1e-5),
        std::slice::from_ref(&x),
    );
}

/// Asserts (lean, save-all) bytes per requires-grad mask over (x, w, b).
fn assert_bytes(rows: &[(u32, usize, usize)], want: impl Fn(bool, bool, bool) -> (usize, usize)) {
    for &(mask, lean, all) in rows {
        let (x, w, b) = (mask & 1 != 0, mask & 2 != 0, mask & 4 != 0);
        let (wl, wa) = if mask == 0 { (0, 0) } else { want(x, w, b) };
        assert_eq!((lean, all), (wl, wa), "mask {mask:03b}");
    }
}

#[test]
fn batch_norm_saves_exactly_what_each_gradient_needs() {
    for shape in [vec![6, 4], vec![3, 4, 5], vec![2, 4, 3, 3]] {
        let n: usize = shape.iter().product();
        let c = 4;
        let inputs = [f32s(&shape, 30), f32s(&[c], 31), f32s(&[c], 32)];
        // train: x̂ (4n) for x or w, scale (4C) for x; SaveAll: x, w, running
        // mean/var, save_mean/save_invstd
        let rows = check_policies(&|t| bn(t, true, 1e-5), &inputs);
        assert_eq!(rows.len(), 8);
        assert_bytes(&rows, |x, w, _| {
            let lean = if x || w { 4 * n } else { 0 } + if x { 4 * c } else { 0 };
            (lean, 4 * n + 4 * c + 8 * c + 8 * c)
        });
        // eval: scale (4C) for x, x̂ (4n) for w; SaveAll: x, w, running mean/var
        let rows = check_policies(&|t| bn(t, false, 1e-5), &inputs);
        assert_bytes(&rows, |x, w, _| {
            let lean = if w { 4 * n } else { 0 } + if x { 4 * c } else { 0 };
            (lean, 4 * n + 4 * c + 8 * c)
        });
        // no affine: the input gradient alone
        for train in [true, false] {
            let rows = check_policies(&|t| bn(t, train, 1e-5), &inputs[..1]);
            let lean = if train { 4 * n + 4 * c } else { 4 * c };
            let all = 4 * n + 8 * c + if train { 8 * c } else { 0 };
            assert_eq!(rows[1], (1, lean, all));
        }
        // no running statistics (batch statistics, nothing to update)
        let rows = check_policies(
            &|t| batch_norm(&t[0], None, None, Some(&t[1]), Some(&t[2]), true, 0.1, 1e-5),
            &inputs,
        );
        assert_bytes(&rows, |x, w, _| {
            let lean = if x || w { 4 * n } else { 0 } + if x { 4 * c } else { 0 };
            (lean, 4 * n + 4 * c + 8 * c)
        });
    }
}

#[test]
fn row_norms_save_exactly_what_each_gradient_needs() {
    // layer norm over [3, 4] of [2, 5, 3, 4]: R = 10 rows of D = 12
    let (n, r, d) = (120, 10, 12);
    let inputs = [
        f32s(&[2, 5, 3, 4], 40),
        f32s(&[3, 4], 41),
        f32s(&[3, 4], 42),
    ];
    let rows = check_policies(
        &|t| layer_norm(&t[0], &[3, 4], Some(&t[1]), Some(&t[2]), 1e-5),
        &inputs,
    );
    assert_eq!(rows.len(), 8);
    assert_bytes(&rows, |x, w, _| {
        let lean = if x || w { 4 * n } else { 0 } + if x { 4 * r + 4 * d } else { 0 };
        (lean, 4 * n + 8 * d + 8 * r)
    });
    let rows = check_policies(&|t| layer_norm(&t[0], &[4], None, None, 1e-5), &inputs[..1]);
    assert_eq!(rows[1], (1, 4 * n + 4 * 30, 4 * n + 8 * 30));

    // RMS norm: no mean, no bias
    let rows = check_policies(
        &|t| rms_norm(&t[0], &[3, 4], Some(&t[1]), None),
        &inputs[..2],
    );
    assert_bytes(&rows, |x, w, _| {
        let lean = if x || w { 4 * n } else { 0 } + if x { 4 * r + 4 * d } else { 0 };
        (lean, 4 * n + 4 * d + 4 * r)
    });

    // group norm [3, 6, 2, 2] in 2 groups: N·G = 6 statistics, C = 6
    let (n, s, c) = (72, 6, 6);
    let inputs = [f32s(&[3, 6, 2, 2], 43), f32s(&[6], 44), f32s(&[6], 45)];
    let rows = check_policies(
        &|t| group_norm(&t[0], 2, Some(&t[1]), Some(&t[2]), 1e-5),
        &inputs,
    );
    assert_bytes(&rows, |x, w, _| {
        let lean = if x || w { 4 * n } else { 0 } + if x { 4 * s + 4 * c } else { 0 };
        (lean, 4 * n + 4 * c + 8 * s)
    });
}

#[test]
fn f64_statistics_are_kept_in_f64() {
    let inputs = [rand64(&[4, 3], 50), rand64(&[3], 51), rand64(&[3], 52)];
    let rows = check_policies(&|t| bn(t, true, 1e-5), &inputs);
    assert_eq!(rows[1], (1, 8 * 12 + 8 * 3, 8 * 12 + 8 * 3 * 5));
    let rows = check_policies(&|t| layer_norm(&t[0], &[3], None, None, 1e-5), &inputs[..1]);
    assert_eq!(rows[1], (1, 8 * 12 + 8 * 4, 8 * 12 + 16 * 4));
}

#[test]
fn modules_report_pytorch_names_and_scopes() {
    let m = BatchNorm::builder(3)
        .name("bn")
        .build2d(&Device::Cpu)
        .unwrap();
    let names: Vec<String> = m.named_buffers().into_iter().map(|b| b.0).collect();
    assert_eq!(
        names,
        ["running_mean", "running_var", "num_batches_tracked"]
    );
    assert_eq!(m.named_parameters().len(), 2);
    let ln = LayerNorm::builder(&[4])
        .name("ln")
        .bias(false)
        .build(&Device::Cpu)
        .unwrap();
    assert_eq!(ln.named_parameters().len(), 1);
    let y = ln.forward(&f32s(&[2, 4], 60)).unwrap();
    assert_eq!(y.shape(), &[2, 4]);
    let gn = GroupNorm::builder(2, 4)
        .name("gn")
        .build(&Device::Cpu)
        .unwrap();
    assert_eq!(
        gn.forward(&f32s(&[2, 4, 3], 61)).unwrap().shape(),
        &[2, 4, 3]
    );
    let rn = RMSNorm::builder(&[4])
        .name("rms")
        .build(&Device::Cpu)
        .unwrap();
    let names: Vec<String> = rn.named_parameters().into_iter().map(|b| b.0).collect();
    assert_eq!(names, ["weight"]);
    let no_track = BatchNormOptions {
        track_running_stats: false,
        affine: false,
        ..Default::default()
    };
    let mut m = BatchNorm::builder(3)
        .name("bn")
        .options(no_track)
        .build1d(&Device::Cpu)
        .unwrap();
    m.set_training(false);
    // without running statistics eval uses batch statistics
    assert!(m.forward(&f32s(&[4, 3], 62)).is_ok());
    assert!(m.named_buffers().is_empty() && m.parameters().is_empty());
}

#[test]
fn errors_are_typed() {
    let bn1 = BatchNorm::builder(3)
        .name("bn")
        .build1d(&Device::Cpu)
        .unwrap();
    // The layer names itself (`LayerInput`); the functional ops below
    // report their op.
    assert_err!(bn1.forward(&f32s(&[4, 5], 70)), LayerInput);
    assert_err!(bn1.forward(&f32s(&[2, 3, 4, 4], 71)), LayerInput);
    assert_err!(bn1.forward(&f32s(&[1, 3], 72)), InvalidArgument);
    // a failed step changes no buffer
    let buffers: Vec<f64> = bn1
        .named_buffers()
        .iter()
        .flat_map(|b| b.1.to_f64_vec().unwrap())
        .collect();
    assert_eq!(buffers, [0., 0., 0., 1., 1., 1., 0.]);
    let bn2 = BatchNorm::builder(3)
        .name("bn")
        .build2d(&Device::Cpu)
        .unwrap();
    assert_err!(bn2.forward(&f32s(&[2, 4, 2, 2], 73)), LayerInput);
    let x = f32s(&[4, 3], 74);
    assert_err!(
        batch_norm(&x, None, None, Some(&f32s(&[4], 75)), None, true, 0.1, 1e-5),
        ShapeMismatch
    );
    assert_err!(
        batch_norm(&x, None, None, None, None, false, 0.1, 1e-5),
        InvalidArgument
    );
    let w64 = rand64(&[3], 76);
    assert_err!(
        batch_norm(&x, None, None, Some(&w64), None, true, 0.1, 1e-5),
        DTypeMismatch
    );

    let x = f32s(&[2, 3, 4], 77);
    assert_err!(layer_norm(&x, &[3], None, None, 1e-5), ShapeMismatch);
    assert_err!(
        layer_norm(&x, &[2, 3, 4, 1], None, None, 1e-5),
        ShapeMismatch
    );
    assert_err!(
        layer_norm(&x, &[4], Some(&f32s(&[3], 78)), None, 1e-5),
        ShapeMismatch
    );
    assert_err!(rms_norm(&x, &[3, 3], None, None), ShapeMismatch);
    let ln = LayerNorm::builder(&[5])
        .name("ln")
        .build(&Device::Cpu)
        .unwrap();
    assert_err!(ln.forward(&x), LayerInput);

    assert_err!(group_norm(&x, 2, None, None, 1e-5), InvalidArgument);
    assert_err!(group_norm(&x, 0, None, None, 1e-5), InvalidArgument);
    assert_err!(
        GroupNorm::builder(4, 6).name("gn").build(&Device::Cpu),
        InvalidArgument
    );
    let gn = GroupNorm::builder(2, 4)
        .name("gn")
        .build(&Device::Cpu)
        .unwrap();
    assert_err!(gn.forward(&x), LayerInput);
}

#[test]
fn large_inputs_take_the_parallel_path() {
    // 2·8·48·48 = 36864 elements: above the parallel threshold
    let shape = [2, 8, 48, 48];
    let x = rand64(&shape, 80);
    let xs = x.to_f64_vec().unwrap();
    let y = batch_norm(&x, None, None, None, None, true, 0.1, 1e-5).unwrap();
    let want = naive_norm(&xs, &channel_sets(2, 8, 2304), 1e-5, true);
    assert_close(&y.to_f64_vec().unwrap(), &want, 1e-12);
    let y = group_norm(&x, 4, None, None, 1e-5).unwrap();
    let want = naive_norm(&xs, &row_sets(xs.len(), 2 * 2304), 1e-5, true);
    assert_close(&y.to_f64_vec().unwrap(), &want, 1e-12);
    let y = layer_norm(&x, &[48], None, None, 1e-5).unwrap();
    let want = naive_norm(&xs, &row_sets(xs.len(), 48), 1e-5, true);
    assert_close(&y.to_f64_vec().unwrap(), &want, 1e-12);

    let n = xs.len();
    let inputs = [f32s(&shape, 81), f32s(&[8], 82), f32s(&[8], 83)];
    let rows = check_policies(&|t| bn(t, true, 1e-5), &inputs);
    assert_eq!(rows[7], (7, 4 * n + 4 * 8, 4 * n + 20 * 8));
    let rows = check_policies(
        &|t| group_norm(&t[0], 4, Some(&t[1]), Some(&t[2]), 1e-5),
        &inputs,
    );
    assert_eq!(rows[3], (3, 4 * n + 4 * 8 + 4 * 8, 4 * n + 4 * 8 + 8 * 8));
    let w = f32s(&[48], 84);
    let rows = check_policies(
        &|t| rms_norm(&t[0], &[48], Some(&t[1]), None),
        &[inputs[0].clone(), w],
    );
    assert_eq!(
        rows[1],
        (
            1,
            4 * n + 4 * (n / 48) + 4 * 48,
            4 * n + 4 * 48 + 4 * (n / 48)
        )
    );
}

#[test]
fn half_precision_keeps_f32_statistics() {
    for dtype in [DType::F16, DType::BF16] {
        let mk = |shape: &[usize], seed| {
            Tensor::rand_range(shape, -1.0, 1.0, dtype, Device::Cpu, seed).unwrap()
        };
        let inputs = [mk(&[4, 3, 5], 90), mk(&[3], 91), mk(&[3], 92)];
        let xs = inputs[0].to_f64_vec().unwrap();
        let y = batch_norm(&inputs[0], None, None, None, None, true, 0.1, 1e-5).unwrap();
        let want = naive_norm(&xs, &channel_sets(4, 3, 5), 1e-5, true);
        assert_close(&y.to_f64_vec().unwrap(), &want, 1e-2);
        // x̂ in the input dtype (2 bytes), scale in f32; SaveAll: save_mean/invstd in f32
        let rows = check_policies(&|t| bn(t, true, 1e-5), &inputs);
        assert_eq!(
            rows[1],
            (1, 2 * 60 + 4 * 3, 2 * 60 + 2 * 3 + 2 * 2 * 3 + 2 * 4 * 3)
        );
        let rows = check_policies(&|t| layer_norm(&t[0], &[5], None, None, 1e-5), &inputs[..1]);
        assert_eq!(rows[1], (1, 2 * 60 + 4 * 12, 2 * 60 + 2 * 4 * 12));
    }
}

#[test]
fn modules_report_saved_bytes_by_layer_and_parameters_stay_parameters() {
    use leangrad::memory::{Category, Ledger};
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let bn = BatchNorm::builder(4)
        .name("bn1")
        .build2d(&Device::Cpu)
        .unwrap();
    let ln = LayerNorm::builder(&[6])
        .name("ln1")
        .build(&Device::Cpu)
        .unwrap();
    let x = f32s(&[2, 4, 3, 6], 100).set_requires_grad(true).unwrap();
    let y = ln.forward(&bn.forward(&x).unwrap()).unwrap();
    // bn: x̂ + scale (the weight is a parameter: not counted as saved);
    // ln: x̂ + 24 rstd (its weight is a parameter)
    let by_layer = ledger.saved_by_layer(Device::Cpu);
    assert!(
        by_layer.contains(&("bn1/batch_norm".to_string(), 4 * 144 + 4 * 4)),
        "{by_layer:?}"
    );
    assert!(
        by_layer.contains(&("ln1/layer_norm".to_string(), 4 * 144 + 4 * 24)),
        "{by_layer:?}"
    );
    assert_eq!(
        ledger.live_in(Device::Cpu, Category::Saved),
        2 * (4 * 144) + 16 + 96
    );
    leangrad::autograd::backward_with(
        &y.sum_all().unwrap(),
        None,
        &mut leangrad::autograd::CollectGrads,
    )
    .unwrap();
    assert_eq!(ledger.live_in(Device::Cpu, Category::Saved), 0);
    assert!(bn.weight.as_ref().unwrap().grad().is_some());
    assert!(ln.bias.as_ref().unwrap().grad().is_some());
}

#[test]
fn batchnorm_module_in_eval_keeps_nothing_for_an_input_gradient() {
    use leangrad::nn::{BatchNorm, Module};
    let ledger = leangrad::memory::Ledger::new();
    let _l = ledger.enter();
    let mut bn = BatchNorm::builder(3)
        .name("bn")
        .build2d(&Device::Cpu)
        .unwrap();
    bn.set_training(false);
    {
        let _ng = leangrad::autograd::no_grad();
        let rv = bn.running_var.as_ref().unwrap();
        rv.mul_scalar_(1.5).unwrap();
    }
    let saved = || ledger.live_in(Device::Cpu, leangrad::memory::Category::Saved);
    let x = Tensor::randn(&[2, 3, 4, 4], DType::F32, Device::Cpu, 5)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    // Trainable weight: x̂ for the weight gradient; the input gradient reads
    // the weight and running variance (model state): no more bytes.
    let y = bn.forward(&x).unwrap();
    assert_eq!(saved(), 2 * 3 * 16 * 4);
    let seed = Tensor::rand_range(&[2, 3, 4, 4], -1.0, 1.0, DType::F32, Device::Cpu, 6).unwrap();
    leangrad::autograd::backward_with(
        &y,
        Some(seed.clone()),
        &mut leangrad::autograd::CollectGrads,
    )
    .unwrap();
    let gx = x.take_grad().unwrap().to_vec::<f32>().unwrap();
    // Frozen weight and bias: nothing at all.
    bn.weight = bn
        .weight
        .take()
        .map(|w| w.set_requires_grad(false).unwrap());
    bn.bias = bn.bias.take().map(|b| b.set_requires_grad(false).unwrap());
    let y = bn.forward(&x).unwrap();
    assert_eq!(saved(), 0);
    leangrad::autograd::backward_with(&y, Some(seed), &mut leangrad::autograd::CollectGrads)
        .unwrap();
    // x·(weight·invstd) scaling: the same bits as with the C-sized vector.
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), gx);
}

#[test]
fn builders_default_to_pytorch_and_apply_each_setting() {
    use leangrad::nn::Module;
    let x = f32s(&[4, 6, 3, 2], 41);
    let out = |m: &dyn Module| m.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let names = |m: &dyn Module| {
        let mut v: Vec<String> = m.named_parameters().into_iter().map(|p| p.0).collect();
        v.extend(m.named_buffers().into_iter().map(|b| b.0));
        v
    };
    // BatchNorm: all options at once equal the same options one by one
    // (PyTorch's defaults for the rest).
    let opts = BatchNormOptions {
        eps: 1e-3,
        momentum: None,
        affine: false,
        track_running_stats: true,
    };
    let a = BatchNorm::builder(6)
        .name("bn")
        .options(opts)
        .build2d(&Device::Cpu)
        .unwrap();
    let b = BatchNorm::builder(6)
        .name("bn")
        .eps(1e-3)
        .momentum(None)
        .affine(false)
        .build2d(&Device::Cpu)
        .unwrap();
    assert_eq!(out(&a), out(&b));
    assert_eq!(names(&a), names(&b));
    assert_eq!(
        buffers(&a),
        buffers(&b),
        "running statistics after one step"
    );
    let d = BatchNorm::builder(6).build1d(&Device::Cpu).unwrap();
    assert_eq!(names(&d).len(), 5);
    assert!(
        d.forward(&x).is_err(),
        "BatchNorm1d takes [N, C] or [N, C, L]"
    );
    let e = BatchNorm::builder(6)
        .track_running_stats(false)
        .dtype(DType::F64)
        .build2d(&Device::Cpu)
        .unwrap();
    assert!(e.running_mean.is_none() && e.num_batches_tracked.is_none());
    assert_eq!(e.weight.as_ref().unwrap().dtype(), DType::F64);
    // LayerNorm, GroupNorm, RMSNorm.
    // Every setting spelled out equals the defaults plus the changed ones.
    let a = LayerNorm::builder(&[3, 2])
        .name("ln")
        .eps(1e-3)
        .elementwise_affine(true)
        .bias(false)
        .dtype(DType::F32)
        .build(&Device::Cpu)
        .unwrap();
    let b = LayerNorm::builder(&[3, 2])
        .name("ln")
        .eps(1e-3)
        .bias(false)
        .build(&Device::Cpu)
        .unwrap();
    assert_eq!((out(&a), names(&a)), (out(&b), names(&b)));
    let c = LayerNorm::builder(&[2])
        .elementwise_affine(false)
        .build(&Device::Cpu)
        .unwrap();
    assert!(c.weight.is_none() && c.bias.is_none());
    let a = GroupNorm::builder(3, 6)
        .name("gn")
        .eps(1e-4)
        .affine(false)
        .dtype(DType::F32)
        .build(&Device::Cpu)
        .unwrap();
    let b = GroupNorm::builder(3, 6)
        .name("gn")
        .eps(1e-4)
        .affine(false)
        .build(&Device::Cpu)
        .unwrap();
    assert_eq!((out(&a), names(&a)), (out(&b), names(&b)));
    assert!(GroupNorm::builder(4, 6).build(&Device::Cpu).is_err());
    let a = RMSNorm::builder(&[2])
        .name("rms")
        .eps(Some(1e-6))
        .elementwise_affine(true)
        .dtype(DType::F32)
        .build(&Device::Cpu)
        .unwrap();
    let b = RMSNorm::builder(&[2])
        .name("rms")
        .eps(Some(1e-6))
        .build(&Device::Cpu)
        .unwrap();
    assert_eq!((out(&a), names(&a)), (out(&b), names(&b)));
    let c = RMSNorm::builder(&[2])
        .elementwise_affine(false)
        .dtype(DType::F64)
        .build(&Device::Cpu)
        .unwrap();
    assert!(c.weight.is_none());
}
