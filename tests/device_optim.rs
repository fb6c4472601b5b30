//! Optimizers on every device: the update kernels equal the CPU's bit for
//! bit on identical gradients (every algorithm, transform and float dtype,
//! strided gradients, parameters at an offset), the sum of squares too, and
//! five training steps of a small MLP (usual `step()` and fused
//! `backward_step()`, every clipping mode) give the CPU's parameters within
//! a per-dtype tolerance with byte-identical ledger peaks and optimizer
//! state.
mod cuda_common;
mod device_common;

use leangrad::memory::{Category, Ledger};
use leangrad::optim::{
    apply_update, apply_update_as, sum_of_squares, Adam, Algorithm, Clip, GradTransform, Optimizer,
    Sgd, StateFormat, NORM_LANES, QUANT_BLOCK,
};
use leangrad::{DType, Device, Tensor};

const STEPS: usize = 5;

/// The float dtypes the update kernels are checked in.
const KERNEL_FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

fn rand(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    Tensor::rand_range(shape, -1.0, 1.0, dtype, Device::Cpu, seed).unwrap()
}

fn sgd_cases() -> Vec<(&'static str, Sgd)> {
    vec![
        ("sgd", Sgd::new(0.1)),
        (
            "sgd momentum dampening wd",
            Sgd::new(0.05)
                .momentum(0.9)
                .dampening(0.3)
                .weight_decay(0.01),
        ),
        (
            "sgd nesterov wd",
            Sgd::new(0.05)
                .momentum(0.8)
                .nesterov(true)
                .weight_decay(0.02),
        ),
        (
            "sgd momentum maximize",
            Sgd::new(0.05).momentum(0.5).maximize(true),
        ),
    ]
}

/// Adam cases. eps is 1e-2 in the training comparison so that an element
/// whose gradient is near 0 (where Adam's step is ≈ ±lr whatever its size)
/// cannot flip sign between the devices' legitimately different forward
/// roundings; the kernel comparison uses torch's default too.
fn adam_cases(eps: f64) -> Vec<(&'static str, Adam)> {
    vec![
        ("adam", Adam::new(0.01).eps(eps)),
        ("adam l2", Adam::new(0.01).eps(eps).weight_decay(0.05)),
        ("adamw", Adam::adamw(0.01).eps(eps)),
        (
            "adamw amsgrad beta1 0.3",
            Adam::adamw(0.01).eps(eps).amsgrad(true).betas(0.3, 0.99),
        ),
        (
            "adam amsgrad maximize",
            Adam::new(0.01).eps(eps).amsgrad(true).maximize(true),
        ),
    ]
}

const TRANSFORMS: [GradTransform; 3] = [
    GradTransform::Identity,
    GradTransform::Scale(0.37),
    GradTransform::ClampAbs(0.3),
];

/// Three updates of a `[3, 40]` parameter that is a view at offset 40 of a
/// `[5, 40]` storage, from transposed (strided) gradients, on `dev`: the
/// parameter's and the state's values after each update.
fn kernel_run<A: Algorithm>(
    alg: &A,
    dtype: DType,
    transform: GradTransform,
    dev: Device,
) -> Vec<Vec<f64>> {
    let base = rand(&[5, 40], dtype, 11).to_device(dev).unwrap();
    let param = base.narrow(0, 1, 3).unwrap();
    let state: Vec<Tensor> = (0..alg.state_slots())
        .map(|_| Tensor::zeros(&[3, 40], dtype, dev).unwrap())
        .collect();
    let mut out = Vec::new();
    for step in 1..=3u64 {
        let g = rand(&[40, 3], dtype, 20 + step).to_device(dev).unwrap();
        let g = g.t().unwrap();
        assert!(!g.is_contiguous());
        apply_update(alg, step, &param, &g, transform, &state).unwrap();
        out.push(param.to_f64_vec().unwrap());
        for s in &state {
            out.push(s.to_f64_vec().unwrap());
        }
    }
    // The rows around the view are untouched.
    let rest = [base.narrow(0, 0, 1).unwrap(), base.narrow(0, 4, 1).unwrap()];
    let orig = rand(&[5, 40], dtype, 11);
    for (r, o) in rest.iter().zip([0, 4]) {
        assert_eq!(
            r.to_f64_vec().unwrap(),
            orig.narrow(0, o, 1).unwrap().to_f64_vec().unwrap()
        );
    }
    out
}

