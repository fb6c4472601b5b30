//! The CPU kernels of the convolutions (and their meta forms): im2col /
//! col2im around the gemm kernel. Reached through the seam in `mod.rs`.
//!
//! Every convolution here is a 2-d one over `[n, c, h, w]` (1-d convolutions
//! use a unit height). For each batch item the input is unfolded into a
//! column buffer `[groups, cin/groups·kh·kw, oh·ow]` (a Workspace tensor,
//! dropped before returning), and one batched product over the groups does
//! the rest:
//!
//! - forward: `y_i[g] = W[g] · cols_i[g]`;
//! - input gradient: `cols_i[g] = W[g]ᵀ · gy_i[g]`, folded back by col2im
//!   (this is also the forward of the transposed convolution);
//! - weight gradient: `gW[g] = Σ_i gy_i[g] · cols_i[g]ᵀ`.
//!
//! An item with few output positions (a late ResNet layer's 7·7) makes a
//! product too narrow for the gemm kernel's tiles, which then reads the
//! whole weight for a handful of columns. The forward therefore covers
//! several items per product when they fit the same buffer (see
//! [`forward_items`]): the column rows in slices, each slice unfolded for
//! the items side by side. The buffer, its size and the ledger are those
//! of one item either way.
//!
//! The forward and input gradient of 3×3, stride-1, padding-1 f32
//! convolutions (ResNet's and VGG's 3×3 layers) run instead on the direct
//! kernel of [`direct`] where the CPU has AVX2: no unfolding and no padded
//! taps, in the same column buffer (see [`direct_dims`]); the meta device
//! and every other convolution take the im2col path.
//!
//! The products go through `matmul_into`, which dispatches Cpu/Meta itself;
//! the data accesses here ask [`on_meta`] at the innermost point, so a meta
//! run allocates (and the ledger moves) exactly as a CPU run.

use super::ConvGeom;
use crate::dtype::CpuData;
use crate::memory::{with_category, Category};
use crate::meta::{backend, Backend};
use crate::primitives::{contiguous_copy, matmul_into, parallel};
use crate::tensor::{contiguous_strides, Layout, Tensor};
use crate::{DType, Error, FloatDType, Result, WithDType};
use direct::{Dims, Pass};
use half::{bf16, f16};
use items::{
    batch_items, forward_items, input_grad_items, input_grad_of_item_in_lanes, input_grad_of_items,
    weight_grad_of_items,
};
use rayon::prelude::*;
use std::ops::Range;
use std::sync::RwLockReadGuard;

impl ConvGeom {
    /// The input coordinate read by output `o` through kernel tap `k` along
    /// axis `a` (0 = height, 1 = width), if it lies inside the input.
    fn src(&self, a: usize, o: usize, k: usize, len: usize) -> Option<usize> {
        let i = (o * self.stride[a] + k * self.dil[a]).checked_sub(self.pad[a])?;
        (i < len).then_some(i)
    }

    /// The outputs `lo..hi` along axis `a` whose input coordinate through
    /// tap `k` lies inside `0..len` (every other output reads padding): the
    /// span the kernels below copy or add without a bounds check per element.
    fn valid(&self, a: usize, k: usize, len: usize, outs: usize) -> Range<usize> {
        let (s, shift, pad) = (self.stride[a], k * self.dil[a], self.pad[a]);
        // o·s + shift − pad ≥ 0  ⇔  o ≥ ⌈(pad − shift) / s⌉.
        let lo = pad.saturating_sub(shift).div_ceil(s);
        // o·s + shift − pad < len  ⇔  o < ⌈(len + pad − shift) / s⌉.
        let hi = (len + pad).saturating_sub(shift).div_ceil(s).min(outs);
        lo.min(hi)..hi
    }

    /// The input coordinate along axis `a` of output `span.start` through
    /// tap `k`, when `span` (from [`ConvGeom::valid`]) is not empty.
    fn first(&self, a: usize, k: usize, span: &Range<usize>) -> Option<usize> {
        (!span.is_empty()).then(|| span.start * self.stride[a] + k * self.dil[a] - self.pad[a])
    }
}

/// Whether a data access runs on meta (shapes only: the destination is just
/// touched) rather than on the CPU. The seam sends CUDA tensors elsewhere;
/// one reaching a CPU kernel anyway is answered as not on CUDA.
fn on_meta(op: &'static str, tensors: &[&Tensor]) -> Result<bool> {
    match backend(op, tensors)? {
        Backend::Cpu => Ok(false),
        Backend::Meta => Ok(true),
        Backend::Cuda(n) => Err(crate::meta::not_on_cuda(op, n)),
    }
}

/// Runs the generic kernel `$f::<T>` for the float dtype `$dt`.
macro_rules! by_dtype {
    ($dt:expr, $f:ident ( $($a:expr),* )) => {
        match $dt {
            DType::F32 => $f::<f32>($($a),*),
            DType::F64 => $f::<f64>($($a),*),
            DType::F16 => $f::<f16>($($a),*),
            DType::BF16 => $f::<bf16>($($a),*),
            dtype => Err(Error::UnsupportedDType { op: "conv", dtype }),
        }
    };
}

