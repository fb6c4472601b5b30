//! 1-bit packed masks: what relu-like ops save for backward instead of a
//! whole input or output. Bit `i % 32` of word `i / 32` is element `i`.

use super::PARALLEL_THRESHOLD;
use crate::dtype::CpuData;
use crate::tensor::{Layout, Tensor};
use crate::{Error, FloatDType, Result, WithDType};
use rayon::prelude::*;

/// Number of u32 words holding `n` bits.
pub fn mask_words(n: usize) -> usize {
    n.div_ceil(32)
}

/// Packs `n` bits, bit `i` being `bit(i)`.
pub fn pack_bits(n: usize, bit: impl Fn(usize) -> bool + Sync) -> Vec<u32> {
    let word = |w: usize| {
        let start = w * 32;
        (start..n.min(start + 32)).fold(0u32, |acc, i| acc | (u32::from(bit(i)) << (i - start)))
    };
    let words = mask_words(n);
    if n >= PARALLEL_THRESHOLD {
        (0..words).into_par_iter().map(word).collect()
    } else {
        (0..words).map(word).collect()
    }
}

/// Bit `i` of a packed mask.
#[inline(always)]
pub fn get_bit(words: &[u32], i: usize) -> bool {
    (words[i / 32] >> (i % 32)) & 1 == 1
}

/// All `n` bits of a packed mask, unpacked.
pub fn unpack_bits(words: &[u32], n: usize) -> Vec<bool> {
    (0..n).map(|i| get_bit(words, i)).collect()
}

/// A U32 tensor of `ceil(n/32)` words with bit `i` set where element `i`
/// of the float tensor `x` (any layout, row-major order) is `> 0`.
pub fn positive_mask(x: &Tensor) -> Result<Tensor> {
    positive_mask_for(x, "positive_mask")
}

/// [`positive_mask`] under the name of the op that keeps it (relu,
/// leaky_relu): the one mask rule with a CUDA kernel.
pub(crate) fn positive_mask_for(x: &Tensor, op: &'static str) -> Result<Tensor> {
    if let crate::meta::Backend::Cuda(_) = crate::meta::backend(op, &[x])? {
        let words = mask_words(x.numel());
        return crate::tensor::cuda::map(x, &[words], crate::cuda::layers_mask::positive_mask);
    }
    mask_where(x, op, |v| v > 0.0)
}

/// A U32 tensor of `ceil(n/32)` words with bit `i` set where `keep` holds
/// for element `i` of the float tensor `x` (any layout, row-major order).
/// Every float dtype converts to f64 exactly, so the test is exact.
pub fn mask_where(
    x: &Tensor,
    op: &'static str,
    keep: impl Fn(f64) -> bool + Sync,
) -> Result<Tensor> {
    match crate::meta::backend(op, &[x])? {
        crate::meta::Backend::Meta => {
            crate::meta::float(op, x.dtype())?;
            return crate::meta::empty(&[mask_words(x.numel())], crate::DType::U32);
        }
        // A host predicate has no device form: the rules that run on CUDA
        // (`x > 0`, clamp's `lo <= x <= hi`) dispatch to their kernels
        // before reaching here (`positive_mask_for`, `ops::mask`).
        crate::meta::Backend::Cuda(n) => return Err(crate::meta::not_on_cuda(op, n)),
        crate::meta::Backend::Cpu => {}
    }
    let data = x.storage().cpu()?;
    fn go<T: FloatDType>(s: &[T], l: &Layout, keep: &(impl Fn(f64) -> bool + Sync)) -> Vec<u32> {
        match l.contiguous_range() {
            Some(r) => {
                let s = &s[r];
                pack_bits(s.len(), |i| keep(s[i].to_f64()))
            }
            None => {
                let o = l.offsets();
                pack_bits(o.len(), |i| keep(s[o[i]].to_f64()))
            }
        }
    }
    let words = crate::match_float_data!(&*data, op, v => go(v, x.layout(), &keep));
    drop(data);
    let n = words.len();
    Tensor::from_vec(words, &[n], x.device())
}