fn bit_equal(what: &str, want: &[Vec<f64>], got: &[Vec<f64>]) {
    assert_eq!(want.len(), got.len(), "{what}");
    for (k, (w, g)) in want.iter().zip(got).enumerate() {
        for (i, (a, b)) in w.iter().zip(g).enumerate() {
            let same = a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
            assert!(same, "{what}: tensor {k} element {i}: cpu {a} vs {b}");
        }
    }
}

fn check_kernels<A: Algorithm>(name: &str, alg: &A) {
    for dtype in KERNEL_FLOATS {
        for transform in TRANSFORMS {
            let want = kernel_run(alg, dtype, transform, Device::Cpu);
            // The update moved the parameter.
            assert_ne!(
                want[0],
                rand(&[5, 40], dtype, 11).to_f64_vec().unwrap()[40..160]
            );
            for dev in cuda_common::devices("optimizer kernels") {
                let got = kernel_run(alg, dtype, transform, dev);
                bit_equal(
                    &format!("{name} {dtype:?} {transform:?} on {dev}"),
                    &want,
                    &got,
                );
            }
        }
    }
}

#[test]
fn sgd_updates_equal_the_cpu_bit_for_bit() {
    for (name, alg) in sgd_cases() {
        check_kernels(name, &alg);
    }
}

#[test]
fn adam_updates_equal_the_cpu_bit_for_bit() {
    for (name, alg) in adam_cases(1e-8) {
        check_kernels(name, &alg);
    }
}

/// Zeroed compact state of `slots` slots for a `shape` parameter: bf16
/// tensors, or per slot the u8 codes and the f32 block scales.
fn compact_state(slots: usize, shape: &[usize], format: StateFormat, dev: Device) -> Vec<Tensor> {
    let n: usize = shape.iter().product();
    let mut out = Vec::new();
    for _ in 0..slots {
        match format {
            StateFormat::Bf16 => out.push(Tensor::zeros(shape, DType::BF16, dev).unwrap()),
            _ => {
                out.push(Tensor::zeros(shape, DType::U8, dev).unwrap());
                let blocks = n.div_ceil(QUANT_BLOCK);
                out.push(Tensor::zeros(&[blocks], DType::F32, dev).unwrap());
            }
        }
    }
    out
}

/// As [`kernel_run`] with compact state: a `[3, 2100]` view at offset 2100
/// of a `[5, 2100]` storage (four quantisation blocks, the last partial),
/// transposed gradients, three updates; the parameter and every state
/// tensor (codes, scales, bf16 values) after each.
fn compact_run(
    alg: &Adam,
    dtype: DType,
    transform: GradTransform,
    format: StateFormat,
    dev: Device,
) -> Vec<Vec<f64>> {
    let base = rand(&[5, 2100], dtype, 12).to_device(dev).unwrap();
    let param = base.narrow(0, 1, 3).unwrap();
    let state = compact_state(alg.state_slots(), &[3, 2100], format, dev);
    let mut out = Vec::new();
    for step in 1..=3u64 {
        let mut g = rand(&[2100, 3], dtype, 30 + step).to_f64_vec().unwrap();
        if step == 1 {
            // The last block (row 2 of the parameter from column 1944) gets
            // a zero gradient: its scales are 0 after the first step.
            for c in 1944..2100 {
                g[c * 3 + 2] = 0.0;
            }
        }
        let g = Tensor::from_vec(g, &[2100, 3], Device::Cpu).unwrap();
        let g = g
            .to_dtype(dtype)
            .unwrap()
            .to_device(dev)
            .unwrap()
            .t()
            .unwrap();
        apply_update_as(alg, step, &param, &g, transform, format, &state).unwrap();
        out.push(param.to_f64_vec().unwrap());
        for s in &state {
            out.push(s.to_f64_vec().unwrap());
        }
    }
    out
}

