//! Reverse-mode autodiff that keeps only what gradients need.
//!
//! - [`Node`]: one recorded op. It owns exactly its saved tensors (inside its
//!   [`BackwardOp`]) and edges to the inputs that require grad.
//! - [`SavedTensor`]: a tensor held for backward; counted as saved in the
//!   ledger and checked against in-place modification by version.
//! - [`engine`]: runs backward, freeing each node's saved tensors as soon as
//!   it has run and each gradient as soon as it has been consumed, and hands
//!   every leaf's final gradient to a [`GradientSink`].
//! - [`checkpoint`]: activation checkpointing; a segment keeps its inputs
//!   and is recomputed in backward.
//! - [`gradcheck`]: finite differences in f64 for tests.

mod checkpoint;
pub mod engine;
mod grad_mode;
pub mod gradcheck;
mod node;
mod policy;
mod saved;

pub use checkpoint::checkpoint;
pub use engine::{backward_with, CallbackSink, CollectGrads, GradientSink};
pub use grad_mode::{enable_grad, is_grad_enabled, is_recomputing, no_grad, GradModeGuard};
pub use node::{attach, needs_grad, BackwardOp, Edge, Node};
pub use policy::{
    buffer_reuse, keep, may_reuse, save_policy, with_buffer_reuse, with_save_policy,
    BufferReuseGuard, SavePolicy, SavePolicyGuard,
};
pub use saved::SavedTensor;
