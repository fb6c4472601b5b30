//! leangrad's CPU next to PyTorch eager on the same machine, same thread
//! count, f32: each workload runs in both frameworks in alternating rounds
//! (leangrad first in even rounds, PyTorch first in odd ones) after a
//! warm-up, so a change of machine load hits both sides alike. PyTorch runs
//! in a worker process (`python-compare/speed_worker.py`) driven over its
//! stdin/stdout; each side times its own iteration, so the pipe is not
//! timed. Prints a table (median of the rounds, both sides, and the ratio
//! leangrad/PyTorch: above 1 means leangrad is slower; beside it the median
//! and range of the ratios within each round, whose two samples ran back to
//! back under the same load) and, with `--json FILE`, writes every sample.
//!
//! ```text
//! cargo bench --bench vs_pytorch -- [--threads N] [--rounds R] [--only a,b]
//!     [--processes P] [--json out.json] [--python python3] [--no-torch] [--list]
//! ```
//!
//! With `--processes P` the whole comparison runs P times, each in a fresh
//! pair of processes (this program and its PyTorch worker), one after the
//! other; a summary then gives each workload's ratio in every pair and
//! their median. On a shared or virtual machine one process can run slow
//! from start to end (by a third, here), which the rounds of that one pair
//! cannot show: only another pair can.
//!
//! Before each timed sample both processes are let go quiet (see
//! [`settle`]): PyTorch's OpenMP threads spin for about 10 ms of CPU after
//! each parallel op, which on a 2-core machine would run over the start of
//! leangrad's next sample and take a core from it.
//!
//! `--threads` sets rayon's pool and `torch.set_num_threads` (default: the
//! machine's cores). Without PyTorch (the worker cannot import torch, or
//! `--no-torch`) only leangrad's column is measured, with a note.
use leangrad::autograd::{backward_with, no_grad, CollectGrads};
use leangrad::memory_plan::find_model;
use leangrad::models::Case;
use leangrad::nn::{conv2d, Conv2dOptions};
use leangrad::ops::CrossEntropyOptions;
use leangrad::optim::{Adam, Algorithm, Optimizer, Sgd, StateFormat};
use leangrad::{DType, Device, Result, Tensor};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

const CPU: Device = Device::Cpu;
const F32: DType = DType::F32;

/// One workload: its name (shared with the worker), what it measures, how
/// many iterations one sample averages (fast kernels are averaged so the
/// sample is not a single 10 ms run) and how many untimed warm-up samples.
struct Workload {
    name: &'static str,
    what: &'static str,
    reps: usize,
    warmup: usize,
}

