//! A run checkpointed after k micro-batches and resumed in fresh objects
//! (a model initialised differently, a new optimizer with another learning
//! rate, a new schedule) ends bit-identical to the uninterrupted run: every
//! parameter, buffer and optimizer state tensor compared as raw bytes, and
//! the learning rates, step counts and schedule positions exactly. For SGD
//! (momentum, Nesterov, weight decay, dampening), Adam (amsgrad) and AdamW,
//! on the usual path (`backward` × k, `step`) and the fused path
//! (`backward_step`), with schedules, clipping, and accumulation windows
//! interrupted in the middle.
use leangrad::io::{serialize_safetensors, state_dict, state_dict_of, Checkpoint};
use leangrad::models::{BlockKind, ResNet, ResNetConfig};
use leangrad::nn::{Linear, Module};
use leangrad::ops::Reduction;
use leangrad::optim::{
    Adam, CheckpointHyper, Clip, FusedStep, LrScheduler, Optimizer, Schedule, ScheduleState,
    Scheduler, SequentialLr, Sgd,
};
use leangrad::{DType, Device, Tensor};
use std::path::PathBuf;

const CPU: Device = Device::Cpu;

/// A model as the tests need it: its state dict and its loss on batch
/// `(step, micro)`.
struct Net {
    state: Vec<(String, Tensor)>,
    loss: Box<dyn Fn(usize, usize) -> Tensor>,
}

impl Net {
    fn params(&self) -> Vec<Tensor> {
        self.state
            .iter()
            .filter(|(_, t)| t.requires_grad())
            .map(|(_, t)| t.clone())
            .collect()
    }
}

fn batch_seed(step: usize, micro: usize) -> u64 {
    1000 + 10 * step as u64 + micro as u64
}

/// A 6→16→16→3 MLP initialised from `seed`.
fn mlp(seed: u64) -> Net {
    let layers: Vec<Linear> = [(6, 16), (16, 16), (16, 3)]
        .iter()
        .enumerate()
        .map(|(i, &(a, b))| {
            Linear::builder(a, b)
                .name(&format!("fc{i}"))
                .seed(seed + i as u64)
                .build(&CPU)
                .unwrap()
        })
        .collect();
    let names = ["fc0", "fc1", "fc2"];
    let children: Vec<(&str, &dyn Module)> = names
        .iter()
        .zip(&layers)
        .map(|(n, l)| (*n, l as &dyn Module))
        .collect();
    let state = state_dict_of(&children);
    let loss = move |step: usize, micro: usize| {
        let seed = batch_seed(step, micro);
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
    };
    Net {
        state,
        loss: Box::new(loss),
    }
}