/// `g` where the mask bit is set and `g * slope` elsewhere (exactly 0 when
/// `slope` is 0): the backward of relu and leaky_relu. `g` may have any layout.
pub fn mask_scale(g: &Tensor, mask: &Tensor, slope: f64) -> Result<Tensor> {
    let n = g.numel();
    match crate::meta::backend("mask_scale", &[g, mask])? {
        crate::meta::Backend::Meta => {
            crate::meta::float("mask_scale", g.dtype())?;
            return crate::meta::empty(g.shape(), g.dtype());
        }
        crate::meta::Backend::Cuda(_) => {
            let mask = crate::tensor::cuda::dense(mask)?;
            return crate::tensor::cuda::map(g, g.shape(), |b, l| {
                crate::cuda::layers_mask::relu_mask_backward(b, l, &*mask.storage().cuda()?, slope)
            });
        }
        crate::meta::Backend::Cpu => {}
    }
    let mdata = mask.storage().cpu()?;
    let words = mdata.as_slice::<u32>().ok_or(Error::DTypeMismatch {
        op: "mask_scale",
        expected: crate::DType::U32,
        got: mask.dtype(),
    })?;
    if words.len() < mask_words(n) {
        return Err(Error::InvalidArgument {
            op: "mask_scale",
            msg: format!("mask of {} words cannot cover {n} elements", words.len()),
        });
    }
    let gdata = g.storage().cpu()?;
    fn go<T: FloatDType>(s: &[T], l: &Layout, words: &[u32], slope: f64) -> CpuData {
        let slope = <T as WithDType>::from_f64(slope);
        let zero = T::zero();
        let f = |bit: bool, v: T| {
            if bit {
                v
            } else if slope == zero {
                zero
            } else {
                v * slope
            }
        };
        let out: Vec<T> = match l.contiguous_range() {
            Some(r) if r.len() >= PARALLEL_THRESHOLD => s[r]
                .par_iter()
                .enumerate()
                .map(|(i, &v)| f(get_bit(words, i), v))
                .collect(),
            Some(r) => s[r]
                .iter()
                .enumerate()
                .map(|(i, &v)| f(get_bit(words, i), v))
                .collect(),
            None => {
                let mut out = Vec::with_capacity(l.numel());
                let mut i = 0;
                l.for_each_offset(|o| {
                    out.push(f(get_bit(words, i), s[o]));
                    i += 1;
                });
                out
            }
        };
        T::wrap(out)
    }
    let out = crate::match_float_data!(&*gdata, "mask_scale", v => go(v, g.layout(), words, slope));
    drop((gdata, mdata));
    Tensor::from_cpu_data(out, g.shape())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_counts() {
        for (n, w) in [
            (0, 0),
            (1, 1),
            (31, 1),
            (32, 1),
            (33, 2),
            (64, 2),
            (1000, 32),
        ] {
            assert_eq!(mask_words(n), w, "n = {n}");
            assert_eq!(pack_bits(n, |_| true).len(), w);
        }
    }

    #[test]
    fn pack_layout_and_round_trip() {
        assert_eq!(pack_bits(3, |i| i != 1), vec![0b101]);
        assert_eq!(pack_bits(32, |_| true), vec![u32::MAX]);
        assert_eq!(pack_bits(33, |i| i == 32), vec![0, 1]);
        for n in [1, 31, 32, 33, 1000, PARALLEL_THRESHOLD + 7] {
            let bits: Vec<bool> = (0..n).map(|i| (i * 7 + i / 3) % 5 < 2).collect();
            let words = pack_bits(n, |i| bits[i]);
            assert_eq!(unpack_bits(&words, n), bits, "n = {n}");
            // Unused high bits of the last word stay clear.
            if n % 32 != 0 {
                assert_eq!(words[words.len() - 1] >> (n % 32), 0);
            }
        }
    }

    #[test]
    fn mask_of_strided_tensor() {
        let x =
            Tensor::from_vec(vec![1.0f32, -1.0, 0.0, 2.0], &[2, 2], crate::Device::Cpu).unwrap();
        let xt = x.view_with_layout(x.layout().permute(&[1, 0]).unwrap());
        // Transposed order: 1, 0, -1, 2.
        let m = positive_mask(&xt).unwrap();
        assert_eq!(m.to_vec::<u32>().unwrap(), vec![0b1001]);
        let g = mask_scale(&xt, &m, 0.5).unwrap();
        assert_eq!(g.to_vec::<f32>().unwrap(), vec![1.0, 0.0, -0.5, 2.0]);
    }
}
