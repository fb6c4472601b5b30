//! Launch wrappers for the Philox4x32-10 kernels (`random.cu`): the same
//! (seed, offset) gives the same numbers as `crate::rng` on the CPU —
//! bit for bit for words and uniforms; normals up to the last bit of the
//! device's double-precision `log`/`cos`. (Dropout's keep rule is
//! `common.cuh`'s `lg_keep`, launched from `src/nn/dropout/`.)

use super::check::float_suffix;
use super::{CudaBuffer, CudaDevice};
use crate::{DType, Result};
use std::sync::Arc;

/// The raw words `offset .. offset + n` of the stream for `seed` (u32).
/// No library code draws raw words on the device; kept, and tested, as the
/// bit-for-bit check of the device Philox against `crate::rng` that the
/// uniforms, normals and dropout's keep rule build on.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn philox_words(
    device: &Arc<CudaDevice>,
    seed: u64,
    offset: u64,
    n: usize,
) -> Result<CudaBuffer> {
    let mut out = CudaBuffer::alloc(device, DType::U32, n)?;
    if n > 0 {
        let n64 = n as i64;
        launch!(device, "random.cu", "philox_words", CudaDevice::grid_for(n);
            &seed, &offset, &n64, out.slice_mut())?;
    }
    Ok(out)
}

/// `n` uniforms in [0, 1) of float `dtype` from `offset` of the stream for
/// `seed`: `crate::rng::uniform` converted to `dtype`.
pub(crate) fn uniform(
    device: &Arc<CudaDevice>,
    dtype: DType,
    seed: u64,
    offset: u64,
    n: usize,
) -> Result<CudaBuffer> {
    draw(device, dtype, "uniform", seed, offset, n)
}

/// `n` standard normals of float `dtype` from `offset` of the normal stream
/// for `seed`: `crate::rng::normal` converted to `dtype`.
pub(crate) fn normal(
    device: &Arc<CudaDevice>,
    dtype: DType,
    seed: u64,
    offset: u64,
    n: usize,
) -> Result<CudaBuffer> {
    draw(device, dtype, "normal", seed, offset, n)
}

fn draw(
    device: &Arc<CudaDevice>,
    dtype: DType,
    kind: &str,
    seed: u64,
    offset: u64,
    n: usize,
) -> Result<CudaBuffer> {
    let sfx = float_suffix("cuda random", dtype)?;
    let mut out = CudaBuffer::alloc(device, dtype, n)?;
    if n > 0 {
        let n64 = n as i64;
        launch!(device, "random.cu", format!("{kind}_{sfx}"), CudaDevice::grid_for(n);
            &seed, &offset, &n64, out.slice_mut())?;
    }
    Ok(out)
}
