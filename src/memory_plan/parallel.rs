//! One rank's step under data parallel, on the meta device (`leangrad
//! memory --world-size N [--shard-optimizer]`): the step runs as rank `r`
//! of a group that does not communicate, through the same
//! [`DataParallel`] buckets and [`ShardedOptimizer`] ownership as a real
//! run, so the ledger sees what that rank allocates. leangrad's
//! collectives work in place on the gradients and parameters, so they add
//! no communication buffers of their own.

use super::{forward_loss, plan_build, AnyOptimizer, StepModel, StepSpec};
use crate::autograd::SavePolicy;
use crate::distributed::{DataParallel, DdpOptions, ProcessGroup, ShardedOptimizer};
use crate::memory::{human_bytes, Ledger, MemoryReport, Phase, TimelineEvent};
use crate::optim::{Algorithm, Optimizer};
use crate::{Error, Result, Tensor};
use serde::Serialize;
use std::sync::Arc;

/// Data parallel for a planned step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ParallelSpec {
    /// Ranks (GPUs), each running the step's batch.
    pub world_size: usize,
    /// Optimizer state sharded over the ranks (ZeRO stage 1, or stage 2
    /// with the fused step).
    pub shard_optimizer: bool,
}

/// One rank's step as predicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RankPeak {
    /// The rank (the one with the largest peak).
    pub rank: usize,
    /// Its peak bytes.
    pub peak_bytes: usize,
    /// Its parameter gradients' peak.
    pub gradient_peak_bytes: usize,
    /// Its optimizer state at the end of the step.
    pub optimizer_state_bytes: usize,
}

/// A step on one device next to one rank of data parallel, unsharded and
/// (when asked) sharded.
#[derive(Clone, Debug, Serialize)]
pub struct ParallelPlan {
    /// The model's name.
    pub model: String,
    /// The step each rank runs.
    pub spec: StepSpec,
    /// Ranks.
    pub world_size: usize,
    /// The step on one device, without data parallel.
    pub single_device: RankPeak,
    /// The largest rank's step with replicated optimizer state.
    pub replicated: RankPeak,
    /// The largest rank's step with sharded optimizer state.
    pub sharded: Option<RankPeak>,
}

/// Rank `rank` of `world_size`, sharded or not: how [`super::run_step_as`]
/// runs the step's backward and update.
pub(super) struct Rank {
    rank: usize,
    world_size: usize,
    shard: bool,
}

impl Rank {
    /// The step as this rank: forward, then backward and update through
    /// data parallel's buckets (and sharded state).
    pub(super) fn step(
        &self,
        model: &dyn StepModel,
        x: &Tensor,
        targets: &Tensor,
        opt: AnyOptimizer,
        fused: bool,
        ledger: &Ledger,
    ) -> Result<(MemoryReport, Vec<TimelineEvent>)> {
        let group = Arc::new(ProcessGroup::predicting(
            self.rank,
            self.world_size,
            x.device(),
        ));
        let parallel = DataParallel::new(model, group.clone(), DdpOptions::default())?;
        let loss = forward_loss(model, x, targets, ledger)?;
        match opt {
            AnyOptimizer::Sgd(o) => self.update(&parallel, group, o, &loss, fused, ledger),
            AnyOptimizer::Adam(o) => self.update(&parallel, group, o, &loss, fused, ledger),
        }
    }

    fn update<A: Algorithm>(
        &self,
        parallel: &DataParallel,
        group: Arc<ProcessGroup>,
        mut opt: Optimizer<A>,
        loss: &Tensor,
        fused: bool,
        ledger: &Ledger,
    ) -> Result<(MemoryReport, Vec<TimelineEvent>)> {
        // The report is taken while the optimizer (and its state) is alive.
        if !self.shard {
            if fused {
                parallel.backward_step(&mut opt, loss)?;
            } else {
                parallel.backward(loss)?;
                ledger.set_phase(Phase::Optimizer);
                opt.step()?;
            }
            return Ok((ledger.report(), ledger.timeline()));
        }
        let mut opt = ShardedOptimizer::from_optimizer(opt, group)?;
        if fused {
            parallel.backward_step_sharded(&mut opt, loss)?;
        } else {
            parallel.backward(loss)?;
            ledger.set_phase(Phase::Optimizer);
            opt.step()?;
        }
        Ok((ledger.report(), ledger.timeline()))
    }
}

