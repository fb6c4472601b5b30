//! Learning-rate schedules, stepped once per optimizer step (or epoch) as
//! `torch.optim.lr_scheduler`: the same recursive ("chainable") formulas,
//! so the rates agree with PyTorch's to the last bits of f64.

use super::{Algorithm, Optimizer};
use crate::{Error, Result};
use std::f64::consts::PI;

/// A schedule's rule.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Schedule {
    /// `StepLR`: the rate times `gamma` every `step_size` epochs.
    Step {
        /// Epochs between decays.
        step_size: u64,
        /// Decay factor.
        gamma: f64,
    },
    /// `CosineAnnealingLR`: from the base rate down to `eta_min` over
    /// `t_max` epochs along half a cosine (and back up after, periodically).
    Cosine {
        /// Half period, in epochs.
        t_max: u64,
        /// Lowest rate.
        eta_min: f64,
    },
    /// `LinearLR` (linear warm-up): the base rate times a factor going
    /// linearly from `start_factor` to `end_factor` over `total_iters`.
    Linear {
        /// Factor at epoch 0.
        start_factor: f64,
        /// Factor from `total_iters` on.
        end_factor: f64,
        /// Epochs of the ramp.
        total_iters: u64,
    },
}

/// A learning-rate scheduler over every parameter group of an optimizer.
///
/// Like PyTorch, creating it applies epoch 0 (a linear warm-up scales the
/// rate by `start_factor` at once); call [`LrScheduler::step`] after each
/// optimizer step.
#[derive(Clone, Debug)]
pub struct LrScheduler {
    schedule: Schedule,
    base_lrs: Vec<f64>,
    last_epoch: u64,
}

impl LrScheduler {
    /// A scheduler whose base rates are the optimizer's current rates.
    pub fn new<A: Algorithm>(opt: &mut Optimizer<A>, schedule: Schedule) -> Result<LrScheduler> {
        let s = LrScheduler::detached(opt, schedule)?;
        let lrs = s.chainable(&opt.lrs());
        opt.set_lrs(&lrs)?;
        Ok(s)
    }

    /// Validated, with base rates taken from `opt`, without applying epoch 0.
    fn detached<A: Algorithm>(opt: &Optimizer<A>, schedule: Schedule) -> Result<LrScheduler> {
        check_schedule(&schedule)?;
        Ok(LrScheduler {
            schedule,
            base_lrs: opt.lrs(),
            last_epoch: 0,
        })
    }

    /// The epoch reached (0 after creation).
    pub fn last_epoch(&self) -> u64 {
        self.last_epoch
    }

    /// Advances one epoch and sets the optimizer's rates.
    pub fn step<A: Algorithm>(&mut self, opt: &mut Optimizer<A>) -> Result<()> {
        self.last_epoch += 1;
        let lrs = self.chainable(&opt.lrs());
        opt.set_lrs(&lrs)
    }

    /// Jumps to `epoch` with the closed form (PyTorch's `step(epoch)`).
    pub fn step_to<A: Algorithm>(&mut self, opt: &mut Optimizer<A>, epoch: u64) -> Result<()> {
        self.last_epoch = epoch;
        let lrs: Vec<f64> = self.base_lrs.iter().map(|&b| self.closed(b)).collect();
        opt.set_lrs(&lrs)
    }

    /// The recursive rule: the next rates from the current ones.
    fn chainable(&self, current: &[f64]) -> Vec<f64> {
        let e = self.last_epoch;
        current
            .iter()
            .zip(&self.base_lrs)
            .map(|(&lr, &base)| match self.schedule {
                Schedule::Step { step_size, gamma } => {
                    if e == 0 || !e.is_multiple_of(step_size) {
                        lr
                    } else {
                        lr * gamma
                    }
                }
                Schedule::Cosine { t_max, eta_min } => {
                    let (e, t) = (e as f64, t_max as f64);
                    if self.last_epoch == 0 {
                        lr
                    } else if (self.last_epoch as i64 - 1 - t_max as i64)
                        .rem_euclid(2 * t_max as i64)
                        == 0
                    {
                        lr + (base - eta_min) * (1.0 - (PI / t).cos()) / 2.0
                    } else {
                        (1.0 + (PI * e / t).cos()) / (1.0 + (PI * (e - 1.0) / t).cos())
                            * (lr - eta_min)
                            + eta_min
                    }
                }
                Schedule::Linear {
                    start_factor,
                    end_factor,
                    total_iters,
                } => {
                    if e == 0 {
                        lr * start_factor
                    } else if e > total_iters {
                        lr
                    } else {
                        lr * (1.0
                            + (end_factor - start_factor)
                                / (total_iters as f64 * start_factor
                                    + (e - 1) as f64 * (end_factor - start_factor)))
                    }
                }
            })
            .collect()
    }

