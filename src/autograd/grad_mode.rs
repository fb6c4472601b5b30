//! Grad mode: whether ops record nodes, per thread.

use std::cell::Cell;

thread_local! {
    static ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Whether ops on this thread record autograd nodes.
pub fn is_grad_enabled() -> bool {
    ENABLED.with(|e| e.get())
}

/// Restores the previous grad mode when dropped.
pub struct NoGradGuard {
    previous: bool,
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        ENABLED.with(|e| e.set(self.previous));
    }
}

/// Stops recording on this thread until the guard drops (like `torch.no_grad()`).
pub fn no_grad() -> NoGradGuard {
    let previous = ENABLED.with(|e| e.replace(false));
    NoGradGuard { previous }
}