// After `by_dtype!`, which it uses.
mod direct;
mod items;
mod tiles;

fn slice<T: FloatDType>(d: &CpuData, r: Range<usize>) -> Result<&[T]> {
    let s = d.as_slice::<T>().ok_or(Error::DTypeMismatch {
        op: "conv",
        expected: T::DTYPE,
        got: d.dtype(),
    })?;
    Ok(&s[r])
}

fn slice_mut<T: FloatDType>(d: &mut CpuData, r: Range<usize>) -> Result<&mut [T]> {
    let dtype = d.dtype();
    let s = d.as_mut_slice::<T>().ok_or(Error::DTypeMismatch {
        op: "conv",
        expected: T::DTYPE,
        got: dtype,
    })?;
    Ok(&mut s[r])
}

/// `t` itself when contiguous, else a contiguous copy (counted under the
/// caller's category: call it under a Workspace guard).
fn dense(t: &Tensor) -> Result<(Tensor, usize)> {
    let t = match t.layout().contiguous_range() {
        Some(_) => t.detach(),
        None => contiguous_copy(t)?,
    };
    let start = t.layout().contiguous_range().map_or(0, |r| r.start);
    Ok((t, start))
}

/// A contiguous `shape` view of `t`'s storage from element `offset`.
fn view(t: &Tensor, shape: &[usize], offset: usize) -> Tensor {
    t.view_with_layout(Layout::from_parts(
        shape.to_vec(),
        contiguous_strides(shape),
        offset,
    ))
}

/// `[groups, a, b]` viewed as `[groups, b, a]` (no copy).
fn transposed(t: &Tensor) -> Result<Tensor> {
    Ok(t.view_with_layout(t.layout().permute(&[0, 2, 1])?))
}

/// Runs `f(index, chunk)` over `chunk`-sized pieces of `data`, in parallel
/// when `data` is large.
fn for_chunks<T: Send>(data: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
    if chunk == 0 {
        return;
    }
    if parallel(data.len()) {
        data.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    } else {
        data.chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    }
}

/// Unfolds `items` consecutive items of `x` (each `[cin, h, w]`, the first
/// at `xr.start`) into `cols`: rows `rows` of the column matrix
/// `[cin·kh·kw, oh·ow]` of every item, side by side (`[rows, items·oh·ow]`:
/// row `r` holds item 0's `oh·ow` positions, then item 1's, …). One item
/// and all rows is the plain unfolding. Each output row copies its valid
/// span in one piece (a plain copy at stride 1) and zero-fills the padding
/// on either side.
fn im2col<T: FloatDType>(
    x: &CpuData,
    xr: Range<usize>,
    cols: &mut CpuData,
    g: &ConvGeom,
    (rows, items): (Range<usize>, usize),
) -> Result<()> {
    let x = slice::<T>(x, xr)?;
    let cols = slice_mut::<T>(cols, 0..rows.len() * items * g.l())?;
    unfold_into(x, cols, g, rows);
    Ok(())
}

/// [`im2col`] over plain slices: `x` holds the items (`[items, cin, h, w]`),
/// `cols` exactly `rows.len()` rows of `items·oh·ow` elements.
fn unfold_into<T: FloatDType>(x: &[T], cols: &mut [T], g: &ConvGeom, rows: Range<usize>) {
    let (l, item) = (g.l(), g.cin * g.h * g.w);
    let items = x.len() / item.max(1);
    let (kk, hw, sw) = (g.kh * g.kw, g.h * g.w, g.stride[1]);
    for_chunks(cols, items * l, |r, row| {
        let r = rows.start + r;
        let (c, ki, kj) = (r / kk, r % kk / g.kw, r % g.kw);
        let cols_in = g.valid(1, kj, g.w, g.ow);
        let first = g.first(1, kj, &cols_in).unwrap_or(0);
        for (b, row) in row.chunks_mut(l).enumerate() {
            let plane = &x[b * item + c * hw..][..hw];
            unfold_row(plane, row, g, ki, (&cols_in, first, sw));
        }
    });
}

/// Whether every valid position of a column row is its input element a
/// fixed distance further (stride 1 and an output as wide as the input: a
/// "same" convolution), so [`unfold_row`] copies and [`fold_row`] adds the
/// valid output rows as one shifted block (the fold after
/// [`neutral_padding`]).
fn shifts_whole_rows(g: &ConvGeom) -> bool {
    g.stride == [1, 1] && g.ow == g.w
}

