//! The fused path (update inside backward) against the usual path
//! (backward, then step): bit-identical parameters for every algorithm,
//! accumulation and clipping mode; and the ledger's exact peaks.
use leangrad::memory::{Category, Ledger};
use leangrad::nn::{Linear, Module};
use leangrad::ops::Reduction;
use leangrad::optim::{Adam, Algorithm, Clip, FusedStep, Optimizer, Sgd};
use leangrad::{DType, Device, Tensor};

const CPU: Device = Device::Cpu;
const STEPS: usize = 5;

/// A small MLP, identical for every seed-equal call.
fn small_mlp() -> Vec<Linear> {
    [(6, 16), (16, 16), (16, 3)]
        .iter()
        .enumerate()
        .map(|(i, &(a, b))| {
            Linear::builder(a, b)
                .name(&format!("fc{i}"))
                .seed(40 + i as u64)
                .build(&CPU)
                .unwrap()
        })
        .collect()
}

fn params(layers: &[Linear]) -> Vec<Tensor> {
    layers.iter().flat_map(|l| l.parameters()).collect()
}

/// The loss of micro-batch `micro` of step `step`.
fn loss(layers: &[Linear], step: usize, micro: usize) -> Tensor {
    let seed = 1000 + 10 * step as u64 + micro as u64;
    let x = Tensor::randn(&[5, 6], DType::F32, CPU, seed).unwrap();
    let y = Tensor::randn(&[5, 3], DType::F32, CPU, seed + 500).unwrap();
    let mut h = x;
    for (i, l) in layers.iter().enumerate() {
        h = l.forward(&h).unwrap();
        if i + 1 < layers.len() {
            h = h.relu().unwrap();
        }
    }
    h.mse_loss(&y, Reduction::Mean).unwrap()
}