/// The compact-state Adam kernels (bf16 and 8-bit, with and without
/// amsgrad, every float parameter dtype and transform) equal the CPU's
/// update bit for bit: parameters, codes, scales and bf16 moments.
#[test]
fn compact_state_updates_equal_the_cpu_bit_for_bit() {
    let cases = [
        ("adamw", Adam::adamw(0.01).weight_decay(0.02)),
        (
            "adam amsgrad l2",
            Adam::new(0.01).amsgrad(true).weight_decay(0.05),
        ),
        (
            "adam maximize beta1 0.3",
            Adam::new(0.01).maximize(true).betas(0.3, 0.99),
        ),
    ];
    for format in [StateFormat::Bf16, StateFormat::Blockwise8] {
        for (name, alg) in &cases {
            for dtype in KERNEL_FLOATS {
                for transform in TRANSFORMS {
                    let want = compact_run(alg, dtype, transform, format, Device::Cpu);
                    assert!(want[1].iter().any(|&m| m != 0.0), "{name}: state moved");
                    for dev in cuda_common::devices("compact optimizer state") {
                        let got = compact_run(alg, dtype, transform, format, dev);
                        bit_equal(
                            &format!("{name} {format} {dtype:?} {transform:?} on {dev}"),
                            &want,
                            &got,
                        );
                    }
                }
            }
        }
    }
}

/// Sizes of the many-parameter model: more tensors than one multi-tensor
/// launch holds (32), sizes that end in a partial run of 4, single
/// elements and a few thousand.
const MANY_SIZES: [usize; 37] = [
    1, 3, 4, 5, 7, 8, 9, 16, 17, 31, 33, 64, 65, 100, 127, 128, 129, 255, 256, 257, 500, 513, 1000,
    1023, 1025, 2, 6, 10, 11, 12, 13, 14, 15, 4093, 4096, 4099, 3,
];

/// Three `step()`s of an optimizer over `MANY_SIZES` parameters (two
/// groups when `split`, the second with `alg2`) whose gradients are exact
/// (the gradient of `Σ sum(p ⊙ c)` is `c`): every parameter after each
/// step, on `dev`.
fn many_run<A: Algorithm>(
    alg: &A,
    alg2: Option<&A>,
    clip: Clip,
    dtype: DType,
    dev: Device,
) -> Vec<Vec<f64>> {
    let ps: Vec<Tensor> = MANY_SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let p = Tensor::rand_range(&[n], -1.0, 1.0, dtype, Device::Cpu, 300 + i as u64);
            p.unwrap()
                .to_device(dev)
                .unwrap()
                .set_requires_grad(true)
                .unwrap()
        })
        .collect();
    let (first, second) = ps.split_at(if alg2.is_some() { 20 } else { ps.len() });
    let mut opt = Optimizer::new(first.to_vec(), alg.clone()).unwrap();
    if let Some(a2) = alg2 {
        opt.add_param_group(second.to_vec(), a2.clone()).unwrap();
    }
    opt.set_clip(clip).unwrap();
    let mut out = Vec::new();
    for step in 0..3u64 {
        let mut loss: Option<Tensor> = None;
        for (i, p) in ps.iter().enumerate() {
            let c = Tensor::rand_range(
                p.shape(),
                -2.0,
                2.0,
                dtype,
                Device::Cpu,
                900 + 50 * step + i as u64,
            );
            let term = p
                .mul(&c.unwrap().to_device(dev).unwrap())
                .unwrap()
                .sum_all()
                .unwrap();
            loss = Some(match loss {
                Some(l) => l.add(&term).unwrap(),
                None => term,
            });
        }
        loss.unwrap().backward().unwrap();
        opt.step().unwrap();
        opt.zero_grad();
        out.extend(ps.iter().map(|p| p.to_f64_vec().unwrap()));
    }
    out
}

/// `step()` on CUDA runs each group's parameters as multi-tensor launches
/// (32 tensors each); on identical gradients the parameters equal the
/// CPU's bit for bit, for every algorithm and float dtype, with shared
/// transforms (value clipping) and per-tensor ones (norm clipping, which
/// cannot share a launch), and across two groups.
#[test]
fn multi_tensor_steps_equal_the_cpu_bit_for_bit() {
    fn check<A: Algorithm>(name: &str, alg: &A, alg2: &A) {
        for dtype in KERNEL_FLOATS {
            for (clip, split) in [
                (Clip::None, false),
                (Clip::Value(0.5), true),
                (Clip::ParamNorm(3.0), false),
            ] {
                let split = split.then_some(alg2);
                let want = many_run(alg, split, clip, dtype, Device::Cpu);
                for dev in cuda_common::devices("multi-tensor optimizer step") {
                    let got = many_run(alg, split, clip, dtype, dev);
                    bit_equal(&format!("{name} {dtype:?} {clip:?} on {dev}"), &want, &got);
                }
            }
        }
    }
    let (sgds, adams) = (sgd_cases(), adam_cases(1e-8));
    for (k, (name, alg)) in sgds.iter().enumerate() {
        check(name, alg, &sgds[(k + 1) % sgds.len()].1);
    }
    for (k, (name, alg)) in adams.iter().enumerate() {
        check(name, alg, &adams[(k + 1) % adams.len()].1);
    }
}

