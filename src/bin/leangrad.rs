//! The `leangrad` command-line tool.

use anyhow::Result;
use clap::{Parser, Subcommand};
use leangrad::demo::{self, DemoOptions};

#[derive(Parser)]
#[command(
    name = "leangrad",
    version,
    about = "A deep-learning framework whose autodiff keeps only the bytes gradients need"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a small MLP on a synthetic spiral (CPU) and print the memory ledger.
    Demo {
        /// Optimisation steps.
        #[arg(long, default_value_t = 300)]
        steps: usize,
        /// Hidden width.
        #[arg(long, default_value_t = 64)]
        hidden: usize,
        /// Points per class.
        #[arg(long, default_value_t = 100)]
        points: usize,
        /// Learning rate.
        #[arg(long, default_value_t = 0.5)]
        lr: f64,
        /// Print the ledger as JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Demo {
            steps,
            hidden,
            points,
            lr,
            json,
        } => {
            let opts = DemoOptions {
                steps,
                hidden,
                points_per_class: points,
                lr,
                ..DemoOptions::default()
            };
            println!(
                "training a 2-{hidden}-{hidden}-3 MLP on {} spiral points for {steps} steps (cpu, f32, fused SGD lr={lr})",
                3 * points
            );
            let every = (steps / 10).max(1);
            let result = demo::run(&opts, |step, loss| {
                if step % every == 0 || step + 1 == steps {
                    println!("step {step:>5}  loss {loss:.4}");
                }
            })?;
            println!("training accuracy: {:.1}%", 100.0 * result.accuracy);
            if json {
                println!("{}", result.memory.to_json());
            } else {
                print!("{}", result.memory.to_table());
            }
        }
    }
    Ok(())
}
