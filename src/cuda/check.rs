//! Launch-argument checks and sizes shared by the launch wrappers (the
//! shared primitives' here and every op family's `cuda.rs`): dtypes,
//! devices, that a buffer holds every element its layout addresses, the
//! statistics dtype and the packed-mask word count.

use super::{CudaBuffer, Strided};
use crate::{DType, Error, Result};

/// The kernel-name suffix of a dtype.
pub(crate) fn suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::U8 => "u8",
        DType::U32 => "u32",
        DType::I64 => "i64",
    }
}

/// The suffix of a float dtype; other dtypes are `UnsupportedDType` for `op`.
pub(crate) fn float_suffix(op: &'static str, dtype: DType) -> Result<&'static str> {
    if dtype.is_float() {
        Ok(suffix(dtype))
    } else {
        Err(Error::UnsupportedDType { op, dtype })
    }
}

/// Checks that `b` has `dtype`, lives on `device`'s device and holds every
/// element `layout` reads.
pub(crate) fn input(
    op: &'static str,
    b: &CudaBuffer,
    dtype: DType,
    layout: &Strided,
    like: &CudaBuffer,
) -> Result<()> {
    same_device(op, b, like)?;
    if b.dtype() != dtype {
        return Err(Error::DTypeMismatch {
            op,
            expected: dtype,
            got: b.dtype(),
        });
    }
    if layout.extent() > b.len() {
        return Err(Error::InvalidArgument {
            op,
            msg: format!(
                "layout {:?} reads {} elements of a buffer of {}",
                layout.shape(),
                layout.extent(),
                b.len()
            ),
        });
    }
    Ok(())
}

/// Checks that two buffers are on the same device.
pub(crate) fn same_device(op: &'static str, a: &CudaBuffer, b: &CudaBuffer) -> Result<()> {
    if a.device().ordinal() != b.device().ordinal() {
        return Err(Error::DeviceMismatch {
            op,
            lhs: a.device().device(),
            rhs: b.device().device(),
        });
    }
    Ok(())
}

/// Checks that two layouts have the same (output) shape.
pub(crate) fn same_shape(op: &'static str, a: &Strided, b: &Strided) -> Result<()> {
    if a.shape() != b.shape() {
        return Err(Error::ShapeMismatch {
            op,
            lhs: a.shape(),
            rhs: b.shape(),
        });
    }
    Ok(())
}

/// Checks that a dim index is below the rank.
pub(crate) fn dim(op: &'static str, dim: usize, rank: usize) -> Result<()> {
    if dim >= rank {
        return Err(Error::DimOutOfRange {
            op,
            dim: dim as isize,
            rank,
        });
    }
    Ok(())
}

/// Checks that `b` has `dtype`, lives on `like`'s device and holds at least
/// `len` elements.
pub(crate) fn expect(
    op: &'static str,
    b: &CudaBuffer,
    dtype: DType,
    len: usize,
    like: &CudaBuffer,
) -> Result<()> {
    same_device(op, b, like)?;
    if b.dtype() != dtype {
        return Err(Error::DTypeMismatch {
            op,
            expected: dtype,
            got: b.dtype(),
        });
    }
    if b.len() < len {
        return Err(Error::InvalidArgument {
            op,
            msg: format!("a buffer of {} elements where {len} are needed", b.len()),
        });
    }
    Ok(())
}

/// An [`Error::InvalidArgument`] for `op`.
pub(crate) fn invalid(op: &'static str, msg: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op,
        msg: msg.into(),
    }
}

/// Words of a 1-bit packed mask over `n` elements (32 per u32 word).
pub(crate) fn mask_words(n: usize) -> usize {
    n.div_ceil(32)
}

/// Elements one thread of the run kernels handles (`LG_RUN` in
/// `kernels/common.cuh`): the norms' apply, the in-place ReLUs, `axpy_dense`.
pub(crate) const RUN: usize = 4;

/// The launch of a run kernel over `n` elements: a thread per run of [`RUN`].
pub(crate) fn runs_grid(n: usize) -> cudarc::driver::LaunchConfig {
    super::CudaDevice::grid_for(n.div_ceil(RUN))
}

/// Whether every buffer present starts on a 16-byte boundary, so that a run
/// kernel moves its runs as whole vectors (its `vec` flag; otherwise
/// element by element, the same values).
pub(crate) fn runs_aligned(bufs: &[Option<&super::CudaBuffer>]) -> bool {
    bufs.iter().flatten().all(|b| b.vector_aligned())
}

/// Launch configuration for the warp-per-word ballot kernels (a packed
/// mask over `n` elements: one warp per word).
pub(crate) fn ballot_grid(n: usize) -> cudarc::driver::LaunchConfig {
    super::CudaDevice::grid_for(mask_words(n).max(1) * 32)
}

#[cfg(test)]
mod run_tests {
    /// The run length the launches size their grids by is the one the
    /// kernels' common header defines (one source each side).
    #[test]
    fn the_run_length_matches_the_kernels() {
        let src = include_str!("../../kernels/common.cuh");
        assert_eq!(super::super::testing::cu_define(src, "LG_RUN"), super::RUN);
    }
}