/// One column row of one item: output positions `row` (`[oh, ow]`) read
/// through tap row `ki` from the input plane `plane`; `cols_in` is the
/// valid span of output columns, `first` the input column of its start.
#[inline(always)]
fn unfold_row<T: FloatDType>(
    plane: &[T],
    row: &mut [T],
    g: &ConvGeom,
    ki: usize,
    (cols_in, first, sw): (&Range<usize>, usize, usize),
) {
    if shifts_whole_rows(g) {
        unfold_row_shifted(plane, row, g, ki, (cols_in, first));
    } else {
        unfold_row_each(plane, row, g, ki, (cols_in, first, sw));
    }
}

/// [`unfold_row`] one output row at a time (any stride and width).
#[inline(always)]
fn unfold_row_each<T: FloatDType>(
    plane: &[T],
    row: &mut [T],
    g: &ConvGeom,
    ki: usize,
    (cols_in, first, sw): (&Range<usize>, usize, usize),
) {
    for (oy, dst) in row.chunks_mut(g.ow).enumerate() {
        let Some(iy) = g.src(0, oy, ki, g.h) else {
            dst.fill(T::zero());
            continue;
        };
        let src = &plane[iy * g.w..(iy + 1) * g.w];
        dst[..cols_in.start].fill(T::zero());
        dst[cols_in.end..].fill(T::zero());
        let span = &mut dst[cols_in.clone()];
        let n = span.len();
        if sw == 1 {
            span.copy_from_slice(&src[first..first + n]);
        } else if n > 0 {
            // Every `sw`-th element from `first`: whole groups of `sw` up to
            // the last element, which may end the row (no bounds check per
            // element, and the compiler vectorises the pick).
            let body = n - 1;
            let groups = src[first..first + sw * body].chunks_exact(sw);
            for (d, group) in span[..body].iter_mut().zip(groups) {
                *d = group[0];
            }
            span[body] = src[first + sw * body];
        }
    }
}

/// [`unfold_row`] at stride 1 when the output is as wide as the input (a
/// "same" convolution): every valid element of the row is the plane's
/// element a fixed distance further, so all the valid output rows are one
/// copy, and only the padding columns, which that copy fills with the
/// neighbouring rows' elements, are zeroed after it. Small output widths
/// (7 or 4 columns in ResNet's last layers) make one copy per output row
/// cost more in calls than in bytes. The same elements and zeros as the
/// row-by-row copy.
#[inline(always)]
fn unfold_row_shifted<T: FloatDType>(
    plane: &[T],
    row: &mut [T],
    g: &ConvGeom,
    ki: usize,
    (cols_in, first): (&Range<usize>, usize),
) {
    let ow = g.ow;
    let rows_in = g.valid(0, ki, g.h, g.oh);
    let Some(iy) = g.first(0, ki, &rows_in).filter(|_| !cols_in.is_empty()) else {
        row.fill(T::zero());
        return;
    };
    let (start, end) = (rows_in.start * ow, rows_in.end * ow);
    // The first and last elements of the block are valid positions, so
    // the whole block's sources lie inside the plane.
    let (a, b) = (start + cols_in.start, end - ow + cols_in.end);
    let from = iy * g.w + first;
    row[a..b].copy_from_slice(&plane[from..from + (b - a)]);
    row[..a].fill(T::zero());
    row[b..].fill(T::zero());
    if cols_in.start > 0 || cols_in.end < ow {
        for r in row[start..end].chunks_mut(ow) {
            fill_few(&mut r[..cols_in.start], T::zero());
            fill_few(&mut r[cols_in.end..], T::zero());
        }
    }
}

/// Fills a slice that is usually a padding width (one or two elements)
/// with plain stores, not a call to `memset`.
#[inline(always)]
fn fill_few<T: FloatDType>(s: &mut [T], v: T) {
    match s {
        [] => {}
        [a] => *a = v,
        [a, b] => (*a, *b) = (v, v),
        _ => s.fill(v),
    }
}

/// Folds `cols` (`[cin·kh·kw, oh·ow]`) back, adding into one item `gx`
/// (`[cin, h, w]`). Each input position receives its taps in a fixed order
/// (kernel row, kernel column, then output row and column), the order of a
/// plain loop over the column rows, so the sums do not depend on how the
/// valid spans are found.
fn col2im<T: FloatDType>(
    cols: &mut CpuData,
    gx: &mut CpuData,
    gr: Range<usize>,
    g: &ConvGeom,
) -> Result<()> {
    let n = cols.len();
    let cols = slice_mut::<T>(cols, 0..n)?;
    let gx = slice_mut::<T>(gx, gr)?;
    let (kk, l) = (g.kh * g.kw, g.l());
    neutral_padding(cols, g, 0..n / l.max(1), l);
    let cols = &*cols;
    for_chunks(gx, g.h * g.w, |c, plane| {
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let row = &cols[(c * kk + ki * g.kw + kj) * l..][..l];
                fold_row(row, plane, g, ki, kj);
            }
        }
    });
    Ok(())
}

