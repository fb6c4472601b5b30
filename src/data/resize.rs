//! Bilinear resizing with antialiasing, computed as PyTorch's
//! `interpolate(mode="bilinear", antialias=True, align_corners=False)` (what
//! torchvision's `Resize` runs on float tensors): a separable filter, the
//! width first and then the height, each axis skipped when its size does not
//! change.
//!
//! Along one axis of `in` samples resized to `out`, with `scale = in / out`:
//! output `i` is centred at `scale·(i + 0.5)` in input coordinates; the
//! triangle filter is stretched by `scale` when shrinking (so every input
//! sample under the output pixel contributes: the antialiasing) and has
//! radius 1 when enlarging; the weights of the inputs inside the support
//! are `max(0, 1 − |x − centre + 0.5|/stretch)`, normalised to sum to 1,
//! so the edges renormalise rather than clamp. The arithmetic follows the
//! reference's f32/f64 mix step by step so that results agree to rounding.

use super::plan::f32_bytes;
use crate::memory::host::{checked_count, try_for_overwrite, try_vec, try_zeroed};
use crate::{DType, Error, Result, Tensor};

/// The filter taps of one axis: for output `i`, inputs `first[i] ..` with
/// `weights[i * taps ..][.. count[i]]`.
struct AxisTaps {
    first: Vec<usize>,
    count: Vec<usize>,
    weights: Vec<f32>,
    taps: usize,
}

fn triangle(x: f32) -> f32 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

/// Taps per output of an axis of `in_size` resized to `out_size`: the
/// stretched triangle's support on both sides and the centre.
fn taps_per_output(in_size: usize, out_size: usize) -> usize {
    let scale = in_size as f32 / out_size as f32;
    let support = if scale >= 1.0 { scale } else { 1.0 };
    (support.ceil() as usize)
        .saturating_mul(2)
        .saturating_add(1)
}

/// Bytes of an axis's taps (saturating).
fn taps_bytes(in_size: usize, out_size: usize) -> usize {
    let per_output = taps_per_output(in_size, out_size).saturating_mul(4);
    out_size.saturating_mul(per_output.saturating_add(16))
}

fn axis_taps(in_size: usize, out_size: usize) -> Result<AxisTaps> {
    let scale = in_size as f32 / out_size as f32;
    // The triangle's radius is 1 input sample, stretched when shrinking.
    let support = if scale >= 1.0 { scale } else { 1.0 };
    let inv_scale = if scale >= 1.0 {
        (1.0 / scale as f64) as f32
    } else {
        1.0
    };
    let taps = taps_per_output(in_size, out_size);
    let mut first = try_vec(out_size)?;
    let mut count = try_vec(out_size)?;
    let mut weights = try_zeroed::<f32>(checked_count(&[out_size, taps])?)?;
    for i in 0..out_size {
        let center = (scale as f64 * (i as f64 + 0.5)) as f32;
        // Truncation toward zero, then clipped to the axis.
        let lo = ((center as f64 - support as f64 + 0.5) as i64).max(0);
        let hi = ((center as f64 + support as f64 + 0.5) as i64).min(in_size as i64);
        let n = (hi - lo).clamp(0, taps as i64) as usize;
        let w = &mut weights[i * taps..i * taps + n];
        let mut total = 0f32;
        for (j, wj) in w.iter_mut().enumerate() {
            let offset = ((j as i64 + lo) as f32 - center) as f64 + 0.5;
            *wj = triangle((offset * inv_scale as f64) as f32);
            total += *wj;
        }
        if total != 0.0 {
            w.iter_mut().for_each(|wj| *wj /= total);
        }
        first.push(lo as usize);
        count.push(n);
    }
    Ok(AxisTaps {
        first,
        count,
        weights,
        taps,
    })
}

/// Resamples `planes` planes of `rows × in_len` samples along the contiguous
/// axis (`stride` 1) or of `in_len × cols` along the rows (`stride` = row
/// length): the one loop both passes share.
fn resample(
    src: &[f32],
    planes: usize,
    in_len: usize,
    out_len: usize,
    lines: usize,
    along_rows: bool,
) -> Result<Vec<f32>> {
    let taps = axis_taps(in_len, out_len)?;
    // Every output sample is written below.
    let mut dst = try_for_overwrite::<f32>(checked_count(&[planes, lines, out_len])?)?;
    for p in 0..planes {
        let s = &src[p * lines * in_len..(p + 1) * lines * in_len];
        let d = &mut dst[p * lines * out_len..(p + 1) * lines * out_len];
        for line in 0..lines {
            for o in 0..out_len {
                let w = &taps.weights[o * taps.taps..o * taps.taps + taps.count[o]];
                // Input sample `k` of this line is `s[offset + k * step]`.
                let (offset, step, slot) = if along_rows {
                    (line, lines, o * lines + line)
                } else {
                    (line * in_len, 1, line * out_len + o)
                };
                let base = offset + taps.first[o] * step;
                // The first product, then the rest added in order.
                let mut acc = match w.first() {
                    Some(&w0) => s[base] * w0,
                    None => 0.0,
                };
                for (j, &wj) in w.iter().enumerate().skip(1) {
                    acc += s[base + j * step] * wj;
                }
                d[slot] = acc;
            }
        }
    }
    Ok(dst)
}

