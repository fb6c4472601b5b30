//! The CUDA arms of the shared primitives (`super::*`): each takes tensors
//! (CUDA storages and layouts), calls the CUDA runtime's launch wrappers
//! (`crate::cuda`) and wraps the output, allocating exactly what the CPU
//! kernel allocates, so a program moves the CUDA ledger as it moves the
//! CPU's. Only the primitives' dispatch arms call these.

pub(crate) mod index;
pub(crate) mod matmul;
pub(crate) mod ops;