const WORKLOADS: &[Workload] = &[
    Workload {
        name: "matmul_1024",
        what: "f32 [1024,1024]·[1024,1024]",
        reps: 3,
        warmup: 2,
    },
    Workload {
        name: "add_1e7",
        what: "f32 add of two 10^7 vectors",
        reps: 5,
        warmup: 2,
    },
    Workload {
        name: "gelu_1e7",
        what: "exact GELU fwd+bwd, 10^7 f32",
        reps: 2,
        warmup: 1,
    },
    Workload {
        name: "conv_c1_fwd",
        what: "7×7/2 conv 3→64 [8,3,112,112] forward (ResNet stem)",
        reps: 3,
        warmup: 2,
    },
    Workload {
        name: "conv_c1_dw",
        what: "same, weight-gradient (backward only)",
        reps: 3,
        warmup: 2,
    },
    Workload {
        name: "conv_l1_fwd",
        what: "3×3 conv 64→64 [8,64,28,28] forward",
        reps: 3,
        warmup: 2,
    },
    Workload {
        name: "conv_l1_dx",
        what: "same, input-gradient (backward only)",
        reps: 3,
        warmup: 2,
    },
    Workload {
        name: "conv_l1_dw",
        what: "same, weight-gradient (backward only)",
        reps: 3,
        warmup: 2,
    },
    Workload {
        name: "conv_l2_fwd",
        what: "3×3 conv 128→128 [8,128,14,14] forward",
        reps: 3,
        warmup: 2,
    },
    Workload {
        name: "conv_l2_dx",
        what: "same, input-gradient (backward only)",
        reps: 3,
        warmup: 2,
    },
    Workload {
        name: "conv_l2_dw",
        what: "same, weight-gradient (backward only)",
        reps: 3,
        warmup: 2,
    },
    Workload {
        name: "conv_l3_fwd",
        what: "3×3 conv 256→256 [8,256,7,7] forward",
        reps: 3,
        warmup: 2,
    },
    Workload {
        name: "conv_l3_dx",
        what: "same, input-gradient (backward only)",
        reps: 3,
        warmup: 2,
    },
    Workload {
        name: "conv_l3_dw",
        what: "same, weight-gradient (backward only)",
        reps: 3,
        warmup: 2,
    },
    Workload {
        name: "conv_l4_fwd",
        what: "3×3 conv 512→512 [8,512,4,4] forward",
        reps: 3,
        warmup: 2,
    },
    Workload {
        name: "conv_l4_dx",
        what: "same, input-gradient (backward only)",
        reps: 3,
        warmup: 2,
    },
    Workload {
        name: "conv_l4_dw",
        what: "same, weight-gradient (backward only)",
        reps: 3,
        warmup: 2,
    },
    Workload {
        name: "sgd_10m",
        what: "SGD momentum update, 10 × [1000,1000]",
        reps: 3,
        warmup: 2,
    },
    Workload {
        name: "adam_10m",
        what: "Adam update, 10 × [1000,1000]",
        reps: 3,
        warmup: 2,
    },
    Workload {
        name: "adam8bit_10m",
        what: "same, 8-bit state (bitsandbytes' Adam8bit)",
        reps: 3,
        warmup: 2,
    },
    Workload {
        name: "resnet18_all",
        what: "ResNet-18 step, batch 8 112², all train, SGD",
        reps: 1,
        warmup: 2,
    },
    Workload {
        name: "resnet18_input_bn_eval",
        what: "ResNet-18 step, input-bn-eval (frozen)",
        reps: 1,
        warmup: 2,
    },
    Workload {
        name: "resnet18_input",
        what: "ResNet-18 step, input only (frozen)",
        reps: 1,
        warmup: 2,
    },
    Workload {
        name: "resnet18_surgical_last",
        what: "ResNet-18 step, last quarter trains",
        reps: 1,
        warmup: 2,
    },
    Workload {
        name: "resnet18_224_all",
        what: "ResNet-18 step, batch 4 224², all train",
        reps: 1,
        warmup: 1,
    },
    Workload {
        name: "resnet18_224_input",
        what: "same, input only (frozen)",
        reps: 1,
        warmup: 1,
    },
    Workload {
        name: "resnet18_224_input_bn_eval",
        what: "same, input-bn-eval",
        reps: 1,
        warmup: 1,
    },
    Workload {
        name: "resnet18_224_surgical_last",
        what: "same, last quarter trains",
        reps: 1,
        warmup: 1,
    },
    Workload {
        name: "bert_all",
        what: "BERT-base step, batch 2×128, all train, Adam",
        reps: 1,
        warmup: 1,
    },
    Workload {
        name: "bert_input",
        what: "BERT-base step, 2×128, frozen, input grad",
        reps: 1,
        warmup: 1,
    },
    Workload {
        name: "bert_surgical_last",
        what: "BERT-base step, 2×128, last quarter trains",
        reps: 1,
        warmup: 1,
    },
    Workload {
        name: "resnet18_all_ckpt",
        what: "resnet18_all, each block checkpointed",
        reps: 1,
        warmup: 2,
    },
    Workload {
        name: "resnet18_input_ckpt",
        what: "resnet18_input, each block checkpointed",
        reps: 1,
        warmup: 2,
    },
    Workload {
        name: "bert_all_ckpt",
        what: "bert_all, each layer checkpointed",
        reps: 1,
        warmup: 1,
    },
];

/// One timed iteration: returns its milliseconds (setup work such as the
/// forward before a backward-only measurement is done outside the clock).
type Iteration = Box<dyn FnMut() -> Result<f64>>;

