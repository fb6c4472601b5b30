//! leangrad: a deep-learning framework whose autodiff keeps only the bytes
//! that gradients actually need, with an exact memory ledger.
//!
//! The map of the code is in `docs/ARCHITECTURE.md`.

#![warn(missing_docs)]

pub mod autograd;
pub mod cuda;
pub mod data;
pub mod demo;
pub mod device;
pub mod distributed;
pub mod dtype;
pub mod error;
pub mod io;
pub mod jobs;
pub mod memory;
pub mod memory_plan;
pub mod meta;
pub mod models;
pub mod nn;
pub mod op_code;
pub mod ops;
pub mod optim;
pub mod primitives;
pub mod rng;
pub mod settings;
pub mod tensor;
pub mod threads;

pub use device::Device;
pub use dtype::{DType, FloatDType, WithDType};
pub use error::{Error, Result};
pub use ops::autocast;
pub use primitives::{cpu_path, CpuPath};
pub use tensor::Tensor;

/// The README's examples, compiled and run as doc tests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The examples of `docs/memory.md` (the ledger), compiled and run as doc
/// tests.
#[doc = include_str!("../docs/memory.md")]
#[cfg(doctest)]
pub struct MemoryDoctests;

/// The examples of `docs/jobs.md` (text classification, model surgery),
/// compiled and run as doc tests.
#[doc = include_str!("../docs/jobs.md")]
#[cfg(doctest)]
pub struct JobsDoctests;

/// The examples of `docs/data-and-checkpoints.md` (`.pth` files,
/// checkpoints, images and the data loader), compiled and run as doc tests.
#[doc = include_str!("../docs/data-and-checkpoints.md")]
#[cfg(doctest)]
pub struct DataAndCheckpointsDoctests;

/// The examples of `docs/training-options.md` (activation checkpointing,
/// autocast, compact optimizer state, loss scaling), compiled and run as
/// doc tests.
#[doc = include_str!("../docs/training-options.md")]
#[cfg(doctest)]
pub struct TrainingOptionsDoctests;

/// The examples of `docs/distributed.md` (process groups, data parallel
/// training, synchronised BatchNorm), compiled as doc tests (they need a
/// launcher and GPUs to run).
#[doc = include_str!("../docs/distributed.md")]
#[cfg(doctest)]
pub struct DistributedDoctests;
