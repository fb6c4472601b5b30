//! Pooling, dropout and embedding layers: values against naive loops,
//! gradients, exactly what each saves under both policies, and errors.
mod common;
use common::*;
use leangrad::autograd::{backward_with, with_save_policy, CollectGrads, SavePolicy};
use leangrad::memory::{Category, Ledger};
use leangrad::nn::*;
use leangrad::{DType, Device, Tensor};

fn f32s(shape: &[usize], seed: u64) -> Tensor {
    Tensor::rand_range(shape, -1.0, 1.0, DType::F32, Device::Cpu, seed).unwrap()
}

fn bytes(rows: &[(u32, usize, usize)], mask: u32) -> (usize, usize) {
    let r = rows.iter().find(|r| r.0 == mask).expect("combination");
    (r.1, r.2)
}

fn idx(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, Device::Cpu).unwrap()
}

/// PyTorch's output length.
fn out_len(len: usize, k: usize, s: usize, p: usize, d: usize, ceil: bool) -> usize {
    let span = (len + 2 * p - d * (k - 1) - 1) as f64 / s as f64;
    let mut o = if ceil { span.ceil() } else { span.floor() } as usize + 1;
    if ceil && (o - 1) * s >= len + p {
        o -= 1;
    }
    o
}

/// Naive max pooling of `[planes, h, w]` values: (output, argmax flat index).
fn naive_max(x: &[f64], planes: usize, hw: [usize; 2], o: &MaxPool2dOptions) -> Vec<f64> {
    let s = o.stride.unwrap_or(o.kernel);
    let oh = out_len(
        hw[0],
        o.kernel[0],
        s[0],
        o.padding[0],
        o.dilation[0],
        o.ceil_mode,
    );
    let ow = out_len(
        hw[1],
        o.kernel[1],
        s[1],
        o.padding[1],
        o.dilation[1],
        o.ceil_mode,
    );
    let mut out = Vec::new();
    for p in 0..planes {
        for i in 0..oh {
            for j in 0..ow {
                let mut best = f64::NEG_INFINITY;
                for ki in 0..o.kernel[0] {
                    for kj in 0..o.kernel[1] {
                        let r = (i * s[0] + ki * o.dilation[0]) as isize - o.padding[0] as isize;
                        let c = (j * s[1] + kj * o.dilation[1]) as isize - o.padding[1] as isize;
                        if r >= 0 && c >= 0 && (r as usize) < hw[0] && (c as usize) < hw[1] {
                            best = best.max(x[p * hw[0] * hw[1] + r as usize * hw[1] + c as usize]);
                        }
                    }
                }
                out.push(best);
            }
        }
    }
    out
}

fn mp(k: [usize; 2], s: [usize; 2], p: [usize; 2], d: [usize; 2], ceil: bool) -> MaxPool2dOptions {
    MaxPool2dOptions {
        kernel: k,
        stride: Some(s),
        padding: p,
        dilation: d,
        ceil_mode: ceil,
    }
}

fn max_cases() -> Vec<MaxPool2dOptions> {
    vec![
        MaxPool2dOptions::new([2, 2]),
        mp([3, 3], [2, 2], [1, 1], [1, 1], false),
        mp([3, 2], [2, 1], [1, 0], [1, 1], true),
        mp([2, 3], [1, 2], [0, 1], [2, 1], false),
        mp([3, 3], [2, 2], [0, 0], [1, 1], true),
    ]
}

