//! Masks kept for backward by relu-like ops.
//!
//! Under the lean policy a mask is 1 bit per element. When the tensor the
//! mask was computed from is later saved by another op anyway (a ReLU
//! output saved by the next layer for its weight gradient), the mask is
//! dropped and the gradient reads the kept values instead; when that op
//! releases the values (its backward ran) and nothing else holds them, the
//! mask is rebuilt and the values freed. The 1-bit mask never costs more
//! than it saves, and never keeps the values alive longer.

use crate::autograd::{save_policy, SavePolicy, SavedTensor};
use crate::primitives::{mask_scale, mask_where, mask_words, positive_mask_for};
use crate::tensor::{Layout, SaveEvent, SaveListener, Storage};
use crate::{Result, Tensor};
use std::sync::{Arc, Mutex};

/// Which elements pass the gradient.
#[derive(Clone, Copy, Debug)]
pub(crate) enum MaskRule {
    /// `x > 0` (relu, leaky_relu).
    Positive,
    /// `lo <= x <= hi` (clamp).
    Within(f64, f64),
}

impl MaskRule {
    fn test(self, v: f64) -> bool {
        match self {
            MaskRule::Positive => v > 0.0,
            MaskRule::Within(lo, hi) => v >= lo && v <= hi,
        }
    }

    fn bits(self, source: &Tensor, op: &'static str) -> Result<Tensor> {
        match self {
            // The rule with a CUDA kernel (same bits as the generic one).
            MaskRule::Positive => positive_mask_for(source, op),
            // clamp's rule: its own kernel on CUDA (a generic predicate
            // has no device form), the generic packer elsewhere.
            MaskRule::Within(lo, hi) => {
                if let crate::meta::Backend::Cuda(_) = crate::meta::backend(op, &[source])? {
                    let words = [mask_words(source.numel())];
                    return crate::tensor::cuda::map(source, &words, |b, l| {
                        crate::cuda::layers_mask::within_mask(b, l, lo, hi)
                    });
                }
                mask_where(source, op, move |v| self.test(v))
            }
        }
    }
}

/// What a lean mask holds now.
enum MaskState {
    /// The packed bits (⌈n/32⌉ u32 words).
    Bits(SavedTensor),
    /// The source values, saved by another op too (so free here).
    Source(SavedTensor),
}

/// A lean mask that switches to its source when the source gets saved.
pub(crate) struct MaskSlot {
    rule: MaskRule,
    op: &'static str,
    source_layout: Layout,
    source_version: u64,
    state: Mutex<MaskState>,
}

impl SaveListener for MaskSlot {
    fn on_save_event(&self, storage: &Arc<Storage>, event: SaveEvent) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let replaced = match (&*state, event) {
            // Another op keeps the values: drop the bits and read those.
            // (Unless they changed in place since the mask was taken.)
            (MaskState::Bits(_), SaveEvent::Saved) if storage.version() == self.source_version => {
                let source = Tensor::from_storage(storage.clone(), self.source_layout.clone());
                std::mem::replace(
                    &mut *state,
                    MaskState::Source(SavedTensor::new(&source, self.op)),
                )
            }
            // The other holder let go, and only this slot (and the releasing
            // holder, still alive while we run) references the values: go
            // back to the bits so the values can be freed now.
            (MaskState::Source(source), SaveEvent::Released) if Arc::strong_count(storage) == 2 => {
                let bits = match source.get().and_then(|s| self.rule.bits(s, self.op)) {
                    Ok(bits) => bits,
                    Err(_) => return true, // keep the values; backward will report
                };
                std::mem::replace(
                    &mut *state,
                    MaskState::Bits(SavedTensor::new(&bits, self.op)),
                )
            }
            _ => return true,
        };
        // Dropped outside the lock: releasing the source notifies again.
        drop(state);
        drop(replaced);
        true
    }
}

/// A mask kept for backward: 1-bit packed under the lean policy (or its
/// source, once another op keeps that); under `SaveAll` the float tensor it
/// is computed from, as PyTorch keeps it. All give bit-identical gradients.
pub(crate) enum SavedMask {
    Lean(Arc<MaskSlot>),
    FromFloat(SavedTensor, MaskRule),
}

impl SavedMask {
    /// Keeps the mask of `rule` over `source` for `op`.
    pub(crate) fn new(source: &Tensor, rule: MaskRule, op: &'static str) -> Result<SavedMask> {
        Ok(match save_policy() {
            SavePolicy::Lean => {
                let bits = SavedTensor::new(&rule.bits(source, op)?, op);
                let slot = Arc::new(MaskSlot {
                    rule,
                    op,
                    source_layout: source.layout().clone(),
                    source_version: source.version(),
                    state: Mutex::new(MaskState::Bits(bits)),
                });
                let weak = Arc::downgrade(&slot);
                source.storage().add_save_listener(weak);
                SavedMask::Lean(slot)
            }
            SavePolicy::SaveAll => SavedMask::FromFloat(SavedTensor::new(source, op), rule),
        })
    }

    /// `g` where the mask is set, `g · slope` elsewhere.
    pub(crate) fn apply(&self, g: &Tensor, slope: f64) -> Result<Tensor> {
        let (source, rule, op) = match self {
            SavedMask::Lean(slot) => {
                let state = slot.state.lock().unwrap_or_else(|e| e.into_inner());
                match &*state {
                    MaskState::Bits(bits) => return mask_scale(g, bits.get()?, slope),
                    MaskState::Source(s) => (s.get()?.clone(), slot.rule, slot.op),
                }
            }
            SavedMask::FromFloat(s, rule) => (s.get()?.clone(), *rule, "mask"),
        };
        mask_scale(g, &rule.bits(&source, op)?, slope)
    }
}
