//! Helpers shared by the `layers_*` launch wrappers: argument checks, the
//! statistics dtype and the packed-mask word count.

use super::CudaBuffer;
use crate::{DType, Error, Result};

/// Checks that `b` has `dtype`, lives on `like`'s device and holds at least
/// `len` elements.
pub(crate) fn expect(
    op: &'static str,
    b: &CudaBuffer,
    dtype: DType,
    len: usize,
    like: &CudaBuffer,
) -> Result<()> {
    super::check::same_device(op, b, like)?;
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

/// The dtype statistics and log-sum-exps are kept in: f64 for f64, else f32
/// (the kernels' `Acc<T>`).
pub fn stat_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Words of a 1-bit packed mask over `n` elements (32 per u32 word).
pub fn mask_words(n: usize) -> usize {
    n.div_ceil(32)
}

/// Launch configuration for the warp-per-word ballot kernels (a packed
/// mask over `n` elements: one warp per word).
pub(crate) fn ballot_grid(n: usize) -> cudarc::driver::LaunchConfig {
    super::CudaDevice::grid_for(mask_words(n).max(1) * 32)
}