/// A tiny ResNet (BatchNorm running statistics are buffers to restore too).
fn tiny_resnet(seed: u64) -> Net {
    let config = ResNetConfig {
        block: BlockKind::Basic,
        layers: [1, 1, 1, 1],
        base_width: 2,
        num_classes: 4,
        in_channels: 1,
        zero_init_residual: false,
        groups: 1,
        width_per_group: 64,
    };
    let model = ResNet::new(config, DType::F32, CPU, seed).unwrap();
    let state = state_dict(&model, "");
    let loss = move |step: usize, micro: usize| {
        let seed = batch_seed(step, micro);
        let x = Tensor::randn(&[2, 1, 16, 16], DType::F32, CPU, seed).unwrap();
        let y = Tensor::randn(&[2, 4], DType::F32, CPU, seed + 500).unwrap();
        let out = model.forward(&x).unwrap();
        out.mse_loss(&y, Reduction::Mean).unwrap()
    };
    Net {
        state,
        loss: Box::new(loss),
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Path {
    /// `backward()` per micro-batch, `step()` + `zero_grad()` after the last.
    Usual,
    /// `backward_step()` per micro-batch, accumulation in the optimizer.
    Fused,
}

#[derive(Clone, Debug)]
enum Sched {
    Single(Schedule),
    /// Warm-up then the second schedule from `milestone` on.
    Sequential(Schedule, Schedule, u64),
}

enum Running {
    Single(LrScheduler),
    Sequential(SequentialLr),
}

impl Running {
    fn new<A: CheckpointHyper>(s: &Sched, opt: &mut Optimizer<A>) -> Running {
        match s {
            Sched::Single(s) => Running::Single(LrScheduler::new(opt, s.clone()).unwrap()),
            Sched::Sequential(a, b, m) => Running::Sequential(
                SequentialLr::new(opt, vec![a.clone(), b.clone()], vec![*m]).unwrap(),
            ),
        }
    }

    fn step<A: CheckpointHyper>(&mut self, opt: &mut Optimizer<A>) {
        match self {
            Running::Single(s) => s.step(opt).unwrap(),
            Running::Sequential(s) => s.step(opt).unwrap(),
        }
    }

    fn as_dyn(&mut self) -> &mut dyn Scheduler {
        match self {
            Running::Single(s) => s,
            Running::Sequential(s) => s,
        }
    }
}

#[derive(Clone, Debug)]
struct Setup {
    model: fn(u64) -> Net,
    path: Path,
    /// Micro-batches per update.
    k: usize,
    /// Updates in the whole run.
    steps: usize,
    /// Micro-batches before the checkpoint.
    split: usize,
    clip: Clip,
    schedule: Sched,
}

/// Everything that must come out identical.
#[derive(Debug, PartialEq)]
struct Outcome {
    model: Vec<u8>,
    optimizer: Vec<u8>,
    lrs: Vec<u64>,
    steps: u64,
    param_steps: Vec<(usize, u64)>,
    schedule: ScheduleState,
}

/// Trains micro-batches `start..stop` (from a checkpoint in `resume_from`,
/// if given, with the model initialised from `seed` before loading) and
/// checkpoints into `save_to` at the end, if given.
fn run<A: CheckpointHyper>(
    hyper: &A,
    s: &Setup,
    seed: u64,
    resume_from: Option<&std::path::Path>,
    stop: usize,
    save_to: Option<&std::path::Path>,
) -> Outcome {
    let net = (s.model)(seed);
    let mut opt = Optimizer::new(net.params(), hyper.clone()).unwrap();
    opt.set_clip(s.clip).unwrap();
    if s.path == Path::Fused {
        opt.set_accumulation(s.k).unwrap();
    }
    if resume_from.is_some() {
        // A different rate: the checkpoint's must win.
        opt.set_lrs(&[0.123]).unwrap();
    }
    let mut sched = Running::new(&s.schedule, &mut opt);
    let mut start = 0;
    if let Some(dir) = resume_from {
        let ckpt = Checkpoint::load(dir).unwrap();
        assert_eq!(ckpt.metadata["run"], "resume-test");
        let report = ckpt
            .restore(&net.state, &mut opt, Some(sched.as_dyn()))
            .unwrap();
        assert_eq!(report.loaded.len(), net.state.len());
        start = ckpt.progress.step as usize;
    }
    for event in start..stop {
        let (step, micro) = (event / s.k, event % s.k);
        let loss = (net.loss)(step, micro);
        match s.path {
            Path::Usual => {
                loss.backward().unwrap();
                if micro + 1 == s.k {
                    opt.step().unwrap();
                    opt.zero_grad();
                    sched.step(&mut opt);
                }
            }
            Path::Fused => {
                if opt.backward_step(&loss).unwrap() == FusedStep::Updated {
                    sched.step(&mut opt);
                }
            }
        }
    }
    if let Some(dir) = save_to {
        Checkpoint::capture(&net.state, &opt, Some(sched.as_dyn()))
            .unwrap()
            .with_pending_grads(&opt)
            .with_progress(0, stop as u64)
            .with_metadata("run", "resume-test")
            .save(dir)
            .unwrap();
    }
    let state = opt.state_dict().unwrap();
    let mut tensors: Vec<(String, Tensor)> = state
        .state
        .iter()
        .flat_map(|(id, p)| {
            p.tensors
                .iter()
                .map(move |(n, t)| (format!("state.{id}.{n}"), t.clone()))
        })
        .collect();
    tensors.extend(
        state
            .accumulated
            .iter()
            .map(|(id, t)| (format!("accumulated.{id}"), t.clone())),
    );
    tensors.extend(
        opt.pending_grads()
            .into_iter()
            .map(|(id, t)| (format!("grad.{id}"), t)),
    );
    Outcome {
        model: serialize_safetensors(&net.state).unwrap(),
        optimizer: serialize_safetensors(&tensors).unwrap(),
        lrs: opt.lrs().iter().map(|l| l.to_bits()).collect(),
        steps: opt.steps(),
        param_steps: state.state.iter().map(|(&id, p)| (id, p.step)).collect(),
        schedule: sched.as_dyn().state(),
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leangrad-resume-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn check_resume<A: CheckpointHyper>(name: &str, hyper: A, s: Setup) {
    let total = s.steps * s.k;
    assert!(s.split > 0 && s.split < total);
    let whole = run(&hyper, &s, 7, None, total, None);
    let dir = scratch(name);
    let first = run(&hyper, &s, 7, None, s.split, Some(&dir));
    assert_ne!(
        first.model, whole.model,
        "{name}: the split must be mid-run"
    );
    // A fresh start from another initialisation ends elsewhere ...
    let unrelated = run(&hyper, &s, 99, None, total, None);
    assert_ne!(unrelated.model, whole.model);
    // ... but the same initialisation restored from the checkpoint does not.
    let resumed = run(&hyper, &s, 99, Some(&dir), total, None);
    assert!(!whole.optimizer.is_empty());
    assert_eq!(resumed, whole, "{name}: the resumed run differs");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn warmup_cosine(milestone: u64) -> Sched {
    Sched::Sequential(
        Schedule::Linear {
            start_factor: 0.25,
            end_factor: 1.0,
            total_iters: milestone,
        },
        Schedule::Cosine {
            t_max: 6,
            eta_min: 1e-4,
        },
        milestone,
    )
}

fn setup(path: Path, k: usize, steps: usize, split: usize, schedule: Sched) -> Setup {
    Setup {
        model: mlp,
        path,
        k,
        steps,
        split,
        clip: Clip::None,
        schedule,
    }
}

#[test]
fn sgd_momentum_usual_path_with_step_lr() {
    let s = setup(
        Path::Usual,
        1,
        7,
        3,
        Sched::Single(Schedule::Step {
            step_size: 2,
            gamma: 0.5,
        }),
    );
    check_resume("sgd-momentum", Sgd::new(0.05).momentum(0.9), s);
}

#[test]
fn sgd_nesterov_weight_decay_fused_mid_accumulation() {
    // 3 micro-batches per update; the checkpoint falls after micro-batch 1 of
    // update 3, so the fused path's accumulation buffers are saved.
    let s = setup(
        Path::Fused,
        3,
        5,
        7,
        Sched::Single(Schedule::Cosine {
            t_max: 4,
            eta_min: 0.001,
        }),
    );
    let hyper = Sgd::new(0.05)
        .momentum(0.9)
        .nesterov(true)
        .weight_decay(0.01);
    check_resume("sgd-nesterov-fused", hyper, s);
}

#[test]
fn sgd_dampening_value_clip_usual_mid_accumulation_with_warmup() {
    // The usual path between backward() calls: the pending .grads are saved.
    let mut s = setup(Path::Usual, 2, 6, 5, warmup_cosine(3));
    s.clip = Clip::Value(0.05);
    check_resume(
        "sgd-dampening-usual",
        Sgd::new(0.1).momentum(0.8).dampening(0.1),
        s,
    );
}

#[test]
fn sgd_global_norm_clip_usual_path() {
    let mut s = setup(
        Path::Usual,
        1,
        6,
        2,
        Sched::Single(Schedule::Step {
            step_size: 1,
            gamma: 0.9,
        }),
    );
    s.clip = Clip::GlobalNorm(0.1);
    check_resume("sgd-global-norm", Sgd::new(0.1).momentum(0.5), s);
}

#[test]
fn adam_usual_path_across_the_warmup_milestone() {
    let s = setup(Path::Usual, 1, 8, 2, warmup_cosine(3));
    check_resume("adam-usual", Adam::new(0.01), s);
}

#[test]
fn adam_amsgrad_fused_mid_accumulation_param_norm_clip() {
    let mut s = setup(
        Path::Fused,
        2,
        6,
        5,
        Sched::Single(Schedule::Step {
            step_size: 2,
            gamma: 0.7,
        }),
    );
    s.clip = Clip::ParamNorm(0.5);
    check_resume(
        "adam-amsgrad-fused",
        Adam::new(0.01).amsgrad(true).weight_decay(0.001),
        s,
    );
}

#[test]
fn adamw_fused_path_with_linear_warmup() {
    let s = setup(
        Path::Fused,
        1,
        6,
        3,
        Sched::Single(Schedule::Linear {
            start_factor: 0.5,
            end_factor: 1.0,
            total_iters: 4,
        }),
    );
    check_resume("adamw-fused", Adam::adamw(0.01).weight_decay(0.05), s);
}

#[test]
fn adamw_usual_path_mid_accumulation() {
    let s = setup(
        Path::Usual,
        3,
        4,
        4,
        Sched::Single(Schedule::Cosine {
            t_max: 4,
            eta_min: 0.0,
        }),
    );
    check_resume("adamw-usual-accum", Adam::adamw(0.02), s);
}

#[test]
fn tiny_resnet_with_batch_norm_buffers_sgd_fused() {
    let mut s = setup(
        Path::Fused,
        1,
        4,
        2,
        Sched::Single(Schedule::Step {
            step_size: 2,
            gamma: 0.5,
        }),
    );
    s.model = tiny_resnet;
    check_resume("resnet-sgd", Sgd::new(0.05).momentum(0.9), s);
}
