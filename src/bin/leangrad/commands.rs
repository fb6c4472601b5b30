//! `leangrad demo` and `leangrad memory`: their options checked, the run
//! refused before it starts when its peak (predicted on the meta device)
//! does not fit the device, then run and reported.

use crate::args::{LaunchArgs, MemoryArgs};
use crate::output::{self, stdout, Progress};
use crate::torch_compare::{self, Outcome, TorchRun};
use anyhow::Result;
use leangrad::demo::{self, DemoOptions};
use leangrad::memory_plan::{self, InputKind, MemoryPlan, OptimizerKind, StepSpec, TorchMeasured};
use leangrad::optim::StateFormat;
use leangrad::{DType, Device};
use std::ops::ControlFlow;

/// `auto` (CUDA 0 when it opens, else the CPU), `cpu` or `cuda` (CUDA 0,
/// an error without one).
fn device(choice: &str) -> Result<Device> {
    Ok(leangrad::jobs::choose_device(choice)?)
}

/// The arguments of `leangrad demo`.
pub struct DemoArgs {
    /// `auto`, `cpu` or `cuda`.
    pub device: String,
    /// Optimisation steps.
    pub steps: usize,
    /// Hidden width.
    pub hidden: usize,
    /// Points per class.
    pub points: usize,
    /// Learning rate.
    pub lr: f64,
    /// Only the ledger's JSON on stdout.
    pub json: bool,
}

/// Trains the demo's MLP and prints the ledger.
pub fn demo(a: DemoArgs) -> Result<()> {
    let opts = DemoOptions {
        steps: a.steps,
        hidden: a.hidden,
        points_per_class: a.points,
        lr: a.lr,
        device: device(&a.device)?,
        ..DemoOptions::default()
    };
    opts.check()?;
    let needed = demo::predict_peak(&opts)?;
    opts.device.check_fits("the demo", needed)?;
    let progress = Progress { json: a.json };
    let (hidden, steps) = (a.hidden, a.steps);
    progress.line(&format!(
        "training a 2-{hidden}-{hidden}-3 MLP on {} spiral points for {steps} steps ({}, f32, fused SGD lr={})",
        3 * a.points,
        opts.device,
        a.lr
    ))?;
    let every = (steps / 10).max(1);
    // A line that cannot be written (stdout closed) stops the training.
    let mut failed = None;
    let result = demo::run(&opts, |step, loss| {
        if step % every == 0 || step + 1 == steps {
            failed = progress
                .line(&format!("step {step:>5}  loss {loss:.4}"))
                .err();
        }
        match failed {
            Some(_) => ControlFlow::Break(()),
            None => ControlFlow::Continue(()),
        }
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    progress.line(&format!(
        "training accuracy: {:.1}%",
        100.0 * result.accuracy
    ))?;
    stdout(&if a.json {
        result.memory.to_json() + "\n"
    } else {
        result.memory.to_table()
    })
}

/// The dtype of an `--autocast` option (`bf16` or `f16`; clap has checked it).
pub fn autocast_arg(arg: &Option<String>) -> anyhow::Result<Option<DType>> {
    Ok(match arg.as_deref() {
        None => None,
        Some("bf16") => Some(DType::BF16),
        Some("f16") => Some(DType::F16),
        Some(other) => anyhow::bail!("--autocast takes bf16 or f16, not {other}"),
    })
}

/// A launched rank ended with a failure: the launcher exits with `code`.
#[derive(Debug)]
pub struct RankFailed {
    /// The rank that failed first.
    pub rank: usize,
    /// Its exit code (1 when a signal ended it).
    pub code: i32,
}

impl std::fmt::Display for RankFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rank {} exited with code {}; the other ranks were stopped",
            self.rank, self.code
        )
    }
}

impl std::error::Error for RankFailed {}

