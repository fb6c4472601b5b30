//! The 1-bit masks relu-like ops keep for backward: `relu` and `leaky_relu`
//! (in `ops/unary.rs`, rule `x > 0`) and `clamp` (in `ops/scalar.rs`, rule
//! `lo <= x <= hi`) save a [`SavedMask`] instead of a float tensor, and
//! their gradient is `g` where the bit is set, `g · slope` elsewhere
//! ([`mask_scale`]). Bit `i % 32` of U32 word `i / 32` is element `i` (the
//! packing helpers `pack_bits`, `get_bit`, `mask_words` are shared
//! primitives); on CUDA one warp writes one word with `__ballot_sync`
//! (`relu_mask.cu`).
//!
//! Under the lean policy a mask is 1 bit per element. When the tensor the
//! mask was computed from is later saved by another op anyway (a ReLU
//! output saved by the next layer for its weight gradient), the mask is
//! dropped and the gradient reads the kept values instead; when that op
//! releases the values (its backward ran) and nothing else holds them, the
//! mask is rebuilt and the values freed. The 1-bit mask never costs more
//! than it saves, and never keeps the values alive longer.
//!
//! Saved for backward, for `n` elements of `b` bytes:
//!
//! | op | requires grad | saved for backward | why |
//! |---|---|---|---|
//! | `relu`, `relu_inplace` (lean) | input | the mask of `output > 0`: `4·⌈n/32⌉` bytes; nothing of its own while another op keeps the output (the mask is rebuilt when that op lets go) | which elements pass the gradient |
//! | `add_relu_owned` (lean) | either input | as `relu_inplace` of the sum (the add saves nothing); on CUDA the add, the ReLU and the mask are one kernel | which elements pass the gradient (to both inputs) |
//! | `leaky_relu` (lean) | input | the mask of `input > 0`: `4·⌈n/32⌉` bytes (or the input while another op keeps it) | which elements get `g`, which `g · slope` |
//! | `clamp` (lean) | input | the mask of `min ≤ input ≤ max`: `4·⌈n/32⌉` bytes (or the input while another op keeps it) | which elements pass the gradient |
//! | `relu` (`SaveAll`) | input | the output: `n·b` bytes | what PyTorch keeps |
//! | `leaky_relu`, `clamp` (`SaveAll`) | input | the input: `n·b` bytes | what PyTorch keeps |
//! | any of them | nothing | — (no node) | |
//!
//! Every form gives bit-identical gradients (the mask is recomputed from
//! the kept values by the same rule). On CUDA under the lean policy,
//! `relu`'s output and mask come from one kernel (`relu_mask_fwd`, in
//! place for `relu_inplace`), the same bytes allocated in the same order
//! as the output's kernel followed by the mask's.

mod cpu;
mod cuda;
#[cfg(test)]
mod tests;

use crate::autograd::{may_reuse, save_policy, SavePolicy, SavedTensor};
use crate::meta::{backend, not_on_cuda, Backend};
use crate::tensor::{Layout, SaveEvent, SaveListener, Storage};
use crate::{Result, Tensor};
use std::sync::{Arc, Mutex};

// The dispatch seam: one small function per kernel, the only place here
// (besides cuda.rs) that names CUDA.

/// The packed mask of `x > 0` (relu, leaky_relu) under `op`'s name.
fn positive_mask_for(x: &Tensor, op: &'static str) -> Result<Tensor> {
    match backend(op, &[x])? {
        Backend::Cpu | Backend::Meta => cpu::mask_where(x, op, |v| v > 0.0),
        Backend::Cuda(_) => cuda::positive(x),
    }
}

/// ReLU of `x` with its output's mask already made (CUDA under the lean
/// policy: one launch for both), as (output, bits); `in_place` writes over
/// `x`, which nothing else holds (the caller checked). `None` elsewhere:
/// the op computes the output and `SavedMask::new` the mask, as before.
pub(crate) fn relu_with_mask(x: &Tensor, in_place: bool) -> Result<Option<(Tensor, Tensor)>> {
    if save_policy() != SavePolicy::Lean {
        return Ok(None);
    }
    match backend("relu", &[x])? {
        Backend::Cpu | Backend::Meta => Ok(None),
        Backend::Cuda(_) => cuda::relu_with_mask(x, in_place).map(Some),
    }
}

/// ReLU of `x + b` written over `x` with the mask of its positives, in one
/// kernel where the device has one (CUDA under the lean policy): the mask,
/// or `None` to take the plain path (an in-place add, then
/// `relu_inplace`). The caller checked that `x` is exclusive and `b` whole
/// and contiguous, of `x`'s shape and dtype, in other storage.
pub(crate) fn add_relu_with_mask(x: &Tensor, b: &Tensor) -> Result<Option<Tensor>> {
    if save_policy() != SavePolicy::Lean {
        return Ok(None);
    }
    match backend("add_relu", &[x, b])? {
        Backend::Cpu | Backend::Meta => Ok(None),
        Backend::Cuda(_) => cuda::add_relu_with_mask(x, b).map(Some),
    }
}

