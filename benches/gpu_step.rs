//! One training step per workload on CUDA device 0 (SGD with momentum; the
//! batch copied from the host, forward, loss, backward, update, the loss
//! read back): ResNet-18 at batch 64 (cases all, input, input-bn-eval; f32
//! with TF32 off and on, and bf16), BERT-base and GPT-2 small at batch
//! 8 × 128 (all).
//!
//! On the simulated GPU (`gpusim/run cargo bench --bench gpu_step`) each
//! step is profiled by the simulator: launches, cuBLAS calls,
//! synchronisations, copies, allocations, the kernels that take the most
//! predicted time, and the step's predicted time on an H100 and an H200
//! next to PyTorch's measured time where `benches/results/` has it. The
//! counts do not depend on the image size, the times do: ResNet-18 runs at
//! 32² and 64² and its profile at 224² is extrapolated from the two (each
//! count is affine in the pixel count; the output says so). The
//! transformers run at their size.
//!
//! On a real GPU the same bench measures: the median of `--iters` timed
//! steps after `--warmup` ones. `python-compare/gpu_step.py` is PyTorch's
//! twin (the same workloads by name); `benches/gpu_session.sh` runs both.
//!
//! Options: `--json` (one object per workload: `workload`, `launches`,
//! `cublas_calls`, `syncs`, `h2d`, `d2h`, `allocs`, `frees`,
//! `predicted_ms_h100`, `predicted_ms_h200`, `predicted_ms_h200_resident`
//! (the step without the batch's host-to-device copy, as PyTorch's
//! reference numbers were measured), `measured_ms`,
//! `pytorch_ms_h200`, `top_kernels`), `--workloads a,b` (names as printed,
//! or a prefix such as `resnet18`), `--table` (the simulator's whole
//! summary table per workload), `--warmup N`, `--iters N`.

use leangrad::cuda::{profiler, with_conv_tf32, with_tf32, CudaDevice};
use leangrad::memory_plan::{find_model, parse_case, OptimizerKind, StepRunner, StepSpec};
use leangrad::{DType, Device, Result};
use leangrad_gpusim::profile::{extrapolate, model, table, Event, Profile};
use serde_json::{json, Value};
use std::time::Instant;

/// One workload.
struct Workload {
    name: &'static str,
    model: &'static str,
    batch: usize,
    /// Image size (0 for token models).
    size: usize,
    seq: usize,
    case: &'static str,
    dtype: DType,
    tf32: bool,
    /// Every block a checkpointed segment (`--checkpoint`).
    checkpoint: bool,
    /// PyTorch's measured ms for this step on an H200, where known
    /// (`benches/results/2026-11-27-h200.md`: forward + backward with the
    /// batch already on the device, PyTorch's defaults, so TF32
    /// convolutions for f32).
    pytorch_ms_h200: Option<f64>,
}

const fn resnet(
    name: &'static str,
    case: &'static str,
    dtype: DType,
    tf32: bool,
    pytorch: Option<f64>,
) -> Workload {
    Workload {
        name,
        model: "resnet18",
        batch: 64,
        size: 224,
        seq: 0,
        case,
        dtype,
        tf32,
        checkpoint: false,
        pytorch_ms_h200: pytorch,
    }
}

/// A text model's step at batch 8 × 128, case all, f32.
const fn tokens(name: &'static str, model: &'static str) -> Workload {
    Workload {
        name,
        model,
        batch: 8,
        size: 0,
        seq: 128,
        case: "all",
        dtype: DType::F32,
        tf32: false,
        checkpoint: false,
        pytorch_ms_h200: None,
    }
}

/// `w` with every block a checkpointed segment.
const fn checkpointed(name: &'static str, w: Workload) -> Workload {
    Workload {
        name,
        checkpoint: true,
        ..w
    }
}

const WORKLOADS: [Workload; 13] = [
    resnet("resnet18_b64_all_f32", "all", DType::F32, false, None),
    resnet("resnet18_b64_input_f32", "input", DType::F32, false, None),
    resnet(
        "resnet18_b64_input-bn-eval_f32",
        "input-bn-eval",
        DType::F32,
        false,
        None,
    ),
    resnet("resnet18_b64_all_tf32", "all", DType::F32, true, Some(14.1)),
    resnet(
        "resnet18_b64_input_tf32",
        "input",
        DType::F32,
        true,
        Some(12.1),
    ),
    resnet(
        "resnet18_b64_input-bn-eval_tf32",
        "input-bn-eval",
        DType::F32,
        true,
        Some(8.6),
    ),
    resnet(
        "resnet18_b64_all_bf16",
        "all",
        DType::BF16,
        false,
        Some(12.2),
    ),
    resnet(
        "resnet18_b64_input_bf16",
        "input",
        DType::BF16,
        false,
        Some(11.4),
    ),
    resnet(
        "resnet18_b64_input-bn-eval_bf16",
        "input-bn-eval",
        DType::BF16,
        false,
        Some(7.4),
    ),
    tokens("bert-base_b8x128_all_f32", "bert_base"),
    tokens("gpt2_b8x128_all_f32", "gpt2"),
    checkpointed(
        "resnet18_b64_all_tf32_ckpt",
        resnet("", "all", DType::F32, true, None),
    ),
    checkpointed("bert-base_b8x128_all_f32_ckpt", tokens("", "bert_base")),
];