fn timed(f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// A conv workload at `[8, cin, hw, hw]`: `cout` filters of `k×k` at
/// `stride`, padding `k/2`. `part` is `fwd`, `dx` (input gradient) or `dw`
/// (weight gradient); the backward ones time only the backward pass.
fn conv(
    (cin, cout, hw): (usize, usize, usize),
    (k, stride): (usize, usize),
    part: &'static str,
) -> Result<Iteration> {
    let opts = Conv2dOptions {
        stride: [stride, stride],
        padding: [k / 2, k / 2],
        ..Default::default()
    };
    let x = Tensor::randn(&[8, cin, hw, hw], F32, CPU, 1)?.set_requires_grad(part == "dx")?;
    let w = Tensor::randn(&[cout, cin, k, k], F32, CPU, 2)?
        .mul_scalar(0.05)?
        .set_requires_grad(part == "dw")?;
    let ohw = (hw + 2 * (k / 2) - k) / stride + 1;
    let g = Tensor::randn(&[8, cout, ohw, ohw], F32, CPU, 3)?;
    Ok(Box::new(move || {
        if part == "fwd" {
            let _ng = no_grad();
            return timed(|| conv2d(&x, &w, None, &opts).map(drop));
        }
        let y = conv2d(&x, &w, None, &opts)?;
        let ms = timed(|| backward_with(&y, Some(g.clone()), &mut CollectGrads))?;
        x.zero_grad();
        w.zero_grad();
        Ok(ms)
    }))
}

/// An optimizer update over ten `[1000, 1000]` weights whose gradients
/// come from a real matmul backward (so their layout is what a Linear
/// layer's weight gradient has).
fn optimizer<A: Algorithm + 'static>(hyper: A, state: StateFormat) -> Result<Iteration> {
    let ws: Vec<Tensor> = (0..10)
        .map(|i| Tensor::randn(&[1000, 1000], F32, CPU, 10 + i)?.into_parameter())
        .collect::<Result<_>>()?;
    let x = Tensor::randn(&[16, 1000], F32, CPU, 5)?;
    let mut loss = x.matmul(&ws[0].t()?)?.sum_all()?;
    for w in &ws[1..] {
        loss = loss.add(&x.matmul(&w.t()?)?.sum_all()?)?;
    }
    loss.backward()?;
    let mut opt = Optimizer::new(ws, hyper)?;
    opt.set_state_format(state)?;
    Ok(Box::new(move || timed(|| opt.step())))
}

/// One training step of a model of `leangrad memory` in a case: forward,
/// cross-entropy, backward and (when a parameter trains) the optimizer's
/// update, gradients dropped after it as `zero_grad(set_to_none)` does.
/// ResNet-18 runs at `size`² (batch 8 at 112², 4 at 224²), BERT-base at
/// batch 2 × 128 tokens with Adam; with `checkpoint` each residual block or
/// encoder layer is a checkpointed segment.
fn model_step(name: &str, case: &str, size: usize, checkpoint: bool) -> Result<Iteration> {
    let entry = find_model(name)?;
    let resnet = name == "resnet18";
    let (size, seq) = if resnet {
        (Some(size), None)
    } else {
        (None, Some(128))
    };
    let (classes, adam) = if resnet { (1000, false) } else { (2, true) };
    let input = entry.step_input(size, seq)?;
    let case: Case = case.parse()?;
    let batch = match size {
        Some(224) => 4,
        Some(_) => 8,
        None => 2,
    };
    let mut model = (entry.build)(classes, size.unwrap_or(224), F32, CPU)?;
    case.apply(model.as_mut())?;
    if checkpoint {
        model.set_gradient_checkpointing(true)?;
    }
    let params: Vec<Tensor> = model
        .parameters()
        .into_iter()
        .filter(|p| p.requires_grad())
        .collect();
    let x = input.make(batch, case.input_requires_grad(), F32, CPU)?;
    let targets = input.targets(batch, classes, CPU)?;
    let mut opt: Option<Box<dyn FnMut() -> Result<()>>> = match (params.is_empty(), adam) {
        (true, _) => None,
        (false, true) => {
            let mut o = Optimizer::new(params, Adam::new(1e-4))?;
            Some(Box::new(move || {
                o.step()?;
                o.zero_grad();
                Ok(())
            }))
        }
        (false, false) => {
            let mut o = Optimizer::new(params, Sgd::new(0.01).momentum(0.9))?;
            Some(Box::new(move || {
                o.step()?;
                o.zero_grad();
                Ok(())
            }))
        }
    };
    Ok(Box::new(move || {
        timed(|| {
            let loss = model
                .step_logits(&x)?
                .cross_entropy(&targets, CrossEntropyOptions::default())?;
            loss.backward()?;
            if let Some(step) = opt.as_mut() {
                step()?;
            }
            x.zero_grad();
            Ok(())
        })
    }))
}

