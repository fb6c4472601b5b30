//! Data parallel training, as PyTorch's `DistributedDataParallel`: every
//! rank holds the whole model, runs its own part of the batch, and the
//! gradients are averaged over the ranks before each update.
//!
//! What [`DataParallel`] (and [`DistributedDataParallel`], the module
//! that holds one) does:
//! - at construction, checks that every rank wraps the same parameters and
//!   buffers (names, shapes, dtypes, which require grad) and copies rank
//!   0's values to the others;
//! - in backward, hands each gradient that is final to its bucket
//!   (`bucket.rs`) and all-reduces a bucket on the communication stream
//!   the moment its last gradient is final, while backward goes on;
//! - [`DataParallel::backward`] leaves the averaged gradients
//!   in `.grad` for [`Optimizer::step`];
//!   [`DataParallel::backward_step`] updates a bucket's parameters (and
//!   frees its gradients) when the next bucket's reduction is queued, the
//!   device's stream waiting for the reduction and the host not, so a
//!   rank holds the bucket being filled and one in flight, never every
//!   gradient;
//! - [`DataParallel::no_sync`] skips the reduction (gradient
//!   accumulation: the micro-batches that do not step add into `.grad`;
//!   the fused step's own accumulation, `Optimizer::set_accumulation`,
//!   reduces only on its updating micro-batch by itself);
//! - with `broadcast_buffers`, each forward in training mode first copies
//!   rank 0's buffers (BatchNorm's running statistics) to every rank.
//!   BatchNorm computes its batch statistics per rank.
//!
//! Saves nothing for backward beyond what the wrapped module saves.

use super::bucket::{BucketPlan, Reducer};
use super::{ProcessGroup, ShardedOptimizer};
use crate::autograd::engine::merge_leaf_gradient;
use crate::autograd::{backward_with, no_grad, CollectGrads, GradientSink};
use crate::nn::{BatchStatsSync, LayerKind, Module};
use crate::optim::{Algorithm, FusedStep, GradRelay, Optimizer};
use crate::tensor::Leaf;
use crate::{Error, Result, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// How [`DistributedDataParallel`] reduces gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DdpOptions {
    /// Gradient bytes per bucket (PyTorch's `bucket_cap_mb`; default
    /// 25 MiB). The first bucket holds at most 1 MiB, so communication
    /// starts early; a parameter larger than this gets a bucket of its own.
    pub bucket_bytes: usize,
    /// Copy rank 0's buffers to every rank at each forward in training
    /// mode (default true, as PyTorch).
    pub broadcast_buffers: bool,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            bucket_bytes: 25 << 20,
            broadcast_buffers: true,
        }
    }
}

/// The gradient side of data parallel, for a model that is not wrapped
/// (a job's trait object, say): checks and broadcasts at construction,
/// then averages gradients over the ranks in backward (see the module
/// documentation). [`DistributedDataParallel`] is a module that holds one.
pub struct DataParallel {
    group: Arc<ProcessGroup>,
    plan: BucketPlan,
    sync: AtomicBool,
}

/// While alive, [`DataParallel::backward`] only accumulates into `.grad`
/// (PyTorch's `no_sync`).
pub struct NoSync<'d> {
    sync: &'d AtomicBool,
    before: bool,
}

impl Drop for NoSync<'_> {
    fn drop(&mut self) {
        self.sync.store(self.before, Ordering::SeqCst);
    }
}

impl DataParallel {
    /// Data parallel over `group` for `module`, whose parameters and
    /// buffers must live on the group's device: checks that every rank
    /// has the same ones and gives every rank rank 0's values. The
    /// parameters that require grad now are the ones reduced (freeze
    /// before this).
    pub fn new(
        module: &dyn Module,
        group: Arc<ProcessGroup>,
        options: DdpOptions,
    ) -> Result<DataParallel> {
        if options.bucket_bytes == 0 {
            return Err(Error::InvalidArgument {
                op: "DistributedDataParallel",
                msg: "bucket_bytes must be at least 1".into(),
            });
        }
        let state: Vec<(String, Tensor)> = module
            .named_parameters()
            .into_iter()
            .chain(module.named_buffers())
            .collect();
        for (name, t) in &state {
            if t.device() != group.device() {
                return Err(Error::Distributed {
                    rank: group.rank(),
                    msg: format!(
                        "{name} is on {:?}, the group's device is {:?}: move the module first",
                        t.device(),
                        group.device()
                    ),
                });
            }
        }
        check_same_module(&group, &state)?;
        {
            let _ng = no_grad();
            for (_, t) in &state {
                group.broadcast(t, 0)?;
            }
        }
        let trainable = module
            .named_parameters()
            .into_iter()
            .filter(|(_, p)| p.requires_grad())
            .collect();
        Ok(DataParallel {
            group,
            plan: BucketPlan::new(trainable, options.bucket_bytes),
            sync: AtomicBool::new(true),
        })
    }