fn bits(ps: &[Tensor]) -> Vec<Vec<u32>> {
    ps.iter()
        .map(|p| {
            p.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect()
}

/// How the usual path clips with the global norm.
#[derive(Clone, Copy, PartialEq)]
enum UsualGlobal {
    /// `Clip::GlobalNorm` in `step()` (norm over the collected grads).
    InStep,
    /// `Clip::None` and `clip_grad_norm` over the collected grads first.
    ClipGradNorm,
}

fn usual<A: Algorithm>(hyper: &A, clip: Clip, k: usize, global: UsualGlobal) -> Vec<Vec<u32>> {
    let layers = small_mlp();
    let ps = params(&layers);
    let mut opt = Optimizer::new(ps.clone(), hyper.clone()).unwrap();
    let max_norm = match (clip, global) {
        (Clip::GlobalNorm(m), UsualGlobal::ClipGradNorm) => {
            opt.set_clip(Clip::None).unwrap();
            Some(m)
        }
        _ => {
            opt.set_clip(clip).unwrap();
            None
        }
    };
    for step in 0..STEPS {
        for micro in 0..k {
            loss(&layers, step, micro).backward().unwrap();
        }
        if let Some(m) = max_norm {
            opt.clip_grad_norm(m).unwrap();
        }
        opt.step().unwrap();
        opt.zero_grad();
        assert!(ps.iter().all(|p| p.grad().is_none()));
    }
    bits(&ps)
}

fn fused<A: Algorithm>(hyper: &A, clip: Clip, k: usize) -> Vec<Vec<u32>> {
    let layers = small_mlp();
    let ps = params(&layers);
    let mut opt = Optimizer::new(ps.clone(), hyper.clone()).unwrap();
    opt.set_clip(clip).unwrap();
    opt.set_accumulation(k).unwrap();
    for step in 0..STEPS {
        if let Clip::GlobalNorm(_) = clip {
            let norm = opt.backward_norm_pass(&loss(&layers, step, 0)).unwrap();
            assert!(norm > 0.0);
        }
        for micro in 0..k {
            let outcome = opt.backward_step(&loss(&layers, step, micro)).unwrap();
            if micro + 1 < k {
                assert_eq!(
                    outcome,
                    FusedStep::Accumulated {
                        micro_batch: micro + 1,
                        of: k
                    }
                );
                assert!(opt.accumulation_bytes() > 0);
            } else {
                assert_eq!(outcome, FusedStep::Updated);
                assert_eq!(opt.accumulation_bytes(), 0);
            }
        }
        assert!(ps.iter().all(|p| p.grad().is_none()), "no .grad is kept");
    }
    assert_eq!(opt.steps(), STEPS as u64);
    bits(&ps)
}

/// A named check: runs both paths for a clipping mode and `k`.
type Case = (&'static str, Box<dyn Fn(Clip, usize)>);

fn algorithms() -> Vec<Case> {
    fn case<A: Algorithm + 'static>(name: &'static str, a: A) -> Case {
        (
            name,
            Box::new(move |clip, k| {
                let f = fused(&a, clip, k);
                let u = usual(&a, clip, k, UsualGlobal::InStep);
                assert_eq!(f, u, "{name}, {clip:?}, k = {k}: fused vs usual");
                if let Clip::GlobalNorm(_) = clip {
                    let c = usual(&a, clip, k, UsualGlobal::ClipGradNorm);
                    assert_eq!(f, c, "{name}, k = {k}: fused two-pass vs clip_grad_norm");
                }
                let start = bits(&params(&small_mlp()));
                assert_ne!(f, start, "{name}: the parameters moved");
            }),
        )
    }
    vec![
        case("sgd", Sgd::new(0.1)),
        case("sgd momentum", Sgd::new(0.1).momentum(0.9).dampening(0.1)),
        case("sgd nesterov", Sgd::new(0.1).momentum(0.9).nesterov(true)),
        case(
            "sgd weight decay",
            Sgd::new(0.1).momentum(0.5).weight_decay(0.01),
        ),
        case("adam", Adam::new(0.01)),
        case("adam l2", Adam::new(0.01).weight_decay(0.1)),
        case("adamw", Adam::adamw(0.01)),
        case("amsgrad", Adam::new(0.01).amsgrad(true)),
        case(
            "adamw amsgrad",
            Adam::adamw(0.01).amsgrad(true).betas(0.6, 0.9),
        ),
    ]
}

#[test]
fn fused_equals_usual_bit_for_bit() {
    for (_name, run) in algorithms() {
        for k in [1, 3] {
            run(Clip::None, k);
        }
    }
}

#[test]
fn fused_equals_usual_with_clipping() {
    for (_name, run) in algorithms() {
        for k in [1, 3] {
            run(Clip::Value(0.02), k);
            run(Clip::ParamNorm(0.05), k);
        }
        run(Clip::GlobalNorm(0.1), 1);
    }
}

#[test]
fn clipping_changes_the_result() {
    let a = Sgd::new(0.1);
    let none = fused(&a, Clip::None, 1);
    assert_ne!(none, fused(&a, Clip::Value(0.02), 1));
    assert_ne!(none, fused(&a, Clip::ParamNorm(0.05), 1));
    assert_ne!(none, fused(&a, Clip::GlobalNorm(0.1), 1));
}

#[test]
fn fused_global_norm_needs_its_first_pass_and_no_accumulation() {
    let layers = small_mlp();
    let mut opt = Optimizer::new(params(&layers), Sgd::new(0.1)).unwrap();
    opt.set_clip(Clip::GlobalNorm(1.0)).unwrap();
    assert!(opt.backward_step(&loss(&layers, 0, 0)).is_err());
    let mut opt = Optimizer::new(params(&layers), Sgd::new(0.1)).unwrap();
    opt.set_clip(Clip::GlobalNorm(1.0)).unwrap();
    opt.set_accumulation(2).unwrap();
    assert!(opt.backward_norm_pass(&loss(&layers, 0, 0)).is_err());
}

// ---------------------------------------------------------------------------
// The ledger on a 20-layer MLP.

const LAYERS: usize = 20;
const WIDTH: usize = 32;
const BATCH: usize = 8;
/// One activation gradient `[BATCH, WIDTH]` in f32.
const ACT: usize = BATCH * WIDTH * 4;
/// One weight gradient `[WIDTH, WIDTH]` in f32: the largest parameter gradient.
const WEIGHT: usize = WIDTH * WIDTH * 4;
/// One bias gradient.
const BIAS: usize = WIDTH * 4;

fn deep_mlp() -> Vec<Linear> {
    (0..LAYERS)
        .map(|i| {
            Linear::builder(WIDTH, WIDTH)
                .name(&format!("fc{i}"))
                .seed(200 + i as u64)
                .build(&CPU)
                .unwrap()
        })
        .collect()
}

fn deep_loss(layers: &[Linear], seed: u64) -> Tensor {
    let mut h = Tensor::randn(&[BATCH, WIDTH], DType::F32, CPU, seed).unwrap();
    for (i, l) in layers.iter().enumerate() {
        h = l.forward(&h).unwrap();
        if i + 1 < layers.len() {
            h = h.relu().unwrap();
        }
    }
    h.sum_all().unwrap()
}

fn param_bytes(ps: &[Tensor]) -> usize {
    ps.iter().map(|p| p.storage_bytes()).sum()
}

/// Peak gradient bytes, derived from the engine's rules (the input does not
/// require grad). Walking backward one layer `i` (from the top):
/// - add (bias): passes the incoming activation gradient `g` (ACT) on to
///   the matmul without a copy, and makes the bias gradient (BIAS), final
///   at once.
/// - matmul: while `g` is alive it makes `ga = g·W` (ACT, not for layer 0,
///   whose input needs no grad) and then `gw = hᵀ·g` (WEIGHT); `g` is freed
///   when the node returns; `gw` reaches the weight (through the transpose,
///   a view) and is final there.
/// - relu: makes its output gradient (ACT) from `g` (ACT).
///
/// Fused: every parameter gradient is dropped the moment it is final, so
/// the most ever alive is at a middle layer's matmul: `g + ga + gw`,
/// i.e. 2·ACT + WEIGHT — the largest single parameter gradient plus two
/// activation gradients in flight. (sum's backward: seed + ACT; relu:
/// 2·ACT; bias: ACT + BIAS; all smaller.)
fn expected_fused_peak() -> usize {
    2 * ACT + WEIGHT
}

/// Usual: the collected gradients stay. The most is reached at layer 0's
/// matmul: every parameter gradient but layer 0's weight is collected,
/// `g` (ACT) is in flight and the weight's gradient (WEIGHT) is being made:
/// all parameter gradients plus one activation gradient. (At layer 1's
/// matmul it is all but layer 0's parameters plus 2·ACT, smaller since a
/// layer's parameters outweigh one activation gradient.)
fn expected_usual_peak(params: usize) -> usize {
    let at_layer0 = params + ACT;
    let at_layer1 = params - (WEIGHT + BIAS) + 2 * ACT;
    at_layer0.max(at_layer1)
}

#[test]
fn peak_gradient_bytes_fused_vs_usual() {
    for alg in ["sgd", "adam"] {
        let ledger = Ledger::new();
        let _g = ledger.enter();
        let layers = deep_mlp();
        let ps = params(&layers);
        let total = param_bytes(&ps);
        assert_eq!(total, LAYERS * (WEIGHT + BIAS));

        // Fused.
        let mut sgd = Optimizer::new(ps.clone(), Sgd::new(0.01).momentum(0.9)).unwrap();
        let mut adam = Optimizer::new(ps.clone(), Adam::new(0.001)).unwrap();
        for step in 0..2 {
            let loss = deep_loss(&layers, 7 + step);
            ledger.reset_peak();
            match alg {
                "sgd" => sgd.backward_step(&loss).unwrap(),
                _ => adam.backward_step(&loss).unwrap(),
            };
            let peak = ledger.peak_gradients(CPU);
            assert_eq!(peak, expected_fused_peak(), "{alg} fused, step {step}");
            // Of those, gradients that reached a parameter: one at a time,
            // the largest single parameter gradient.
            assert_eq!(
                ledger.peak_in(CPU, Category::ParameterGradient),
                WEIGHT,
                "{alg} fused, step {step}"
            );
            assert_eq!(ledger.live_gradients(CPU), 0);
            println!("{alg} fused peak gradient bytes: {peak}");
        }
        drop(sgd);
        drop(adam);

        // Usual.
        let mut opt = Optimizer::new(ps.clone(), Sgd::new(0.01)).unwrap();
        let loss = deep_loss(&layers, 9);
        ledger.reset_peak();
        loss.backward().unwrap();
        let peak = ledger.peak_gradients(CPU);
        assert_eq!(peak, expected_usual_peak(total), "usual");
        // Every parameter gradient is kept: their sum.
        assert_eq!(
            ledger.peak_in(CPU, Category::ParameterGradient),
            total,
            "usual"
        );
        assert_eq!(ledger.live_gradients(CPU), total);
        println!("usual peak gradient bytes: {peak} (parameters: {total})");
        opt.step().unwrap();
        opt.zero_grad();
        assert_eq!(ledger.live_gradients(CPU), 0);
    }
}

#[test]
fn optimizer_state_bytes_are_exact_and_lazy() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let mut layers = deep_mlp();
    // Freeze the first two layers: they get no state and no update.
    for l in &mut layers[..2] {
        l.weight = l.weight.detach();
        l.bias = l.bias.as_ref().map(|b| b.detach());
    }
    let ps = params(&layers);
    let trainable = param_bytes(&ps[4..]);
    let frozen_before = bits_f32(&ps[..4]);

    fn check<A: Algorithm>(
        ledger: &Ledger,
        layers: &[Linear],
        ps: &[Tensor],
        hyper: A,
        expected: usize,
        fused: bool,
    ) {
        let before = ledger.live_in(CPU, Category::OptimizerState);
        let mut opt = Optimizer::new(ps.to_vec(), hyper).unwrap();
        assert_eq!(opt.state_bytes(), 0, "state is created lazily");
        for step in 0..2 {
            let loss = deep_loss(layers, 30 + step);
            if fused {
                opt.backward_step(&loss).unwrap();
            } else {
                loss.backward().unwrap();
                opt.step().unwrap();
                opt.zero_grad();
            }
        }
        assert_eq!(opt.state_bytes(), expected);
        assert_eq!(
            ledger.live_in(CPU, Category::OptimizerState) - before,
            expected
        );
        drop(opt);
        assert_eq!(ledger.live_in(CPU, Category::OptimizerState), before);
    }
    for fused in [true, false] {
        check(&ledger, &layers, &ps, Sgd::new(0.01), 0, fused);
        check(
            &ledger,
            &layers,
            &ps,
            Sgd::new(0.01).momentum(0.9),
            trainable,
            fused,
        );
        check(
            &ledger,
            &layers,
            &ps,
            Adam::new(0.001),
            2 * trainable,
            fused,
        );
        check(
            &ledger,
            &layers,
            &ps,
            Adam::adamw(0.001),
            2 * trainable,
            fused,
        );
        check(
            &ledger,
            &layers,
            &ps,
            Adam::new(0.001).amsgrad(true),
            3 * trainable,
            fused,
        );
    }
    assert_eq!(
        bits_f32(&ps[..4]),
        frozen_before,
        "frozen parameters did not move"
    );
    println!(
        "trainable parameter bytes {trainable}: adam state {}",
        2 * trainable
    );
}

fn bits_f32(ps: &[Tensor]) -> Vec<Vec<u32>> {
    bits(ps)
}

#[test]
fn accumulation_buffers_count_as_gradients() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let layers = deep_mlp();
    let ps = params(&layers);
    let total = param_bytes(&ps);
    let mut opt = Optimizer::new(ps.clone(), Adam::new(0.001)).unwrap();
    opt.set_accumulation(3).unwrap();
    for micro in 0..3 {
        let loss = deep_loss(&layers, 50 + micro);
        opt.backward_step(&loss).unwrap();
        let live = ledger.live_gradients(CPU);
        if micro < 2 {
            assert_eq!(opt.accumulation_bytes(), total);
            assert_eq!(live, total, "one buffer per parameter");
        } else {
            assert_eq!(live, 0, "freed after the update");
        }
    }
}