/// leangrad's side of a workload.
fn leangrad_setup(name: &str) -> Result<Iteration> {
    match name {
        "matmul_1024" => {
            let a = Tensor::randn(&[1024, 1024], F32, CPU, 1)?;
            let b = Tensor::randn(&[1024, 1024], F32, CPU, 2)?;
            Ok(Box::new(move || timed(|| a.matmul(&b).map(drop))))
        }
        "add_1e7" => {
            let a = Tensor::randn(&[10_000_000], F32, CPU, 1)?;
            let b = Tensor::randn(&[10_000_000], F32, CPU, 2)?;
            Ok(Box::new(move || timed(|| a.add(&b).map(drop))))
        }
        "gelu_1e7" => {
            let x = Tensor::randn(&[10_000_000], F32, CPU, 1)?.set_requires_grad(true)?;
            let g = Tensor::randn(&[10_000_000], F32, CPU, 2)?;
            Ok(Box::new(move || {
                let ms = timed(|| {
                    let y = x.gelu(false)?;
                    backward_with(&y, Some(g.clone()), &mut CollectGrads)
                })?;
                x.zero_grad();
                Ok(ms)
            }))
        }
        "conv_c1_fwd" => conv((3, 64, 112), (7, 2), "fwd"),
        "conv_c1_dw" => conv((3, 64, 112), (7, 2), "dw"),
        "conv_l1_fwd" => conv((64, 64, 28), (3, 1), "fwd"),
        "conv_l1_dx" => conv((64, 64, 28), (3, 1), "dx"),
        "conv_l1_dw" => conv((64, 64, 28), (3, 1), "dw"),
        "conv_l2_fwd" => conv((128, 128, 14), (3, 1), "fwd"),
        "conv_l2_dx" => conv((128, 128, 14), (3, 1), "dx"),
        "conv_l2_dw" => conv((128, 128, 14), (3, 1), "dw"),
        "conv_l3_fwd" => conv((256, 256, 7), (3, 1), "fwd"),
        "conv_l3_dx" => conv((256, 256, 7), (3, 1), "dx"),
        "conv_l3_dw" => conv((256, 256, 7), (3, 1), "dw"),
        "conv_l4_fwd" => conv((512, 512, 4), (3, 1), "fwd"),
        "conv_l4_dx" => conv((512, 512, 4), (3, 1), "dx"),
        "conv_l4_dw" => conv((512, 512, 4), (3, 1), "dw"),
        "sgd_10m" => optimizer(Sgd::new(0.01).momentum(0.9), StateFormat::Full),
        "adam_10m" => optimizer(Adam::new(1e-3), StateFormat::Full),
        "adam8bit_10m" => optimizer(Adam::new(1e-3), StateFormat::Blockwise8),
        other => {
            let case = |rest: &str| rest.replace('_', "-");
            let (base, ckpt) = match other.strip_suffix("_ckpt") {
                Some(base) => (base, true),
                None => (other, false),
            };
            if let Some(rest) = base.strip_prefix("resnet18_224_") {
                return model_step("resnet18", &case(rest), 224, ckpt);
            }
            if let Some(rest) = base.strip_prefix("resnet18_") {
                return model_step("resnet18", &case(rest), 112, ckpt);
            }
            if let Some(rest) = base.strip_prefix("bert_") {
                return model_step("bert_base", &case(rest), 0, ckpt);
            }
            Err(leangrad::Error::InvalidArgument {
                op: "vs_pytorch",
                msg: format!("unknown workload {other}"),
            })
        }
    }
}