#[test]
fn sum_of_squares_equals_the_cpu_bit_for_bit() {
    for dtype in KERNEL_FLOATS {
        // Fewer elements than lanes, all multiples of 1/8: every square and
        // partial sum is exact, so the sum is Σ((i − 31)/8)² in any order.
        let eighths: Vec<f64> = (0..63).map(|i| (i as f64 - 31.0) / 8.0).collect();
        let small = Tensor::from_vec(eighths, &[7, 9], Device::Cpu)
            .and_then(|t| t.to_dtype(dtype))
            .unwrap();
        let plain = (0..63).map(|i| ((i - 31) * (i - 31)) as f64).sum::<f64>() / 64.0;
        assert_eq!(sum_of_squares(&small).unwrap(), plain);
        // Random values: the f64 sum within rounding of the plain one.
        let odd = rand(&[7, 9], dtype, 3);
        let naive = odd
            .to_f64_vec()
            .unwrap()
            .iter()
            .fold(0.0f64, |a, v| a + v * v);
        let got = sum_of_squares(&odd).unwrap();
        assert!((got - naive).abs() <= 1e-14 * naive, "{got} vs {naive}");
        // More elements than lanes, read through a transposed view.
        let n = 3 * NORM_LANES + 17;
        let big = rand(&[n / 17, 17], dtype, 4).t().unwrap();
        let want = sum_of_squares(&big).unwrap();
        let naive = big
            .to_f64_vec()
            .unwrap()
            .iter()
            .fold(0.0f64, |a, v| a + v * v);
        assert!((want - naive).abs() <= 1e-12 * naive, "{want} vs {naive}");
        assert!(want > 0.1 * n as f64, "{want}");
        for dev in cuda_common::devices("sum_of_squares") {
            let odd_want = sum_of_squares(&odd).unwrap();
            for (t, w) in [(&small, plain), (&odd, odd_want), (&big, want)] {
                let got = sum_of_squares(&t.to_device(dev).unwrap()).unwrap();
                assert_eq!(
                    got.to_bits(),
                    w.to_bits(),
                    "{dtype:?} on {dev}: {got} vs {w}"
                );
            }
            // Layout is honoured: the transposed view's own order.
            let moved = big.to_device(dev).unwrap();
            assert_eq!(sum_of_squares(&moved).unwrap(), want);
        }
    }
}

/// Which path trains.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    /// backward, then `step()`.
    Usual,
    /// `backward_step()` (after `backward_norm_pass` for the global norm).
    Fused,
}

/// What a training run leaves: the parameters (host copies), the ledger's
/// peak and optimizer-state peak on the device, and the state's bytes.
struct Trained {
    params: Vec<Tensor>,
    peak: usize,
    state_peak: usize,
    state_bytes: usize,
}

/// A `[6 → 16 → 16 → 3]` MLP's parameters (weights `[in, out]`, biases),
/// made on the CPU and moved to `dev`, requiring grad.
fn mlp_params(dtype: DType, dev: Device) -> Vec<Tensor> {
    [(6, 16), (16, 16), (16, 3)]
        .iter()
        .enumerate()
        .flat_map(|(i, &(a, b))| {
            let seed = 40 + 2 * i as u64;
            [
                Tensor::rand_range(&[a, b], -0.4, 0.4, dtype, Device::Cpu, seed).unwrap(),
                Tensor::rand_range(&[b], -0.1, 0.1, dtype, Device::Cpu, seed + 1).unwrap(),
            ]
        })
        .map(|t| t.to_device(dev).unwrap().set_requires_grad(true).unwrap())
        .collect()
}

