//! Optimizers against PyTorch (Adam losses, LR schedules, read from the
//! fixtures python-compare/*.py wrote), against hand-computed updates, and
//! their API rules (groups, frozen parameters, errors).
use leangrad::memory::{Category, Ledger};
use leangrad::nn::{Linear, Module};
use leangrad::ops::Reduction;
use leangrad::optim::{Adam, Algorithm, Clip, LrScheduler, Optimizer, Schedule, SequentialLr, Sgd};
use leangrad::{DType, Device, Tensor};
use serde_json::Value;

mod common;

const CPU: Device = Device::Cpu;

fn fixture(name: &str) -> Value {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR is set by cargo");
    let path = std::path::Path::new(&dir).join("tests/fixtures").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap()
}

fn numbers(v: &Value) -> Vec<f64> {
    match v {
        Value::Array(items) => items.iter().flat_map(numbers).collect(),
        Value::Number(n) => vec![n.as_f64().unwrap()],
        other => panic!("not a number: {other}"),
    }
}

fn f64_tensor(v: &Value, shape: &[usize]) -> Tensor {
    Tensor::from_f64_slice(&numbers(v), shape, DType::F64, CPU).unwrap()
}

fn linear(name: &str, w: &Value, b: &Value, inp: usize, out: usize) -> Linear {
    let mut l = Linear::builder(inp, out)
        .name(name)
        .dtype(DType::F64)
        .build(&CPU)
        .unwrap();
    l.weight = f64_tensor(w, &[out, inp]).into_parameter().unwrap();
    l.bias = Some(f64_tensor(b, &[out]).into_parameter().unwrap());
    l
}

/// Runs the model of python-compare/adam_reference.py (f64, like the
/// script: Linear(4→8), tanh, Linear(8→3), MSE (mean) on its fixed data)
/// on both paths and checks the loss before each step against PyTorch's,
/// within 1e-5 relative. Returns the largest relative difference seen.
fn check_against_torch<A: Algorithm>(f: &Value, hyper: A, expected: &[f64], name: &str) -> f64 {
    let x = f64_tensor(&f["x"], &[6, 4]);
    let y = f64_tensor(&f["y"], &[6, 3]);
    let mut worst = 0.0f64;
    for fused in [false, true] {
        let fc1 = linear("fc1", &f["w1"], &f["b1"], 4, 8);
        let fc2 = linear("fc2", &f["w2"], &f["b2"], 8, 3);
        let ps: Vec<Tensor> = fc1
            .parameters()
            .into_iter()
            .chain(fc2.parameters())
            .collect();
        let mut opt = Optimizer::new(ps, hyper.clone()).unwrap();
        for (step, &want) in expected.iter().enumerate() {
            let h = fc1.forward(&x).unwrap().tanh().unwrap();
            let loss = fc2
                .forward(&h)
                .unwrap()
                .mse_loss(&y, Reduction::Mean)
                .unwrap();
            let got = loss.to_scalar().unwrap();
            worst = worst.max((got - want).abs() / want.abs());
            assert!(
                (got - want).abs() <= 1e-5 * want.abs(),
                "{name}, fused={fused}, step {step}: leangrad {got} vs torch {want}"
            );
            if fused {
                opt.backward_step(&loss).unwrap();
            } else {
                loss.backward().unwrap();
                opt.step().unwrap();
                opt.zero_grad();
            }
        }
    }
    println!("{name}: largest relative difference to torch {worst:e}");
    worst
}

/// 20 Adam steps: the loss before each equals PyTorch's within 1e-5
/// relative (f64 throughout; in practice about 1e-15).
#[test]
fn adam_matches_pytorch_losses() {
    let f = fixture("adam_reference.json");
    assert_eq!(f["dtype"], "f64");
    let betas = numbers(&f["betas"]);
    let hyper = Adam::new(f["lr"].as_f64().unwrap())
        .betas(betas[0], betas[1])
        .eps(f["eps"].as_f64().unwrap())
        .weight_decay(f["weight_decay"].as_f64().unwrap());
    let expected = numbers(&f["losses"]);
    assert_eq!(expected.len(), 20);
    check_against_torch(&f, hyper, &expected, "adam");
}