/// Writes −0 over the padding columns of the column rows `rows` (each of
/// `width` elements: items of `[oh, ow]` side by side), the positions
/// whose tap reads outside the input, when [`fold_row`] adds whole
/// shifted blocks. Adding −0 changes no value (`x + −0 = x` for every
/// `x`, −0 included), so the padding the block carries along lands as a
/// no-op on positions that tap does not reach, and the fold's values are
/// those of the row-by-row adds bit for bit.
fn neutral_padding<T: FloatDType>(cols: &mut [T], g: &ConvGeom, rows: Range<usize>, width: usize) {
    if !shifts_whole_rows(g) || width == 0 {
        return;
    }
    let neg_zero = T::from_f64(-0.0);
    for (i, row) in cols.chunks_mut(width).take(rows.len()).enumerate() {
        let cols_in = g.valid(1, (rows.start + i) % g.kw, g.w, g.ow);
        if cols_in == (0..g.ow) {
            continue;
        }
        for r in row.chunks_mut(g.ow) {
            fill_few(&mut r[..cols_in.start], neg_zero);
            fill_few(&mut r[cols_in.end..], neg_zero);
        }
    }
}

/// Adds one column row (`row`, `[oh, ow]`: the values of tap `(ki, kj)`)
/// into the input plane `plane` it was unfolded from, in output order.
#[inline(always)]
fn fold_row<T: FloatDType>(row: &[T], plane: &mut [T], g: &ConvGeom, ki: usize, kj: usize) {
    if shifts_whole_rows(g) {
        fold_row_shifted(row, plane, g, ki, kj);
    } else {
        fold_row_each(row, plane, g, ki, kj);
    }
}

/// [`fold_row`] one output row at a time (any stride and width).
#[inline(always)]
fn fold_row_each<T: FloatDType>(row: &[T], plane: &mut [T], g: &ConvGeom, ki: usize, kj: usize) {
    let sw = g.stride[1];
    let cols_in = g.valid(1, kj, g.w, g.ow);
    let Some(first) = g.first(1, kj, &cols_in) else {
        return;
    };
    for (oy, src) in row.chunks(g.ow).enumerate() {
        let Some(iy) = g.src(0, oy, ki, g.h) else {
            continue;
        };
        let dst = &mut plane[iy * g.w..(iy + 1) * g.w];
        let src = &src[cols_in.clone()];
        if sw == 1 {
            for (d, &v) in dst[first..first + src.len()].iter_mut().zip(src) {
                *d = *d + v;
            }
        } else if let Some((&last, body)) = src.split_last() {
            // Every `sw`-th element from `first`, in whole groups of `sw`
            // up to the last one (see `unfold_row_each`).
            let end = first + sw * body.len();
            let groups = dst[first..end].chunks_exact_mut(sw);
            for (group, &v) in groups.zip(body) {
                group[0] = group[0] + v;
            }
            dst[end] = dst[end] + last;
        }
    }
}

/// [`fold_row`] of a "same" convolution: every valid position of the row
/// lands a fixed distance further in the plane, so the valid output rows
/// are one block add; the padding columns inside the block (made −0 by
/// [`neutral_padding`]) land on positions this tap does not reach.
#[inline(always)]
fn fold_row_shifted<T: FloatDType>(row: &[T], plane: &mut [T], g: &ConvGeom, ki: usize, kj: usize) {
    let (cols_in, rows_in) = (g.valid(1, kj, g.w, g.ow), g.valid(0, ki, g.h, g.oh));
    let (Some(first), Some(iy)) = (g.first(1, kj, &cols_in), g.first(0, ki, &rows_in)) else {
        return;
    };
    // The block's first and last positions are valid, so its target lies
    // inside the plane.
    let ow = g.ow;
    let (a, b) = (
        rows_in.start * ow + cols_in.start,
        (rows_in.end - 1) * ow + cols_in.end,
    );
    let to = iy * g.w + first;
    for (d, &v) in plane[to..to + (b - a)].iter_mut().zip(&row[a..b]) {
        *d = *d + v;
    }
}

/// Writes `bias[c]` into every output position of channel `c`: `out[range]`
/// is a sequence of rows of `l` positions, row `i` of channel `i % c`.
fn fill_bias<T: FloatDType>(
    out: &mut CpuData,
    range: Range<usize>,
    b: &CpuData,
    br: Range<usize>,
    l: usize,
) -> Result<()> {
    let b = slice::<T>(b, br)?;
    let out = slice_mut::<T>(out, range)?;
    let c = b.len();
    for_chunks(out, l, |i, d| d.fill(b[i % c]));
    Ok(())
}

/// Per channel of `gy` (`[n, c, l]`): the sum over `n` and `l`, in f64.
fn channel_sums<T: FloatDType>(
    gy: &CpuData,
    r: Range<usize>,
    dst: &mut CpuData,
    n: usize,
    l: usize,
) -> Result<()> {
    let gy = slice::<T>(gy, r)?;
    let c = dst.len();
    let dst = slice_mut::<T>(dst, 0..c)?;
    for (ch, d) in dst.iter_mut().enumerate() {
        let mut acc = 0.0f64;
        for i in 0..n {
            acc += gy[(i * c + ch) * l..][..l]
                .iter()
                .map(|&v| WithDType::to_f64(v))
                .sum::<f64>();
        }
        *d = <T as WithDType>::from_f64(acc);
    }
    Ok(())
}

