//! Forward + backward time and ledger peak of the ResNet-style conv stack
//! that `python-compare/conv_stack_bench.py` runs in PyTorch (torchvision's
//! ResNet-18 at batch 64, 224×224, cross-entropy on f32 logits, no
//! optimizer step), for each dtype (f32, bf16), case (`all`, `input`,
//! `input-bn-eval`: which parameters train, as `models::Case`) and save
//! policy (lean, save-all). One JSON line per run, with the Python script's
//! field names (`median_ms`, `best_ms`, `start_bytes`,
//! `max_memory_allocated` = the ledger's peak over the timed steps) plus
//! `policy` and `saved_peak_bytes`; a run that fails (an op not on CUDA
//! yet, out of memory) prints its `error` and the bench goes on.
//!
//! `cargo bench --bench conv_stack` runs on CUDA device 0 and prints one
//! `skipped` line without a GPU. `--cpu` runs on the CPU instead and
//! `--small` shrinks it (batch 2, 32×32, width 8, 1 warm-up, 2 timed), so
//! the code path runs anywhere: `cargo test --bench conv_stack -- --cpu
//! --small`. Also `--batch N --size N --width N --warmup N --iters N
//! --dtypes f32,bf16 --cases all,input --policies lean,save-all
//! --workspace BYTES` (the convolutions' workspace budget on every device,
//! `nn::with_conv_workspace`: 4 MiB by default; more lets the CPU unfold
//! whole items and CUDA weight gradients split their reduction further),
//! and on the simulated GPU `--profile-dir DIR` (each
//! run's timed step profiled by the simulator, written as
//! `DIR/<dtype>_<case>_<policy>_b<batch>_<size>_ws<budget>.json`; the
//! calibration profiles of `gpusim/tests/profile_model.rs` are made so).
use leangrad::autograd::{with_save_policy, SavePolicy};
use leangrad::cuda::CudaDevice;
use leangrad::memory::{Category, Ledger};
use leangrad::models::{Case, ResNet, ResNetConfig};
use leangrad::nn::Module;
use leangrad::ops::CrossEntropyOptions;
use leangrad::{DType, Device, Result, Tensor};
use serde_json::{json, Map, Value};
use std::time::Instant;

/// What to run (from the command line).
struct Options {
    cpu: bool,
    batch: usize,
    size: usize,
    width: usize,
    warmup: usize,
    iters: usize,
    dtypes: Vec<String>,
    cases: Vec<String>,
    policies: Vec<String>,
    /// CUDA conv column budget (0: one item, the CPU's ledger).
    workspace: usize,
    /// On the simulated GPU: write the simulator's profile of the first
    /// timed step of each run into this folder.
    profile_dir: Option<std::path::PathBuf>,
}

fn list(s: &str) -> Vec<String> {
    s.split(',').map(str::to_string).collect()
}