/// AdamW + amsgrad, Adam with L2 and other betas, SGD with Nesterov and
/// weight decay, SGD with dampening: the same model, against PyTorch.
#[test]
fn other_algorithms_match_pytorch_losses() {
    let f = fixture("adam_reference.json");
    let extra = &f["extra"];
    let runs = [
        "adamw_lr0.05_wd0.1_amsgrad",
        "adam_lr0.02_wd0.05_betas0.8_0.99",
        "sgd_lr0.1_momentum0.9_nesterov_wd0.01",
        "sgd_lr0.1_momentum0.5_dampening0.2",
    ];
    for name in runs {
        let expected = numbers(&extra[name]);
        assert_eq!(expected.len(), 20, "{name}");
        match name {
            "adamw_lr0.05_wd0.1_amsgrad" => check_against_torch(
                &f,
                Adam::adamw(0.05).weight_decay(0.1).amsgrad(true),
                &expected,
                name,
            ),
            "adam_lr0.02_wd0.05_betas0.8_0.99" => check_against_torch(
                &f,
                Adam::new(0.02).weight_decay(0.05).betas(0.8, 0.99),
                &expected,
                name,
            ),
            "sgd_lr0.1_momentum0.9_nesterov_wd0.01" => check_against_torch(
                &f,
                Sgd::new(0.1)
                    .momentum(0.9)
                    .nesterov(true)
                    .weight_decay(0.01),
                &expected,
                name,
            ),
            _ => check_against_torch(
                &f,
                Sgd::new(0.1).momentum(0.5).dampening(0.2),
                &expected,
                name,
            ),
        };
    }
}

fn run_schedule(
    make: impl Fn(&mut Optimizer<Sgd>) -> Box<dyn FnMut(&mut Optimizer<Sgd>)>,
) -> Vec<f64> {
    let p = Tensor::zeros(&[1], DType::F32, CPU)
        .unwrap()
        .into_parameter()
        .unwrap();
    let mut opt = Optimizer::new([p], Sgd::new(0.1)).unwrap();
    let mut step = make(&mut opt);
    (0..25)
        .map(|_| {
            let lr = opt.lrs()[0];
            step(&mut opt);
            lr
        })
        .collect()
}

/// Advances a schedule by one epoch.
type Stepper = Box<dyn FnMut(&mut Optimizer<Sgd>)>;

fn single(s: Schedule) -> impl Fn(&mut Optimizer<Sgd>) -> Stepper {
    move |opt| {
        let mut sched = LrScheduler::new(opt, s.clone()).unwrap();
        Box::new(move |opt| sched.step(opt).unwrap())
    }
}

fn assert_lrs(name: &str, got: &[f64], want: &Value) {
    let want = numbers(want);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-15 * w.abs(),
            "{name} step {i}: {g} vs torch {w}"
        );
    }
}

#[test]
fn lr_schedules_match_pytorch() {
    let f = fixture("lr_schedules.json");
    assert_eq!(f["base_lr"].as_f64().unwrap(), 0.1);
    let step = run_schedule(single(Schedule::Step {
        step_size: 4,
        gamma: 0.5,
    }));
    assert_lrs("step", &step, &f["step"]);
    let cosine = run_schedule(single(Schedule::Cosine {
        t_max: 10,
        eta_min: 0.001,
    }));
    assert_lrs("cosine", &cosine, &f["cosine"]);
    let linear = run_schedule(single(Schedule::Linear {
        start_factor: 0.1,
        end_factor: 1.0,
        total_iters: 5,
    }));
    assert_lrs("linear", &linear, &f["linear"]);
    let warmup_cosine = run_schedule(|opt| {
        let mut s = SequentialLr::new(
            opt,
            vec![
                Schedule::Linear {
                    start_factor: 0.1,
                    end_factor: 1.0,
                    total_iters: 5,
                },
                Schedule::Cosine {
                    t_max: 15,
                    eta_min: 0.001,
                },
            ],
            vec![5],
        )
        .unwrap();
        Box::new(move |opt| s.step(opt).unwrap())
    });
    assert_lrs("warmup_cosine", &warmup_cosine, &f["warmup_cosine"]);
}

fn scalar_param(v: f64) -> Tensor {
    Tensor::from_f64_slice(&[v], &[1], DType::F64, CPU)
        .unwrap()
        .into_parameter()
        .unwrap()
}

/// d(w²/2)/dw = w: hand-computed SGD with momentum and Nesterov.
#[test]
fn sgd_momentum_and_nesterov_by_hand() {
    for nesterov in [false, true] {
        let w = scalar_param(1.0);
        let mut opt =
            Optimizer::new([w.clone()], Sgd::new(0.1).momentum(0.5).nesterov(nesterov)).unwrap();
        let (mut x, mut buf) = (1.0f64, 0.0f64);
        for step in 0..4 {
            let loss = w
                .mul(&w)
                .unwrap()
                .sum_all()
                .unwrap()
                .mul_scalar(0.5)
                .unwrap();
            opt.backward_step(&loss).unwrap();
            let g = x;
            buf = if step == 0 { g } else { buf * 0.5 + g };
            let d = if nesterov { g + 0.5 * buf } else { buf };
            x -= 0.1 * d;
            assert!(
                (w.to_scalar().unwrap() - x).abs() < 1e-15,
                "nesterov={nesterov} step {step}"
            );
        }
    }
}

