//! The mask kernels on the CPU (and their meta forms): packing a float
//! tensor's test into bits, and the masked gradient read back from them.

use crate::dtype::CpuData;
use crate::memory::host::{try_collect, try_filled, try_par_collect, try_vec};
use crate::meta::{self, backend, not_on_cuda, Backend};
use crate::primitives::{
    assign_indexed, get_bit, mask_words, pack_bits, parallel, widest_vectors, IndexedAssign,
};
use crate::tensor::{Layout, Tensor};
use crate::{DType, Error, FloatDType, Result, WithDType};
use rayon::prelude::*;

/// A U32 tensor of `ceil(n/32)` words with bit `i` set where `keep` holds
/// for element `i` of the float tensor `x` (any layout, row-major order).
pub(super) fn mask_where(
    x: &Tensor,
    op: &'static str,
    keep: impl Fn(f64) -> bool + Sync,
) -> Result<Tensor> {
    match backend(op, &[x])? {
        Backend::Meta => {
            meta::float(op, x.dtype())?;
            return meta::empty(&[mask_words(x.numel())], DType::U32);
        }
        // A host predicate has no device form: the rules that run on CUDA
        // (`x > 0`, clamp's `lo <= x <= hi`) have their own kernels, chosen
        // in the seam.
        Backend::Cuda(n) => return Err(not_on_cuda(op, n)),
        Backend::Cpu => {}
    }
    let data = x.storage().cpu()?;
    fn go<T: FloatDType>(
        s: &[T],
        l: &Layout,
        keep: &(impl Fn(f64) -> bool + Sync),
    ) -> Result<Vec<u32>> {
        match l.contiguous_range() {
            Some(r) => {
                let s = &s[r];
                let mut words: Vec<u32> = try_filled(mask_words(s.len()), 0)?;
                // Chunks of whole words, so each task owns its words.
                const WORDS: usize = 512;
                if parallel(s.len()) {
                    words
                        .par_chunks_mut(WORDS)
                        .zip(s.par_chunks(WORDS * 32))
                        .for_each(|(w, s)| dense_words(s, w, keep));
                } else {
                    dense_words(s, &mut words, keep);
                }
                Ok(words)
            }
            None => {
                let o = l.offsets()?;
                pack_bits(o.len(), |i| keep(s[o[i]].to_f64()))
            }
        }
    }
    let words = crate::match_float_data!(&*data, op, v => go(v, x.layout(), &keep)?);
    drop(data);
    let n = words.len();
    Tensor::from_vec(words, &[n], x.device())
}

widest_vectors! {
    /// Word by word over a dense slice: 32 tests folded into one u32 (bit
    /// `j` of word `w` for element `32·w + j`), in the widest vector form
    /// the CPU runs (the tests are exact comparisons, so every width gives
    /// the same bits).
    fn dense_words<T: FloatDType, K: Fn(f64) -> bool>(s: &[T], words: &mut [u32], keep: &K)
        => dense_words_with
}

#[inline(always)]
fn dense_words_with<T: FloatDType, K: Fn(f64) -> bool>(s: &[T], words: &mut [u32], keep: &K) {
    let test = |v: T| u32::from(keep(WithDType::to_f64(v)));
    for (w, c) in words.iter_mut().zip(s.chunks(32)) {
        *w = match <&[T; 32]>::try_from(c) {
            Ok(c) => (0..32).fold(0u32, |acc, j| acc | (test(c[j]) << j)),
            Err(_) => c
                .iter()
                .enumerate()
                .fold(0, |acc, (j, &v)| acc | (test(v) << j)),
        };
    }
}

/// The words of `mask`, checked to cover `n` elements.
fn mask_words_of<'a>(words: Option<&'a [u32]>, mask: &Tensor, n: usize) -> Result<&'a [u32]> {
    let words = words.ok_or(Error::DTypeMismatch {
        op: "mask_scale",
        expected: DType::U32,
        got: mask.dtype(),
    })?;
    if words.len() < mask_words(n) {
        return Err(Error::InvalidArgument {
            op: "mask_scale",
            msg: format!("mask of {} words cannot cover {n} elements", words.len()),
        });
    }
    Ok(words)
}

/// `v` where `bit` is set, else `v * slope` (exactly 0 when `slope` is 0).
#[inline(always)]
fn masked<T: FloatDType>(bit: bool, v: T, slope: T) -> T {
    if bit {
        v
    } else if slope == T::zero() {
        T::zero()
    } else {
        v * slope
    }
}

