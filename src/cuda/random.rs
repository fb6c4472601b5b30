//! Launch wrappers for the Philox4x32-10 kernels (`random.cu`): the same
//! (seed, offset) gives the same numbers as `crate::rng` on the CPU —
//! bit for bit for words, uniforms and dropout; normals up to the last bit
//! of the device's double-precision `log`/`cos`.

use super::check::float_suffix;
use super::{CudaBuffer, CudaDevice, Strided};
use crate::{DType, Result};
use std::sync::Arc;

/// The raw words `offset .. offset + n` of the stream for `seed` (u32).
pub fn philox_words(
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
pub fn uniform(
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
pub fn normal(
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

/// Dropout: element `i` (row-major over `lx`) of `x` times `scale` where
/// `crate::rng::dropout_keep(seed, offset, i, p)`, else 0; the product is
/// rounded in `x`'s dtype as on the CPU. Used for forward and (on the
/// incoming gradient) backward alike: the mask is never stored.
pub fn dropout(
    x: &CudaBuffer,
    lx: &Strided,
    seed: u64,
    offset: u64,
    p: f64,
    scale: f64,
) -> Result<CudaBuffer> {
    let sfx = float_suffix("cuda dropout", x.dtype())?;
    super::check::input("cuda dropout", x, x.dtype(), lx, x)?;
    let n = lx.numel();
    let mut out = CudaBuffer::alloc(x.device(), x.dtype(), n)?;
    if n > 0 {
        let n64 = n as i64;
        let lx = lx.coalesced();
        launch!(x.device(), "random.cu", format!("dropout_{sfx}"), CudaDevice::grid_for(n);
            &seed, &offset, &p, &scale, &n64, out.slice_mut(), x.slice(), &lx)?;
    }
    Ok(out)
}

/// The keep-mask of a dropout draw over `n` elements as u8 (1 = kept):
/// what the save-everything policy stores, as `cpu::dropout` does.
pub fn dropout_mask(
    device: &Arc<CudaDevice>,
    seed: u64,
    offset: u64,
    p: f64,
    n: usize,
) -> Result<CudaBuffer> {
    let mut out = CudaBuffer::alloc(device, DType::U8, n)?;
    if n > 0 {
        let n64 = n as i64;
        launch!(device, "random.cu", "dropout_mask", CudaDevice::grid_for(n);
            &seed, &offset, &p, &n64, out.slice_mut())?;
    }
    Ok(out)
}
