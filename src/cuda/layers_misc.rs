//! Launch wrapper for the per-channel sum of conv bias gradients
//! (`conv.cu`). The optimizer updates moved to [`super::optim`] and are
//! re-exported here under their old paths.

use super::check::float_suffix;
use super::layers_util::expect;
use super::{CudaBuffer, CudaDevice};
use crate::Result;

// The optimizer wrappers live in `super::optim`; re-exported here for the
// callers that named them through this module.
pub use super::optim::{adam_update, sgd_update, AdamParams, GradMap, SgdParams};

/// Per channel of `gy` (`[n, c, l]`): the sum over `n` and `l` in f64 (the
/// bias gradient), in `gy`'s dtype.
pub fn channel_sum(gy: &CudaBuffer, n: usize, c: usize, l: usize) -> Result<CudaBuffer> {
    let op = "cuda channel_sum";
    let sfx = float_suffix(op, gy.dtype())?;
    expect(op, gy, gy.dtype(), n * c * l, gy)?;
    let mut out = CudaBuffer::alloc(gy.device(), gy.dtype(), c)?;
    if c > 0 {
        let (n64, c64, l64) = (n as i64, c as i64, l as i64);
        launch!(gy.device(), "conv.cu", format!("channel_sum_{sfx}"), CudaDevice::grid_per_row(c);
            &n64, &c64, &l64, out.slice_mut(), gy.slice())?;
    }
    Ok(out)
}