/// The two passes of fused global-norm clipping each peak like one fused
/// backward: no gradient outlives its sink call.
#[test]
fn global_norm_two_pass_keeps_the_fused_peak() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let layers = deep_mlp();
    let mut opt = Optimizer::new(params(&layers), Adam::new(0.001)).unwrap();
    opt.set_clip(Clip::GlobalNorm(0.5)).unwrap();
    for step in 0..2 {
        let first = deep_loss(&layers, 60 + step);
        ledger.reset_peak();
        let norm = opt.backward_norm_pass(&first).unwrap();
        assert!(norm > 0.5, "clipping engages: {norm}");
        assert_eq!(ledger.peak_gradients(CPU), expected_fused_peak());
        assert_eq!(ledger.live_gradients(CPU), 0);
        let second = deep_loss(&layers, 60 + step);
        ledger.reset_peak();
        opt.backward_step(&second).unwrap();
        assert_eq!(ledger.peak_gradients(CPU), expected_fused_peak());
        assert_eq!(ledger.live_gradients(CPU), 0);
    }
}

/// The k-th micro-batch of fused accumulation starts with every buffer
/// alive (all parameter gradients, P) and frees each as its parameter is
/// updated. Its peak is at the top layer's matmul: the top bias's buffer is
/// already freed, the rest are alive, and `g`, `ga` (2·ACT) and the new
/// weight gradient (WEIGHT, added into its buffer when final) are in
/// flight: P − BIAS + 2·ACT + WEIGHT.
#[test]
fn last_micro_batch_peak_is_the_buffers_plus_the_fused_peak() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let layers = deep_mlp();
    let ps = params(&layers);
    let total = param_bytes(&ps);
    let mut opt = Optimizer::new(ps, Sgd::new(0.01).momentum(0.9)).unwrap();
    opt.set_accumulation(3).unwrap();
    for micro in 0..3 {
        let loss = deep_loss(&layers, 70 + micro);
        ledger.reset_peak();
        opt.backward_step(&loss).unwrap();
        if micro == 2 {
            assert_eq!(
                ledger.peak_gradients(CPU),
                total - BIAS + expected_fused_peak()
            );
            // Parameter gradients: the buffers (all but the top bias's, freed
            // first) plus the one weight gradient being added in.
            assert_eq!(
                ledger.peak_in(CPU, Category::ParameterGradient),
                total - BIAS + WEIGHT
            );
        }
    }
    assert_eq!(ledger.live_gradients(CPU), 0);
}
