//! The stand-in CUDA driver (`libcuda.so`): the `cu*` functions cudarc 0.19
//! and leangrad call, with exactly their C ABI, over simulated devices.
//!
//! One mutex guards the whole simulator. Work is queued per device in
//! enqueue order and run when a synchronising call needs it (see
//! gpusim/README.md for the model: streams, faults, the memory pool).
//! Every failing call prints `gpusim: <function>: <what>` and
//! `cuGetErrorString` returns the standard text followed by that detail.

pub mod api_device;
pub mod api_event;
pub mod api_func;
pub mod api_memory;
pub mod api_module;
pub mod config;
pub mod consts;
pub mod errors;
pub mod lock;
pub mod pool;
pub mod state;
pub mod stats;

pub use stats::{stats, Stats};