#[test]
fn parameter_groups_have_their_own_hyper_parameters() {
    let a = scalar_param(1.0);
    let b = scalar_param(1.0);
    let mut opt = Optimizer::new([a.clone()], Sgd::new(0.1)).unwrap();
    opt.add_param_group([b.clone()], Sgd::new(0.01)).unwrap();
    assert_eq!(opt.lrs(), vec![0.1, 0.01]);
    let loss = a.add(&b).unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    opt.step().unwrap();
    assert_eq!(a.to_scalar().unwrap(), 1.0 - 0.1);
    assert_eq!(b.to_scalar().unwrap(), 1.0 - 0.01);
    // The same parameter in two groups is refused.
    assert!(opt.add_param_group([a.clone()], Sgd::new(0.1)).is_err());
    // A scheduler scales every group from its own base rate.
    let mut s = LrScheduler::new(
        &mut opt,
        Schedule::Step {
            step_size: 1,
            gamma: 0.5,
        },
    )
    .unwrap();
    s.step(&mut opt).unwrap();
    assert_eq!(opt.lrs(), vec![0.05, 0.005]);
}

#[test]
fn invalid_hyper_parameters_are_typed_errors() {
    let p = || vec![scalar_param(1.0)];
    assert_err!(Optimizer::new(p(), Sgd::new(-1.0)), InvalidArgument);
    assert_err!(
        Optimizer::new(p(), Sgd::new(0.1).nesterov(true)),
        InvalidArgument
    );
    assert_err!(
        Optimizer::new(p(), Adam::new(0.1).betas(1.0, 0.9)),
        InvalidArgument
    );
    assert_err!(
        Optimizer::new(p(), Adam::new(0.1).eps(-1.0)),
        InvalidArgument
    );
    let mut opt = Optimizer::new(p(), Sgd::new(0.1)).unwrap();
    assert_err!(opt.set_accumulation(0), InvalidArgument);
    assert_err!(opt.set_clip(Clip::Value(-1.0)), InvalidArgument);
    // A non-leaf cannot be optimized.
    let q = scalar_param(1.0);
    let r = q.mul_scalar(2.0).unwrap();
    assert_err!(Optimizer::new([r], Sgd::new(0.1)), InvalidArgument);
}

#[test]
fn fused_update_bumps_versions_and_other_leaves_collect_grads() {
    let w = scalar_param(2.0);
    let x = Tensor::from_f64_slice(&[3.0], &[1], DType::F64, CPU)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let mut opt = Optimizer::new([w.clone()], Sgd::new(0.1)).unwrap();
    let v0 = w.version();
    let loss = w.mul(&x).unwrap().sum_all().unwrap();
    opt.backward_step(&loss).unwrap();
    assert!(w.version() > v0, "in-place update bumps the version");
    assert_eq!(w.to_scalar().unwrap(), 2.0 - 0.1 * 3.0);
    assert!(
        w.grad().is_none(),
        "the owned parameter's gradient was dropped"
    );
    assert_eq!(
        x.grad().unwrap().to_scalar().unwrap(),
        2.0,
        "x is not owned: .grad"
    );
}

#[test]
fn frozen_parameters_get_no_state_and_no_update() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let mut l = Linear::builder(4, 4)
        .name("fc")
        .seed(3)
        .build(&CPU)
        .unwrap();
    l.weight = l.weight.detach();
    let before = l.weight.to_vec::<f32>().unwrap();
    let mut opt = Optimizer::new(l.parameters(), Adam::new(0.1)).unwrap();
    let x = Tensor::randn(&[2, 4], DType::F32, CPU, 1).unwrap();
    let loss = l.forward(&x).unwrap().sum_all().unwrap();
    opt.backward_step(&loss).unwrap();
    assert_eq!(l.weight.to_vec::<f32>().unwrap(), before);
    assert_eq!(opt.state_bytes(), 2 * 4 * 4, "only the bias has state");
    assert_eq!(ledger.live_in(CPU, Category::OptimizerState), 2 * 4 * 4);
}
