//! Sharded optimizer state, as PyTorch's `ZeroRedundancyOptimizer`: each
//! parameter has one owner rank (the parameters are dealt out largest
//! first, each to the rank holding the fewest bytes so far, the same on
//! every rank), and only its owner keeps its optimizer state and updates
//! it; the updated parameter is then broadcast from its owner.
//!
//! - ZeRO stage 1, [`ShardedOptimizer::step`] after
//!   [`DataParallel::backward`](super::DataParallel::backward): every rank
//!   gets every averaged gradient, keeps its own parameters' and frees the
//!   rest, updates its own, and the parameters are broadcast.
//! - ZeRO stage 2, [`DataParallel::backward_step_sharded`](super::DataParallel::backward_step_sharded):
//!   the fused step with each bucket's gradients reduced to their owners
//!   alone; a rank frees the others' gradients as soon as the reduction
//!   is queued, updates its own and broadcasts them, bucket by bucket.
//!
//! Saves nothing for backward.

use super::bucket::{BucketPlan, Reducer};
use super::ProcessGroup;
use crate::optim::{Algorithm, Clip, FusedStep, Optimizer};
use crate::{Error, Result, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

/// An [`Optimizer`] whose state is split over the ranks of a group (see
/// the module documentation).
pub struct ShardedOptimizer<A: Algorithm> {
    group: Arc<ProcessGroup>,
    opt: Optimizer<A>,
    params: Vec<Tensor>,
    /// Leaf id → the rank that owns the parameter.
    owners: HashMap<u64, usize>,
}

impl<A: Algorithm> ShardedOptimizer<A> {
    /// An optimizer of `params` with `hyper` whose state is sharded over
    /// `group`. Every rank must give the same parameters in the same order.
    pub fn new(
        params: impl IntoIterator<Item = Tensor>,
        hyper: A,
        group: Arc<ProcessGroup>,
    ) -> Result<ShardedOptimizer<A>> {
        ShardedOptimizer::from_optimizer(Optimizer::new(params, hyper)?, group)
    }

    /// `opt`'s parameters (every group's, in order), its hyper-parameters
    /// and settings kept, with the state sharded over `group`. `opt` must
    /// not hold state yet.
    pub fn from_optimizer(
        opt: Optimizer<A>,
        group: Arc<ProcessGroup>,
    ) -> Result<ShardedOptimizer<A>> {
        if opt.state_bytes() > 0 || opt.steps() > 0 {
            return Err(Error::InvalidArgument {
                op: "ShardedOptimizer",
                msg: "the optimizer already holds state for every parameter: shard it before its first step".into(),
            });
        }
        let params: Vec<Tensor> = opt
            .groups()
            .iter()
            .flat_map(|g| g.params().iter().cloned())
            .collect();
        let owners = deal(&params, group.world_size());
        Ok(ShardedOptimizer {
            group,
            opt,
            params,
            owners,
        })
    }

    /// The rank that owns `param` (keeps its state and updates it), if it
    /// is one of this optimizer's trainable parameters.
    pub fn owner(&self, param: &Tensor) -> Option<usize> {
        self.owners.get(&param.leaf_id()?).copied()
    }

    /// The optimizer underneath (its settings, learning rates, state).
    pub fn optimizer(&self) -> &Optimizer<A> {
        &self.opt
    }

    /// The optimizer underneath, to change its settings (clipping per
    /// parameter, accumulation, state format, learning rates).
    pub fn optimizer_mut(&mut self) -> &mut Optimizer<A> {
        &mut self.opt
    }

    /// Bytes of optimizer state on this rank (its shard).
    pub fn state_bytes(&self) -> usize {
        self.opt.state_bytes()
    }

    /// ZeRO stage 1: updates this rank's parameters from their `.grad`
    /// (freeing the `.grad` of the others first), then broadcasts every
    /// parameter from its owner.
    pub fn step(&mut self) -> Result<()> {
        self.check_clip()?;
        let rank = self.group.rank();
        for p in &self.params {
            if self.owner(p).is_some_and(|o| o != rank) {
                p.zero_grad();
            }
        }
        self.opt.step()?;
        let (params, roots): (Vec<Tensor>, Vec<usize>) = self
            .params
            .iter()
            .filter_map(|p| Some((p.clone(), self.owner(p)?)))
            .unzip();
        self.group.broadcast_group(&params, &roots)
    }

    /// Frees every parameter's `.grad`.
    pub fn zero_grad(&self) {
        self.opt.zero_grad();
    }

    /// Global-norm clipping would need the norm over every rank's shard.
    fn check_clip(&self) -> Result<()> {
        if let Clip::GlobalNorm(_) = self.opt.clip() {
            return Err(Error::InvalidArgument {
                op: "ShardedOptimizer",
                msg: "global-norm clipping is not available with sharded state: clip per parameter (Clip::ParamNorm)".into(),
            });
        }
        Ok(())
    }

    /// ZeRO stage 2: the fused step with `plan`'s buckets reduced to each
    /// parameter's owner over `group`.
    pub(super) fn fused_step(
        &mut self,
        group: &ProcessGroup,
        plan: &BucketPlan,
        loss: &Tensor,
    ) -> Result<FusedStep> {
        self.check_clip()?;
        if group.rank() != self.group.rank() || group.world_size() != self.group.world_size() {
            return Err(Error::Distributed {
                rank: group.rank(),
                msg: "the sharded optimizer belongs to another group".into(),
            });
        }
        let mut reducer = Reducer::sharded(group, plan, &self.owners);
        self.opt.backward_step_relayed(loss, &mut reducer)
    }
}

/// Each trainable parameter's owner: largest first, each to the rank with
/// the fewest bytes so far (the lowest such rank), as PyTorch's
/// `ZeroRedundancyOptimizer` partitions.
fn deal(params: &[Tensor], world_size: usize) -> HashMap<u64, usize> {
    let mut order: Vec<&Tensor> = params.iter().filter(|p| p.leaf_id().is_some()).collect();
    // A stable sort: equal sizes keep the given order on every rank.
    order.sort_by_key(|p| std::cmp::Reverse(p.storage_bytes()));
    let mut load = vec![0usize; world_size.max(1)];
    let mut owners = HashMap::new();
    for p in order {
        let rank = (0..load.len()).min_by_key(|&r| (load[r], r)).unwrap_or(0);
        load[rank] += p.storage_bytes();
        if let Some(id) = p.leaf_id() {
            owners.insert(id, rank);
        }
    }
    owners
}
