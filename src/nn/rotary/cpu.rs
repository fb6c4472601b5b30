//! The rotary embedding on the CPU: the `[len, D/2]` cos/sin table once per
//! call (Hugging Face's f32 angles), then every row rotated in parallel,
//! read through the operand's strides and written contiguously.

use super::RotaryGeom;
use crate::memory::host::{try_collect, try_for_overwrite};
use crate::{FloatDType, Result, Tensor};
use rayon::prelude::*;

/// Rows per parallel task: small rows (a tiny head) would otherwise cost
/// more in scheduling than in arithmetic.
const ROWS_PER_TASK: usize = 64;

/// Hugging Face's angle `p · inv_freq[i]` in f32, with `inv_freq[i] =
/// 1 / base^(2i/D)` (the exponent an f32 division, the power rounded to
/// f32), and its cos and sin rounded to f32. `rotary.cu`'s `lg_rope_angle`
/// computes the same steps.
pub(crate) fn cos_sin(position: i64, i: usize, dim: i64, theta: f64) -> (f32, f32) {
    let exponent = (2 * i) as f32 / dim as f32;
    let power = theta.powf(exponent as f64) as f32;
    let inv_freq = 1.0f32 / power;
    let angle = (position as f32 * inv_freq) as f64;
    (angle.cos() as f32, angle.sin() as f32)
}

/// The `[len, half]` table of (cos, ±sin) for `g`'s positions, the sine
/// negated (exactly) for backward's inverse rotation.
fn table(g: &RotaryGeom) -> Result<Vec<(f32, f32)>> {
    let (len, half) = (g.len as usize, g.half());
    let sign = g.sin_sign as f32;
    try_collect(
        len * half,
        (0..len * half).map(|k| {
            let (c, s) = cos_sin(g.start + (k / half) as i64, k % half, g.dim, g.theta);
            (c, sign * s)
        }),
    )
}

/// One row: `out[i] = x[i]·c − x[i+h]·s`, `out[i+h] = x[i+h]·c + x[i]·s`
/// (`s` already carries the direction's sign), each product and sum
/// rounded to `T` as PyTorch's composition rounds them.
fn rotate_row<T: FloatDType>(
    src: &[T],
    at: usize,
    col: usize,
    angles: &[(f32, f32)],
    out: &mut [T],
) {
    let half = angles.len();
    for (i, &(c, s)) in angles.iter().enumerate() {
        let (c, s) = (T::from_f32(c), T::from_f32(s));
        let lo = src[at + i * col];
        let hi = src[at + (i + half) * col];
        out[i] = lo * c - hi * s;
        out[i + half] = hi * c + lo * s;
    }
}

/// `src` (the operand's storage, read through `g.x`) rotated into a new
/// contiguous buffer of `g.numel()` elements.
fn rotate_data<T: FloatDType + bytemuck::Zeroable>(src: &[T], g: &RotaryGeom) -> Result<Vec<T>> {
    let angles = table(g)?;
    let (dim, half, len) = (g.dim as usize, g.half(), g.len as usize);
    let heads = g.heads as usize;
    let mut out = try_for_overwrite::<T>(g.numel())?;
    let v = g.x;
    out.par_chunks_mut(dim * ROWS_PER_TASK)
        .enumerate()
        .for_each(|(task, rows)| {
            for (k, row) in rows.chunks_mut(dim).enumerate() {
                let r = task * ROWS_PER_TASK + k;
                let (bh, l) = (r / len, r % len);
                let (b, h) = (bh / heads, bh % heads);
                let at = v.offset + b as i64 * v.batch + h as i64 * v.head + l as i64 * v.row;
                let table = &angles[l * half..(l + 1) * half];
                rotate_row(src, at as usize, v.col as usize, table, row);
            }
        });
    Ok(out)
}

/// [`super::rotate`] on the CPU: `t` rotated by `g` into a new contiguous
/// tensor of `t`'s shape.
pub(super) fn rotate(t: &Tensor, g: &RotaryGeom) -> Result<Tensor> {
    let data = t.storage().cpu()?;
    let out = crate::match_float_data!(&*data, super::OP, v => {
        fn wrap<T: FloatDType + bytemuck::Zeroable>(v: &[T], g: &RotaryGeom) -> Result<crate::dtype::CpuData> {
            Ok(T::wrap(rotate_data(v, g)?))
        }
        wrap(v, g)?
    });
    drop(data);
    Tensor::from_cpu_data(out, t.shape())
}