/// This process's rank when a launcher started it (`leangrad launch` or
/// torchrun set `WORLD_SIZE`), from the environment; `None` otherwise.
pub fn launched_rank() -> Result<Option<leangrad::distributed::InitOptions>> {
    if std::env::var_os("WORLD_SIZE").is_none() {
        return Ok(None);
    }
    Ok(Some(leangrad::distributed::InitOptions::from_env()?))
}

/// `leangrad launch`: one process per rank here, waited for.
pub fn launch(a: LaunchArgs) -> Result<()> {
    use leangrad::distributed::{launch, LaunchOptions};
    let opts = LaunchOptions {
        nnodes: a.nnodes,
        node_rank: a.node_rank,
        master_addr: a.master_addr,
        master_port: a.master_port,
        ..LaunchOptions::new(a.nproc_per_node)
    };
    let (program, args) = a
        .command
        .split_first()
        .ok_or_else(|| anyhow::anyhow!("launch: give the command to run after `--`"))?;
    let outcome = launch(&opts, program, args)?;
    match outcome.failed_rank {
        None => Ok(()),
        Some(rank) => Err(RankFailed {
            rank,
            code: outcome.code,
        }
        .into()),
    }
}

/// Predicts or measures one training step's memory.
pub fn memory(a: MemoryArgs) -> Result<()> {
    // Refused before any work: a file there that leangrad did not write.
    if let Some(path) = &a.timeline {
        memory_plan::plot::check_timeline_output(path)?;
    }
    if let Some(path) = &a.plot {
        memory_plan::plot::check_plot_output(path)?;
    }
    let entry = memory_plan::find_model(&a.model)?;
    let input = entry.step_input(a.size.map(|s| s as usize), a.seq.map(|s| s as usize))?;
    let classes = match entry.input {
        InputKind::Tokens {
            vocab,
            next_token: true,
            ..
        } => {
            if a.classes.is_some_and(|c| c as usize != vocab) {
                anyhow::bail!(
                    "{} predicts its vocabulary of {vocab} tokens: --classes does not apply",
                    a.model
                );
            }
            vocab
        }
        _ => a.classes.map_or(1000, |c| c as usize),
    };
    let spec = StepSpec {
        batch: a.batch as usize,
        input,
        classes,
        dtype: match a.dtype.as_str() {
            "f16" => DType::F16,
            "bf16" => DType::BF16,
            _ => DType::F32,
        },
        optimizer: OptimizerKind::parse(&a.optimizer)?,
        fused: a.fused,
        checkpoint: a.checkpoint,
        optimizer_state: StateFormat::parse(&a.optimizer_state, "memory")?,
        autocast: autocast_arg(&a.autocast)?,
        case: memory_plan::parse_case(&a.case)?,
        device: match a.device.as_str() {
            "meta" => Device::Meta,
            other => device(other)?,
        },
    };
    if a.world_size > 1 || a.shard_optimizer {
        return memory_parallel(&a, &spec);
    }
    if !spec.device.is_meta() {
        // Both policies run one after the other, each in its own ledger:
        // the larger peak is what the device must hold.
        let predicted = memory_plan::plan(
            &a.model,
            &StepSpec {
                device: Device::Meta,
                ..spec.clone()
            },
        )?;
        let needed = predicted
            .lean
            .report
            .peak_total
            .max(predicted.pytorch.report.peak_total);
        let what = format!("one {} training step at batch {}", a.model, a.batch);
        spec.device.check_fits(&what, needed)?;
    }
    let record = a.timeline.is_some() || a.plot.is_some();
    let plan = memory_plan::plan_recording(&a.model, &spec, record)?;
    if let Some(path) = &a.timeline {
        memory_plan::plot::write_timeline(&plan, path)?;
    }
    show_memory(&a, &spec, &plan)
}