/// Step `step`'s batch: inputs `[5, 6]` and targets `[5, 3]` on `dev`.
fn batch(step: usize, dtype: DType, dev: Device) -> (Tensor, Tensor) {
    let s = 1000 + step as u64;
    let x = Tensor::randn(&[5, 6], dtype, Device::Cpu, s).unwrap();
    let y = Tensor::randn(&[5, 3], dtype, Device::Cpu, s + 500).unwrap();
    (x.to_device(dev).unwrap(), y.to_device(dev).unwrap())
}

/// Mean squared error of the MLP (ReLU between layers) on a batch.
fn loss(ps: &[Tensor], x: &Tensor, y: &Tensor) -> Tensor {
    let mut h = x.clone();
    for (l, pair) in ps.chunks(2).enumerate() {
        h = h.matmul(&pair[0]).unwrap().add(&pair[1]).unwrap();
        if l < 2 {
            h = h.relu().unwrap();
        }
    }
    let d = h.sub(y).unwrap();
    d.mul(&d)
        .unwrap()
        .sum_all()
        .unwrap()
        .mul_scalar(1.0 / 15.0)
        .unwrap()
}

fn train<A: Algorithm>(alg: &A, clip: Clip, path: Path, dtype: DType, dev: Device) -> Trained {
    let ps = mlp_params(dtype, dev);
    let batches: Vec<(Tensor, Tensor)> = (0..STEPS).map(|s| batch(s, dtype, dev)).collect();
    let ledger = Ledger::new();
    let guard = ledger.enter();
    let mut opt = Optimizer::new(ps.clone(), alg.clone()).unwrap();
    opt.set_clip(clip).unwrap();
    for (x, y) in &batches {
        match path {
            Path::Usual => {
                loss(&ps, x, y).backward().unwrap();
                opt.step().unwrap();
                opt.zero_grad();
            }
            Path::Fused => {
                if let Clip::GlobalNorm(_) = clip {
                    let norm = opt.backward_norm_pass(&loss(&ps, x, y)).unwrap();
                    assert!(norm > 0.0);
                }
                opt.backward_step(&loss(&ps, x, y)).unwrap();
            }
        }
        assert!(ps.iter().all(|p| p.grad().is_none()));
    }
    assert_eq!(opt.steps(), STEPS as u64);
    // The peaks first: nothing after this point is part of the run.
    let (peak, state_peak) = (
        ledger.peak(dev),
        ledger.peak_in(dev, Category::OptimizerState),
    );
    let trained = Trained {
        params: ps
            .iter()
            .map(|p| p.detach().to_device(Device::Cpu).unwrap())
            .collect(),
        peak,
        state_peak,
        state_bytes: opt.state_bytes(),
    };
    drop(guard);
    trained
}

/// Tolerance of a trained parameter against the CPU's, relative to the
/// tensor's largest magnitude: the devices' forwards and backwards round
/// differently (GEMM order), and five steps carry that along.
fn train_tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 1e-2,
        _ => 4e-2,
    }
}

fn close(what: &str, want: &[Tensor], got: &[Tensor], t: f64) {
    for (k, (w, g)) in want.iter().zip(got).enumerate() {
        assert_eq!(w.shape(), g.shape(), "{what}: param {k}");
        let (w, g) = (w.to_f64_vec().unwrap(), g.to_f64_vec().unwrap());
        let big = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (i, (a, b)) in w.iter().zip(&g).enumerate() {
            assert!(
                (a - b).abs() <= t * big,
                "{what}: param {k} element {i}: cpu {a} vs {b}"
            );
        }
    }
}

fn same_bits(a: &[Tensor], b: &[Tensor]) -> bool {
    a.iter().zip(b).all(|(x, y)| {
        let (x, y) = (x.to_f64_vec().unwrap(), y.to_f64_vec().unwrap());
        x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits())
    })
}

const CLIPS: [Clip; 4] = [
    Clip::None,
    Clip::Value(0.05),
    Clip::ParamNorm(0.2),
    Clip::GlobalNorm(0.3),
];