/// The PyTorch worker process: one JSON request per line, one JSON answer
/// per line.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    torch: String,
}

impl Worker {
    fn start(python: &str, threads: usize) -> std::result::Result<Worker, String> {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/python-compare/speed_worker.py"
        );
        let mut child = Command::new(python)
            .arg(script)
            .arg("--threads")
            .arg(threads.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {python}: {e}"))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut w = Worker {
            child,
            stdin,
            stdout,
            torch: String::new(),
        };
        let hello = w.read()?;
        match hello.get("torch").and_then(Value::as_str) {
            Some(v) => w.torch = v.to_string(),
            None => return Err(format!("worker: {}", hello["error"])),
        }
        Ok(w)
    }

    fn read(&mut self) -> std::result::Result<Value, String> {
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .map_err(|e| format!("worker: {e}"))?;
        if line.is_empty() {
            return Err("the worker exited".into());
        }
        serde_json::from_str(&line).map_err(|e| format!("worker said {line:?}: {e}"))
    }

    fn ask(&mut self, request: Value) -> std::result::Result<Value, String> {
        writeln!(self.stdin, "{request}").map_err(|e| format!("worker: {e}"))?;
        self.stdin.flush().map_err(|e| format!("worker: {e}"))?;
        let answer = self.read()?;
        match answer.get("error") {
            Some(e) => Err(format!("worker: {e}")),
            None => Ok(answer),
        }
    }

    /// One sample: the mean of `reps` iterations, in milliseconds.
    fn sample(&mut self, reps: usize) -> std::result::Result<f64, String> {
        let a = self.ask(json!({"cmd": "time", "reps": reps}))?;
        a["ms"].as_f64().ok_or_else(|| format!("worker said {a}"))
    }
}

/// CPU time, in ns, that the threads of the processes `pids` have run
/// (Linux `/proc/PID/task/*/schedstat`; 0 where it cannot be read).
fn cpu_ns(pids: &[u32]) -> u64 {
    let mut total = 0;
    for pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            total += stat
                .split_whitespace()
                .next()
                .and_then(|t| t.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    total
}

/// Waits (at most 0.5 s) until the threads of this process and of the
/// worker `worker` run less than 0.5 ms of CPU in 5 ms: the threads a
/// sample woke, on either side, have gone to sleep before the next one
/// starts, so neither side's spinning threads are timed in the other's
/// sample. Where `/proc` cannot be read this is a fixed 5 ms pause.
fn settle(worker: Option<&Worker>) {
    let pids: Vec<u32> = [Some(std::process::id()), worker.map(|w| w.child.id())]
        .into_iter()
        .flatten()
        .collect();
    let quiet = std::time::Duration::from_millis(5);
    let mut before = cpu_ns(&pids);
    for _ in 0..100 {
        std::thread::sleep(quiet);
        let now = cpu_ns(&pids);
        if now.saturating_sub(before) < 500_000 {
            return;
        }
        before = now;
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"cmd": "quit"}));
        let _ = self.child.wait();
    }
}

struct Options {
    threads: usize,
    rounds: usize,
    processes: usize,
    only: Option<Vec<String>>,
    json: Option<String>,
    python: String,
    torch: bool,
}

