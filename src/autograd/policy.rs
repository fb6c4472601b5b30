//! The save policy: what ops keep for backward, chosen per thread and scope.

use std::cell::Cell;

/// What ops keep for backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum SavePolicy {
    /// Only what the gradients of the inputs that require grad need, in the
    /// most compact form (1-bit masks, u8 window indices). The default.
    Lean,
    /// The reference: what PyTorch keeps. Whenever a node is recorded, every
    /// input its formulas may read is saved (whether or not that input's
    /// gradient is needed), masks are whole tensors, indices are i64. The
    /// gradients are bit-for-bit those of `Lean`; only the memory differs.
    SaveAll,
}

thread_local! {
    static POLICY: Cell<SavePolicy> = const { Cell::new(SavePolicy::Lean) };
}

/// The policy ops recorded now on this thread follow.
pub fn save_policy() -> SavePolicy {
    POLICY.with(|p| p.get())
}

/// Restores the previous policy when dropped.
pub struct SavePolicyGuard {
    previous: SavePolicy,
}

impl Drop for SavePolicyGuard {
    fn drop(&mut self) {
        POLICY.with(|p| p.set(self.previous));
    }
}

/// Records ops under `policy` on this thread until the guard drops.
pub fn with_save_policy(policy: SavePolicy) -> SavePolicyGuard {
    let previous = POLICY.with(|p| p.replace(policy));
    SavePolicyGuard { previous }
}

/// Whether an op keeps a tensor that the lean policy keeps only when
/// `needed`: always under [`SavePolicy::SaveAll`].
pub fn keep(needed: bool) -> bool {
    needed || save_policy() == SavePolicy::SaveAll
}

thread_local! {
    static REUSE: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Whether ops may write their output over an input nobody else holds
/// (buffer reuse): an input handed over by value (`Module::forward_owned`,
/// `Tensor::add_owned`) or a gradient the engine passes on, whose storage,
/// tensor and views are held once and which no node saved. Results are
/// bit-identical either way; only the bytes allocated differ. By default on
/// under [`SavePolicy::Lean`] and off under [`SavePolicy::SaveAll`] (PyTorch
/// reuses a buffer only where a layer says `inplace=True`);
/// [`with_buffer_reuse`] overrides it for a scope.
pub fn buffer_reuse() -> bool {
    REUSE
        .with(|r| r.get())
        .unwrap_or_else(|| save_policy() == SavePolicy::Lean)
}

/// Restores the previous buffer-reuse setting when dropped.
pub struct BufferReuseGuard {
    previous: Option<bool>,
}

impl Drop for BufferReuseGuard {
    fn drop(&mut self) {
        REUSE.with(|r| r.set(self.previous));
    }
}

/// Turns buffer reuse on or off on this thread until the guard drops (see
/// [`buffer_reuse`]).
pub fn with_buffer_reuse(on: bool) -> BufferReuseGuard {
    let previous = REUSE.with(|r| r.replace(Some(on)));
    BufferReuseGuard { previous }
}

/// Whether an op may write its output over `t`'s storage now: buffer reuse
/// is on and `t` is exclusive ([`crate::Tensor::is_exclusive`]).
pub fn may_reuse(t: &crate::Tensor) -> bool {
    buffer_reuse() && t.is_exclusive()
}
