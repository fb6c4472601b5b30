//! The `leangrad` command-line tool.

mod args;
mod commands;
mod output;
mod torch_compare;

use anyhow::Result;
use args::{Cli, Command};
use clap::Parser;
use commands::DemoArgs;
use leangrad::jobs;
use leangrad::jobs::adversarial::{self, AdversarialOptions, Attack};
use leangrad::jobs::finetune::{self, FinetuneOptions};
use leangrad::jobs::style::{
    self, InputConvention, StyleInit, StyleNet, StyleOptimizer, StyleOptions,
};
use leangrad::memory_plan::OptimizerKind;
use output::{report, PipeClosed};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The first thing, so it cannot fail for a pool already built: this
    // thread runs the jobs' ops and computes with the pool's threads.
    if let Err(e) = leangrad::threads::init(None) {
        output::stderr(&format!("warning: {e}\n"));
    }
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // The reader of stdout went away (`| head`): nothing left to say.
        Err(e) if e.is::<PipeClosed>() => std::process::ExitCode::SUCCESS,
        // A launched rank failed: its own exit code, as torchrun returns.
        Err(e) if e.is::<commands::RankFailed>() => {
            output::stderr(&format!("error: {}\n", error_text(&e)));
            let code = e
                .downcast_ref::<commands::RankFailed>()
                .map_or(1, |f| f.code);
            std::process::ExitCode::from(u8::try_from(code).unwrap_or(1).max(1))
        }
        Err(e) => {
            output::stderr(&format!("error: {}\n", error_text(&e)));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes, `: `-separated, leaving out a cause whose
/// text the message already holds (leangrad's errors quote the system's
/// error in their own text, which `{:#}` would print a second time).
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let cause = cause.to_string();
        if text.is_empty() {
            text = cause;
        } else if !text.contains(&cause) {
            text = format!("{text}: {cause}");
        }
    }
    text
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Demo {
            device,
            steps,
            hidden,
            points,
            lr,
            json,
        } => commands::demo(DemoArgs {
            device,
            steps,
            hidden,
            points,
            lr,
            json,
        })?,
        Command::Memory(args) => commands::memory(args)?,
        Command::Launch(args) => commands::launch(args)?,
        Command::Finetune {
            model,
            weights,
            strict,
            strip_prefix,
            add_prefix,
            data,
            val,
            case,
            epochs,
            batch,
            size,
            lr,
            optimizer,
            fused,
            gradient_checkpointing,
            sync_batch_norm,
            optimizer_state,
            autocast,
            out,
            resume,
            seed,
            workers,
            skip_bad_images,
            device,
            json,
        } => {
            // Under a launcher, each rank trains on CUDA device LOCAL_RANK.
            let distributed = commands::launched_rank()?;
            let device = match &distributed {
                Some(d) => d.device,
                None => jobs::choose_device(&device)?,
            };
            let rank0 = distributed.as_ref().is_none_or(|d| d.rank == 0);
            let opts = FinetuneOptions {
                weights,
                loading: jobs::WeightsLoading {
                    strict,
                    strip_prefix,
                    add_prefix,
                },
                val,
                case,
                epochs,
                batch,
                size,
                lr,
                optimizer: OptimizerKind::parse(&optimizer)?,
                fused,
                gradient_checkpointing,
                sync_batch_norm,
                optimizer_state: leangrad::optim::StateFormat::parse(&optimizer_state, "finetune")?,
                autocast: commands::autocast_arg(&autocast)?,
                out,
                resume,
                device,
                seed,
                workers,
                skip_bad_images,
                quiet: json,
                distributed,
                ..FinetuneOptions::new(&model, data)
            };
            let start = std::time::Instant::now();
            let r = finetune::run(&opts)?;
            let seconds = start.elapsed().as_secs_f64();
            if rank0 {
                output::report_timed(&r, json, finetune::describe, seconds)?;
            }
        }
        Command::Adversarial {
            model,
            weights,
            images,
            attack,
            eps,
            alpha,
            steps,
            targeted,
            size,
            batch,
            classes,
            labels,
            seed,
            device,
            out,
            skip_bad_images,
            json,
        } => {
            let opts = AdversarialOptions {
                weights,
                attack: Attack::parse(&attack)?,
                eps,
                alpha,
                steps,
                targeted,
                size,
                batch,
                classes,
                labels,
                device: jobs::choose_device(&device)?,
                seed,
                skip_bad_images,
                quiet: json,
                ..AdversarialOptions::new(&model, images, out)
            };
            report(&adversarial::run(&opts)?, json, adversarial::describe)?;
        }
        Command::Style {
            content,
            style: style_image,
            weights,
            model,
            size,
            steps,
            content_weight,
            style_weight,
            optimizer,
            lr,
            init,
            seed,
            out,
            every,
            input_convention,
            keep_going,
            device,
            json,
        } => {
            let opts = StyleOptions {
                net: StyleNet::named(&model)?,
                weights,
                size,
                steps,
                content_weight,
                style_weight,
                optimizer: StyleOptimizer::parse(&optimizer)?,
                lr,
                init: if init == "noise" {
                    StyleInit::Noise
                } else {
                    StyleInit::Content
                },
                seed,
                every,
                input_convention: InputConvention::parse(&input_convention)?,
                keep_going,
                device: jobs::choose_device(&device)?,
                quiet: json,
                ..StyleOptions::new(content, style_image, out)
            };
            let r = style::run(&opts)?;
            if let Some(what) = &r.diverged {
                output::stderr(&format!(
                    "warning: style diverged (running on, --keep-going): {what}\n"
                ));
            }
            report(&r, json, style::describe)?;
        }
    }
    Ok(())
}