/// `leangrad memory --world-size N [--shard-optimizer]`: one rank next to
/// one device, on the meta device.
fn memory_parallel(a: &MemoryArgs, spec: &StepSpec) -> Result<()> {
    if a.shard_optimizer && a.world_size < 2 {
        anyhow::bail!("--shard-optimizer shards over the ranks of --world-size (2 or more)");
    }
    let others = [
        (a.timeline.is_some(), "--timeline"),
        (a.plot.is_some(), "--plot"),
        (a.compare_torch.is_some(), "--compare-torch"),
        (!spec.device.is_meta(), "--device other than meta"),
    ];
    if let Some((_, flag)) = others.iter().find(|(given, _)| *given) {
        anyhow::bail!(
            "--world-size predicts on the meta device alone: {flag} does not combine with it"
        );
    }
    let parallel = memory_plan::ParallelSpec {
        world_size: a.world_size as usize,
        shard_optimizer: a.shard_optimizer,
    };
    let plan = memory_plan::plan_parallel(&a.model, spec, parallel)?;
    stdout(&if a.json {
        serde_json::to_string_pretty(&plan)? + "\n"
    } else {
        plan.to_table()
    })
}

/// The rest of `leangrad memory` once `plan` is made: PyTorch's run of
/// `--compare-torch` (and leangrad's numbers for its batch when that is
/// another), the plot, and the table or JSON.
fn show_memory(a: &MemoryArgs, spec: &StepSpec, plan: &MemoryPlan) -> Result<()> {
    let run = TorchRun::asked(a);
    let torch = match &run {
        Some(run) => Some(compare_torch(a, spec, run)?),
        None => None,
    };
    let column = torch.as_ref().and_then(|(_, c)| c.as_ref());
    // PyTorch at another batch: leangrad's numbers for that batch beside
    // its own (predicted on meta, which allocates as the CPU does).
    let beside = match (&run, column) {
        (Some(run), Some(_)) if run.batch != spec.batch => {
            let at = StepSpec {
                batch: run.batch,
                device: Device::Meta,
                ..spec.clone()
            };
            Some((run.batch, memory_plan::plan(&a.model, &at)?))
        }
        _ => None,
    };
    if let Some(path) = &a.plot {
        let same_step = column.filter(|_| beside.is_none());
        if let (Some(run), Some(_), None) = (&run, column, same_step) {
            output::stderr(&format!(
                "--plot: no line for PyTorch's peak: it ran at batch {}, the plot is of batch {} \
                 (give --torch-batch {} for both)\n",
                run.batch, spec.batch, spec.batch
            ));
        }
        memory_plan::plot::write_plot_compared(plan, path, same_step)?;
    }
    stdout(&if a.json {
        let mut v = serde_json::to_value(plan)?;
        if let Some((json, _)) = &torch {
            v["torch"] = json.clone();
        }
        if let Some((_, at)) = &beside {
            v["torch_batch_plan"] = serde_json::to_value(at)?;
        }
        serde_json::to_string_pretty(&v)? + "\n"
    } else if let Some((batch, at)) = &beside {
        format!(
            "{}\nPyTorch ran the step at batch {batch} (--torch-batch); beside it, leangrad's \
             prediction for batch {batch}:\n\n{}",
            plan.to_table(a.top),
            at.to_table_compared(0, column)
        )
    } else {
        plan.to_table_compared(a.top, column)
    })
}

/// Runs the same step in PyTorch as `run` says: its JSON for `--json`
/// and, when it ran, the table's column. When PyTorch is not there, says
/// on stderr how to install it and returns the JSON `{missing, install}`
/// without a column.
fn compare_torch(
    a: &MemoryArgs,
    spec: &StepSpec,
    run: &TorchRun,
) -> Result<(serde_json::Value, Option<TorchMeasured>)> {
    let args = torch_compare::script_args(a, spec, run);
    output::stderr(&format!(
        "measuring the same step in PyTorch ({} {})\n",
        torch_compare::SCRIPT_NAME,
        args.join(" ")
    ));
    Ok(match torch_compare::measure(a, &args, run)? {
        Outcome::Measured(json, column) => (json, Some(column)),
        Outcome::Unavailable(json, message) => {
            output::stderr(&message);
            (json, None)
        }
    })
}
