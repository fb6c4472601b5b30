//! Grad mode: whether ops record nodes, per thread; and whether the ops
//! running now are a checkpointed segment's recompute.

use std::cell::Cell;

thread_local! {
    static ENABLED: Cell<bool> = const { Cell::new(true) };
    static RECOMPUTING: Cell<bool> = const { Cell::new(false) };
}

/// Whether ops on this thread record autograd nodes.
pub fn is_grad_enabled() -> bool {
    ENABLED.with(|e| e.get())
}

/// Restores the previous grad mode when dropped.
pub struct GradModeGuard {
    previous: bool,
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        ENABLED.with(|e| e.set(self.previous));
    }
}

/// Stops recording on this thread until the guard drops (like `torch.no_grad()`).
pub fn no_grad() -> GradModeGuard {
    let previous = ENABLED.with(|e| e.replace(false));
    GradModeGuard { previous }
}

/// Records on this thread until the guard drops, inside `no_grad` too
/// (like `torch.enable_grad()`).
pub fn enable_grad() -> GradModeGuard {
    let previous = ENABLED.with(|e| e.replace(true));
    GradModeGuard { previous }
}

/// Whether the ops running on this thread recompute a checkpointed
/// segment in backward. Layers with side effects beyond their output
/// (batch norm's running statistics) skip them then: the forward made them.
pub fn is_recomputing() -> bool {
    RECOMPUTING.with(|r| r.get())
}

/// Ends a [`recomputing`] scope when dropped.
pub(crate) struct RecomputingGuard {
    previous: bool,
}

impl Drop for RecomputingGuard {
    fn drop(&mut self) {
        RECOMPUTING.with(|r| r.set(self.previous));
    }
}

/// Marks the ops run until the guard drops as a recompute.
pub(crate) fn recomputing() -> RecomputingGuard {
    let previous = RECOMPUTING.with(|r| r.replace(true));
    RecomputingGuard { previous }
}