    /// The closed form at `last_epoch` from a base rate.
    fn closed(&self, base: f64) -> f64 {
        let e = self.last_epoch;
        match self.schedule {
            Schedule::Step { step_size, gamma } => base * gamma.powf((e / step_size) as f64),
            Schedule::Cosine { t_max, eta_min } => {
                eta_min + (base - eta_min) * (1.0 + (PI * e as f64 / t_max as f64).cos()) / 2.0
            }
            Schedule::Linear {
                start_factor,
                end_factor,
                total_iters,
            } => {
                base * (start_factor
                    + (end_factor - start_factor) * e.min(total_iters) as f64 / total_iters as f64)
            }
        }
    }
}

/// Schedules one after another (`SequentialLR`): schedule `i + 1` takes
/// over at epoch `milestones[i]`, restarting from its base rate (closed
/// form at its epoch 0). Warm-up then cosine:
/// `SequentialLr::new(opt, vec![Linear{..}, Cosine{..}], vec![warmup])`.
#[derive(Clone, Debug)]
pub struct SequentialLr {
    schedulers: Vec<LrScheduler>,
    milestones: Vec<u64>,
    last_epoch: u64,
}

impl SequentialLr {
    /// The composition; `milestones` has one entry fewer than `schedules`,
    /// increasing. Applies the first schedule's epoch 0.
    pub fn new<A: Algorithm>(
        opt: &mut Optimizer<A>,
        schedules: Vec<Schedule>,
        milestones: Vec<u64>,
    ) -> Result<SequentialLr> {
        if schedules.is_empty()
            || milestones.len() + 1 != schedules.len()
            || milestones.windows(2).any(|w| w[0] >= w[1])
        {
            return Err(Error::InvalidArgument {
                op: "SequentialLr",
                msg: format!(
                    "{} schedules need {} increasing milestones, got {:?}",
                    schedules.len(),
                    schedules.len().saturating_sub(1),
                    milestones
                ),
            });
        }
        let schedulers = schedules
            .into_iter()
            .map(|s| LrScheduler::detached(opt, s))
            .collect::<Result<Vec<_>>>()?;
        let lrs = schedulers[0].chainable(&opt.lrs());
        opt.set_lrs(&lrs)?;
        Ok(SequentialLr {
            schedulers,
            milestones,
            last_epoch: 0,
        })
    }

    /// The epoch reached (0 after creation).
    pub fn last_epoch(&self) -> u64 {
        self.last_epoch
    }

    /// Advances one epoch and sets the optimizer's rates.
    pub fn step<A: Algorithm>(&mut self, opt: &mut Optimizer<A>) -> Result<()> {
        self.last_epoch += 1;
        let idx = self.milestones.partition_point(|&m| m <= self.last_epoch);
        let s = &mut self.schedulers[idx];
        if idx > 0 && self.milestones[idx - 1] == self.last_epoch {
            s.step_to(opt, 0)
        } else {
            s.step(opt)
        }
    }
}

/// Checks a schedule's parameters (as PyTorch's constructors do).
fn check_schedule(schedule: &Schedule) -> Result<()> {
    let bad = match schedule {
        Schedule::Step { step_size, .. } => *step_size == 0,
        Schedule::Cosine { t_max, .. } => *t_max == 0,
        Schedule::Linear {
            start_factor,
            end_factor,
            total_iters,
        } => {
            !(*start_factor > 0.0 && *start_factor <= 1.0 && (0.0..=1.0).contains(end_factor))
                || *total_iters == 0
        }
    };
    if bad {
        return Err(Error::InvalidArgument {
            op: "LrScheduler",
            msg: format!("invalid schedule {schedule:?}"),
        });
    }
    Ok(())
}

/// An [`LrScheduler`]'s position: its rule, base rates and epoch.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LrSchedulerState {
    /// The rule.
    pub schedule: Schedule,
    /// One base rate per parameter group.
    pub base_lrs: Vec<f64>,
    /// The epoch reached.
    pub last_epoch: u64,
}