/// One step of the model `name` (lean policy, on `spec.device`, normally
/// the meta device) on one device and as every rank of `parallel`: the
/// single-device figures and the largest rank's.
pub fn plan_parallel(name: &str, spec: &StepSpec, parallel: ParallelSpec) -> Result<ParallelPlan> {
    if parallel.world_size == 0 {
        return Err(Error::InvalidArgument {
            op: "memory",
            msg: "the world size must be at least 1".into(),
        });
    }
    let build = plan_build(name, spec)?;
    let peak = |rank: Option<Rank>| -> Result<RankPeak> {
        let r = rank.as_ref().map_or(0, |r| r.rank);
        let m = super::run_step_as(&build, spec, SavePolicy::Lean, false, rank)?;
        Ok(RankPeak {
            rank: r,
            peak_bytes: m.report.peak_total,
            gradient_peak_bytes: m.report.peak.parameter_gradients,
            optimizer_state_bytes: m.report.live.optimizer_state,
        })
    };
    let largest = |shard: bool| -> Result<RankPeak> {
        let mut best: Option<RankPeak> = None;
        for rank in 0..parallel.world_size {
            let p = peak(Some(Rank {
                rank,
                world_size: parallel.world_size,
                shard,
            }))?;
            if best.is_none_or(|b| p.peak_bytes > b.peak_bytes) {
                best = Some(p);
            }
            if !shard {
                // Every rank replicates the same step.
                break;
            }
        }
        best.ok_or_else(|| Error::InvalidArgument {
            op: "memory",
            msg: "no rank".into(),
        })
    };
    Ok(ParallelPlan {
        model: name.to_string(),
        spec: spec.clone(),
        world_size: parallel.world_size,
        single_device: peak(None)?,
        replicated: largest(false)?,
        sharded: parallel
            .shard_optimizer
            .then(|| largest(true))
            .transpose()?,
    })
}

impl ParallelPlan {
    /// The three steps side by side, for people.
    pub fn to_table(&self) -> String {
        let mut s = format!(
            "{}: one training step, batch {} per rank, {:?}{} — one rank's memory under data parallel over {} ranks\n\n",
            self.model,
            self.spec.batch,
            self.spec.optimizer,
            if self.spec.fused { " fused into backward" } else { "" },
            self.world_size
        );
        s += &format!(
            "{:<34} {:>12} {:>14} {:>16}\n",
            "", "peak", "gradients", "optimizer state"
        );
        let mut row = |what: String, p: &RankPeak| {
            s += &format!(
                "{:<34} {:>12} {:>14} {:>16}\n",
                what,
                human_bytes(p.peak_bytes),
                human_bytes(p.gradient_peak_bytes),
                human_bytes(p.optimizer_state_bytes)
            );
        };
        row("one device".into(), &self.single_device);
        row(
            format!(
                "rank {} of {}, replicated state",
                self.replicated.rank, self.world_size
            ),
            &self.replicated,
        );
        if let Some(p) = &self.sharded {
            row(
                format!("rank {} of {}, sharded state", p.rank, self.world_size),
                p,
            );
            let even = self.replicated.optimizer_state_bytes / self.world_size;
            if p.optimizer_state_bytes > even {
                s += &format!(
                    "\neach parameter's state lives whole on one rank (dealt largest first, as \
                     ZeroRedundancyOptimizer does): rank {} holds {}, an even split {}\n",
                    p.rank,
                    human_bytes(p.optimizer_state_bytes),
                    human_bytes(even)
                );
            }
        }
        s += "\ngradients are all-reduced in place in 25 MiB buckets: no communication buffer is added\n";
        s
    }
}
