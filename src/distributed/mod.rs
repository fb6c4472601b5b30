//! Process groups and collectives, as `torch.distributed` with the NCCL
//! backend: one process (or thread) per rank and device, a TCP rendezvous
//! at rank 0 that hands out the NCCL unique id, one NCCL communicator per
//! rank, and collectives on CUDA tensors in the device's stream order.
//!
//! ```no_run
//! use leangrad::distributed::{InitOptions, ReduceOp};
//! use leangrad::{DType, Tensor};
//! # fn main() -> leangrad::Result<()> {
//! // Started by `torchrun` or `leangrad launch`: RANK, WORLD_SIZE,
//! // LOCAL_RANK, MASTER_ADDR, MASTER_PORT are set.
//! let group = InitOptions::from_env()?.init()?;
//! let x = Tensor::ones(&[4], DType::F32, group.device())?;
//! group.all_reduce(&x, ReduceOp::Sum)?; // every element is now WORLD_SIZE
//! # Ok(())
//! # }
//! ```
//!
//! NCCL is loaded at run time like the rest of CUDA: a binary without it
//! runs, and only a group of more than one rank asks for it (a clear error
//! where it is missing). A group of one rank needs nothing: its collectives
//! leave the tensors as they are, on any device.

mod bucket;
mod cuda;
mod ddp;
mod launch;
mod rendezvous;
mod zero;

pub use ddp::{DataParallel, DdpOptions, DistributedDataParallel, NoSync};
pub use launch::{launch, LaunchOptions, LaunchOutcome};
pub use rendezvous::Rendezvous;
pub use zero::ShardedOptimizer;

use crate::nn::{BatchStatsSync, Module};
use crate::{Device, Error, Result, Tensor};
use std::sync::Arc;
use std::time::Duration;

/// How a reduction combines the ranks' values (NCCL's `ncclRedOp_t`).
/// Sums add rank 0's value first, then rank 1's, and so on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// The sum over ranks.
    Sum,
    /// The sum divided by the world size.
    Avg,
    /// The product over ranks.
    Product,
    /// The largest value.
    Max,
    /// The smallest value.
    Min,
}

/// Who this process is in the group and where rank 0 listens: from the
/// environment `torchrun` sets ([`InitOptions::from_env`]) or given.
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// The number of ranks.
    pub world_size: usize,
    /// The device this rank computes on (default: CUDA device `LOCAL_RANK`).
    pub device: Device,
    /// Rank 0's host name or address (default `127.0.0.1`).
    pub master_addr: String,
    /// Rank 0's rendezvous port (default 29500, torchrun's).
    pub master_port: u16,
    /// How long a rank waits for the others to arrive (default 300 s).
    pub timeout: Duration,
}

impl InitOptions {
    /// Rank `rank` of `world_size` on CUDA device `rank`, rank 0 at
    /// `127.0.0.1:29500`, a 300 s timeout.
    pub fn new(rank: usize, world_size: usize) -> InitOptions {
        InitOptions {
            rank,
            world_size,
            device: Device::Cuda(rank),
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            timeout: Duration::from_secs(300),
        }
    }

    /// The options `torchrun` (and `leangrad launch`) pass in the
    /// environment: `RANK`, `WORLD_SIZE` (both required), `LOCAL_RANK`
    /// (the CUDA device; default: `RANK`), `MASTER_ADDR` and `MASTER_PORT`
    /// (defaults as [`InitOptions::new`]). A missing or malformed variable
    /// is an error naming it.
    pub fn from_env() -> Result<InitOptions> {
        InitOptions::from_vars(|name| std::env::var(name).ok())
    }

