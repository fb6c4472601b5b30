//! What a data loader reads from: a numbered collection of labelled images.

use super::random::SampleRng;
use crate::{Result, Tensor};

/// A map-style dataset (PyTorch's `Dataset`): `len()` samples, each an
/// image tensor and a class index. Implementations are shared by the
/// loader's worker threads, hence `Send + Sync`.
pub trait Dataset: Send + Sync {
    /// The number of samples.
    fn len(&self) -> usize;

    /// Whether there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sample `index` (in `0..len()`), its random transforms drawn from
    /// `rng`. A file that cannot be read is [`crate::Error::Image`] naming
    /// it (a loader can skip those).
    fn sample(&self, index: usize, rng: &mut SampleRng) -> Result<(Tensor, usize)>;
}