/// Unfolds one item of `x` (from element `start`) into `cols`.
fn unfold(x: &Tensor, start: usize, cols: &Tensor, g: &ConvGeom) -> Result<()> {
    unfold_items(x, start, cols, g, 0..g.cin * g.kh * g.kw, 1)
}

/// Unfolds rows `rows` of `items` consecutive items of `x` (from element
/// `start`) into the front of `cols`, side by side (see [`im2col`]).
fn unfold_items(
    x: &Tensor,
    start: usize,
    cols: &Tensor,
    g: &ConvGeom,
    rows: Range<usize>,
    items: usize,
) -> Result<()> {
    if on_meta("conv", &[x, cols])? {
        crate::meta::touch(cols);
        return Ok(());
    }
    let xd = x.storage().cpu()?;
    let mut cd = cols.storage().cpu_mut()?;
    let xr = start..start + items * g.cin * g.h * g.w;
    by_dtype!(x.dtype(), im2col(&xd, xr, &mut cd, g, (rows, items)))
}

/// The convolution `y = conv(x, w) + b` (no autograd): `x` `[n, cin, h, w]`,
/// `w` `[cout, cin/groups, kh, kw]`, `b` `[cout]`; a new contiguous
/// `[n, cout, oh, ow]` tensor.
pub(super) fn conv2d_forward(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    g: &ConvGeom,
) -> Result<Tensor> {
    // Every path below writes every output element (its first product
    // overwrites, or adds to the bias written first).
    let out = Tensor::for_overwrite(&[g.n, g.cout, g.oh, g.ow], x.dtype(), x.device())?;
    let _ws = with_category(Category::Workspace);
    if let Some(b) = bias {
        let (b, bs) = dense(b)?;
        if on_meta("conv2d", &[x, &b])? {
            crate::meta::touch(&out);
        } else {
            let bd = b.storage().cpu()?;
            let mut od = out.storage().cpu_mut()?;
            let all = 0..od.len();
            by_dtype!(
                x.dtype(),
                fill_bias(&mut od, all, &bd, bs..bs + g.cout, g.l())
            )?;
        }
    }
    let (x, xs) = dense(x)?;
    let (w, ws) = dense(w)?;
    let (k, l, cg) = (g.k(), g.l(), g.cout_g());
    // Scratch: each use writes the part it reads first.
    let len = g.column_buffer_len(x.dtype());
    let cols = Tensor::for_overwrite(&[len], x.dtype(), x.device())?;
    if let Some(d) = direct_dims(Pass::Forward, g, &x) {
        let onto_out = bias.is_some();
        direct_pass(
            (d, Pass::Forward, onto_out),
            (&x, xs),
            (&w, ws),
            (&out, &cols),
        )?;
        return Ok(out);
    }
    let n = items(&x, g);
    if let Some(pieces) = tiles::pieces(g, len) {
        for i in 0..n {
            let how = (i, bias.is_some(), pieces);
            tiles::forward_item((&x, xs), (&w, ws), (&out, &cols), g, how)?;
        }
        return Ok(out);
    }
    let cols = view(&cols, &[g.groups, k, l], 0);
    let wv = view(&w, &[g.groups, cg, k], ws);
    // A bias is read in place by the batched products (a view would need a
    // copy, which the one-item products do not make).
    let bias_at = bias.map(|b| b.layout().contiguous_range().map(|r| (b, r.start)));
    let per_product = match bias_at {
        Some(None) => 1,
        _ => batch_items(g, n, x.dtype()),
    };
    let mut i = 0;
    while i < n {
        let nb = per_product.min(n - i);
        if nb > 1 {
            let b = bias_at.flatten();
            forward_items((&x, xs), (&w, ws), b, &out, &cols, g, i..i + nb)?;
        } else {
            unfold(&x, xs + i * g.cin * g.h * g.w, &cols, g)?;
            let dst = view(&out, &[g.groups, cg, l], i * g.cout * l);
            matmul_into(&dst, &wv, &cols, bias.is_some())?;
        }
        i += nb;
    }
    Ok(out)
}

