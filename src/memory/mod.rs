//! The memory ledger: every allocation on every device is counted here.
//!
//! Each storage registers its exact byte size under a [`Category`] when it is
//! allocated and unregisters when it is dropped. A storage that an autograd
//! node saves for backward moves to [`Category::Saved`] (labelled with the
//! layer/op that saved it) for as long as some node holds it, then moves back;
//! parameters and optimizer state keep their own category when saved, since
//! saving them costs no extra memory.
//!
//! Ledgers are values: tests make their own with [`Ledger::new`] and
//! [`Ledger::enter`], so that exact byte counts are not disturbed by other
//! tests running on other threads. A storage remembers the ledger it was
//! counted in, so it is uncounted there wherever it is dropped.

pub mod host;
mod ledger;
mod report;
mod scope;

pub use host::host_available_bytes;
pub use ledger::{Allocation, Ledger};
pub use report::{human_bytes, CategoryBytes, DeviceReport, LayerBytes, MemoryReport};
pub use scope::{current_category, current_scope, scope, with_category, CategoryGuard, ScopeGuard};

/// What an allocation is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Category {
    /// Trainable or frozen model weights.
    Parameter,
    /// Gradient buffers (created during backward, or collected `.grad`s).
    Gradient,
    /// Tensors held by autograd nodes for backward.
    Saved,
    /// Optimizer state (moments, momentum buffers).
    OptimizerState,
    /// Temporaries an op needs while it runs.
    Workspace,
    /// Everything else: inputs, activations, results.
    Other,
}

impl Category {
    /// Every category, in report order.
    pub const ALL: [Category; 6] = [
        Category::Parameter,
        Category::Gradient,
        Category::Saved,
        Category::OptimizerState,
        Category::Workspace,
        Category::Other,
    ];

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// A short lower-case name, as used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Gradient => "gradient",
            Category::Saved => "saved",
            Category::OptimizerState => "optimizer_state",
            Category::Workspace => "workspace",
            Category::Other => "other",
        }
    }
}