fn parse() -> std::result::Result<Options, String> {
    let mut o = Options {
        cpu: false,
        batch: 64,
        size: 224,
        width: 64,
        warmup: 3,
        iters: 10,
        dtypes: list("f32,bf16"),
        cases: list("all,input,input-bn-eval"),
        policies: list("lean,save-all"),
        workspace: leangrad::nn::DEFAULT_CONV_WORKSPACE_BYTES,
        profile_dir: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{a} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|e| format!("{a} {v}: {e}"));
        match a.as_str() {
            "--cpu" => o.cpu = true,
            "--small" => {
                (o.batch, o.size, o.width, o.warmup, o.iters) = (2, 32, 8, 1, 2);
            }
            "--batch" => o.batch = number(value()?)?,
            "--size" => o.size = number(value()?)?,
            "--width" => o.width = number(value()?)?,
            "--warmup" => o.warmup = number(value()?)?,
            "--iters" => o.iters = number(value()?)?.max(1),
            "--dtypes" => o.dtypes = list(&value()?),
            "--cases" => o.cases = list(&value()?),
            "--policies" => o.policies = list(&value()?),
            "--workspace" => o.workspace = number(value()?)?,
            "--profile-dir" => o.profile_dir = Some(value()?.into()),
            // What cargo passes to a bench or test binary.
            "--bench" | "--nocapture" => {}
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(o)
}

/// Our dtype name and PyTorch's (`str(dtype)` without `torch.`).
fn dtype_of(name: &str) -> std::result::Result<(DType, &'static str), String> {
    match name {
        "f32" => Ok((DType::F32, "float32")),
        "bf16" => Ok((DType::BF16, "bfloat16")),
        "f16" => Ok((DType::F16, "float16")),
        other => Err(format!("unknown dtype {other}")),
    }
}

fn policy_of(name: &str) -> std::result::Result<SavePolicy, String> {
    match name {
        "lean" => Ok(SavePolicy::Lean),
        "save-all" => Ok(SavePolicy::SaveAll),
        other => Err(format!("unknown policy {other}")),
    }
}

/// Waits for the device's queued work (timing boundaries).
fn sync(dev: Device) -> Result<()> {
    match dev {
        Device::Cuda(n) => CudaDevice::get(n)?.synchronize(),
        _ => Ok(()),
    }
}

/// One run: the model, input and targets made in a fresh ledger, `warmup`
/// untimed steps, then `iters` timed ones. Adds its results to `out`.
fn run(
    o: &Options,
    dev: Device,
    dtype: DType,
    case: Case,
    policy: SavePolicy,
    out: &mut Map<String, Value>,
) -> Result<()> {
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let _ws = leangrad::nn::with_conv_workspace(o.workspace);
    let config = ResNetConfig {
        base_width: o.width,
        ..ResNetConfig::resnet18(1000)
    };
    let mut model = ResNet::new(config, dtype, dev, 7)?;
    case.apply(&mut model)?;
    let params: Vec<Tensor> = model.parameters();
    let x = Tensor::randn(&[o.batch, 3, o.size, o.size], dtype, dev, 11)?
        .set_requires_grad(case.input_requires_grad())?;
    let labels: Vec<i64> = (0..o.batch as i64).map(|i| (i * 37) % 1000).collect();
    let targets = Tensor::from_vec(labels, &[o.batch], dev)?;
    let _p = with_save_policy(policy);
    // PyTorch's step: forward, cross-entropy on f32 logits, backward; the
    // gradients are dropped after each step (PyTorch drops them before).
    let step = || -> Result<()> {
        let logits = model.forward(&x)?.to_dtype(DType::F32)?;
        let loss = logits.cross_entropy(&targets, CrossEntropyOptions::default())?;
        drop(logits);
        loss.backward()?;
        for p in &params {
            p.zero_grad();
        }
        x.zero_grad();
        Ok(())
    };
    for _ in 0..o.warmup {
        step()?;
    }
    sync(dev)?;
    let start_bytes = ledger.live(dev);
    ledger.reset_peak();
    let profiled = match (dev, &o.profile_dir) {
        (Device::Cuda(n), Some(dir)) => Some((CudaDevice::get(n)?, dir)),
        _ => None,
    };
    if let Some((d, _)) = &profiled {
        leangrad::cuda::profiler::simulator_profile_reset(d)?;
    }
    let mut times = Vec::with_capacity(o.iters);
    for _ in 0..o.iters {
        let t = Instant::now();
        step()?;
        sync(dev)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        if let Some((d, dir)) = &profiled {
            write_profile(d, dir, out, dtype, case, policy)?;
        }
    }
    times.sort_by(f64::total_cmp);
    let median = if times.len() % 2 == 1 {
        times[times.len() / 2]
    } else {
        (times[times.len() / 2 - 1] + times[times.len() / 2]) / 2.0
    };
    out.insert("median_ms".into(), json!(median));
    out.insert("best_ms".into(), json!(times[0]));
    out.insert("start_bytes".into(), json!(start_bytes));
    out.insert("max_memory_allocated".into(), json!(ledger.peak(dev)));
    let saved = ledger.peak_in(dev, Category::Saved);
    out.insert("saved_peak_bytes".into(), json!(saved));
    Ok(())
}

/// Writes the simulator's profile of the step just run (and resets it) to
/// `dir/<dtype>_<case>_<policy>_b<batch>_<size>_ws<budget>.json`; the file
/// name also goes into `out` as `profile`.
fn write_profile(
    d: &CudaDevice,
    dir: &std::path::Path,
    out: &mut Map<String, Value>,
    dtype: DType,
    case: Case,
    policy: SavePolicy,
) -> Result<()> {
    let name = format!(
        "{:?}_{case}_{}_b{}_{}_ws{}.json",
        dtype,
        if policy == SavePolicy::Lean {
            "lean"
        } else {
            "save-all"
        },
        out["batch"],
        out["size"],
        out["conv_workspace_budget"]
    )
    .to_lowercase();
    let path = dir.join(&name);
    let json = leangrad::cuda::profiler::simulator_profile_json(d)?;
    std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&path, json))
        .map_err(|e| leangrad::Error::InvalidArgument {
            op: "conv_stack --profile-dir",
            msg: format!("{}: {e}", path.display()),
        })?;
    leangrad::cuda::profiler::simulator_profile_reset(d)?;
    out.insert("profile".into(), json!(path.display().to_string()));
    Ok(())
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("conv_stack: {e}");
            std::process::exit(2);
        }
    };
    let dev = if o.cpu {
        Device::Cpu
    } else {
        match CudaDevice::get(0) {
            Ok(_) => Device::Cuda(0),
            Err(e) => {
                println!(
                    "{}",
                    json!({"bench": "conv_stack", "skipped": format!("no CUDA device ({e})")})
                );
                return;
            }
        }
    };
    let gpu = match dev {
        Device::Cuda(n) => CudaDevice::get(n).and_then(|d| d.name()).ok(),
        _ => None,
    };
    let mut failed = false;
    for dname in &o.dtypes {
        for cname in &o.cases {
            for pname in &o.policies {
                let parsed = dtype_of(dname).and_then(|d| {
                    let case = cname.parse::<Case>().map_err(|e| e.to_string())?;
                    Ok((d, case, policy_of(pname)?))
                });
                let ((dtype, torch_name), case, policy) = match parsed {
                    Ok(p) => p,
                    Err(e) => {
                        eprintln!("conv_stack: {e}");
                        std::process::exit(2);
                    }
                };
                let mut out = Map::new();
                out.insert("framework".into(), json!("leangrad"));
                out.insert("model".into(), json!("resnet18"));
                out.insert("case".into(), json!(cname));
                out.insert("dtype".into(), json!(torch_name));
                out.insert("policy".into(), json!(pname));
                out.insert("conv_workspace_budget".into(), json!(o.workspace));
                out.insert("batch".into(), json!(o.batch));
                out.insert("size".into(), json!(o.size));
                out.insert("width".into(), json!(o.width));
                out.insert("device".into(), json!(if o.cpu { "cpu" } else { "cuda" }));
                if let Some(g) = &gpu {
                    out.insert("gpu".into(), json!(g));
                }
                if let Err(e) = run(&o, dev, dtype, case, policy, &mut out) {
                    failed = true;
                    out.insert("error".into(), json!(e.to_string()));
                }
                println!("{}", Value::Object(out));
            }
        }
    }
    // On the CPU (the code-path check) every case must run.
    if failed && o.cpu {
        std::process::exit(1);
    }
}
