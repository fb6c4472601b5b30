//! The meta device: tensors with shapes, dtypes, strides, versions and
//! ledger registrations but no data.
//!
//! Every kernel call goes through a dispatch seam (each shared primitive's
//! entry in `src/primitives/`, each op family's seam functions in its
//! `mod.rs`) with one `match` on `backend`: `Backend::Cuda` calls the
//! family's `cuda.rs`, `Backend::Cpu` runs the CPU kernel, and
//! `Backend::Meta` returns outputs of the right shape and dtype made by
//! `empty` without arithmetic and without host buffers the size of the
//! data; an in-place kernel only bumps the version. Allocations made by
//! the kernels (outputs, workspace, contiguous copies) go through the same
//! code on both devices, so a training step on meta moves the ledger exactly
//! as the same step on the CPU does, category by category and byte by byte
//! (`tests/meta_ledger.rs`).
//!
//! Data-dependent reads are replaced by assumptions: class targets,
//! embedding and gather indices are treated as valid without being read
//! (so an out-of-range index is not reported on meta), and the values of
//! small per-channel vectors (statistics, BatchNorm's running variance)
//! read by a kernel are zeros of the right length.

use crate::{DType, Device, Error, Result, Tensor};

/// Which backend computes a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    /// The CPU kernels, on host data.
    Cpu,
    /// Shapes only: outputs of the right shape and dtype, no data.
    Meta,
    /// The CUDA launch wrappers (`src/cuda/`) on device ordinal `n`.
    Cuda(usize),
}

/// The backend for a kernel over `tensors`: they must share one device
/// (else [`Error::DeviceMismatch`]).
pub(crate) fn backend(op: &'static str, tensors: &[&Tensor]) -> Result<Backend> {
    crate::memory::note_op(op);
    let Some(first) = tensors.first() else {
        return Ok(Backend::Cpu);
    };
    let device = first.device();
    if let Some(other) = tensors.iter().find(|t| t.device() != device) {
        return Err(Error::DeviceMismatch {
            op,
            lhs: device,
            rhs: other.device(),
        });
    }
    backend_of(op, device)
}

/// The backend of one device (a CUDA device is opened by the first kernel
/// that uses it, which reports it unavailable with a typed error).
pub(crate) fn backend_of(op: &'static str, device: Device) -> Result<Backend> {
    crate::memory::note_op(op);
    match device {
        Device::Cpu => Ok(Backend::Cpu),
        Device::Meta => Ok(Backend::Meta),
        Device::Cuda(n) => Ok(Backend::Cuda(n)),
    }
}

/// The typed error of a kernel that has no CUDA implementation yet: never a
/// panic, never a silent copy to the CPU.
pub(crate) fn not_on_cuda(op: &'static str, ordinal: usize) -> Error {
    Error::NotOnCuda {
        op,
        device: Device::Cuda(ordinal),
    }
}

/// A new contiguous meta tensor: a kernel's output on the meta device.
pub(crate) fn empty(shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::new_meta(shape, dtype)
}

/// `Ok` for float dtypes, as the CPU kernels require.
pub(crate) fn float(op: &'static str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType { op, dtype })
    }
}

/// An in-place kernel on meta: the destination's version moves on, as the
/// CPU kernel's write would move it.
pub(crate) fn touch(dst: &Tensor) {
    dst.storage().bump_version();
}