struct Options {
    json: bool,
    table: bool,
    workloads: Vec<String>,
    warmup: usize,
    iters: usize,
    /// How many of the slowest single launches to list (simulated runs).
    launches: usize,
}

fn parse() -> std::result::Result<Options, String> {
    let mut o = Options {
        json: false,
        table: false,
        workloads: Vec::new(),
        warmup: 3,
        iters: 10,
        launches: 0,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--json" => o.json = true,
            "--table" => o.table = true,
            "--workloads" => o.workloads = value()?.split(',').map(str::to_string).collect(),
            "--warmup" => o.warmup = value()?.parse().map_err(|e| format!("{a}: {e}"))?,
            "--iters" => o.iters = value()?.parse().map_err(|e| format!("{a}: {e}"))?,
            "--launches" => o.launches = value()?.parse().map_err(|e| format!("{a}: {e}"))?,
            "--bench" | "--nocapture" => {}
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(o)
}

/// The step of `w` at image size `size` (ignored by token models).
fn spec(w: &Workload, size: usize) -> Result<StepSpec> {
    let entry = find_model(w.model)?;
    let input = if w.size > 0 {
        entry.step_input(Some(size), None)?
    } else {
        entry.step_input(None, Some(w.seq))?
    };
    Ok(StepSpec {
        batch: w.batch,
        input,
        classes: 1000,
        dtype: w.dtype,
        optimizer: OptimizerKind::Sgd,
        fused: false,
        checkpoint: w.checkpoint,
        optimizer_state: leangrad::optim::StateFormat::Full,
        autocast: None,
        case: parse_case(w.case)?,
        device: Device::Cuda(0),
    })
}

/// The simulator's profile of one step of `w` at `size` (after one
/// untimed step that loads the kernels).
fn profile_at(dev: &CudaDevice, w: &Workload, size: usize) -> Result<Profile> {
    let mut runner = StepRunner::new(w.model, &spec(w, size)?)?;
    runner.step()?;
    profiler::simulator_profile_reset(dev)?;
    runner.step()?;
    let text = profiler::simulator_profile_json(dev)?;
    Profile::from_json(&text).map_err(|e| leangrad::Error::InvalidArgument {
        op: "gpu_step",
        msg: format!("the simulator's profile: {e}"),
    })
}

/// The profile of `w` at its size: run there, or for images extrapolated
/// from 32² and 64² runs; and a note saying which.
fn simulated(dev: &CudaDevice, w: &Workload) -> Result<(Profile, String)> {
    if w.size == 0 {
        return Ok((profile_at(dev, w, 0)?, "run at its size".into()));
    }
    let (a, b) = (profile_at(dev, w, 32)?, profile_at(dev, w, 64)?);
    let pixels = |s: usize| (s * s) as f64;
    let t = (pixels(w.size) - pixels(32)) / (pixels(64) - pixels(32));
    let p = extrapolate(&a, &b, t).map_err(|e| leangrad::Error::InvalidArgument {
        op: "gpu_step",
        msg: format!("{}: the 32² and 64² steps differ: {e}", w.name),
    })?;
    let note = format!(
        "counts from 32² and 64² runs (equal), times extrapolated to {0}²",
        w.size
    );
    Ok((p, note))
}

/// Median ms of `iters` steps of `w` on a real GPU.
fn measured(dev: &CudaDevice, w: &Workload, o: &Options) -> Result<f64> {
    let mut runner = StepRunner::new(w.model, &spec(w, w.size)?)?;
    for _ in 0..o.warmup {
        runner.step()?;
    }
    let mut ms = Vec::new();
    for _ in 0..o.iters.max(1) {
        dev.synchronize()?;
        let t0 = Instant::now();
        runner.step()?;
        dev.synchronize()?;
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[ms.len() / 2])
}

fn report(w: &Workload, p: Option<&Profile>, note: &str, measured_ms: Option<f64>) -> Value {
    let mut v = json!({
        "workload": w.name,
        "pytorch_ms_h200": w.pytorch_ms_h200,
        "measured_ms": measured_ms,
        "note": note,
    });
    if let Some(p) = p {
        let c = p.counts();
        let ms = |g| model::predict(p, g).total_us / 1e3;
        let top: Vec<Value> = table::kernel_rows(p, &model::H200)
            .into_iter()
            .take(8)
            .map(|r| json!({"name": r.name, "launches": r.launches, "predicted_ms_h200": r.total_us / 1e3}))
            .collect();
        for (k, n) in [
            ("launches", c.launches),
            ("cublas_calls", c.cublas_calls),
            ("syncs", c.syncs),
            ("h2d", c.h2d),
            ("d2h", c.d2h),
            ("allocs", c.allocs),
            ("frees", c.frees),
        ] {
            v[k] = json!(n);
        }
        v["predicted_ms_h100"] = json!(ms(&model::H100_SXM));
        v["predicted_ms_h200"] = json!(ms(&model::H200));
        v["predicted_ms_h200_resident"] =
            json!(model::predict(&without_uploads(p), &model::H200).total_us / 1e3);
        v["top_kernels"] = json!(top);
    }
    v
}

/// `p` without its host-to-device copies: the step with its batch already
/// on the device, as PyTorch's measured reference ran it.
fn without_uploads(p: &Profile) -> Profile {
    let mut q = p.clone();
    q.events.retain(|e| !matches!(e, Event::HtoD(_)));
    q
}

fn print_row(v: &Value) {
    let n = |k: &str| v[k].as_u64().map_or("-".into(), |x| x.to_string());
    let f = |k: &str| v[k].as_f64().map_or("-".into(), |x| format!("{x:.1}"));
    println!(
        "{:<34} {:>8} {:>7} {:>6} {:>5} {:>5} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9}",
        v["workload"].as_str().unwrap_or("?"),
        n("launches"),
        n("cublas_calls"),
        n("syncs"),
        n("h2d"),
        n("d2h"),
        n("allocs"),
        f("predicted_ms_h100"),
        f("predicted_ms_h200"),
        f("predicted_ms_h200_resident"),
        f("measured_ms"),
        f("pytorch_ms_h200"),
    );
}

fn main() -> Result<()> {
    let o = parse().map_err(|msg| leangrad::Error::InvalidArgument {
        op: "gpu_step",
        msg,
    })?;
    let dev = match CudaDevice::get(0) {
        Ok(d) => d,
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            return Ok(());
        }
    };
    let chosen: Vec<&Workload> = WORKLOADS
        .iter()
        .filter(|w| {
            o.workloads.is_empty() || o.workloads.iter().any(|p| w.name.starts_with(p.as_str()))
        })
        .collect();
    if !o.json {
        println!(
            "{} ({}): one training step per workload",
            dev.name()?,
            if dev.is_simulated() {
                "simulated: counts exact, times predicted"
            } else {
                "measured"
            }
        );
        println!(
            "{:<34} {:>8} {:>7} {:>6} {:>5} {:>5} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "workload",
            "launches",
            "cuBLAS",
            "syncs",
            "H2D",
            "D2H",
            "allocs",
            "H100 ms",
            "H200 ms",
            "resident",
            "measured",
            "PyTorch"
        );
    }
    // A workload that fails is reported and the others still run (a long
    // simulated run should not lose every row to one).
    let mut failed = Vec::new();
    for w in chosen {
        match row(&dev, w, &o) {
            Ok(v) if o.json => println!("{v}"),
            Ok(v) => print_row(&v),
            Err(e) => {
                eprintln!("{}: {e}", w.name);
                failed.push(w.name);
            }
        }
    }
    if !o.json && dev.is_simulated() {
        println!(
            "(ResNet-18 times: profiles at 32² and 64², extrapolated to 224²; resident: H200 without the \
             batch's copy from the host; PyTorch: H200, forward + backward, batch on the device)"
        );
    }
    match failed.is_empty() {
        true => Ok(()),
        false => Err(leangrad::Error::InvalidArgument {
            op: "gpu_step",
            msg: format!("failed: {}", failed.join(", ")),
        }),
    }
}