fn parse() -> std::result::Result<Options, String> {
    let mut o = Options {
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        rounds: 7,
        processes: 1,
        only: None,
        json: None,
        python: "python3".into(),
        torch: true,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{a} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|e| format!("{a} {v}: {e}"));
        match a.as_str() {
            "--threads" => o.threads = number(value()?)?.max(1),
            "--rounds" => o.rounds = number(value()?)?.max(1),
            "--processes" => o.processes = number(value()?)?.max(1),
            "--only" => o.only = Some(value()?.split(',').map(str::to_string).collect()),
            "--json" => o.json = Some(value()?),
            "--python" => o.python = value()?,
            "--no-torch" => o.torch = false,
            "--list" => {
                for w in WORKLOADS {
                    println!("{:26} {}", w.name, w.what);
                }
                std::process::exit(0);
            }
            "--bench" | "--nocapture" => {}
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if let Some(only) = &o.only {
        if let Some(bad) = only.iter().find(|n| WORKLOADS.iter().all(|w| w.name != *n)) {
            return Err(format!("unknown workload {bad} (--list names them)"));
        }
    }
    Ok(o)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Runs one workload on both sides, interleaved; returns (leangrad
/// samples, PyTorch samples) in milliseconds.
fn measure(
    w: &Workload,
    rounds: usize,
    worker: &mut Option<Worker>,
) -> std::result::Result<(Vec<f64>, Vec<f64>), String> {
    let mut ours = leangrad_setup(w.name).map_err(|e| format!("leangrad: {e}"))?;
    let mut our_sample = || -> std::result::Result<f64, String> {
        let mut sum = 0.0;
        for _ in 0..w.reps {
            sum += ours().map_err(|e| format!("leangrad: {e}"))?;
        }
        Ok(sum / w.reps as f64)
    };
    if let Some(p) = worker.as_mut() {
        p.ask(json!({"cmd": "setup", "workload": w.name}))?;
    }
    for _ in 0..w.warmup {
        our_sample()?;
        if let Some(p) = worker.as_mut() {
            p.sample(w.reps)?;
        }
    }
    let (mut l, mut t) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        if round % 2 == 0 {
            settle(worker.as_ref());
            l.push(our_sample()?);
        }
        if let Some(p) = worker.as_mut() {
            settle(Some(p));
            t.push(p.sample(w.reps)?);
        }
        if round % 2 == 1 {
            settle(worker.as_ref());
            l.push(our_sample()?);
        }
    }
    if let Some(p) = worker.as_mut() {
        p.ask(json!({"cmd": "teardown"}))?;
    }
    Ok((l, t))
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("vs_pytorch: {e}");
            std::process::exit(2);
        }
    };
    if o.processes > 1 {
        if let Err(e) = in_processes(&o) {
            eprintln!("vs_pytorch: {e}");
            std::process::exit(1);
        }
        return;
    }
    // The pool a leangrad program should build (this thread computes too).
    if let Err(e) = leangrad::threads::init(Some(o.threads)) {
        eprintln!("vs_pytorch: {e}");
    }
    let mut worker = if o.torch {
        match Worker::start(&o.python, o.threads) {
            Ok(w) => Some(w),
            Err(e) => {
                println!("note: PyTorch is not available ({e}); measuring leangrad only");
                None
            }
        }
    } else {
        println!("note: --no-torch; measuring leangrad only");
        None
    };
    let torch = worker.as_ref().map(|w| w.torch.clone());
    println!(
        "threads {} · rounds {} · f32 · PyTorch {}",
        o.threads,
        o.rounds,
        torch.as_deref().unwrap_or("absent")
    );
    let cpu = cpu_model();
    println!("CPU {cpu} · leangrad's kernels: {}", leangrad::cpu_path());
    println!(
        "{:26} {:>12} {:>12} {:>8} {:>17}  what",
        "workload", "leangrad ms", "pytorch ms", "ratio", "per round"
    );
    let mut rows = Vec::new();
    for w in WORKLOADS {
        if o.only
            .as_ref()
            .is_some_and(|only| !only.iter().any(|n| n == w.name))
        {
            continue;
        }
        match measure(w, o.rounds, &mut worker) {
            Ok((l, t)) => {
                let (lm, tm) = (median(&l), (!t.is_empty()).then(|| median(&t)));
                let cell = |v: Option<f64>, digits: usize| {
                    v.map_or("-".to_string(), |v| format!("{v:.digits$}"))
                };
                // Sample i of each side belongs to round i.
                let per_round: Vec<f64> = l.iter().zip(&t).map(|(l, t)| l / t).collect();
                let paired = (!per_round.is_empty()).then(|| {
                    let lo = per_round.iter().copied().fold(f64::INFINITY, f64::min);
                    let hi = per_round.iter().copied().fold(0.0, f64::max);
                    (median(&per_round), lo, hi)
                });
                let paired_cell = paired.map_or("-".to_string(), |(m, lo, hi)| {
                    format!("{m:.2} ({lo:.2}–{hi:.2})")
                });
                println!(
                    "{:26} {:>12.2} {:>12} {:>8} {:>17}  {}",
                    w.name,
                    lm,
                    cell(tm, 2),
                    cell(tm.map(|tm| lm / tm), 2),
                    paired_cell,
                    w.what
                );
                rows.push(json!({
                    "workload": w.name, "what": w.what, "reps_per_sample": w.reps,
                    "leangrad_ms": l, "pytorch_ms": t,
                    "leangrad_median_ms": lm, "pytorch_median_ms": tm,
                    "ratio": tm.map(|tm| lm / tm),
                    "round_ratios": per_round,
                    "round_ratio_median": paired.map(|p| p.0),
                }));
            }
            Err(e) => {
                println!("{:26} error: {e}", w.name);
                rows.push(json!({"workload": w.name, "error": e}));
            }
        }
    }
    if let Some(path) = &o.json {
        let doc = json!({
            "threads": o.threads, "rounds": o.rounds, "torch": torch,
            "dtype": "f32", "cpu": cpu, "cpu_path": leangrad::cpu_path().name(),
            "results": rows,
        });
        let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("vs_pytorch: {path}: {e}");
            std::process::exit(1);
        }
    }
}