/// The gradient of [`conv2d_forward`] with respect to `x`, given `gy`
/// `[n, cout, oh, ow]`: a new contiguous `[n, cin, h, w]` tensor. This is
/// also the transposed convolution of `gy` by `w`, whose bias `[cin]`, if
/// given, is the starting value of every position (the taps added after it).
pub(super) fn conv2d_input_grad(
    gy: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    g: &ConvGeom,
) -> Result<Tensor> {
    let shape = [g.n, g.cin, g.h, g.w];
    // The direct kernel writes every element; im2col's fold adds into zeros.
    let direct = direct_dims(Pass::InputGrad, g, gy);
    let gx = match direct {
        Some(_) => Tensor::for_overwrite(&shape, gy.dtype(), gy.device())?,
        None => Tensor::zeros(&shape, gy.dtype(), gy.device())?,
    };
    let _ws = with_category(Category::Workspace);
    if let Some(b) = bias {
        let (b, bs) = dense(b)?;
        if on_meta("conv_transpose2d", &[gy, &b])? {
            crate::meta::touch(&gx);
        } else {
            let bd = b.storage().cpu()?;
            let mut xd = gx.storage().cpu_mut()?;
            let all = 0..xd.len();
            by_dtype!(
                gy.dtype(),
                fill_bias(&mut xd, all, &bd, bs..bs + g.cin, g.h * g.w)
            )?;
        }
    }
    let (gy, gs) = dense(gy)?;
    let (w, ws) = dense(w)?;
    let (k, l, cg) = (g.k(), g.l(), g.cout_g());
    // Scratch: each use writes the part it reads first.
    let len = g.column_buffer_len(gy.dtype());
    let cols = Tensor::for_overwrite(&[len], gy.dtype(), gy.device())?;
    if let Some(d) = direct {
        let onto_out = bias.is_some();
        direct_pass(
            (d, Pass::InputGrad, onto_out),
            (&gy, gs),
            (&w, ws),
            (&gx, &cols),
        )?;
        return Ok(gx);
    }
    let n = items(&gy, g);
    if let Some(pieces) = tiles::pieces(g, len) {
        for i in 0..n {
            tiles::input_grad_item((&gy, gs), (&w, ws), (&gx, &cols), g, (i, pieces))?;
        }
        return Ok(gx);
    }
    let cols = view(&cols, &[g.groups, k, l], 0);
    let wt = transposed(&view(&w, &[g.groups, cg, k], ws))?;
    let item = g.cin * g.h * g.w;
    let per_product = match gy.shares_storage_with(&w) {
        true => 1,
        false => input_grad_items(g, n, gy.dtype()),
    };
    let mut i = 0;
    while i < n {
        let nb = per_product.min(n - i);
        i += nb;
        if nb > 1 {
            input_grad_of_items((&gy, gs), (&w, ws), &gx, &cols, g, i - nb..i)?;
            continue;
        }
        if input_grad_of_item_in_lanes((&gy, gs), (&w, ws), &gx, &cols, g, i - 1)? {
            continue;
        }
        let gyv = view(&gy, &[g.groups, cg, l], gs + (i - 1) * g.cout * l);
        matmul_into(&cols, &wt, &gyv, false)?;
        if on_meta("conv2d_backward", &[&cols, &gx])? {
            crate::meta::touch(&gx);
            continue;
        }
        let mut cd = cols.storage().cpu_mut()?;
        let mut xd = gx.storage().cpu_mut()?;
        by_dtype!(
            gy.dtype(),
            col2im(&mut cd, &mut xd, (i - 1) * item..i * item, g)
        )?;
    }
    Ok(gx)
}

/// The sizes of `pass` on the direct 3×3 kernel (see [`direct`]) for `g`
/// with `input`'s dtype and device, when that kernel applies on this CPU
/// and fits the column buffer ([`ConvGeom::column_buffer_len`]); `None`
/// sends the convolution to im2col, as does the meta device (whose ledger
/// is the same either way: both paths allocate the output and that
/// buffer).
fn direct_dims(pass: Pass, g: &ConvGeom, input: &Tensor) -> Option<Dims> {
    let (ins, outs) = match pass {
        Pass::Forward => (g.cin, g.cout),
        Pass::InputGrad => (g.cout, g.cin),
    };
    let f32_data = input.dtype() == DType::F32;
    if input.device().is_meta() || !direct::applies(g, outs, f32_data) {
        return None;
    }
    let d = Dims {
        n: g.n,
        ins,
        outs,
        h: g.h,
        w: g.w,
    };
    direct::fits(&d, g.column_buffer_len(input.dtype())).then_some(d)
}

/// Runs `pass` (sizes `d` from [`direct_dims`]) on the direct 3×3 kernel
/// from `input` (contiguous from element `is`) and the weight (from `ws`)
/// into `out`, with `cols` (the im2col column buffer) as its workspace.
/// `onto_out`: `out` already holds the bias.
fn direct_pass(
    (d, pass, onto_out): (Dims, Pass, bool),
    (input, is): (&Tensor, usize),
    (w, ws): (&Tensor, usize),
    (out, cols): (&Tensor, &Tensor),
) -> Result<()> {
    // The op the ledger notes last before the column buffer is freed, as
    // on the im2col path.
    crate::memory::note_op("matmul_into");
    let (xd, wd) = read_both(input, w)?;
    let wd: &CpuData = wd.as_deref().unwrap_or(&xd);
    let mut od = out.storage().cpu_mut()?;
    let mut cd = cols.storage().cpu_mut()?;
    let plane = d.h * d.w;
    let x = slice::<f32>(&xd, is..is + d.n * d.ins * plane)?;
    let wt = slice::<f32>(wd, ws..ws + d.ins * d.outs * 9)?;
    let o = slice_mut::<f32>(&mut od, 0..d.n * d.outs * plane)?;
    let c = slice_mut::<f32>(&mut cd, 0..cols.layout().numel())?;
    direct::run((x, wt, o), c, d, pass, onto_out);
    Ok(())
}

