//! Dropout kernels. The keep-mask is never stored by the lean path: element
//! `i` is kept iff `rng::dropout_keep(seed, offset, i, p)`, which forward and
//! backward evaluate alike (any layout in, row-major element order).

use super::elementwise::{fill, Source};
use crate::dtype::CpuData;
use crate::meta::{self, backend, Backend};
use crate::rng::dropout_keep;
use crate::tensor::{Layout, Tensor};
use crate::{DType, Device, Error, FloatDType, Result, WithDType};

/// The (seed, offset) of a dropout draw and its drop probability.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct DropoutDraw {
    pub seed: u64,
    pub offset: u64,
    pub p: f64,
}

impl DropoutDraw {
    /// Whether element `i` is kept.
    #[inline(always)]
    pub fn keep(&self, i: usize) -> bool {
        dropout_keep(self.seed, self.offset, i as u64, self.p)
    }

    /// The factor kept elements are scaled by: `1/(1-p)` (0 for `p = 1`,
    /// where nothing is kept).
    pub fn scale(&self) -> f64 {
        if self.p >= 1.0 {
            0.0
        } else {
            1.0 / (1.0 - self.p)
        }
    }
}

/// `v · scale` where `keep(i)`, else 0, for every element of the float
/// tensor `x` (any layout), as a new contiguous tensor.
fn masked_scale(x: &Tensor, scale: f64, keep: impl Fn(usize) -> bool + Sync) -> Result<Tensor> {
    match backend("dropout", &[x])? {
        Backend::Meta => {
            meta::float("dropout", x.dtype())?;
            return meta::empty(x.shape(), x.dtype());
        }
        // A host keep rule has no device form: on CUDA, `dropout_apply`
        // replays Philox and `dropout_apply_mask` selects by the U8 mask on
        // the device before reaching here.
        Backend::Cuda(n) => return Err(crate::meta::not_on_cuda("dropout", n)),
        Backend::Cpu => {}
    }
    let data = x.storage().cpu()?;
    fn go<T: FloatDType>(
        s: &[T],
        l: &Layout,
        scale: f64,
        keep: &(impl Fn(usize) -> bool + Sync),
    ) -> CpuData {
        let src = Source::new(s, l);
        let scale = <T as WithDType>::from_f64(scale);
        T::wrap(fill(l.numel(), |i| {
            if keep(i) {
                src.get(i) * scale
            } else {
                T::zero()
            }
        }))
    }
    let out = crate::match_float_data!(&*data, "dropout", v => go(v, x.layout(), scale, &keep));
    drop(data);
    Tensor::from_cpu_data(out, x.shape())
}

/// Forward (and lean backward): elements kept by `draw` scaled by
/// `1/(1-p)`, the others zero.
pub(crate) fn dropout_apply(x: &Tensor, draw: DropoutDraw) -> Result<Tensor> {
    if let Backend::Cuda(_) = backend("dropout", &[x])? {
        // The same keep rule, replayed from Philox on the device.
        let (seed, offset, p, scale) = (draw.seed, draw.offset, draw.p, draw.scale());
        return crate::tensor::cuda::map(x, x.shape(), |b, l| {
            crate::cuda::layers_mask::dropout_forward(b, l, seed, offset, p, scale)
        });
    }
    masked_scale(x, draw.scale(), |i| draw.keep(i))
}

/// The keep-mask of `draw` over a tensor of `shape` as a U8 tensor on
/// `device` (1 = kept): what PyTorch keeps for backward.
pub(crate) fn dropout_mask(shape: &[usize], draw: DropoutDraw, device: Device) -> Result<Tensor> {
    match meta::backend_of("dropout", device)? {
        Backend::Meta => meta::empty(shape, DType::U8),
        Backend::Cuda(n) => {
            let dev = crate::tensor::cuda::device(n)?;
            let n = shape.iter().product();
            let mask = crate::cuda::random::dropout_mask(&dev, draw.seed, draw.offset, draw.p, n)?;
            crate::tensor::cuda::wrap(mask, shape)
        }
        Backend::Cpu => {
            let n = shape.iter().product();
            Tensor::from_vec(fill(n, |i| u8::from(draw.keep(i))), shape, device)
        }
    }
}

/// The CUDA form of [`dropout_apply_mask`]: `mask ? g · scale : +0` in one
/// kernel (the product rounded in `g`'s dtype, as on the CPU), so the only
/// buffer it allocates is the gradient, as the CPU's.
fn cuda_apply_mask(g: &Tensor, mask: &Tensor, scale: f64) -> Result<Tensor> {
    use crate::tensor::cuda::strided;
    if mask.dtype() != DType::U8 || mask.shape() != g.shape() {
        return Err(Error::Backward(
            "dropout: the saved mask does not match the gradient".into(),
        ));
    }
    let lm = strided(mask.layout())?;
    let m = mask.storage().cuda()?;
    crate::tensor::cuda::map(g, g.shape(), |b, l| {
        crate::cuda::layers_mask::dropout_byte_masked(b, l, &m, &lm, scale)
    })
}

/// Backward from a stored byte mask (a U8 tensor made by [`dropout_mask`]):
/// `g · scale` where the mask is set.
pub(crate) fn dropout_apply_mask(g: &Tensor, mask: &Tensor, scale: f64) -> Result<Tensor> {
    match backend("dropout", &[g, mask])? {
        Backend::Meta => return masked_scale(g, scale, |_| true),
        Backend::Cuda(_) => return cuda_apply_mask(g, mask, scale),
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
