//! Unit tests of the shared primitives' launch wrappers against the CPU
//! (were `tests/cuda_{elementwise,reduce,index_random,gemm}.rs` and the
//! `fill` test of `tests/cuda_buffers.rs`, moved in when the wrappers
//! became `pub(crate)`; tests of the public API alone stay in `tests/`). Without a
//! CUDA device each test prints `skipped: no CUDA device (…)` and passes;
//! under `LEANGRAD_REQUIRE_CUDA=1` (the simulated-GPU CI phase runs
//! `--lib`) a missing device fails it.

mod elementwise;
mod gemm;
mod index_random;
mod reduce;