#[test]
fn max_pool_values_match_a_naive_loop() {
    let x = rand64(&[2, 3, 7, 6], 1);
    let xs = x.to_f64_vec().unwrap();
    for o in max_cases() {
        let y = max_pool2d(&x, &o).unwrap();
        let want = naive_max(&xs, 6, [7, 6], &o);
        assert_eq!(y.to_f64_vec().unwrap(), want, "{o:?}");
        assert_eq!(y.numel(), want.len());
    }
    // Hand-computed: 4x4, 2x2 windows.
    let x = Tensor::from_vec(
        (0..16).map(|v| v as f32).collect(),
        &[1, 1, 4, 4],
        Device::Cpu,
    )
    .unwrap();
    let y = MaxPool2d::new("pool", MaxPool2dOptions::new([2, 2]))
        .forward(&x)
        .unwrap();
    assert_eq!(y.shape(), &[1, 1, 2, 2]);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![5.0, 7.0, 13.0, 15.0]);
    // 3-d input, NaN wins, ties go to the first maximum.
    let x = Tensor::from_vec(vec![1.0f64, 1.0, f64::NAN, 0.0], &[1, 2, 2], Device::Cpu).unwrap();
    let y = max_pool2d(&x, &MaxPool2dOptions::new([2, 2])).unwrap();
    assert!(y.to_f64_vec().unwrap()[0].is_nan());
    let x = Tensor::from_vec(vec![2.0f64, 2.0, 1.0, 2.0], &[1, 2, 2], Device::Cpu)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let y = max_pool2d(&x, &MaxPool2dOptions::new([2, 2])).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(
        x.grad().unwrap().to_f64_vec().unwrap(),
        vec![1.0, 0.0, 0.0, 0.0]
    );
}

#[test]
fn max_pool_gradcheck_and_policies() {
    for o in max_cases() {
        check(|t| max_pool2d(&t[0], &o), &[rand64(&[1, 2, 6, 7], 2)]);
    }
    // Overlapping windows: the gradient accumulates where argmaxes repeat.
    let o = mp([3, 3], [1, 1], [1, 1], [1, 1], false);
    check(|t| max_pool2d(&t[0], &o), &[rand64(&[2, 1, 5, 5], 3)]);
    let x = f32s(&[2, 3, 7, 7], 4);
    for o in max_cases() {
        let y = max_pool2d(&x, &o).unwrap();
        let n_out = y.numel();
        let rows = check_policies(&|t| max_pool2d(&t[0], &o), std::slice::from_ref(&x));
        assert_eq!(bytes(&rows, 0), (0, 0));
        assert_eq!(bytes(&rows, 1), (n_out, 4 * x.numel() + 8 * n_out), "{o:?}");
    }
    // f16 and bf16 follow the same path.
    for dt in [DType::F16, DType::BF16] {
        let x = Tensor::rand_range(&[1, 2, 4, 4], -1.0, 1.0, dt, Device::Cpu, 5).unwrap();
        let rows = check_policies(&|t| max_pool2d(&t[0], &MaxPool2dOptions::new([2, 2])), &[x]);
        assert_eq!(bytes(&rows, 1), (8, 2 * 32 + 64));
    }
}

/// Naive average pooling of `[planes, h, w]` values.
fn naive_avg(x: &[f64], planes: usize, hw: [usize; 2], o: &AvgPool2dOptions) -> Vec<f64> {
    let s = o.stride.unwrap_or(o.kernel);
    let oh = out_len(hw[0], o.kernel[0], s[0], o.padding[0], 1, false);
    let ow = out_len(hw[1], o.kernel[1], s[1], o.padding[1], 1, false);
    let mut out = Vec::new();
    for p in 0..planes {
        for i in 0..oh {
            for j in 0..ow {
                let (mut sum, mut count) = (0.0, 0usize);
                for ki in 0..o.kernel[0] {
                    for kj in 0..o.kernel[1] {
                        let r = (i * s[0] + ki) as isize - o.padding[0] as isize;
                        let c = (j * s[1] + kj) as isize - o.padding[1] as isize;
                        if r >= 0 && c >= 0 && (r as usize) < hw[0] && (c as usize) < hw[1] {
                            sum += x[p * hw[0] * hw[1] + r as usize * hw[1] + c as usize];
                            count += 1;
                        }
                    }
                }
                // Without ceil mode a window never passes the right padding.
                let div = if o.count_include_pad {
                    o.kernel[0] * o.kernel[1]
                } else {
                    count
                };
                out.push(sum / div as f64);
            }
        }
    }
    out
}

fn avg_cases() -> Vec<AvgPool2dOptions> {
    let mut v = vec![AvgPool2dOptions::new([2, 2])];
    for include in [true, false] {
        v.push(AvgPool2dOptions {
            kernel: [3, 3],
            stride: Some([2, 2]),
            padding: [1, 1],
            count_include_pad: include,
        });
        v.push(AvgPool2dOptions {
            kernel: [2, 3],
            stride: Some([1, 2]),
            padding: [1, 1],
            count_include_pad: include,
        });
    }
    v
}

