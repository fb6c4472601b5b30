//! Data parallel's gradient buckets: which parameters share a bucket, and
//! the reducer that collects one backward's gradients, all-reduces each
//! bucket the moment its last gradient is final, and hands the averaged
//! gradients back.
//!
//! Buckets are filled in reverse parameter order (the order backward
//! usually finishes gradients in), the first one small (1 MiB, as
//! PyTorch's) so that communication starts early. A bucket is reduced in
//! place, gradient by gradient, as one NCCL group: no flat copy of the
//! gradients is made. Buckets are launched in index order on every rank
//! (NCCL needs every rank to issue its collectives in one order), and a
//! launched bucket is waited for only when the next one launches, so its
//! all-reduce overlaps the backward kernels that produce the next bucket.

use super::{PendingReduce, ProcessGroup, ReduceOp};
use crate::optim::GradRelay;
use crate::{Error, Result, Tensor};
use std::collections::{HashMap, VecDeque};

/// PyTorch's first bucket: 1 MiB (`dist._DEFAULT_FIRST_BUCKET_BYTES`).
const FIRST_BUCKET_BYTES: usize = 1 << 20;

/// Launched buckets left in flight while backward goes on.
const IN_FLIGHT: usize = 1;

/// The parameters that data parallel reduces, grouped into buckets.
pub(super) struct BucketPlan {
    /// Names and tensors of the parameters that require grad, in the
    /// module's order.
    params: Vec<(String, Tensor)>,
    /// Each bucket's parameters (indices into `params`).
    buckets: Vec<Vec<usize>>,
    /// Leaf id → (bucket, position in it).
    slot: HashMap<u64, (usize, usize)>,
}

impl BucketPlan {
    /// Buckets of at most `cap` bytes of gradients (a parameter larger
    /// than `cap` gets its own), the first at most 1 MiB.
    pub(super) fn new(params: Vec<(String, Tensor)>, cap: usize) -> BucketPlan {
        let mut buckets: Vec<Vec<usize>> = Vec::new();
        let mut bytes = 0usize;
        for i in (0..params.len()).rev() {
            let size = params[i].1.storage_bytes();
            let limit = match buckets.len() {
                1 => cap.min(FIRST_BUCKET_BYTES),
                _ => cap,
            };
            match buckets.last_mut() {
                Some(b) if bytes.saturating_add(size) <= limit => {
                    b.push(i);
                    bytes += size;
                }
                _ => {
                    buckets.push(vec![i]);
                    bytes = size;
                }
            }
        }
        let mut slot = HashMap::new();
        for (b, members) in buckets.iter().enumerate() {
            for (pos, &i) in members.iter().enumerate() {
                if let Some(id) = params[i].1.leaf_id() {
                    slot.insert(id, (b, pos));
                }
            }
        }
        BucketPlan {
            params,
            buckets,
            slot,
        }
    }

    /// The parameters' names, bucket by bucket.
    pub(super) fn bucket_names(&self) -> Vec<Vec<String>> {
        self.buckets
            .iter()
            .map(|b| b.iter().map(|&i| self.params[i].0.clone()).collect())
            .collect()
    }

    /// Each bucket's gradient bytes.
    pub(super) fn bucket_bytes(&self) -> Vec<usize> {
        self.buckets
            .iter()
            .map(|b| b.iter().map(|&i| self.params[i].1.storage_bytes()).sum())
            .collect()
    }

    /// Whether `param` is one the plan reduces.
    pub(super) fn holds(&self, param: &Tensor) -> bool {
        param
            .leaf_id()
            .is_some_and(|id| self.slot.contains_key(&id))
    }
}

/// One backward's gradients on their way through the buckets.
pub(super) struct Reducer<'a> {
    group: &'a ProcessGroup,
    plan: &'a BucketPlan,
    /// Sharded optimizer state: each parameter's owner (leaf id → rank),
    /// the one rank its averaged gradient goes to and that updates it.
    owners: Option<&'a HashMap<u64, usize>>,
    /// Buckets handed back to their owners' updates, whose parameters are
    /// to be broadcast from their owners once updated.
    updated: Vec<usize>,
    /// Per bucket, per position: the gradient once final.
    grads: Vec<Vec<Option<Tensor>>>,
    /// Per bucket: gradients still to come.
    missing: Vec<usize>,
    /// The next bucket to launch.
    next: usize,
    in_flight: VecDeque<(usize, PendingReduce)>,
}

