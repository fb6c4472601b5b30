//! Each rank's shard of an epoch for data-parallel training (PyTorch's
//! `torch.utils.data.distributed.DistributedSampler`).
//!
//! Every rank computes the same epoch order (a permutation drawn from
//! (seed, epoch), or `0..len`), pads it by repeating its beginning, or with
//! `drop_last` cuts it, to a multiple of the number of replicas, and takes
//! every `num_replicas`-th index starting at its rank. The shards are
//! disjoint (up to the padding) and together cover the dataset.
//!
//! ```
//! use leangrad::data::DistributedSampler;
//!
//! // Rank 1 of 3 over 10 samples, in dataset order.
//! let sampler = DistributedSampler::new(3, 1)?.shuffle(false);
//! assert_eq!(sampler.indices(10, 0)?, [1, 4, 7, 0]); // 0 pads the last round
//! assert_eq!(sampler.drop_last(true).indices(10, 0)?, [1, 4, 7]);
//!
//! // Shuffled (the default): a new order each epoch, the same on every rank.
//! let shuffled = DistributedSampler::new(3, 1)?.seed(7);
//! assert_ne!(shuffled.indices(10, 0)?, shuffled.indices(10, 1)?);
//! # Ok::<(), leangrad::Error>(())
//! ```

use super::random::permutation;
use crate::{Error, Result};

/// Which samples of each epoch one rank of `num_replicas` takes: shuffle
/// (default on), seed (default 0) and drop_last (default off) as in
/// PyTorch's `DistributedSampler`; the epoch is given per call, as the
/// [`DataLoader`](super::DataLoader)'s `order(epoch)` and `epoch(epoch)` take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DistributedSampler {
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
}

impl DistributedSampler {
    /// The sampler of `rank` among `num_replicas` ranks (the world size),
    /// shuffling with seed 0 and padding rather than dropping. No replicas,
    /// or a rank not below `num_replicas`, is [`Error::InvalidArgument`].
    pub fn new(num_replicas: usize, rank: usize) -> Result<DistributedSampler> {
        if num_replicas == 0 || rank >= num_replicas {
            return Err(Error::InvalidArgument {
                op: "DistributedSampler::new",
                msg: format!(
                    "rank {rank} of {num_replicas} replicas: need num_replicas >= 1 \
                     and rank < num_replicas"
                ),
            });
        }
        Ok(DistributedSampler {
            num_replicas,
            rank,
            shuffle: true,
            seed: 0,
            drop_last: false,
        })
    }

    /// Whether each epoch has its own random order (else dataset order).
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// The seed of the shuffles (default 0); every rank must use the same.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Whether the tail that does not fill a whole round of replicas is
    /// left out (else the order is padded by repeating its beginning).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// The number of ranks (the world size).
    pub fn num_replicas(&self) -> usize {
        self.num_replicas
    }

    /// This sampler's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Whether the epochs are shuffled.
    pub fn is_shuffled(&self) -> bool {
        self.shuffle
    }

    /// How many indices each rank gets per epoch from `len` samples:
    /// `ceil((len - num_replicas) / num_replicas)` (0 below `num_replicas`)
    /// with `drop_last` when `len` is not a multiple, else
    /// `ceil(len / num_replicas)`.
    pub fn num_samples(&self, len: usize) -> usize {
        let n = self.num_replicas;
        if self.drop_last && !len.is_multiple_of(n) {
            len.saturating_sub(n).div_ceil(n)
        } else {
            len.div_ceil(n)
        }
    }

    /// The length of the padded or cut epoch order all ranks share:
    /// `num_samples(len) * num_replicas`.
    pub fn total_size(&self, len: usize) -> usize {
        self.num_samples(len).saturating_mul(self.num_replicas)
    }

    /// This rank's indices of `epoch` over `len` samples: the shared order
    /// (a permutation drawn from (seed, epoch), the same one a shuffling
    /// [`DataLoader`](super::DataLoader) with this seed visits, or `0..len`),
    /// repeated from its beginning (as often as needed) or cut to
    /// [`total_size`](Self::total_size), then every `num_replicas`-th entry
    /// from `rank`. A shard that would be empty (no samples, or `drop_last`
    /// with fewer samples than replicas) is [`Error::InvalidArgument`]:
    /// PyTorch yields nothing there, which trains silently on no data.
    pub fn indices(&self, len: usize, epoch: u64) -> Result<Vec<usize>> {
        let total = self.total_size(len);
        if total == 0 {
            return Err(Error::InvalidArgument {
                op: "DistributedSampler::indices",
                msg: format!(
                    "{len} samples leave nothing for each of {} replicas{}",
                    self.num_replicas,
                    if self.drop_last {
                        " with drop_last"
                    } else {
                        ""
                    }
                ),
            });
        }
        let order = if self.shuffle {
            permutation(len, self.seed, epoch)
        } else {
            (0..len).collect()
        };
        Ok(order
            .iter()
            .cycle()
            .take(total)
            .skip(self.rank)
            .step_by(self.num_replicas)
            .copied()
            .collect())
    }
}