    /// The group the gradients are averaged over.
    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }

    /// The parameters of each bucket, in the order they are reduced.
    pub fn bucket_names(&self) -> Vec<Vec<String>> {
        self.plan.bucket_names()
    }

    /// Each bucket's gradient bytes.
    pub fn bucket_bytes(&self) -> Vec<usize> {
        self.plan.bucket_bytes()
    }

    /// Whether backward reduces now (not inside [`DataParallel::no_sync`]).
    pub fn is_syncing(&self) -> bool {
        self.sync.load(Ordering::SeqCst)
    }

    /// Until the guard drops, [`DataParallel::backward`] adds this rank's
    /// gradients into `.grad` without communicating; the next backward
    /// outside it reduces the accumulated `.grad`s.
    pub fn no_sync(&self) -> NoSync<'_> {
        NoSync {
            sync: &self.sync,
            before: self.sync.swap(false, Ordering::SeqCst),
        }
    }

    /// Backward from `loss`, leaving in each reduced parameter's `.grad`
    /// its gradient (what `.grad` held plus this backward's) averaged over
    /// the ranks; other leaves get their `.grad` as usual.
    pub fn backward(&self, loss: &Tensor) -> Result<()> {
        // One rank: nothing to average, no bucket to hold gradients in.
        if !self.is_syncing() || self.group.world_size() == 1 {
            return loss.backward();
        }
        let mut sink = ReducingSink {
            plan: &self.plan,
            reducer: Reducer::new(&self.group, &self.plan),
        };
        backward_with(loss, None, &mut sink)?;
        let ready = sink.reducer.finish()?;
        set_grads(ready);
        Ok(())
    }

    /// The fused step ([`Optimizer::backward_step`]) with each bucket's
    /// gradients averaged over the ranks before its parameters update; the
    /// gradients are freed bucket by bucket. `opt` must own every parameter
    /// this reduces. The micro-batches of `opt`'s accumulation that do not
    /// update do not communicate.
    pub fn backward_step<A: Algorithm>(
        &self,
        opt: &mut Optimizer<A>,
        loss: &Tensor,
    ) -> Result<FusedStep> {
        if !self.is_syncing() {
            return Err(Error::InvalidArgument {
                op: "DistributedDataParallel::backward_step",
                msg: "no_sync does not apply to the fused step: accumulate with Optimizer::set_accumulation, which communicates only on the updating micro-batch".into(),
            });
        }
        if self.group.world_size() == 1 {
            return opt.backward_step(loss);
        }
        let mut reducer = Reducer::new(&self.group, &self.plan);
        opt.backward_step_relayed(loss, &mut reducer)
    }

    /// ZeRO stage 2: the fused step with each bucket's gradients averaged
    /// onto their owners alone ([`ShardedOptimizer`]); every other rank
    /// frees them once the reduction is queued, the owner updates them, and
    /// each bucket's parameters are broadcast from their owners. `opt` must
    /// hold every parameter this reduces.
    pub fn backward_step_sharded<A: Algorithm>(
        &self,
        opt: &mut ShardedOptimizer<A>,
        loss: &Tensor,
    ) -> Result<FusedStep> {
        if !self.is_syncing() {
            return Err(Error::InvalidArgument {
                op: "DataParallel::backward_step_sharded",
                msg: "no_sync does not apply to the fused step: accumulate with the optimizer's set_accumulation".into(),
            });
        }
        if self.group.world_size() == 1 {
            return opt.optimizer_mut().backward_step(loss);
        }
        opt.fused_step(&self.group, &self.plan, loss)
    }

    /// Copies rank 0's buffers of `module` to every rank.
    pub fn broadcast_buffers(&self, module: &dyn Module) -> Result<()> {
        for (_, b) in module.named_buffers() {
            self.group.broadcast(&b, 0)?;
        }
        Ok(())
    }
}

/// A module trained data parallel over a [`ProcessGroup`] (see the module
/// documentation): a [`Module`] with the wrapped module's parameter names,
/// and the [`DataParallel`] that reduces its gradients.
pub struct DistributedDataParallel<M> {
    module: M,
    parallel: DataParallel,
    options: DdpOptions,
    training: bool,
}

impl<M: Module> DistributedDataParallel<M> {
    /// Wraps `module` ([`DataParallel::new`]).
    pub fn new(
        module: M,
        group: Arc<ProcessGroup>,
        options: DdpOptions,
    ) -> Result<DistributedDataParallel<M>> {
        let parallel = DataParallel::new(&module, group, options)?;
        Ok(DistributedDataParallel {
            module,
            parallel,
            options,
            training: true,
        })
    }

