//! How much device memory a convolution's im2col / col2im columns may take
//! on CUDA: a scoped, per-thread choice (like TF32 and the save policy).
//!
//! By default (0) the columns of one batch item at a time, exactly the
//! Workspace buffer the CPU kernels use, so a CUDA step's ledger equals the
//! CPU's (and the meta prediction) byte for byte. A larger budget lets one
//! strided-batched GEMM cover several items — fewer launches, more memory —
//! and the ledger shows that extra Workspace honestly.

use std::cell::Cell;

thread_local! {
    static BUDGET: Cell<usize> = const { Cell::new(0) };
}

/// Restores the previous budget when dropped.
#[must_use = "the budget applies only while the guard lives"]
pub struct ConvWorkspaceGuard {
    previous: usize,
}

impl Drop for ConvWorkspaceGuard {
    fn drop(&mut self) {
        BUDGET.with(|b| b.set(self.previous));
    }
}

/// CUDA convolutions on this thread may use up to `bytes` for their column
/// buffer (at least one item's columns, whatever `bytes` says), until the
/// guard drops.
pub fn with_conv_workspace(bytes: usize) -> ConvWorkspaceGuard {
    ConvWorkspaceGuard {
        previous: BUDGET.with(|b| b.replace(bytes)),
    }
}

/// The column budget on this thread now (0: one item, as the CPU).
pub fn conv_workspace_bytes() -> usize {
    BUDGET.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_item_by_default_and_scoped() {
        assert_eq!(conv_workspace_bytes(), 0);
        {
            let _big = with_conv_workspace(256 << 20);
            assert_eq!(conv_workspace_bytes(), 256 << 20);
            assert_eq!(std::thread::spawn(conv_workspace_bytes).join().unwrap(), 0);
        }
        assert_eq!(conv_workspace_bytes(), 0);
    }
}