fn check_training<A: Algorithm>(name: &str, alg: &A) {
    for dtype in device_common::FLOATS {
        let unclipped = train(alg, Clip::None, Path::Usual, dtype, Device::Cpu);
        for clip in CLIPS {
            let usual = train(alg, clip, Path::Usual, dtype, Device::Cpu);
            let fused = train(alg, clip, Path::Fused, dtype, Device::Cpu);
            let what = format!("{name} {dtype:?} {clip:?}");
            // The fused path equals the usual one bit for bit on the CPU,
            // and every clipping mode bites on this model.
            assert!(
                same_bits(&usual.params, &fused.params),
                "{what}: fused vs usual"
            );
            if clip != Clip::None {
                assert!(
                    !same_bits(&usual.params, &unclipped.params),
                    "{what}: no effect"
                );
            }
            assert!(usual.state_bytes == fused.state_bytes && usual.peak > 0);
            for dev in cuda_common::devices("optimizer training") {
                for (path, cpu) in [(Path::Usual, &usual), (Path::Fused, &fused)] {
                    let got = train(alg, clip, path, dtype, dev);
                    let what = format!("{what} {path:?} on {dev}");
                    close(&what, &cpu.params, &got.params, train_tol(dtype));
                    assert_eq!(got.peak, cpu.peak, "{what}: ledger peak");
                    assert_eq!(got.state_peak, cpu.state_peak, "{what}: state peak");
                    assert_eq!(got.state_bytes, cpu.state_bytes, "{what}: state bytes");
                }
            }
        }
    }
}

#[test]
fn sgd_training_on_every_device_matches_the_cpu() {
    for (name, alg) in sgd_cases() {
        check_training(name, &alg);
    }
}

#[test]
fn adam_training_on_every_device_matches_the_cpu() {
    for (name, alg) in adam_cases(1e-2) {
        check_training(name, &alg);
    }
}

#[test]
fn optimizer_state_lives_on_the_parameter_device_and_counts_exactly() {
    for dev in cuda_common::devices("optimizer state") {
        for dtype in device_common::FLOATS {
            let amsgrad = Adam::adamw(0.01).amsgrad(true);
            let run = train(&amsgrad, Clip::None, Path::Fused, dtype, dev);
            let numel: usize = mlp_params(dtype, Device::Cpu)
                .iter()
                .map(|p| p.numel())
                .sum();
            let want = 3 * numel * dtype.size_in_bytes();
            assert_eq!(run.state_bytes, want, "{dtype:?} on {dev}");
            assert_eq!(run.state_peak, want, "{dtype:?} on {dev}");
            let plain = train(&Sgd::new(0.1), Clip::None, Path::Fused, dtype, dev);
            assert_eq!((plain.state_bytes, plain.state_peak), (0, 0));
        }
    }
}

/// An optimizer with compact state on a device: three steps (usual and
/// fused) of a 5000-element parameter (three quantisation blocks) and a
/// 40-element one (under the 8-bit threshold: full state) whose gradients
/// are exact give the CPU's parameters and state bit for bit, the same
/// state bytes, and state that lives on the device.
#[test]
fn compact_state_optimizer_on_every_device_equals_the_cpu() {
    fn run(format: StateFormat, fused: bool, dev: Device) -> (Vec<Vec<f64>>, usize, usize) {
        let ps: Vec<Tensor> = [5000usize, 40]
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                rand(&[n], DType::F32, 70 + i as u64)
                    .to_device(dev)
                    .and_then(|t| t.set_requires_grad(true))
                    .unwrap()
            })
            .collect();
        let ledger = Ledger::new();
        let guard = ledger.enter();
        let mut opt = Optimizer::new(ps.clone(), Adam::adamw(0.01).amsgrad(true)).unwrap();
        opt.set_state_format(format).unwrap();
        for step in 0..3u64 {
            let mut loss: Option<Tensor> = None;
            for (i, p) in ps.iter().enumerate() {
                let c = rand(&[p.numel()], DType::F32, 80 + 2 * step + i as u64);
                let term = p
                    .mul(&c.to_device(dev).unwrap())
                    .unwrap()
                    .sum_all()
                    .unwrap();
                loss = Some(match loss {
                    None => term,
                    Some(l) => l.add(&term).unwrap(),
                });
            }
            let loss = loss.unwrap();
            if fused {
                opt.backward_step(&loss).unwrap();
            } else {
                loss.backward().unwrap();
                opt.step().unwrap();
                opt.zero_grad();
            }
        }
        let state_peak = ledger.peak_in(dev, Category::OptimizerState);
        drop(guard);
        let mut out: Vec<Vec<f64>> = ps.iter().map(|p| p.to_f64_vec().unwrap()).collect();
        let sd = opt.state_dict().unwrap();
        for s in sd.state.values() {
            for t in s.tensors.values() {
                assert_eq!(t.device(), dev);
                out.push(t.to_f64_vec().unwrap());
            }
        }
        (out, opt.state_bytes(), state_peak)
    }
    for format in [StateFormat::Bf16, StateFormat::Blockwise8] {
        let want = run(format, false, Device::Cpu);
        let full = run(StateFormat::Full, false, Device::Cpu);
        assert!(
            want.1 <= full.1 / 2,
            "{format}: {} vs {} bytes",
            want.1,
            full.1
        );
        assert_eq!(want.2, want.1, "{format}: ledger counts the state");
        for fused in [false, true] {
            for dev in cuda_common::devices("compact optimizer state") {
                let got = run(format, fused, dev);
                let what = format!("{format} fused {fused} on {dev}");
                bit_equal(&what, &want.0, &got.0);
                assert_eq!((got.1, got.2), (want.1, want.2), "{what}: state bytes");
            }
        }
    }
}