/// The `n` slowest launches of `p` on the modelled H200, one line each
/// (to stderr, beside the JSON): which layer of a step costs what.
fn print_slowest_launches(p: &Profile, w: &Workload, n: usize) {
    let mut rows: Vec<(f64, String)> = p
        .launches
        .iter()
        .map(|l| {
            let (us, bound) = model::launch_us(l, &model::H200, &model::COSTS);
            let name = &p.kernels[l.kernel as usize];
            (us, format!("{name} grid {} {bound:?}", l.grid[0]))
        })
        .collect();
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (us, what) in rows.into_iter().take(n) {
        eprintln!("{}: {us:9.1} µs  {what}", w.name);
    }
}

/// One workload's row: simulated (with its summary table when asked) or
/// measured.
fn row(dev: &CudaDevice, w: &Workload, o: &Options) -> Result<Value> {
    // f32 rows strict (PyTorch's twin turns both of its switches off),
    // tf32 rows TF32 in matrix products and convolutions (both on).
    let _tf32 = with_tf32(w.tf32);
    let _conv_tf32 = with_conv_tf32(w.tf32);
    if dev.is_simulated() {
        let (p, note) = simulated(dev, w)?;
        let v = report(w, Some(&p), &note, None);
        if o.table && !o.json {
            println!("{}", table::summary(&p, &model::H200));
        }
        print_slowest_launches(&p, w, o.launches);
        Ok(v)
    } else {
        Ok(report(
            w,
            None,
            "measured on the GPU",
            Some(measured(dev, w, o)?),
        ))
    }
}