/// [`mask_scale`] written over `g` (exclusive and contiguous: the caller
/// checked), bit for bit the same values.
pub(super) fn mask_scale_in_place(g: &Tensor, mask: &Tensor, slope: f64) -> Result<()> {
    struct Scale<'a> {
        words: &'a [u32],
        slope: f64,
    }
    impl IndexedAssign for Scale<'_> {
        fn chunk<T: FloatDType>(&self, start: usize, d: &mut [T]) {
            let slope = <T as WithDType>::from_f64(self.slope);
            if !start.is_multiple_of(32) {
                for (i, v) in d.iter_mut().enumerate() {
                    *v = masked(get_bit(self.words, start + i), *v, slope);
                }
                return;
            }
            // Word by word: a full word leaves its 32 elements as they are,
            // and the rest is a branch-free select per element.
            let words = &self.words[start / 32..];
            for (d, &w) in d.chunks_mut(32).zip(words) {
                if w == u32::MAX {
                    continue;
                }
                if slope == T::zero() {
                    for (j, v) in d.iter_mut().enumerate() {
                        *v = if (w >> j) & 1 == 1 { *v } else { T::zero() };
                    }
                } else {
                    for (j, v) in d.iter_mut().enumerate() {
                        *v = masked((w >> j) & 1 == 1, *v, slope);
                    }
                }
            }
        }
    }
    if g.device().is_meta() {
        return assign_indexed(g, "mask_scale", &Scale { words: &[], slope });
    }
    let mdata = mask.storage().cpu()?;
    let words = mask_words_of(mdata.as_slice::<u32>(), mask, g.numel())?;
    assign_indexed(g, "mask_scale", &Scale { words, slope })
}

/// `g` where the mask bit is set and `g * slope` elsewhere (exactly 0 when
/// `slope` is 0); `g` may have any layout.
pub(super) fn mask_scale(g: &Tensor, mask: &Tensor, slope: f64) -> Result<Tensor> {
    let n = g.numel();
    match backend("mask_scale", &[g, mask])? {
        Backend::Meta => {
            meta::float("mask_scale", g.dtype())?;
            return meta::empty(g.shape(), g.dtype());
        }
        Backend::Cuda(d) => return Err(not_on_cuda("mask_scale", d)),
        Backend::Cpu => {}
    }
    let mdata = mask.storage().cpu()?;
    let words = mask_words_of(mdata.as_slice::<u32>(), mask, n)?;
    let gdata = g.storage().cpu()?;
    fn go<T: FloatDType>(s: &[T], l: &Layout, words: &[u32], slope: f64) -> Result<CpuData> {
        let slope = <T as WithDType>::from_f64(slope);
        let f = |bit: bool, v: T| masked(bit, v, slope);
        let out: Vec<T> = match l.contiguous_range() {
            Some(r) if parallel(r.len()) => try_par_collect(
                r.len(),
                s[r].par_iter()
                    .enumerate()
                    .map(|(i, &v)| f(get_bit(words, i), v)),
            )?,
            Some(r) => try_collect(
                r.len(),
                s[r].iter()
                    .enumerate()
                    .map(|(i, &v)| f(get_bit(words, i), v)),
            )?,
            None => {
                let mut out = try_vec(l.numel())?;
                let mut i = 0;
                l.for_each_offset(|o| {
                    out.push(f(get_bit(words, i), s[o]));
                    i += 1;
                });
                out
            }
        };
        Ok(T::wrap(out))
    }
    let out =
        crate::match_float_data!(&*gdata, "mask_scale", v => go(v, g.layout(), words, slope)?);
    drop((gdata, mdata));
    Tensor::from_cpu_data(out, g.shape())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    /// The packed words of a dense tensor hold, bit for bit, the test of
    /// each element: lengths around a word, a parallel chunk and the
    /// parallel threshold, every float dtype, ±0, NaN and ±∞ included.
    #[test]
    fn dense_words_hold_each_elements_test() -> Result<()> {
        let lengths = [0, 1, 31, 32, 33, 1000, 16_384 * 3 + 45, 200_001];
        for &n in &lengths {
            let v: Vec<f64> = (0..n)
                .map(|i| match i % 11 {
                    0 => 0.0,
                    1 => -0.0,
                    2 => f64::NAN,
                    3 => f64::INFINITY,
                    4 => f64::NEG_INFINITY,
                    k => (k as f64 - 7.5) * (1.0 + i as f64 * 1e-3),
                })
                .collect();
            for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
                let x = Tensor::from_vec(v.clone(), &[n], Device::Cpu)?.to_dtype(dtype)?;
                let words = mask_where(&x, "test", |v| v > 0.0)?.to_vec::<u32>()?;
                assert_eq!(words.len(), mask_words(n));
                for (i, &e) in x.to_f64_vec()?.iter().enumerate() {
                    assert_eq!(get_bit(&words, i), e > 0.0, "n {n}, {dtype:?}, element {i}");
                }
                // Bits past the end stay clear.
                for i in n..words.len() * 32 {
                    assert!(!get_bit(&words, i), "n {n}, {dtype:?}, padding bit {i}");
                }
            }
        }
        Ok(())
    }
}