    /// [`InitOptions::from_env`] reading the variables through `get`.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<InitOptions> {
        let bad = |msg: String| Error::InvalidArgument {
            op: "distributed init",
            msg,
        };
        let number = |name: &str, required: bool| -> Result<Option<usize>> {
            match get(name) {
                None if required => Err(bad(format!(
                    "{name} is not set (start the ranks with `leangrad launch` or torchrun, or give InitOptions)"
                ))),
                None => Ok(None),
                Some(v) => v
                    .trim()
                    .parse::<usize>()
                    .map(Some)
                    .map_err(|_| bad(format!("{name}={v:?} is not a whole number"))),
            }
        };
        let rank = number("RANK", true)?.unwrap_or_default();
        let world_size = number("WORLD_SIZE", true)?.unwrap_or_default();
        let local_rank = number("LOCAL_RANK", false)?.unwrap_or(rank);
        let mut opts = InitOptions::new(rank, world_size);
        opts.device = Device::Cuda(local_rank);
        if let Some(addr) = get("MASTER_ADDR") {
            opts.master_addr = addr;
        }
        if let Some(port) = get("MASTER_PORT") {
            opts.master_port = port
                .trim()
                .parse::<u16>()
                .map_err(|_| bad(format!("MASTER_PORT={port:?} is not a port number")))?;
        }
        opts.check()?;
        Ok(opts)
    }

    /// Rank 0 at `addr:port`.
    pub fn master(mut self, addr: &str, port: u16) -> InitOptions {
        self.master_addr = addr.to_string();
        self.master_port = port;
        self
    }

    /// How long a rank waits for the others.
    pub fn timeout(mut self, timeout: Duration) -> InitOptions {
        self.timeout = timeout;
        self
    }

    /// The device this rank computes on.
    pub fn device(mut self, device: Device) -> InitOptions {
        self.device = device;
        self
    }

    fn check(&self) -> Result<()> {
        let bad = |msg: String| Error::InvalidArgument {
            op: "distributed init",
            msg,
        };
        if self.world_size == 0 {
            return Err(bad("the world size must be at least 1".into()));
        }
        if self.rank >= self.world_size {
            return Err(bad(format!(
                "rank {} is not below the world size {}",
                self.rank, self.world_size
            )));
        }
        Ok(())
    }

    /// Joins the group: the rendezvous, then (for more than one rank) the
    /// NCCL communicator on this rank's device. Every rank must call it;
    /// it returns once all have, or fails after the timeout.
    pub fn init(&self) -> Result<ProcessGroup> {
        self.check()?;
        let rendezvous = Rendezvous {
            rank: self.rank,
            world_size: self.world_size,
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
            timeout: self.timeout,
        };
        let comm = if self.world_size == 1 {
            None
        } else {
            let Device::Cuda(ordinal) = self.device else {
                return Err(Error::Distributed {
                    rank: self.rank,
                    msg: format!(
                        "a group of {} ranks communicates through NCCL between CUDA devices; {:?} has none",
                        self.world_size, self.device
                    ),
                });
            };
            let id = match self.rank {
                0 => Some(cuda::unique_id(self.rank)?),
                _ => None,
            };
            let id = rendezvous.exchange(id.as_deref())?;
            Some(cuda::Communicator::new(
                ordinal,
                &id,
                self.rank,
                self.world_size,
            )?)
        };
        Ok(ProcessGroup {
            rank: self.rank,
            world_size: self.world_size,
            device: self.device,
            comm,
        })
    }
}

/// One rank's membership of a group: its collectives run on its device's
/// stream, in order with the kernels around them (they return before the
/// data has moved, as PyTorch's asynchronous NCCL ops; a read of the
/// result waits for them).
pub struct ProcessGroup {
    rank: usize,
    world_size: usize,
    device: Device,
    comm: Option<cuda::Communicator>,
}

impl ProcessGroup {
    /// Rank `rank` of a group of `world_size` that does not communicate:
    /// its collectives leave the tensors as they are (an all-gather or a
    /// reduce-scatter still allocates its output), so that a step on the
    /// meta device allocates as that rank would (`leangrad memory
    /// --world-size`).
    pub(crate) fn predicting(rank: usize, world_size: usize, device: Device) -> ProcessGroup {
        ProcessGroup {
            rank,
            world_size,
            device,
            comm: None,
        }
    }

    /// Whether collectives reach other ranks (not a group of one rank or a
    /// predicting one).
    pub(crate) fn communicates(&self) -> bool {
        self.comm.is_some()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The device this rank's tensors live on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The communicator, after checking that `t` lives on this rank's
    /// device; `None` for a group of one rank (nothing to exchange).
    fn comm_for(&self, op: &'static str, t: &Tensor) -> Result<Option<&cuda::Communicator>> {
        if t.device() != self.device {
            return Err(Error::DeviceMismatch {
                op,
                lhs: self.device,
                rhs: t.device(),
            });
        }
        Ok(self.comm.as_ref())
    }

    /// Reduces `t` over all ranks, in place: afterwards every rank holds
    /// the same result. `t` must be contiguous and the whole of its storage.
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<()> {
        match self.comm_for("all_reduce", t)? {
            Some(c) => c.all_reduce(t, op),
            None => Ok(()),
        }
    }

    /// Copies rank `root`'s `t` into every other rank's `t`, in place.
    pub fn broadcast(&self, t: &Tensor, root: usize) -> Result<()> {
        if root >= self.world_size {
            return Err(Error::InvalidArgument {
                op: "broadcast",
                msg: format!(
                    "root {root} is not below the world size {}",
                    self.world_size
                ),
            });
        }
        match self.comm_for("broadcast", t)? {
            Some(c) => c.broadcast(t, root),
            None => Ok(()),
        }
    }

    /// Every rank's `t` stacked along a new first dimension in rank order:
    /// `[world_size, ...t.shape]` (as `all_gather_into_tensor`), a new
    /// tensor counted under the current category.
    pub fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        match self.comm_for("all_gather", t)? {
            Some(c) => c.all_gather(t),
            None if self.world_size == 1 => t.contiguous()?.unsqueeze(0),
            None => {
                let mut shape = vec![self.world_size];
                shape.extend_from_slice(t.shape());
                let _ng = crate::autograd::no_grad();
                crate::primitives::contiguous_copy(&t.unsqueeze(0)?.broadcast_to(&shape)?)
            }
        }
    }

