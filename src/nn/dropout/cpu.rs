//! Dropout on the CPU (and its meta form): the keep-mask is never stored
//! by the lean path: element `i` is kept iff `draw.keep(i)`, which forward
//! and backward evaluate alike (any layout in, row-major element order).

use super::DropoutDraw;
use crate::dtype::CpuData;
use crate::meta::{self, backend, backend_of, not_on_cuda, Backend};
use crate::primitives::{assign_indexed, fill, IndexedAssign, Source};
use crate::tensor::{Layout, Tensor};
use crate::{DType, Device, Error, FloatDType, Result, WithDType};

/// `v · scale` where `keep(i)`, else 0, for every element of the float
/// tensor `x` (any layout), as a new contiguous tensor.
fn masked_scale(x: &Tensor, scale: f64, keep: impl Fn(usize) -> bool + Sync) -> Result<Tensor> {
    match backend("dropout", &[x])? {
        Backend::Meta => {
            meta::float("dropout", x.dtype())?;
            return meta::empty(x.shape(), x.dtype());
        }
        // A host keep rule has no device form: the seam sends CUDA tensors
        // to the kernels, which replay Philox or read the U8 mask.
        Backend::Cuda(n) => return Err(not_on_cuda("dropout", n)),
        Backend::Cpu => {}
    }
    let data = x.storage().cpu()?;
    fn go<T: FloatDType>(
        s: &[T],
        l: &Layout,
        scale: f64,
        keep: &(impl Fn(usize) -> bool + Sync),
    ) -> Result<CpuData> {
        let src = Source::new(s, l)?;
        let scale = <T as WithDType>::from_f64(scale);
        Ok(T::wrap(fill(l.numel(), |i| {
            if keep(i) {
                src.get(i) * scale
            } else {
                T::zero()
            }
        })?))
    }
    let out = crate::match_float_data!(&*data, "dropout", v => go(v, x.layout(), scale, &keep)?);
    drop(data);
    Tensor::from_cpu_data(out, x.shape())
}

/// Forward (and lean backward): elements kept by `draw` scaled by
/// `1/(1-p)`, the others zero.
pub(super) fn apply(x: &Tensor, draw: DropoutDraw) -> Result<Tensor> {
    masked_scale(x, draw.scale(), |i| draw.keep(i))
}

/// [`apply`] written over `x` (exclusive and contiguous: the caller
/// checked), the same values.
pub(super) fn apply_in_place(x: &Tensor, draw: DropoutDraw) -> Result<()> {
    struct Draw(DropoutDraw);
    impl IndexedAssign for Draw {
        fn chunk<T: FloatDType>(&self, start: usize, d: &mut [T]) {
            let scale = <T as WithDType>::from_f64(self.0.scale());
            for (i, v) in d.iter_mut().enumerate() {
                *v = if self.0.keep(start + i) {
                    *v * scale
                } else {
                    T::zero()
                };
            }
        }
    }
    assign_indexed(x, "dropout", &Draw(draw))
}

/// The keep-mask of `draw` over a tensor of `shape` as a U8 tensor on
/// `device` (1 = kept).
pub(super) fn mask(shape: &[usize], draw: DropoutDraw, device: Device) -> Result<Tensor> {
    match backend_of("dropout", device)? {
        Backend::Meta => meta::empty(shape, DType::U8),
        Backend::Cuda(n) => Err(not_on_cuda("dropout", n)),
        Backend::Cpu => {
            let n = crate::tensor::checked_numel("dropout", shape)?;
            Tensor::from_vec(fill(n, |i| u8::from(draw.keep(i)))?, shape, device)
        }
    }
}

/// Backward from a stored byte mask: `g · scale` where the mask is set.
pub(super) fn apply_mask(g: &Tensor, mask: &Tensor, scale: f64) -> Result<Tensor> {
    match backend("dropout", &[g, mask])? {
        Backend::Meta => return masked_scale(g, scale, |_| true),
        Backend::Cuda(n) => return Err(not_on_cuda("dropout", n)),
        Backend::Cpu => {}
    }
    let data = mask.storage().cpu()?;
    match data.as_slice::<u8>() {
        Some(bytes) if bytes.len() >= g.numel() => masked_scale(g, scale, |i| bytes[i] != 0),
        _ => Err(Error::Backward(
            "dropout: the saved mask does not match the gradient".into(),
        )),
    }
}