/// The packed mask of `lo <= x <= hi` (clamp) under `op`'s name.
fn within_mask(x: &Tensor, op: &'static str, lo: f64, hi: f64) -> Result<Tensor> {
    match backend(op, &[x])? {
        Backend::Cpu | Backend::Meta => cpu::mask_where(x, op, move |v| v >= lo && v <= hi),
        Backend::Cuda(_) => cuda::within(x, lo, hi),
    }
}

/// A U32 tensor of `ceil(n/32)` words with bit `i` set where element `i`
/// of the float tensor `x` (any layout, row-major order) is `> 0`: the
/// mask relu and leaky_relu keep. Saves nothing (not differentiable).
pub fn positive_mask(x: &Tensor) -> Result<Tensor> {
    positive_mask_for(x, "positive_mask")
}

/// A U32 tensor of `ceil(n/32)` words with bit `i` set where `keep` holds
/// for element `i` of the float tensor `x` (any layout, row-major order).
/// Every float dtype converts to f64 exactly, so the test is exact. CPU
/// and meta only: a host predicate has no device form (the rules that run
/// on CUDA have their own kernels). Saves nothing (not differentiable).
pub fn mask_where(
    x: &Tensor,
    op: &'static str,
    keep: impl Fn(f64) -> bool + Sync,
) -> Result<Tensor> {
    match backend(op, &[x])? {
        Backend::Cpu | Backend::Meta => cpu::mask_where(x, op, keep),
        Backend::Cuda(n) => Err(not_on_cuda(op, n)),
    }
}

/// `g` where the mask bit is set and `g * slope` elsewhere (exactly 0 when
/// `slope` is 0): the backward of relu, leaky_relu and clamp. `g` may have
/// any layout; the result is contiguous. Saves nothing (not differentiable).
pub fn mask_scale(g: &Tensor, mask: &Tensor, slope: f64) -> Result<Tensor> {
    match backend("mask_scale", &[g, mask])? {
        Backend::Cpu | Backend::Meta => cpu::mask_scale(g, mask, slope),
        Backend::Cuda(_) => cuda::scale(g, mask, slope),
    }
}

/// [`mask_scale`] of a gradient handed over: written over `g` when buffer
/// reuse is on and nothing else holds `g` (the same values, no new buffer).
pub(crate) fn mask_scale_owned(g: Tensor, mask: &Tensor, slope: f64) -> Result<Tensor> {
    if !may_reuse(&g) {
        return mask_scale(&g, mask, slope);
    }
    match backend("mask_scale", &[&g, mask])? {
        Backend::Cpu | Backend::Meta => cpu::mask_scale_in_place(&g, mask, slope)?,
        Backend::Cuda(_) => cuda::scale_in_place(&g, mask, slope)?,
    }
    Ok(g)
}

/// Which elements pass the gradient.
#[derive(Clone, Copy, Debug)]
pub(crate) enum MaskRule {
    /// `x > 0` (relu, leaky_relu).
    Positive,
    /// `lo <= x <= hi` (clamp).
    Within(f64, f64),
}

impl MaskRule {
    /// The packed mask of this rule over `source`, under `op`'s name.
    fn bits(self, source: &Tensor, op: &'static str) -> Result<Tensor> {
        match self {
            MaskRule::Positive => positive_mask_for(source, op),
            MaskRule::Within(lo, hi) => within_mask(source, op, lo, hi),
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

    /// [`SavedMask::new`] under the lean policy with the `bits` of `rule`
    /// over `source` already made (by a kernel that made both).
    pub(crate) fn from_bits(
        source: &Tensor,
        bits: &Tensor,
        rule: MaskRule,
        op: &'static str,
    ) -> SavedMask {
        let slot = Arc::new(MaskSlot {
            rule,
            op,
            source_layout: source.layout().clone(),
            source_version: source.version(),
            state: Mutex::new(MaskState::Bits(SavedTensor::new(bits, op))),
        });
        let weak = Arc::downgrade(&slot);
        source.storage().add_save_listener(weak);
        SavedMask::Lean(slot)
    }

    /// `g` where the mask is set, `g · slope` elsewhere; written over `g`
    /// when buffer reuse is on and nothing else holds it.
    pub(crate) fn apply(&self, g: Tensor, slope: f64) -> Result<Tensor> {
        let (source, rule, op) = match self {
            SavedMask::Lean(slot) => {
                let state = slot.state.lock().unwrap_or_else(|e| e.into_inner());
                match &*state {
                    MaskState::Bits(bits) => return mask_scale_owned(g, bits.get()?, slope),
                    MaskState::Source(s) => (s.get()?.clone(), slot.rule, slot.op),
                }
            }
            SavedMask::FromFloat(s, rule) => (s.get()?.clone(), *rule, "mask"),
        };
        mask_scale_owned(g, &rule.bits(&source, op)?, slope)
    }
}