/// Naive adaptive average pooling.
fn naive_adaptive(x: &[f64], planes: usize, hw: [usize; 2], out: [usize; 2]) -> Vec<f64> {
    let mut v = Vec::new();
    for p in 0..planes {
        for i in 0..out[0] {
            for j in 0..out[1] {
                let (r0, r1) = (i * hw[0] / out[0], ((i + 1) * hw[0]).div_ceil(out[0]));
                let (c0, c1) = (j * hw[1] / out[1], ((j + 1) * hw[1]).div_ceil(out[1]));
                let mut sum = 0.0;
                for r in r0..r1 {
                    for c in c0..c1 {
                        sum += x[p * hw[0] * hw[1] + r * hw[1] + c];
                    }
                }
                v.push(sum / ((r1 - r0) * (c1 - c0)) as f64);
            }
        }
    }
    v
}

#[test]
fn avg_pools_match_naive_loops_gradcheck_and_save_nothing() {
    let x = rand64(&[2, 3, 7, 6], 6);
    let xs = x.to_f64_vec().unwrap();
    for o in avg_cases() {
        let y = AvgPool2d::new("avg", o).forward(&x).unwrap();
        assert_close(
            &y.to_f64_vec().unwrap(),
            &naive_avg(&xs, 6, [7, 6], &o),
            1e-14,
        );
        check(|t| avg_pool2d(&t[0], &o), &[rand64(&[1, 2, 5, 6], 7)]);
    }
    for out in [[1, 1], [3, 4], [7, 6], [5, 4], [2, 6]] {
        let y = AdaptiveAvgPool2d::new("gap", out).forward(&x).unwrap();
        assert_eq!(y.shape(), &[2, 3, out[0], out[1]]);
        assert_close(
            &y.to_f64_vec().unwrap(),
            &naive_adaptive(&xs, 6, [7, 6], out),
            1e-14,
        );
        check(
            |t| adaptive_avg_pool2d(&t[0], out),
            &[rand64(&[1, 2, 7, 6], 8)],
        );
    }
    let x = f32s(&[2, 3, 7, 7], 9);
    for o in avg_cases() {
        let rows = check_policies(&|t| avg_pool2d(&t[0], &o), std::slice::from_ref(&x));
        assert_eq!(bytes(&rows, 1), (0, 4 * x.numel()), "{o:?}");
    }
    let rows = check_policies(
        &|t| adaptive_avg_pool2d(&t[0], [3, 2]),
        std::slice::from_ref(&x),
    );
    assert_eq!(bytes(&rows, 1), (0, 4 * x.numel()));
    assert_eq!(bytes(&rows, 0), (0, 0));
}

#[test]
fn pool_errors() {
    let x = f32s(&[1, 1, 5, 5], 10);
    let big = MaxPool2dOptions::new([17, 16]);
    assert_err!(max_pool2d(&f32s(&[1, 1, 20, 20], 1), &big), InvalidArgument);
    assert_err!(
        max_pool2d(&f32s(&[5, 5], 1), &MaxPool2dOptions::new([2, 2])),
        InvalidArgument
    );
    assert_err!(
        max_pool2d(&x, &MaxPool2dOptions::new([6, 6])),
        InvalidArgument
    );
    assert_err!(
        max_pool2d(&x, &MaxPool2dOptions::new([0, 2])),
        InvalidArgument
    );
    assert_err!(
        max_pool2d(&x, &mp([2, 2], [2, 2], [2, 0], [1, 1], false)),
        InvalidArgument
    );
    assert_err!(
        max_pool2d(&x, &mp([2, 2], [0, 1], [0, 0], [1, 1], false)),
        InvalidArgument
    );
    let ints = idx(&[1, 2, 3, 4], &[1, 1, 2, 2]);
    assert_err!(
        max_pool2d(&ints, &MaxPool2dOptions::new([2, 2])),
        UnsupportedDType
    );
    assert_err!(
        avg_pool2d(&ints, &AvgPool2dOptions::new([2, 2])),
        UnsupportedDType
    );
    assert_err!(adaptive_avg_pool2d(&x, [0, 2]), InvalidArgument);
    assert_err!(
        adaptive_avg_pool2d(&f32s(&[2, 2, 2, 2, 2], 1), [1, 1]),
        InvalidArgument
    );
    let mut o = AvgPool2dOptions::new([2, 2]);
    o.padding = [2, 2];
    assert_err!(avg_pool2d(&x, &o), InvalidArgument);
}