/// `planes` planes of `h × w` f32 samples resized to `out_h × out_w`.
pub(crate) fn resize_planes(
    src: Vec<f32>,
    planes: usize,
    (h, w): (usize, usize),
    (out_h, out_w): (usize, usize),
) -> Result<Vec<f32>> {
    let mut data = src;
    if out_w != w {
        data = resample(&data, planes, w, out_w, h, false)?;
    }
    if out_h != h {
        data = resample(&data, planes, h, out_h, out_w, true)?;
    }
    Ok(data)
}

/// The most host bytes [`resize`] holds at once for an f32 image of
/// `shape` resized to `height × width`: the input, its copy, the
/// width pass, the height pass and the taps (saturating).
pub(crate) fn resize_plan(shape: &[usize], height: usize, width: usize) -> usize {
    let rank = shape.len();
    let (h, w) = (shape[rank - 2], shape[rank - 1]);
    let planes = &shape[..rank - 2];
    let wide = f32_bytes(&[planes, &[h, width]].concat());
    let out = f32_bytes(&[planes, &[height, width]].concat());
    f32_bytes(shape)
        .saturating_mul(2)
        .saturating_add(wide)
        .saturating_add(out)
        .saturating_add(taps_bytes(w, width))
        .saturating_add(taps_bytes(h, height))
}

/// Resizes the last two axes of a `[C, H, W]` or `[N, C, H, W]` f32 tensor
/// to `height × width` with antialiased bilinear filtering (torchvision's
/// `resize(..., antialias=True)` on tensors). The result is a new tensor on
/// the input's device (computed on the host). Not recorded by autograd.
pub fn resize(image: &Tensor, height: usize, width: usize) -> Result<Tensor> {
    let shape = image.shape().to_vec();
    if !(3..=4).contains(&shape.len()) {
        return Err(Error::InvalidArgument {
            op: "resize",
            msg: format!("expected a [C, H, W] or [N, C, H, W] image, got shape {shape:?}"),
        });
    }
    if image.dtype() != DType::F32 {
        return Err(Error::DTypeMismatch {
            op: "resize",
            expected: DType::F32,
            got: image.dtype(),
        });
    }
    let (h, w) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    if height == 0 || width == 0 || h == 0 || w == 0 {
        return Err(Error::InvalidArgument {
            op: "resize",
            msg: format!("cannot resize {h}×{w} to {height}×{width}"),
        });
    }
    let planes = checked_count(&shape[..shape.len() - 2])?;
    // Output sizes from an argument are checked before anything is read.
    checked_count(&[planes, height, width, 4])?;
    let src = image.to_vec::<f32>()?;
    let out = resize_planes(src, planes, (h, w), (height, width))?;
    let mut out_shape = shape;
    let rank = out_shape.len();
    out_shape[rank - 2] = height;
    out_shape[rank - 1] = width;
    Tensor::from_vec(out, &out_shape, image.device())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halving_averages_pairs() {
        // Shrinking by 2 stretches the triangle to radius 2 around centres
        // 1.0 and 3.0: inputs 0, 1, 2 weigh 0.75, 0.75, 0.25 for the first
        // output (input 3 is outside the support), renormalised by 1.75.
        let out = resize_planes(vec![0.0, 8.0, 16.0, 24.0], 1, (1, 4), (1, 2)).unwrap();
        let left = (0.0 * 0.75 + 8.0 * 0.75 + 16.0 * 0.25) / 1.75;
        let right = (8.0 * 0.25 + 16.0 * 0.75 + 24.0 * 0.75) / 1.75;
        assert!((out[0] - left).abs() < 1e-5, "{out:?}");
        assert!((out[1] - right).abs() < 1e-5, "{out:?}");
    }

    #[test]
    fn same_size_is_identity() {
        let src: Vec<f32> = (0..12).map(|v| v as f32).collect();
        assert_eq!(resize_planes(src.clone(), 1, (3, 4), (3, 4)).unwrap(), src);
    }
}