/// `.grad` of a `[6, 40]` parameter after backward of `Σ pᵀ ⊙ w`: exactly
/// `wᵀ` on every device (no arithmetic touches it), possibly strided.
fn leaf_with_grad(dtype: DType, dev: Device) -> Tensor {
    let p = rand(&[6, 40], dtype, 60)
        .to_device(dev)
        .and_then(|t| t.set_requires_grad(true))
        .unwrap();
    let w = rand(&[40, 6], dtype, 61).to_device(dev).unwrap();
    let loss = p.t().unwrap().mul(&w).unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    p
}

#[test]
fn clip_grad_value_and_norm_on_every_device_equal_the_cpu() {
    use leangrad::optim::{clip_grad_norm, clip_grad_value, total_norm};
    for dtype in KERNEL_FLOATS {
        let want_grad = rand(&[40, 6], dtype, 61).t().unwrap().to_f64_vec().unwrap();
        // With `read`, the gradient's values after each stage; without, the
        // ledger's peak (reading a strided device tensor copies it).
        let run = |dev: Device, read: bool| {
            let ledger = Ledger::new();
            let _g = ledger.enter();
            let p = leaf_with_grad(dtype, dev);
            let snap = || match read {
                true => p.grad().unwrap().to_f64_vec().unwrap(),
                false => Vec::new(),
            };
            let grad = snap();
            let norm = total_norm(std::slice::from_ref(&p)).unwrap();
            clip_grad_value(std::slice::from_ref(&p), 0.3).unwrap();
            let clamped = snap();
            let clipped_norm = clip_grad_norm(std::slice::from_ref(&p), 0.5).unwrap();
            let scaled = snap();
            (grad, norm, clamped, clipped_norm, scaled, ledger.peak(dev))
        };
        let cpu = run(Device::Cpu, true);
        let cpu_peak = run(Device::Cpu, false).5;
        assert!(cpu_peak > 0);
        assert_eq!(cpu.0, want_grad, "{dtype:?}: the gradient is wᵀ");
        assert!(cpu.2.iter().all(|v| v.abs() <= 0.3 + 1e-3) && cpu.2 != cpu.0);
        let scaled_norm = cpu.4.iter().map(|v| v * v).sum::<f64>().sqrt();
        assert!((scaled_norm - 0.5).abs() < 0.01, "{dtype:?}: {scaled_norm}");
        for dev in cuda_common::devices("clip helpers") {
            let got = run(dev, true);
            let what = format!("{dtype:?} on {dev}");
            assert_eq!(got.0, cpu.0, "{what}: gradient");
            assert_eq!(got.1.to_bits(), cpu.1.to_bits(), "{what}: total norm");
            assert_eq!(got.2, cpu.2, "{what}: clip_grad_value");
            assert_eq!(got.3.to_bits(), cpu.3.to_bits(), "{what}: clipped norm");
            // The scaling is `mul_scalar`, whose CUDA kernel need not round
            // half types exactly as the CPU does: compared with tolerance.
            let t = device_common::tol(dtype);
            for (a, b) in cpu.4.iter().zip(&got.4) {
                assert!((a - b).abs() <= t * a.abs().max(1e-3), "{what}: {a} vs {b}");
            }
            assert_eq!(run(dev, false).5, cpu_peak, "{what}: ledger peak");
        }
    }
}