const PS: [f64; 4] = [0.1, 0.3, 0.5, 0.9];

#[test]
fn dropout_replays_its_mask_and_keeps_no_bytes() {
    let n = 10_000;
    for p in PS {
        for policy in [SavePolicy::Lean, SavePolicy::SaveAll] {
            let ledger = Ledger::new();
            let _l = ledger.enter();
            let _p = with_save_policy(policy);
            let x = Tensor::rand_range(&[100, 100], 0.5, 1.5, DType::F32, Device::Cpu, 11)
                .unwrap()
                .set_requires_grad(true)
                .unwrap();
            let layer = Dropout::new("drop", p, 99).unwrap();
            let y = layer.forward(&x).unwrap();
            let saved = ledger.live_in(Device::Cpu, Category::Saved);
            match policy {
                SavePolicy::Lean => assert_eq!(saved, 0, "p={p}: no mask bytes"),
                SavePolicy::SaveAll => assert_eq!(saved, n, "p={p}: a byte mask"),
            }
            let ys = y.to_vec::<f32>().unwrap();
            let xs = x.to_vec::<f32>().unwrap();
            let scale = (1.0 / (1.0 - p)) as f32;
            let ones = Tensor::ones(&[100, 100], DType::F32, Device::Cpu).unwrap();
            backward_with(&y, Some(ones), &mut CollectGrads).unwrap();
            let g = x.grad().unwrap().to_vec::<f32>().unwrap();
            for i in 0..n {
                let kept = ys[i] != 0.0;
                assert_eq!(ys[i], if kept { xs[i] * scale } else { 0.0 });
                assert_eq!(g[i], if kept { scale } else { 0.0 }, "p={p} i={i}");
            }
        }
    }
}

#[test]
fn dropout_keeps_one_minus_p_of_a_million() {
    let n = 1_000_000;
    let x = Tensor::ones(&[n], DType::F32, Device::Cpu).unwrap();
    for p in PS {
        let y = dropout(&x, p, 1234, 0).unwrap();
        let kept = y
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .filter(|&&v| v != 0.0)
            .count();
        let frac = kept as f64 / n as f64;
        assert!((frac - (1.0 - p)).abs() < 0.01, "p={p}: kept {frac}");
    }
}