/// The CPU's model name (from `/proc/cpuinfo`, where there is one).
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}

/// Runs this program `o.processes` times, one after the other, each with
/// the same arguments but its own JSON report (its table goes to stdout as
/// it runs); then prints each workload's ratio in every run and their
/// median, and with `--json` writes every run's report and the summary.
fn in_processes(o: &Options) -> std::result::Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    // The arguments less `--processes P` and `--json FILE`.
    let mut args = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--processes" | "--json" => {
                it.next();
            }
            _ => args.push(a),
        }
    }
    let dir = std::env::temp_dir();
    let mut runs = Vec::new();
    for run in 0..o.processes {
        println!("run {} of {}", run + 1, o.processes);
        let path = dir.join(format!("vs_pytorch-{}-{run}.json", std::process::id()));
        let status = Command::new(&exe)
            .args(&args)
            .arg("--json")
            .arg(&path)
            .status()
            .map_err(|e| format!("run {}: {e}", run + 1))?;
        if !status.success() {
            return Err(format!("run {} failed: {status}", run + 1));
        }
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let _ = std::fs::remove_file(&path);
        let doc: Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        runs.push(doc);
    }
    let summary = summarize(&runs);
    println!(
        "\nratio leangrad/PyTorch in each of {} runs (separate processes), and their median",
        runs.len()
    );
    println!("{:26} {:>8}  runs", "workload", "median");
    for row in &summary {
        let ratios: Vec<String> = row["ratios"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| r.as_f64().map_or("-".into(), |r| format!("{r:.2}")))
            .collect();
        let median = row["median_ratio"]
            .as_f64()
            .map_or("-".into(), |m| format!("{m:.2}"));
        println!(
            "{:26} {:>8}  {}",
            row["workload"].as_str().unwrap_or("?"),
            median,
            ratios.join(" ")
        );
    }
    if let Some(path) = &o.json {
        let doc = json!({"processes": runs.len(), "runs": runs, "summary": summary});
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

/// Per workload (in the first run's order): its ratio in each run (null
/// where a run has none) and the median of those it has.
fn summarize(runs: &[Value]) -> Vec<Value> {
    // Each run's rows, read once.
    let tables: Vec<&[Value]> = runs
        .iter()
        .map(|run| run["results"].as_array().map_or(&[][..], Vec::as_slice))
        .collect();
    let names = tables.first().copied().unwrap_or_default();
    names
        .iter()
        .filter_map(|r| r["workload"].as_str())
        .map(|name| {
            let ratios: Vec<Option<f64>> = tables
                .iter()
                .map(|rows| {
                    rows.iter()
                        .find(|r| r["workload"] == name)
                        .and_then(|r| r["ratio"].as_f64())
                })
                .collect();
            let have: Vec<f64> = ratios.iter().flatten().copied().collect();
            let median_ratio = (!have.is_empty()).then(|| median(&have));
            json!({"workload": name, "ratios": ratios, "median_ratio": median_ratio})
        })
        .collect()
}
