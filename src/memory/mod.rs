//! The memory ledger: every allocation on every device is counted here.
//!
//! Each storage registers its exact byte size under a [`Category`] when it is
//! allocated and unregisters when it is dropped. A storage that an autograd
//! node saves for backward moves to [`Category::Saved`] (labelled with the
//! layer/op that saved it) for as long as some node holds it, then moves back;
//! parameters and optimizer state keep their own category when saved, since
//! saving them costs no extra memory. A gradient that reaches a leaf moves
//! from [`Category::IntermediateGradient`] to [`Category::ParameterGradient`]
//! (the leaf is a parameter) or [`Category::InputGradient`] (any other leaf,
//! such as an input image).
//!
//! The categories always add up: at every moment the live bytes of the
//! categories sum to the device's live total, and the report keeps the
//! breakdown at the moment of the peak (with the layer, op and [`Phase`]
//! running then), next to each category's own peak.
//!
//! Ledgers are values: tests make their own with [`Ledger::new`] and
//! [`Ledger::enter`], so that exact byte counts are not disturbed by other
//! tests running on other threads. A storage remembers the ledger it was
//! counted in, so it is uncounted there wherever it is dropped. A ledger made
//! with [`Ledger::record_timeline`] also keeps every allocation, free and
//! change of category as a [`TimelineEvent`].

pub mod host;
mod host_cache;
mod ledger;
mod report;
mod scope;
mod stats;
mod timeline;

pub use host::host_available_bytes;
pub(crate) use host_cache::keep as keep_host_buffer;
pub use host_cache::{
    cached_host_bytes, release_cached_host_buffers, CACHED_MIN_BYTES, CACHE_CAP_BYTES,
};
pub use ledger::{Allocation, Ledger};
pub use report::{human_bytes, CategoryBytes, DeviceReport, LayerBytes, MemoryReport, PeakMoment};
pub use scope::{
    attribute_to_scope, current_category, current_scope, current_scope_path, enter_scope_path,
    note_op, scope, with_category, AttributionGuard, CategoryGuard, ScopeGuard,
};
pub use timeline::{replay, EventKind, TimelineEvent};

/// Runs `f` with a private ledger current: the small statistics, parameter
/// and status buffers it allocates (per-channel statistics, targets, losses
/// read back) are not tensor memory, so they stay out of the caller's
/// ledger on every device alike, as host vectors would.
pub(crate) fn uncounted<R>(f: impl FnOnce() -> crate::Result<R>) -> crate::Result<R> {
    let scratch = Ledger::new();
    let _guard = scratch.enter();
    f()
}

/// What an allocation is for, as a person reading a memory report thinks of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Category {
    /// Model weights and buffers, trainable or frozen.
    #[serde(rename = "parameters")]
    Parameter,
    /// Optimizer state (moments, momentum buffers).
    #[serde(rename = "optimizer_state")]
    OptimizerState,
    /// Forward outputs that are alive but not held for backward, with the
    /// input batch, the loss and other results: everything allocated
    /// outside another category.
    #[serde(rename = "activations")]
    Activation,
    /// Tensors held by autograd nodes for backward.
    #[serde(rename = "saved")]
    Saved,
    /// Temporaries an op needs only while it runs (column buffers, scratch).
    #[serde(rename = "workspace")]
    Workspace,
    /// Gradients that reached a parameter: the pending gradient of a
    /// parameter, its `.grad`, an accumulation buffer.
    #[serde(rename = "parameter_gradients")]
    ParameterGradient,
    /// Gradients that reached a leaf that is not a parameter (an input
    /// image, the input embeddings, an image being optimised).
    #[serde(rename = "input_gradients")]
    InputGradient,
    /// Gradients flowing between ops during backward (and the other
    /// tensors backward makes), before they reach a leaf.
    #[serde(rename = "intermediate_gradients")]
    IntermediateGradient,
}

impl Category {
    /// Every category, in report order.
    pub const ALL: [Category; 8] = [
        Category::Parameter,
        Category::OptimizerState,
        Category::Activation,
        Category::Saved,
        Category::Workspace,
        Category::ParameterGradient,
        Category::InputGradient,
        Category::IntermediateGradient,
    ];

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The key of the category in JSON reports (`parameters`,
    /// `activations`, `parameter_gradients`, …).
    pub fn name(self) -> &'static str {
        match self {
            Category::Parameter => "parameters",
            Category::OptimizerState => "optimizer_state",
            Category::Activation => "activations",
            Category::Saved => "saved",
            Category::Workspace => "workspace",
            Category::ParameterGradient => "parameter_gradients",
            Category::InputGradient => "input_gradients",
            Category::IntermediateGradient => "intermediate_gradients",
        }
    }

    /// The category's name for people, as in the report's rows.
    pub fn label(self) -> &'static str {
        match self {
            Category::Parameter => "parameters",
            Category::OptimizerState => "optimizer state",
            Category::Activation => "activations",
            Category::Saved => "saved for backward",
            Category::Workspace => "workspace",
            Category::ParameterGradient => "parameter gradients",
            Category::InputGradient => "input gradients",
            Category::IntermediateGradient => "intermediate gradients",
        }
    }

    /// Whether this is one of the three gradient categories.
    pub fn is_gradient(self) -> bool {
        matches!(
            self,
            Category::ParameterGradient | Category::InputGradient | Category::IntermediateGradient
        )
    }
}

/// The part of a training step that runs now: set on a ledger with
/// [`Ledger::set_phase`] (`leangrad memory` does), recorded with the peak
/// and with every timeline event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Before the forward pass: building the model, making the inputs.
    #[default]
    Setup,
    /// The forward pass and the loss.
    Forward,
    /// Backward (with the updates, for a fused optimizer step).
    Backward,
    /// The optimizer step after backward.
    Optimizer,
}

impl Phase {
    /// Every phase, in the order of a step.
    pub const ALL: [Phase; 4] = [
        Phase::Setup,
        Phase::Forward,
        Phase::Backward,
        Phase::Optimizer,
    ];

    /// The phase's name (`setup`, `forward`, `backward`, `optimizer`).
    pub fn name(self) -> &'static str {
        match self {
            Phase::Setup => "setup",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
        }
    }
}