#[test]
fn dropout_policies_gradcheck_modes_and_errors() {
    let x = f32s(&[3, 50], 12);
    for p in [0.2, 0.5, 1.0] {
        let rows = check_policies(&|t| dropout(&t[0], p, 5, 8), std::slice::from_ref(&x));
        assert_eq!(bytes(&rows, 1), (0, 150), "p={p}");
        assert_eq!(bytes(&rows, 0), (0, 0));
        check(|t| dropout(&t[0], p, 5, 8), &[rand64(&[4, 9], 13)]);
    }
    // p = 1 zeroes everything, gradient included.
    let xg = x.clone().set_requires_grad(true).unwrap();
    let y = dropout(&xg, 1.0, 1, 0).unwrap();
    assert!(y.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
    y.sum_all().unwrap().backward().unwrap();
    assert!(xg
        .grad()
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .all(|&v| v == 0.0));
    // Eval mode and p = 0: the input itself, nothing recorded or allocated.
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let xg = f32s(&[4, 4], 14).set_requires_grad(true).unwrap();
    let before = ledger.allocation_count(Device::Cpu);
    let mut layer = Dropout::new("drop", 0.5, 3).unwrap();
    layer.set_training(false);
    let y = layer.forward(&xg).unwrap();
    assert!(y.shares_storage_with(&xg) && y.is_leaf());
    let y0 = Dropout::new("drop0", 0.0, 3).unwrap().forward(&xg).unwrap();
    assert!(y0.shares_storage_with(&xg) && y0.is_leaf());
    assert_eq!(ledger.allocation_count(Device::Cpu), before);
    // Successive training forwards draw fresh masks from the generator.
    layer.set_training(true);
    let a = layer.forward(&xg).unwrap().to_vec::<f32>().unwrap();
    let b = layer.forward(&xg).unwrap().to_vec::<f32>().unwrap();
    assert_ne!(a, b);
    for p in [-0.1, 1.5, f64::NAN] {
        assert_err!(Dropout::new("d", p, 0), InvalidArgument);
        assert_err!(dropout(&x, p, 0, 0), InvalidArgument);
    }
    assert_err!(dropout(&idx(&[1, 2], &[2]), 0.5, 0, 0), UnsupportedDType);
}

#[test]
fn embedding_gathers_rows_and_accumulates_repeats() {
    let w = rand64(&[5, 3], 15);
    let ws = w.to_f64_vec().unwrap();
    let ids = [4i64, 0, 4, 2, 4, 1];
    let y = embedding(&w, &idx(&ids, &[2, 3]), None).unwrap();
    assert_eq!(y.shape(), &[2, 3, 3]);
    let want: Vec<f64> = ids
        .iter()
        .flat_map(|&r| ws[r as usize * 3..r as usize * 3 + 3].to_vec())
        .collect();
    assert_eq!(y.to_f64_vec().unwrap(), want);
    let u = Tensor::from_vec(vec![1u32, 3], &[2], Device::Cpu).unwrap();
    assert_eq!(
        embedding(&w, &u, None).unwrap().to_f64_vec().unwrap(),
        [&ws[3..6], &ws[9..12]].concat()
    );
    // Repeated rows accumulate; the padding row gets nothing.
    for pad in [None, Some(4i64), Some(-1)] {
        let wg = w.clone().set_requires_grad(true).unwrap();
        let g = rand64(&[2, 3, 3], 16);
        let y = embedding(&wg, &idx(&ids, &[2, 3]), pad).unwrap();
        backward_with(&y, Some(g.clone()), &mut CollectGrads).unwrap();
        let gs = g.to_f64_vec().unwrap();
        let mut want = vec![0.0; 15];
        for (k, &r) in ids.iter().enumerate() {
            if pad.is_some() && r == 4 {
                continue;
            }
            for c in 0..3 {
                want[r as usize * 3 + c] += gs[k * 3 + c];
            }
        }
        assert_eq!(
            wg.grad().unwrap().to_f64_vec().unwrap(),
            want,
            "pad {pad:?}"
        );
    }
    // (The padding row is read by forward but gets no gradient, as in
    // PyTorch, so gradcheck uses a padding row no index names.)
    check(
        |t| embedding(&t[0], &idx(&ids, &[3, 2]), Some(3)),
        &[rand64(&[5, 3], 17)],
    );
    check(
        |t| embedding(&t[0], &idx(&ids, &[6]), None),
        &[rand64(&[5, 3], 18)],
    );
}

#[test]
fn embedding_saves_the_indices_only_for_the_weight() {
    let w = f32s(&[10, 4], 19);
    let i = idx(&[1, 9, 9, 0, 3, 2], &[2, 3]);
    let rows = check_policies(
        &|t| embedding(&t[0], &t[1], Some(0)),
        &[w.clone(), i.clone()],
    );
    assert_eq!(rows.len(), 2);
    assert_eq!(bytes(&rows, 0b01), (6 * 8, 6 * 8));
    assert_eq!(bytes(&rows, 0b00), (0, 0));
    let u = Tensor::from_vec(vec![1u32, 2, 3], &[3], Device::Cpu).unwrap();
    let rows = check_policies(&|t| embedding(&t[0], &t[1], None), &[w, u]);
    assert_eq!(bytes(&rows, 0b01), (12, 12));
    // The module: PyTorch names, a zero padding row, frozen saves nothing.
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let i = idx(&[1, 9, 9, 0, 3, 2], &[2, 3]);
    let mut e = Embedding::builder(10, 4)
        .name("emb")
        .padding_idx(Some(3))
        .seed(20)
        .build(&Device::Cpu)
        .unwrap();
    let names: Vec<String> = e.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight"]);
    assert_eq!(e.weight.to_vec::<f32>().unwrap()[12..16], [0.0; 4]);
    assert_eq!(ledger.live_in(Device::Cpu, Category::Parameter), 160);
    let y = e.forward(&i).unwrap();
    assert_eq!(
        ledger.saved_by_layer(Device::Cpu),
        vec![("emb/embedding".to_string(), 48)]
    );
    drop(y);
    e.weight = e.weight.clone().set_requires_grad(false).unwrap();
    let y = e.forward(&i).unwrap();
    assert!(!y.requires_grad());
    assert_eq!(ledger.live_in(Device::Cpu, Category::Saved), 0);
}

/// A tied table (GPT-2's `wte`: the embedding and the output head): the
/// head's gradient reaches the weight first and the embedding adds its
/// rows into that buffer, so backward never holds two `[num, dim]`
/// gradients; the values are those of two untied copies' gradients added.
#[test]
fn a_tied_embedding_adds_its_rows_into_the_head_gradient() {
    let (num, dim) = (64, 256);
    let ids = [5i64, 9, 5, 63, 0, 9];
    let table = f32s(&[num, dim], 41);
    let r = f32s(&[ids.len(), num], 42);
    let step = |emb: &Tensor, head: &Tensor| {
        let h = embedding(emb, &idx(&ids, &[ids.len()]), Some(0)).unwrap();
        let logits = h.matmul(&head.t().unwrap()).unwrap();
        logits
            .mul(&r)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
    };
    let ledger = Ledger::new();
    let tied = {
        let _g = ledger.enter();
        let w = table.clone().set_requires_grad(true).unwrap();
        step(&w, &w);
        w.grad().unwrap()
    };
    let (emb, head) = (
        table.clone().set_requires_grad(true).unwrap(),
        table.clone().set_requires_grad(true).unwrap(),
    );
    step(&emb, &head);
    let untied = head.grad().unwrap().add(&emb.grad().unwrap()).unwrap();
    assert_eq!(
        tied.to_f64_vec().unwrap(),
        untied.to_f64_vec().unwrap(),
        "bit for bit"
    );
    let table_bytes = num * dim * 4;
    let peak = ledger.peak_gradients(Device::Cpu);
    assert!(
        peak < 2 * table_bytes && peak >= table_bytes,
        "one [num, dim] gradient at a time: peak {peak} for a {table_bytes}-byte table"
    );
}

#[test]
fn embedding_errors() {
    let w = f32s(&[4, 2], 21);
    assert_err!(embedding(&w, &idx(&[0, 4], &[2]), None), IndexOutOfRange);
    assert_err!(embedding(&w, &idx(&[-1], &[1]), None), IndexOutOfRange);
    assert_err!(embedding(&w, &idx(&[0], &[1]), Some(4)), IndexOutOfRange);
    assert_err!(embedding(&w, &idx(&[0], &[1]), Some(-5)), IndexOutOfRange);
    assert_err!(embedding(&w, &f32s(&[2], 1), None), DTypeMismatch);
    assert_err!(
        embedding(&f32s(&[4], 1), &idx(&[0], &[1]), None),
        InvalidArgument
    );
    assert_err!(
        embedding(&idx(&[0, 1], &[1, 2]), &idx(&[0], &[1]), None),
        UnsupportedDType
    );
    assert_err!(
        Embedding::builder(4, 2)
            .name("e")
            .padding_idx(Some(7))
            .build(&Device::Cpu),
        IndexOutOfRange
    );
}

#[test]
fn layers_chain_identically_under_both_policies() {
    // relu → max pool → dropout: lean keeps relu's bit mask and the pool's
    // window bytes; SaveAll keeps relu's output (which the pool saves too,
    // counted once), the i64 indices and dropout's byte mask.
    let x = f32s(&[2, 2, 6, 6], 22);
    let o = mp([3, 3], [2, 2], [1, 1], [1, 1], false);
    let f = |t: &[Tensor]| dropout(&max_pool2d(&t[0].relu()?, &o)?, 0.4, 7, 0);
    let rows = check_policies(&f, std::slice::from_ref(&x));
    let (n, n_out): (usize, usize) = (144, 2 * 2 * 3 * 3);
    assert_eq!(
        bytes(&rows, 1),
        (n.div_ceil(32) * 4 + n_out, 4 * n + 8 * n_out + n_out)
    );
    // embedding → adaptive pool: the pool saves nothing, the index is kept
    // for the weight's gradient.
    let w = f32s(&[6, 8], 23);
    let i = idx(&[0, 5, 5, 1, 2, 3, 4, 0], &[2, 4]);
    let g = |t: &[Tensor]| {
        let e = embedding(&t[0], &t[1], None)?.reshape(&[2, 1, 4, 8])?;
        adaptive_avg_pool2d(&e, [2, 3])
    };
    let rows = check_policies(&g, &[w, i]);
    assert_eq!(bytes(&rows, 1), (64, 64 + 4 * 64));
}

#[test]
fn large_pools_take_the_parallel_path_deterministically() {
    // 8·16 planes of 32×32 → 32768 outputs of a 2×2 max pool (the threshold).
    let x = f32s(&[8, 16, 32, 32], 24);
    let xs = x.to_f64_vec().unwrap();
    let o = MaxPool2dOptions::new([2, 2]);
    let y = max_pool2d(&x, &o).unwrap();
    assert_eq!(y.to_f64_vec().unwrap(), naive_max(&xs, 128, [32, 32], &o));
    let rows = check_policies(&|t| max_pool2d(&t[0], &o), std::slice::from_ref(&x));
    assert_eq!(bytes(&rows, 1), (32768, 4 * 131072 + 8 * 32768));
    let a = AvgPool2dOptions::new([2, 2]);
    let y = avg_pool2d(&x, &a).unwrap();
    let want: Vec<f64> = naive_avg(&xs, 128, [32, 32], &a)
        .into_iter()
        .map(|v| v as f32 as f64)
        .collect();
    assert_eq!(y.to_f64_vec().unwrap(), want);
    let rows = check_policies(&|t| avg_pool2d(&t[0], &a), std::slice::from_ref(&x));
    assert_eq!(bytes(&rows, 1), (0, 4 * 131072));
}

#[test]
fn strided_inputs_and_gradients() {
    // A transposed input, and a transposed (non-contiguous) incoming gradient.
    let o = mp([2, 3], [1, 2], [1, 1], [1, 1], false);
    let a = AvgPool2dOptions {
        count_include_pad: false,
        ..AvgPool2dOptions::new([2, 2])
    };
    check(
        |t| max_pool2d(&t[0].transpose(2, 3)?, &o)?.transpose(2, 3),
        &[rand64(&[2, 2, 5, 6], 25)],
    );
    check(
        |t| avg_pool2d(&t[0].transpose(1, 3)?, &a)?.transpose(2, 3),
        &[rand64(&[1, 4, 5, 3], 26)],
    );
    check(
        |t| adaptive_avg_pool2d(&t[0].transpose(2, 3)?, [2, 3])?.transpose(0, 3),
        &[rand64(&[2, 1, 5, 4], 27)],
    );
    check(
        |t| dropout(&t[0].t()?, 0.3, 9, 4)?.t(),
        &[rand64(&[6, 7], 28)],
    );
    let w = rand64(&[5, 4], 29);
    check(
        |t| embedding(&t[0].t()?.t()?, &idx(&[3, 1, 3], &[3]), None)?.t(),
        &[w],
    );
    // The transposed input gives the values of its contiguous copy.
    let x = rand64(&[1, 2, 6, 5], 30);
    let xt = x.transpose(2, 3).unwrap();
    let xc = xt.contiguous().unwrap();
    assert_eq!(
        max_pool2d(&xt, &o).unwrap().to_f64_vec().unwrap(),
        max_pool2d(&xc, &o).unwrap().to_f64_vec().unwrap()
    );
    let d1 = dropout(&xt, 0.5, 1, 0).unwrap().to_f64_vec().unwrap();
    let d2 = dropout(&xc, 0.5, 1, 0).unwrap().to_f64_vec().unwrap();
    assert_eq!(d1, d2);
}

/// Stochastic depth drops whole samples (`Row`) by the dropout keep rule
/// over one counter per sample, scales the kept ones by `1/(1−p)`, and its
/// gradient is the same factor per sample; lean keeps no bytes, `SaveAll`
/// the `N`-element noise PyTorch keeps.
#[test]
fn stochastic_depth_drops_whole_samples_and_replays_them() {
    use leangrad::rng::dropout_keep;
    let (n, c) = (64usize, 12usize);
    for p in PS {
        let x = f32s(&[n, 3, 2, 2], 21);
        let rows = check_policies(
            &|t| stochastic_depth(&t[0], p, StochasticDepthMode::Row, 4, 16),
            std::slice::from_ref(&x),
        );
        assert_eq!(bytes(&rows, 1), (0, n * 4), "p={p}");
        let xg = x.clone().set_requires_grad(true).unwrap();
        let y = stochastic_depth(&xg, p, StochasticDepthMode::Row, 4, 16).unwrap();
        let seed_g = f32s(&[n, 3, 2, 2], 22);
        backward_with(&y, Some(seed_g.clone()), &mut CollectGrads).unwrap();
        let (xs, ys) = (x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
        let (gs, gx) = (
            seed_g.to_vec::<f32>().unwrap(),
            xg.grad().unwrap().to_vec::<f32>().unwrap(),
        );
        let scale = (1.0 / (1.0 - p)) as f32;
        let mut kept = 0;
        for s in 0..n {
            let keep = dropout_keep(4, 16, s as u64, p);
            kept += usize::from(keep);
            let f = if keep { scale } else { 0.0 };
            for i in s * c..(s + 1) * c {
                assert_eq!(ys[i], xs[i] * f, "p={p} sample {s}");
                assert_eq!(gx[i], gs[i] * f, "p={p} sample {s}");
            }
        }
        assert!(kept > 0 || p > 0.8, "p={p}: no sample kept");
        check(
            |t| stochastic_depth(&t[0], p, StochasticDepthMode::Row, 4, 16),
            &[rand64(&[5, 3, 2], 23)],
        );
    }
}

#[test]
fn stochastic_depth_batch_mode_module_eval_and_errors() {
    // Batch mode: one draw for the whole input.
    let x = Tensor::ones(&[8, 5], DType::F32, Device::Cpu).unwrap();
    for offset in 0..40 {
        let y = stochastic_depth(&x, 0.5, StochasticDepthMode::Batch, 2, offset * 4)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let want = if leangrad::rng::dropout_keep(2, offset * 4, 0, 0.5) {
            2.0
        } else {
            0.0
        };
        assert!(y.iter().all(|&v| v == want), "offset {offset}");
    }
    // Row mode keeps about 1 − p of many samples.
    let many = Tensor::ones(&[200_000, 1], DType::F32, Device::Cpu).unwrap();
    let kept = stochastic_depth(&many, 0.3, StochasticDepthMode::Row, 9, 0)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .filter(|&&v| v != 0.0)
        .count();
    assert!((kept as f64 / 200_000.0 - 0.7).abs() < 0.01, "kept {kept}");
    // The layer: fresh draws per training forward, the identity in eval
    // mode and for p = 0, nothing allocated then.
    let xg = f32s(&[32, 4], 24).set_requires_grad(true).unwrap();
    let mut layer = StochasticDepth::new("sd", 0.5, StochasticDepthMode::Row, 3).unwrap();
    let a = layer.forward(&xg).unwrap().to_vec::<f32>().unwrap();
    let b = layer.forward(&xg).unwrap().to_vec::<f32>().unwrap();
    assert_ne!(a, b);
    let ledger = Ledger::new();
    let _l = ledger.enter();
    layer.set_training(false);
    let y = layer.forward(&xg).unwrap();
    assert!(y.shares_storage_with(&xg) && y.is_leaf());
    let zero = StochasticDepth::new("sd0", 0.0, StochasticDepthMode::Row, 3).unwrap();
    assert!(zero.forward(&xg).unwrap().shares_storage_with(&xg));
    assert_eq!(ledger.allocation_count(Device::Cpu), 0);
    // p = 1 drops everything.
    let y = stochastic_depth(&xg, 1.0, StochasticDepthMode::Row, 1, 0).unwrap();
    assert!(y.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
    for p in [-0.1, 1.5, f64::NAN] {
        assert_err!(
            StochasticDepth::new("sd", p, StochasticDepthMode::Row, 0),
            InvalidArgument
        );
        assert_err!(
            stochastic_depth(&xg, p, StochasticDepthMode::Row, 0, 0),
            InvalidArgument
        );
    }
    let scalar = Tensor::ones(&[], DType::F32, Device::Cpu).unwrap();
    assert_err!(
        stochastic_depth(&scalar, 0.5, StochasticDepthMode::Row, 0, 0),
        InvalidArgument
    );
    assert_err!(
        stochastic_depth(&idx(&[1, 2], &[2]), 0.5, StochasticDepthMode::Row, 0, 0),
        UnsupportedDType
    );
}