/// Read guards on the storages of `x` and `w`; none for `w` when it shares
/// `x`'s storage (a second guard on one lock could deadlock a writer).
fn read_both<'a>(
    x: &'a Tensor,
    w: &'a Tensor,
) -> Result<(
    RwLockReadGuard<'a, CpuData>,
    Option<RwLockReadGuard<'a, CpuData>>,
)> {
    let xd = x.storage().cpu()?;
    let wd = match w.shares_storage_with(x) {
        true => None,
        false => Some(w.storage().cpu()?),
    };
    Ok((xd, wd))
}

/// The gradient of [`conv2d_forward`] with respect to `w`, given `gy`
/// `[n, cout, oh, ow]` and the input `x`: a new `[cout, cin/groups, kh, kw]`
/// tensor.
pub(super) fn conv2d_weight_grad(gy: &Tensor, x: &Tensor, g: &ConvGeom) -> Result<Tensor> {
    let cin_g = g.cin / g.groups;
    // The first item's product overwrites it; with no items it stays 0.
    let shape = [g.cout, cin_g, g.kh, g.kw];
    let gw = match g.n {
        0 => Tensor::zeros(&shape, gy.dtype(), gy.device())?,
        _ => Tensor::for_overwrite(&shape, gy.dtype(), gy.device())?,
    };
    let _ws = with_category(Category::Workspace);
    let (gy, gs) = dense(gy)?;
    let (x, xs) = dense(x)?;
    let (k, l, cg) = (g.k(), g.l(), g.cout_g());
    // Scratch: each use writes the part it reads first. The kernels here
    // use the column buffer's share of it (`len`); the rest is room for the
    // CUDA kernels' split partial sums, held on every device so that the
    // ledgers agree.
    let len = g.column_buffer_len(gy.dtype());
    let held = g.weight_grad_workspace_len(gy.dtype());
    let cols = Tensor::for_overwrite(&[held], gy.dtype(), gy.device())?;
    let n = items(&x, g);
    if let Some(pieces) = tiles::pieces(g, len) {
        for i in 0..n {
            tiles::weight_grad_item((&gy, gs), (&x, xs), (&gw, &cols), g, (i, pieces))?;
        }
        return Ok(gw);
    }
    let cols = view(&cols, &[g.groups, k, l], 0);
    let colst = transposed(&cols)?;
    let gwv = view(&gw, &[g.groups, cg, k], 0);
    // The same buffer layout as the input gradient's items (f32/f64 only:
    // a half type would round the partial sums at other points).
    let per_product = if matches!(gy.dtype(), DType::F32 | DType::F64) {
        input_grad_items(g, n, gy.dtype())
    } else {
        1
    };
    let mut i = 0;
    while i < n {
        let nb = per_product.min(n - i);
        if nb > 1 {
            weight_grad_of_items((&gy, gs), (&x, xs), &gw, &cols, g, i..i + nb)?;
        } else {
            unfold(&x, xs + i * g.cin * g.h * g.w, &cols, g)?;
            let gyv = view(&gy, &[g.groups, cg, l], gs + i * g.cout * l);
            matmul_into(&gwv, &gyv, &colst, i > 0)?;
        }
        i += nb;
    }
    Ok(gw)
}

/// How many batch items the per-item loops run: all of them, but on the
/// meta device one (every item allocates nothing and checks the same
/// shapes), so that predicting a step costs the same at any batch size.
fn items(t: &Tensor, g: &ConvGeom) -> usize {
    if t.device().is_meta() {
        g.n.min(1)
    } else {
        g.n
    }
}

