//! What cross-entropy keeps for backward: the softmax probabilities, or —
//! while another op keeps the logits anyway — nothing of its own.
//!
//! The gradient is `w·(p − q)`; `p` is either kept (`n·b` bytes) or
//! recomputed in backward from the logits by the forward's own kernel, so
//! both ways give the same bits. Like a relu's mask, the slot listens to the
//! logits' storage: when another op saves those values, the probabilities
//! are dropped and the logits read instead; when that op lets them go and
//! only this slot still holds them, the probabilities are computed again and
//! the logits released. The probabilities are never kept beside logits that
//! are kept anyway, and the logits are never kept alive by this slot alone.

use super::{cross_entropy_forward, CrossEntropyOptions};
use crate::autograd::SavedTensor;
use crate::memory::{with_category, Category};
use crate::tensor::{Layout, SaveEvent, SaveListener, Storage};
use crate::{Error, Result, Tensor};
use std::sync::{Arc, Mutex};

/// What the slot holds now.
enum Held {
    /// The softmax probabilities (the logits' shape and dtype).
    Probs(SavedTensor),
    /// The logits, saved by another op too (so free here).
    Logits(SavedTensor),
}

/// How the probabilities are computed from the logits (the forward's call).
struct Recompute {
    class_dim: usize,
    targets: Tensor,
    opts: CrossEntropyOptions,
}

impl Recompute {
    fn probs(&self, logits: &Tensor) -> Result<Tensor> {
        cross_entropy_forward(logits, self.class_dim, &self.targets, &self.opts, true)?
            .probs
            .ok_or_else(|| Error::Backward("cross_entropy: probabilities not computed".into()))
    }
}

/// The probabilities of one cross-entropy node, or its logits while another
/// op keeps them.
pub(super) struct ProbSlot {
    logits_layout: Layout,
    logits_version: u64,
    recompute: Recompute,
    held: Mutex<Held>,
}

impl ProbSlot {
    /// Keeps `probs` (made by the forward), or only the logits when their
    /// storage is saved by another op already (then `probs` is `None`: the
    /// forward did not make them). Listens to the logits' storage.
    pub(super) fn new(
        logits: &Tensor,
        probs: Option<Tensor>,
        class_dim: usize,
        targets: &Tensor,
        opts: CrossEntropyOptions,
    ) -> Result<Arc<ProbSlot>> {
        let held = match probs {
            Some(p) => Held::Probs(SavedTensor::new(&p, "cross_entropy")),
            None => Held::Logits(SavedTensor::new(logits, "cross_entropy")),
        };
        let slot = Arc::new(ProbSlot {
            logits_layout: logits.layout().clone(),
            logits_version: logits.version(),
            recompute: Recompute {
                class_dim,
                targets: targets.detach(),
                opts,
            },
            held: Mutex::new(held),
        });
        let weak = Arc::downgrade(&slot);
        logits.storage().add_save_listener(weak);
        Ok(slot)
    }

    /// Whether the logits' values are saved by another op right now, so
    /// that the forward need not make the probabilities at all.
    pub(super) fn logits_kept_anyway(logits: &Tensor) -> bool {
        logits.storage().allocation().is_saved()
    }

    /// The probabilities: the kept ones, or computed again from the logits
    /// (counted as workspace while backward uses them).
    pub(super) fn probs(&self) -> Result<Tensor> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        match &*held {
            Held::Probs(p) => Ok(p.get()?.clone()),
            Held::Logits(l) => {
                let logits = l.get()?.clone();
                drop(held);
                let _ws = with_category(Category::Workspace);
                self.recompute.probs(&logits)
            }
        }
    }
}

impl SaveListener for ProbSlot {
    fn on_save_event(&self, storage: &Arc<Storage>, event: SaveEvent) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let replaced = match (&*held, event) {
            // Another op keeps the logits (unchanged since the forward):
            // drop the probabilities and read the logits in backward.
            (Held::Probs(_), SaveEvent::Saved) if storage.version() == self.logits_version => {
                let logits = Tensor::from_storage(storage.clone(), self.logits_layout.clone());
                std::mem::replace(
                    &mut *held,
                    Held::Logits(SavedTensor::new(&logits, "cross_entropy")),
                )
            }
            // The other holder let go and only this slot (and the releasing
            // holder, alive while we run) holds the logits: make the
            // probabilities again so the logits can be freed now.
            (Held::Logits(l), SaveEvent::Released) if Arc::strong_count(storage) == 2 => {
                let probs = match l.get().and_then(|t| self.recompute.probs(t)) {
                    Ok(p) => p,
                    Err(_) => return true, // keep the logits; backward will report
                };
                std::mem::replace(
                    &mut *held,
                    Held::Probs(SavedTensor::new(&probs, "cross_entropy")),
                )
            }
            _ => return true,
        };
        // Dropped outside the lock: releasing the logits notifies again.
        drop(held);
        drop(replaced);
        true
    }
}