    /// The wrapped module.
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The wrapped module, to change (freezing it anew needs a new wrapper).
    pub fn module_mut(&mut self) -> &mut M {
        &mut self.module
    }

    /// The wrapped module, unwrapped.
    pub fn into_inner(self) -> M {
        self.module
    }

    /// What reduces the gradients.
    pub fn data_parallel(&self) -> &DataParallel {
        &self.parallel
    }

    /// [`DataParallel::group`].
    pub fn group(&self) -> &ProcessGroup {
        self.parallel.group()
    }

    /// [`DataParallel::bucket_names`].
    pub fn bucket_names(&self) -> Vec<Vec<String>> {
        self.parallel.bucket_names()
    }

    /// [`DataParallel::bucket_bytes`].
    pub fn bucket_bytes(&self) -> Vec<usize> {
        self.parallel.bucket_bytes()
    }

    /// [`DataParallel::no_sync`].
    pub fn no_sync(&self) -> NoSync<'_> {
        self.parallel.no_sync()
    }

    /// [`DataParallel::backward`].
    pub fn backward(&self, loss: &Tensor) -> Result<()> {
        self.parallel.backward(loss)
    }

    /// [`DataParallel::backward_step`].
    pub fn backward_step<A: Algorithm>(
        &self,
        opt: &mut Optimizer<A>,
        loss: &Tensor,
    ) -> Result<FusedStep> {
        self.parallel.backward_step(opt, loss)
    }

    fn before_forward(&self) -> Result<()> {
        let wanted = self.options.broadcast_buffers
            && self.training
            && self.parallel.group().world_size() > 1
            && self.parallel.is_syncing();
        if wanted {
            self.parallel.broadcast_buffers(&self.module)?;
        }
        Ok(())
    }
}

impl<M: Module> Module for DistributedDataParallel<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.before_forward()?;
        self.module.forward(x)
    }

    fn forward_owned(&self, x: Tensor) -> Result<Tensor> {
        self.before_forward()?;
        self.module.forward_owned(x)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.module.named_parameters()
    }

    fn parameter_kinds(&self) -> Vec<(String, LayerKind)> {
        self.module.parameter_kinds()
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.module.named_buffers()
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
        self.module.set_training(training);
    }

    fn sync_batch_norm(&mut self, sync: Option<&Arc<dyn BatchStatsSync>>) -> usize {
        self.module.sync_batch_norm(sync)
    }
}

/// The usual path's sink: a reduced parameter's gradient, added to its
/// `.grad`, goes to its bucket; other leaves collect as usual.
struct ReducingSink<'a> {
    plan: &'a BucketPlan,
    reducer: Reducer<'a>,
}

impl GradientSink for ReducingSink<'_> {
    fn gradient_ready(
        &mut self,
        leaf: &Arc<Leaf>,
        param: Option<&Tensor>,
        grad: Tensor,
    ) -> Result<()> {
        let Some(param) = param.filter(|p| self.plan.holds(p)) else {
            return CollectGrads.gradient_ready(leaf, param, grad);
        };
        let merged = merge_leaf_gradient(leaf.take_grad(), grad, Some(param))?;
        let ready = self.reducer.relay(param, merged)?;
        set_grads(ready);
        Ok(())
    }
}

fn set_grads(ready: Vec<(Tensor, Tensor)>) {
    for (param, grad) in ready {
        if let Some(leaf) = param.leaf() {
            leaf.set_grad(Some(grad));
        }
    }
}

/// Errors unless every rank wraps parameters and buffers of the same
/// names, shapes and dtypes, the same ones requiring grad: one 64-bit
/// digest per rank, gathered.
fn check_same_module(group: &ProcessGroup, state: &[(String, Tensor)]) -> Result<()> {
    if !group.communicates() {
        return Ok(());
    }
    let mut digest = Fnv::default();
    for (name, t) in state {
        digest.add(name.as_bytes());
        digest.add(format!("{:?}{:?}{}", t.shape(), t.dtype(), t.requires_grad()).as_bytes());
    }
    let mine = digest.0 as i64;
    let t = Tensor::from_vec(vec![mine], &[1], group.device())?;
    let all: Vec<i64> = group.all_gather(&t)?.to_vec()?;
    let differ: Vec<usize> = (0..all.len()).filter(|&r| all[r] != all[0]).collect();
    if differ.is_empty() {
        return Ok(());
    }
    Err(Error::Distributed {
        rank: group.rank(),
        msg: format!(
            "ranks {differ:?} wrap a module whose parameters or buffers (names, shapes, dtypes, requires_grad) differ from rank 0's"
        ),
    })
}

/// FNV-1a, 64 bits: a digest that is the same on every machine.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn add(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}