/// A scheduler's position, to save and restore (what PyTorch's scheduler
/// `state_dict` holds). The current rates themselves live in the
/// optimizer's state, which is saved alongside.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ScheduleState {
    /// An [`LrScheduler`]'s.
    Single(LrSchedulerState),
    /// A [`SequentialLr`]'s.
    Sequential {
        /// Each schedule's own position.
        schedulers: Vec<LrSchedulerState>,
        /// The epochs at which the next schedule takes over.
        milestones: Vec<u64>,
        /// The epoch reached.
        last_epoch: u64,
    },
}

/// A learning-rate scheduler whose position can be saved and restored.
pub trait Scheduler {
    /// The position to save.
    fn state(&self) -> ScheduleState;

    /// Restores a saved position, rule included (as PyTorch's
    /// `load_state_dict` does). The saved state must be of the same kind
    /// (single or sequential) with one base rate per group of this
    /// scheduler's optimizer; errors are [`Error::Checkpoint`] naming the
    /// entry, and nothing changes on error.
    fn load_state(&mut self, state: &ScheduleState) -> Result<()>;
}

fn schedule_fault(entry: &str, reason: String) -> Error {
    Error::Checkpoint {
        entry: entry.to_string(),
        reason,
    }
}

impl LrScheduler {
    /// Checks `state` against this scheduler (`entry` names it in errors).
    fn check_state(&self, state: &LrSchedulerState, entry: &str) -> Result<()> {
        check_schedule(&state.schedule)
            .map_err(|e| schedule_fault(&format!("{entry}.schedule"), e.to_string()))?;
        if state.base_lrs.len() != self.base_lrs.len() {
            return Err(schedule_fault(
                &format!("{entry}.base_lrs"),
                format!(
                    "{} base rates saved, the optimizer has {} groups",
                    state.base_lrs.len(),
                    self.base_lrs.len()
                ),
            ));
        }
        Ok(())
    }

    fn own_state(&self) -> LrSchedulerState {
        LrSchedulerState {
            schedule: self.schedule.clone(),
            base_lrs: self.base_lrs.clone(),
            last_epoch: self.last_epoch,
        }
    }

    fn set_state(&mut self, state: &LrSchedulerState) {
        self.schedule = state.schedule.clone();
        self.base_lrs = state.base_lrs.clone();
        self.last_epoch = state.last_epoch;
    }
}

impl Scheduler for LrScheduler {
    fn state(&self) -> ScheduleState {
        ScheduleState::Single(self.own_state())
    }

    fn load_state(&mut self, state: &ScheduleState) -> Result<()> {
        let ScheduleState::Single(s) = state else {
            return Err(schedule_fault(
                "schedule",
                "saved by a SequentialLr, this is an LrScheduler".into(),
            ));
        };
        self.check_state(s, "schedule")?;
        self.set_state(s);
        Ok(())
    }
}

impl Scheduler for SequentialLr {
    fn state(&self) -> ScheduleState {
        ScheduleState::Sequential {
            schedulers: self.schedulers.iter().map(|s| s.own_state()).collect(),
            milestones: self.milestones.clone(),
            last_epoch: self.last_epoch,
        }
    }

    fn load_state(&mut self, state: &ScheduleState) -> Result<()> {
        let ScheduleState::Sequential {
            schedulers,
            milestones,
            last_epoch,
        } = state
        else {
            return Err(schedule_fault(
                "schedule",
                "saved by an LrScheduler, this is a SequentialLr".into(),
            ));
        };
        if schedulers.len() != self.schedulers.len()
            || milestones.len() + 1 != schedulers.len()
            || milestones.windows(2).any(|w| w[0] >= w[1])
        {
            return Err(schedule_fault(
                "schedule.schedulers",
                format!(
                    "{} schedules with milestones {milestones:?} saved, this SequentialLr has {}",
                    schedulers.len(),
                    self.schedulers.len()
                ),
            ));
        }
        for (i, (own, saved)) in self.schedulers.iter().zip(schedulers).enumerate() {
            own.check_state(saved, &format!("schedule.schedulers.{i}"))?;
        }
        for (own, saved) in self.schedulers.iter_mut().zip(schedulers) {
            own.set_state(saved);
        }
        self.milestones = milestones.clone();
        self.last_epoch = *last_epoch;
        Ok(())
    }
}
