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