    /// `t` (`[world_size, ...]`) reduced over ranks, rank `r` keeping block
    /// `r`: `[...]` (as `reduce_scatter_tensor`), a new tensor.
    pub fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        if t.shape().first() != Some(&self.world_size) {
            return Err(Error::InvalidArgument {
                op: "reduce_scatter",
                msg: format!(
                    "the input's first dimension must be the world size {}, got shape {:?}",
                    self.world_size,
                    t.shape()
                ),
            });
        }
        match self.comm_for("reduce_scatter", t)? {
            Some(c) => c.reduce_scatter(t, op),
            None if self.world_size == 1 => t.contiguous()?.squeeze(0),
            None => {
                let _ng = crate::autograd::no_grad();
                crate::primitives::contiguous_copy(&t.narrow(0, 0, 1)?.squeeze(0)?)
            }
        }
    }

    /// Reduces each of `tensors` (each the whole of its storage) in place,
    /// to every rank where its root is `None` and to that rank otherwise,
    /// as one group of collectives on the communication stream, after the
    /// work already queued on the device: the device's stream goes on at
    /// once and waits for the results only at [`PendingReduce::wait`].
    fn reduce_async(
        &self,
        tensors: Vec<Tensor>,
        roots: &[Option<usize>],
        op: ReduceOp,
    ) -> Result<PendingReduce> {
        for t in &tensors {
            self.comm_for("all_reduce", t)?;
        }
        Ok(match &self.comm {
            Some(c) => PendingReduce::Queued(c.reduce_async(tensors, roots, op)?),
            None => PendingReduce::Done(tensors),
        })
    }

    /// Broadcasts each of `tensors` from its root, in place, as one group
    /// on the device's stream.
    fn broadcast_group(&self, tensors: &[Tensor], roots: &[usize]) -> Result<()> {
        for t in tensors {
            self.comm_for("broadcast", t)?;
        }
        match &self.comm {
            Some(c) => c.broadcast_group(tensors, roots),
            None => Ok(()),
        }
    }

    /// Waits until every rank has reached this point and its device has
    /// run everything queued before it.
    pub fn barrier(&self) -> Result<()> {
        match &self.comm {
            Some(c) => c.barrier(),
            None => Ok(()),
        }
    }
}

/// A process group is what a synchronised batch norm exchanges its
/// statistics over ([`convert_sync_batchnorm`]).
impl BatchStatsSync for ProcessGroup {
    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        ProcessGroup::all_gather(self, t)
    }

    /// On the communication stream, as data parallel's gradient buckets:
    /// one stream keeps every rank's collectives on the communicator in
    /// the order they were issued.
    fn all_reduce_sum(&self, t: &Tensor) -> Result<()> {
        self.reduce_async(vec![t.clone()], &[None], ReduceOp::Sum)?
            .wait()
            .map(drop)
    }
}

/// Makes every BatchNorm of `module` normalise training batches with the
/// statistics of all ranks' batches of `group` together, as
/// `torch.nn.SyncBatchNorm.convert_sync_batchnorm`; returns how many it
/// converted. Each forward in training mode then all-gathers each rank's
/// per-channel mean and variance and its count, and each backward that
/// needs the input gradient all-reduces two sums per channel; nothing more
/// is kept for backward. Every
/// rank must convert the same model. A group of one rank changes nothing.
pub fn convert_sync_batchnorm(module: &mut dyn Module, group: &Arc<ProcessGroup>) -> usize {
    let sync: Arc<dyn BatchStatsSync> = group.clone();
    module.sync_batch_norm(Some(&sync))
}

/// All-reduces in flight ([`ProcessGroup::all_reduce_async`]).
enum PendingReduce {
    /// A group of one rank: nothing to wait for.
    Done(Vec<Tensor>),
    /// Queued on the communication stream.
    Queued(cuda::CommWork),
}

impl PendingReduce {
    /// Orders the device's later work after the reductions and gives the
    /// tensors back.
    fn wait(self) -> Result<Vec<Tensor>> {
        match self {
            PendingReduce::Done(t) => Ok(t),
            PendingReduce::Queued(work) => work.wait(),
        }
    }
}
