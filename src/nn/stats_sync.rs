//! How a batch norm exchanges its batch statistics with the other ranks of
//! a data-parallel group (`SyncBatchNorm`), without the layers knowing
//! about process groups: `distributed::ProcessGroup` implements the trait
//! over NCCL, and a test can implement it over threads.

use crate::{Result, Tensor};

/// The two collectives a synchronised batch norm needs, over the ranks of
/// one group. Every rank must call them in the same order with tensors of
/// the same shape and dtype (the layers' forward and backward do, when
/// every rank runs the same model).
pub trait BatchStatsSync: Send + Sync {
    /// The number of ranks the statistics are taken over.
    fn world_size(&self) -> usize;

    /// Every rank's `t` (contiguous, `[k]`) stacked in rank order:
    /// `[world_size, k]`, a new tensor on `t`'s device.
    fn all_gather(&self, t: &Tensor) -> Result<Tensor>;

    /// Sums `t` (contiguous, the whole of its storage) over the ranks, in
    /// place, ordered after the work already queued on its device and
    /// before the work queued after it.
    fn all_reduce_sum(&self, t: &Tensor) -> Result<()>;
}