/// The bias gradient: `gy` `[n, c, …]` summed over every dim but 1.
pub(super) fn channel_sum(gy: &Tensor) -> Result<Tensor> {
    let (n, c) = (gy.shape()[0], gy.shape()[1]);
    let l = gy.shape()[2..].iter().product();
    let gb = Tensor::zeros(&[c], gy.dtype(), gy.device())?;
    let _ws = with_category(Category::Workspace);
    let (gy, gs) = dense(gy)?;
    if on_meta("conv_bias_grad", &[&gy, &gb])? {
        crate::meta::touch(&gb);
        return Ok(gb);
    }
    let gd = gy.storage().cpu()?;
    let mut bd = gb.storage().cpu_mut()?;
    by_dtype!(
        gy.dtype(),
        channel_sums(&gd, gs..gs + n * c * l, &mut bd, n, l)
    )?;
    drop(bd);
    Ok(gb)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(h, w, kh, kw, pad, dil)` of a convolution.
    type SameCase = (usize, usize, usize, usize, [usize; 2], [usize; 2]);

    /// "Same" convolutions `(h, w, kh, kw, pad, dil)` at stride 1 (2·pad =
    /// dil·(k − 1)): 3×3 and wider kernels, dilation, planes of one row
    /// or column, 1×1 kernels.
    const SAME_CASES: [SameCase; 11] = [
        (7, 7, 3, 3, [1, 1], [1, 1]),
        (5, 7, 3, 3, [1, 1], [1, 1]),
        (4, 4, 3, 3, [1, 1], [1, 1]),
        (4, 5, 5, 3, [2, 1], [1, 1]),
        (6, 6, 3, 3, [2, 2], [2, 2]),
        (1, 9, 3, 3, [1, 1], [1, 1]),
        (9, 1, 3, 3, [1, 1], [1, 1]),
        (1, 6, 1, 3, [0, 1], [1, 1]),
        (6, 1, 3, 1, [1, 0], [1, 1]),
        (3, 3, 7, 7, [3, 3], [1, 1]),
        (5, 4, 1, 1, [0, 0], [1, 1]),
    ];

    /// One channel in and out, one item, of a "same" case.
    fn same_geometry((h, w, kh, kw, pad, dil): SameCase) -> ConvGeom {
        let g = ConvGeom {
            n: 1,
            cin: 1,
            h,
            w,
            cout: 1,
            kh,
            kw,
            stride: [1, 1],
            pad,
            dil,
            groups: 1,
            oh: h + 2 * pad[0] - dil[0] * (kh - 1),
            ow: w + 2 * pad[1] - dil[1] * (kw - 1),
        };
        assert_eq!((g.oh, g.ow), (h, w));
        g
    }

    /// The shifted block fold of a "same" convolution adds what the
    /// row-by-row fold adds, bit for bit, once the padding columns hold −0:
    /// whatever the product left there (NaN here), and into planes holding
    /// −0.
    #[test]
    fn a_same_convolutions_shifted_fold_equals_the_row_by_row_one() {
        for (h, w, kh, kw, pad, dil) in SAME_CASES {
            let g = same_geometry((h, w, kh, kw, pad, dil));
            let l = g.l();
            // Column rows: the padding positions hold NaN (as a product
            // over them may), valid ones values with a −0 among them.
            let mut cols: Vec<f32> = (0..kh * kw * l)
                .map(|i| match i % 5 {
                    0 => -0.0,
                    _ => (i as f32 * 0.37).sin(),
                })
                .collect();
            for r in 0..kh * kw {
                let (ki, kj) = (r / kw, r % kw);
                for (p, v) in cols[r * l..][..l].iter_mut().enumerate() {
                    let (oy, ox) = (p / w, p % w);
                    if g.src(0, oy, ki, h).is_none() || g.src(1, ox, kj, w).is_none() {
                        *v = f32::NAN;
                    }
                }
            }
            let start: Vec<f32> = (0..h * w)
                .map(|i| if i % 3 == 0 { -0.0 } else { 0.5 })
                .collect();
            let mut each = start.clone();
            for r in 0..kh * kw {
                fold_row_each(&cols[r * l..][..l], &mut each, &g, r / kw, r % kw);
            }
            let mut shifted = start.clone();
            neutral_padding(&mut cols, &g, 0..kh * kw, l);
            for r in 0..kh * kw {
                fold_row_shifted(&cols[r * l..][..l], &mut shifted, &g, r / kw, r % kw);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&shifted),
                bits(&each),
                "{h}×{w} kernel {kh}×{kw} pad {pad:?} dil {dil:?}"
            );
            assert!(each.iter().all(|v| !v.is_nan()));
        }
    }

    /// The shifted copy of a "same" convolution's rows equals the
    /// row-by-row copy for every tap, with padding wider than the kernel's
    /// reach, dilation, planes of one row or column, and 1×1 kernels.
    #[test]
    fn a_same_convolutions_shifted_unfold_equals_the_row_by_row_one() {
        for (h, w, kh, kw, pad, dil) in SAME_CASES {
            let g = same_geometry((h, w, kh, kw, pad, dil));
            let plane: Vec<f32> = (0..h * w).map(|i| i as f32 + 1.0).collect();
            for ki in 0..kh {
                for kj in 0..kw {
                    let cols_in = g.valid(1, kj, g.w, g.ow);
                    let first = g.first(1, kj, &cols_in).unwrap_or(0);
                    let (mut fast, mut each) = (vec![f32::NAN; g.l()], vec![f32::NAN; g.l()]);
                    unfold_row_shifted(&plane, &mut fast, &g, ki, (&cols_in, first));
                    unfold_row_each(&plane, &mut each, &g, ki, (&cols_in, first, 1));
                    assert_eq!(
                        fast, each,
                        "{h}×{w} kernel {kh}×{kw} pad {pad:?} dil {dil:?} tap {ki},{kj}"
                    );
                }
            }
        }
    }
}