impl<'a> Reducer<'a> {
    pub(super) fn new(group: &'a ProcessGroup, plan: &'a BucketPlan) -> Reducer<'a> {
        Reducer {
            group,
            plan,
            owners: None,
            updated: Vec::new(),
            grads: plan.buckets.iter().map(|b| vec![None; b.len()]).collect(),
            missing: plan.buckets.iter().map(Vec::len).collect(),
            next: 0,
            in_flight: VecDeque::new(),
        }
    }

    /// A reducer whose averaged gradients go to each parameter's owner
    /// alone (`owners`: leaf id → rank), and whose parameters are broadcast
    /// from their owners once updated ([`GradRelay::after_updates`]).
    pub(super) fn sharded(
        group: &'a ProcessGroup,
        plan: &'a BucketPlan,
        owners: &'a HashMap<u64, usize>,
    ) -> Reducer<'a> {
        Reducer {
            owners: Some(owners),
            ..Reducer::new(group, plan)
        }
    }

    /// Each of bucket `b`'s parameters: its owner, when sharded.
    fn owner_of(&self, b: usize, pos: usize) -> Option<usize> {
        let id = self.plan.params[self.plan.buckets[b][pos]].1.leaf_id()?;
        self.owners.and_then(|o| o.get(&id).copied())
    }

    /// Launches every complete bucket whose turn it is.
    fn launch_ready(&mut self) -> Result<()> {
        while self.next < self.missing.len() && self.missing[self.next] == 0 {
            let b = self.next;
            let grads: Vec<Tensor> = self.grads[b].iter_mut().filter_map(Option::take).collect();
            let roots: Vec<Option<usize>> =
                (0..grads.len()).map(|pos| self.owner_of(b, pos)).collect();
            let pending = self.group.reduce_async(grads, &roots, ReduceOp::Avg)?;
            self.in_flight.push_back((b, pending));
            self.next += 1;
        }
        Ok(())
    }

    /// The (parameter, averaged gradient) pairs of launched buckets beyond
    /// the newest `keep`.
    fn collect(&mut self, keep: usize) -> Result<Vec<(Tensor, Tensor)>> {
        let mut ready = Vec::new();
        while self.in_flight.len() > keep {
            let Some((b, pending)) = self.in_flight.pop_front() else {
                break;
            };
            let grads = pending.wait()?;
            for (pos, grad) in grads.into_iter().enumerate() {
                let param = &self.plan.params[self.plan.buckets[b][pos]].1;
                match self.owner_of(b, pos) {
                    // Another rank's parameter: its gradient is freed here.
                    Some(owner) if owner != self.group.rank() => {}
                    _ => ready.push((param.clone(), grad)),
                }
            }
            if self.owners.is_some() {
                self.updated.push(b);
            }
        }
        Ok(ready)
    }

    /// Broadcasts the parameters of the buckets updated since the last
    /// call from their owners, one group per bucket.
    fn broadcast_updated(&mut self) -> Result<()> {
        for b in std::mem::take(&mut self.updated) {
            let members = &self.plan.buckets[b];
            let params: Vec<Tensor> = members
                .iter()
                .map(|&i| self.plan.params[i].1.clone())
                .collect();
            let roots: Vec<usize> = (0..members.len())
                .map(|pos| self.owner_of(b, pos).unwrap_or(0))
                .collect();
            self.group.broadcast_group(&params, &roots)?;
        }
        Ok(())
    }

    /// The parameters no gradient reached, by name.
    fn absent(&self) -> Vec<&str> {
        let mut names = Vec::new();
        for (b, members) in self.plan.buckets.iter().enumerate().skip(self.next) {
            for (pos, &i) in members.iter().enumerate() {
                if self.grads[b][pos].is_none() {
                    names.push(self.plan.params[i].0.as_str());
                }
            }
        }
        names
    }
}

impl GradRelay for Reducer<'_> {
    fn relay(&mut self, param: &Tensor, grad: Tensor) -> Result<Vec<(Tensor, Tensor)>> {
        // What the last call handed back has been updated by now.
        self.broadcast_updated()?;
        let Some(&(b, pos)) = param.leaf_id().and_then(|id| self.plan.slot.get(&id)) else {
            // Not one data parallel reduces: this rank's own gradient.
            return Ok(vec![(param.clone(), grad)]);
        };
        if b < self.next || self.grads[b][pos].is_some() {
            return Err(Error::Distributed {
                rank: self.group.rank(),
                msg: format!(
                    "parameter {} got a second final gradient in one backward",
                    self.plan.params[self.plan.buckets[b][pos]].0
                ),
            });
        }
        // NCCL reduces whole buffers in place: a gradient that is a view,
        // or whose buffer something else also holds (an op's backward may
        // hand one buffer to two inputs), is copied first.
        let grad = match grad.is_exclusive() {
            true => grad,
            false => crate::primitives::contiguous_copy(&grad)?,
        };
        self.grads[b][pos] = Some(grad);
        self.missing[b] -= 1;
        self.launch_ready()?;
        self.collect(IN_FLIGHT)
    }

    fn finish(&mut self) -> Result<Vec<(Tensor, Tensor)>> {
        let absent = self.absent();
        if !absent.is_empty() {
            return Err(Error::Distributed {
                rank: self.group.rank(),
                msg: format!(
                    "no gradient reached {} in this backward; every parameter that requires grad must take part in the loss on every rank (freeze the others before wrapping the model)",
                    absent.join(", ")
                ),
            });
        }
        self.broadcast_updated()?;
        self.launch_ready()?;
        self.collect(0)
    }

    fn after_updates(&mut self) -> Result<()> {
        self.broadcast_updated()
    }
}
