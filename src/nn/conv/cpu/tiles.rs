//! Convolutions whose column buffer holds less than one batch item's
//! columns (the Workspace budget of `workspace.rs`): each item in pieces,
//! every piece unfolded into the buffer and multiplied as its part of the
//! one-item product, so that every value is that product's where the
//! pieces' products add their terms alike: always on leangrad's f32
//! kernels (their depth blocking depends on the depth alone, which the
//! pieces keep; a piece is never one row or column, which would take the
//! matrix-vector path), within rounding through the `gemm` crate (f64,
//! f16, the portable path), whose blocking also follows the shape
//! (`adds_alike`).
//!
//! - Whole groups at a time where one group's columns (`k·oh·ow`) fit: the
//!   one-item batched products restricted to those groups.
//! - Else group by group: the forward in ranges of output positions (each
//!   `[k, positions]` unfolded, its outputs one block of columns of the
//!   group's `[cout/groups, oh·ow]`); the input and weight gradients in
//!   slices of column rows, the input gradient's folded back in ascending
//!   row order (as col2im folds), the weight gradient's one block of
//!   columns of the group's `gW`.

use super::items::fold_rows;
use super::{
    neutral_padding, on_meta, read_both, slice, slice_mut, transposed, unfold_into, unfold_items,
    view, ConvGeom,
};
use crate::dtype::CpuData;
use crate::primitives::{column_blocks, gemm_slices, matmul_into};
use crate::tensor::{Layout, Tensor};
use crate::{DType, Error, FloatDType, Result, WithDType};
use half::{bf16, f16};
use std::ops::Range;

/// How an item is cut to fit a column buffer shorter than its columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pieces {
    /// This many whole groups at a time.
    Groups(usize),
    /// One group at a time, in ranges of positions or slices of rows.
    InGroup,
}

/// How `g`'s items are cut for a column buffer of `len` elements; `None`
/// when it holds a whole item's columns.
pub(super) fn pieces(g: &ConvGeom, len: usize) -> Option<Pieces> {
    let group = g.k() * g.l();
    match len >= g.full_columns() {
        true => None,
        false if len >= group => Some(Pieces::Groups(len / group)),
        false => Some(Pieces::InGroup),
    }
}

/// Runs `f` on the host data of the two tensors it reads and the two it
/// writes (a product's destination and the column buffer), noting the
/// products' op as the one-item path does; on meta only touches the two
/// written, as a CPU run writes them.
fn on_data(
    (a, b): (&Tensor, &Tensor),
    (dst, cols): (&Tensor, &Tensor),
    f: impl FnOnce((&CpuData, &CpuData, &mut CpuData, &mut CpuData)) -> Result<()>,
) -> Result<()> {
    crate::memory::note_op("matmul_into");
    if on_meta("matmul_into", &[a, b, dst, cols])? {
        crate::meta::touch(cols);
        crate::meta::touch(dst);
        return Ok(());
    }
    let (ad, bd) = read_both(a, b)?;
    let bd: &CpuData = bd.as_deref().unwrap_or(&ad);
    let mut dd = dst.storage().cpu_mut()?;
    let mut cd = cols.storage().cpu_mut()?;
    f((&*ad, bd, &mut *dd, &mut *cd))
}

/// Where one item's data starts: input (or input-gradient) and output (or
/// output-gradient) elements.
fn item_starts(g: &ConvGeom, item: usize) -> (usize, usize) {
    (item * g.cin * g.h * g.w, item * g.cout * g.l())
}

/// The forward of batch item `item` in pieces: `out[item] (+)= W ⊛ x[item]`
/// (onto the bias already in `out` when `onto_bias`).
pub(super) fn forward_item(
    (x, xs): (&Tensor, usize),
    (w, ws): (&Tensor, usize),
    (out, cols): (&Tensor, &Tensor),
    g: &ConvGeom,
    (item, onto_bias, pieces): (usize, bool, Pieces),
) -> Result<()> {
    let (k, l, cg) = (g.k(), g.l(), g.cout_g());
    let (xi, oi) = item_starts(g, item);
    let Pieces::Groups(per) = pieces else {
        return on_data((x, w), (out, cols), |bufs| {
            let starts = (xs + xi, ws, oi);
            by_dtype!(x.dtype(), forward_positions(bufs, starts, g, onto_bias))
        });
    };
    for g0 in (0..g.groups).step_by(per) {
        let gn = per.min(g.groups - g0);
        unfold_items(x, xs + xi, cols, g, g0 * k..(g0 + gn) * k, 1)?;
        let dst = view(out, &[gn, cg, l], oi + g0 * cg * l);
        let wv = view(w, &[gn, cg, k], ws + g0 * cg * k);
        matmul_into(&dst, &wv, &view(cols, &[gn, k, l], 0), onto_bias)?;
    }
    Ok(())
}

/// [`forward_item`] group by group in ranges of output positions: the
/// item's input from element `xs`, the weight from `ws`, its outputs from
/// `os`.
fn forward_positions<T: FloatDType>(
    (x, w, out, cols): (&CpuData, &CpuData, &mut CpuData, &mut CpuData),
    (xs, ws, os): (usize, usize, usize),
    g: &ConvGeom,
    onto_bias: bool,
) -> Result<()> {
    let (k, l, cg) = (g.k(), g.l(), g.cout_g());
    let group_in = g.cin / g.groups * g.h * g.w;
    let x = slice::<T>(x, xs..xs + g.groups * group_in)?;
    let w = slice::<T>(w, ws..ws + g.cout * k)?;
    let out = slice_mut::<T>(out, os..os + g.cout * l)?;
    let n = cols.len();
    let cols = slice_mut::<T>(cols, 0..n)?;
    // Positions per piece: as many `k`-row columns as the buffer holds.
    let positions = piece_ranges(l, n / k.max(1));
    for gi in 0..g.groups {
        let xg = &x[gi * group_in..][..group_in];
        let wg = &w[gi * cg * k..][..cg * k];
        let og = &mut out[gi * cg * l..][..cg * l];
        for ps in positions.iter().cloned() {
            let piece = &mut cols[..k * ps.len()];
            unfold_positions(xg, piece, g, ps.clone());
            let width = ps.len();
            let a = (wg, k, 1);
            let b = (&*piece, width, 1);
            product_columns(og, (cg, l), (ps, k), a, b, onto_bias)?;
        }
    }
    Ok(())
}

/// Unfolds the output positions `ps` of one group's input `x`
/// (`[cin/groups, h, w]`) into `cols` (`[k, ps.len()]`): the columns
/// `ps` of that group's column matrix.
fn unfold_positions<T: FloatDType>(x: &[T], cols: &mut [T], g: &ConvGeom, ps: Range<usize>) {
    let (kk, hw, ow) = (g.kh * g.kw, g.h * g.w, g.ow);
    super::for_chunks(cols, ps.len(), |r, row| {
        let (c, ki, kj) = (r / kk, r % kk / g.kw, r % g.kw);
        let plane = &x[c * hw..][..hw];
        let cols_in = g.valid(1, kj, g.w, ow);
        let first = g.first(1, kj, &cols_in).unwrap_or(0);
        let mut p = ps.start;
        while p < ps.end {
            let (oy, ox0) = (p / ow, p % ow);
            let ox1 = (ox0 + ps.end - p).min(ow);
            let dst = &mut row[p - ps.start..][..ox1 - ox0];
            unfold_span(plane, dst, g, (oy, ox0..ox1, ki), (&cols_in, first));
            p += ox1 - ox0;
        }
    });
}

/// Output row `oy`'s positions `oxs` of the column row of tap row `ki`
/// into `dst`: the plane's elements where the tap reads inside it
/// (`cols_in`, the valid output columns, the first at input column
/// `first`), zeros elsewhere.
fn unfold_span<T: FloatDType>(
    plane: &[T],
    dst: &mut [T],
    g: &ConvGeom,
    (oy, oxs, ki): (usize, Range<usize>, usize),
    (cols_in, first): (&Range<usize>, usize),
) {
    let Some(iy) = g.src(0, oy, ki, g.h) else {
        dst.fill(T::zero());
        return;
    };
    let src = &plane[iy * g.w..(iy + 1) * g.w];
    let a = cols_in.start.clamp(oxs.start, oxs.end);
    let b = cols_in.end.clamp(oxs.start, oxs.end);
    if a >= b {
        dst.fill(T::zero());
        return;
    }
    let (a0, b0) = (a - oxs.start, b - oxs.start);
    dst[..a0].fill(T::zero());
    dst[b0..].fill(T::zero());
    let from = first + (a - cols_in.start) * g.stride[1];
    if g.stride[1] == 1 {
        dst[a0..b0].copy_from_slice(&src[from..from + (b - a)]);
    } else {
        let picks = src[from..].iter().step_by(g.stride[1]);
        for (d, &v) in dst[a0..b0].iter_mut().zip(picks) {
            *d = v;
        }
    }
}

/// The input gradient of batch item `item` in pieces, added into `gx`
/// (zeros, or the transposed convolution's bias).
pub(super) fn input_grad_item(
    (gy, gs): (&Tensor, usize),
    (w, ws): (&Tensor, usize),
    (gx, cols): (&Tensor, &Tensor),
    g: &ConvGeom,
    (item, pieces): (usize, Pieces),
) -> Result<()> {
    let (k, l, cg) = (g.k(), g.l(), g.cout_g());
    let (xi, yi) = item_starts(g, item);
    let gx_item = xi..xi + g.cin * g.h * g.w;
    if let Pieces::Groups(per) = pieces {
        for g0 in (0..g.groups).step_by(per) {
            let gn = per.min(g.groups - g0);
            let wt = transposed(&view(w, &[gn, cg, k], ws + g0 * cg * k))?;
            let gyv = view(gy, &[gn, cg, l], gs + yi + g0 * cg * l);
            matmul_into(&view(cols, &[gn, k, l], 0), &wt, &gyv, false)?;
            fold_item(cols, gx, g, gx_item.clone(), g0 * k..(g0 + gn) * k)?;
        }
        return Ok(());
    }
    let slices = piece_ranges(k, cols.layout().numel() / l.max(1));
    for gi in 0..g.groups {
        let gyv = view(gy, &[cg, l], gs + yi + gi * cg * l);
        for rows in slices.iter().cloned() {
            // W[gi][:, rows]ᵀ: element (r, c) at w[(gi·cg + c)·k + rows.start + r].
            let at = ws + gi * cg * k + rows.start;
            let wt = w.view_with_layout(Layout::from_parts(vec![rows.len(), cg], vec![1, k], at));
            matmul_into(&view(cols, &[rows.len(), l], 0), &wt, &gyv, false)?;
            let global = gi * k + rows.start..gi * k + rows.end;
            fold_item(cols, gx, g, gx_item.clone(), global)?;
        }
    }
    Ok(())
}

/// Folds the column rows `rows` (item-wide numbering, `cin·kh·kw` in all)
/// held at the front of `cols` into the item's input gradient `gx[gr]`.
fn fold_item(
    cols: &Tensor,
    gx: &Tensor,
    g: &ConvGeom,
    gr: Range<usize>,
    rows: Range<usize>,
) -> Result<()> {
    if on_meta("conv2d_backward", &[cols, gx])? {
        crate::meta::touch(gx);
        return Ok(());
    }
    let mut cd = cols.storage().cpu_mut()?;
    let mut xd = gx.storage().cpu_mut()?;
    fn go<T: FloatDType>(
        cols: &mut CpuData,
        gx: &mut CpuData,
        (gr, rows): (Range<usize>, Range<usize>),
        g: &ConvGeom,
    ) -> Result<()> {
        let cols = slice_mut::<T>(cols, 0..rows.len() * g.l())?;
        let gx = slice_mut::<T>(gx, gr)?;
        neutral_padding(cols, g, rows.clone(), g.l());
        fold_rows(cols, gx, g, rows, 1);
        Ok(())
    }
    by_dtype!(gx.dtype(), go(&mut cd, &mut xd, (gr, rows), g))
}

/// The weight gradient's share of batch item `item` in pieces:
/// `gW (+)= gy[item] · cols[item]ᵀ` (added to `gW` for every item after
/// the first).
pub(super) fn weight_grad_item(
    (gy, gs): (&Tensor, usize),
    (x, xs): (&Tensor, usize),
    (gw, cols): (&Tensor, &Tensor),
    g: &ConvGeom,
    (item, pieces): (usize, Pieces),
) -> Result<()> {
    let (k, l, cg) = (g.k(), g.l(), g.cout_g());
    let (xi, yi) = item_starts(g, item);
    let accumulate = item > 0;
    let Pieces::Groups(per) = pieces else {
        return on_data((x, gy), (gw, cols), |bufs| {
            let starts = (xs + xi, gs + yi);
            by_dtype!(x.dtype(), weight_grad_slices(bufs, starts, g, accumulate))
        });
    };
    for g0 in (0..g.groups).step_by(per) {
        let gn = per.min(g.groups - g0);
        unfold_items(x, xs + xi, cols, g, g0 * k..(g0 + gn) * k, 1)?;
        let gwv = view(gw, &[gn, cg, k], g0 * cg * k);
        let gyv = view(gy, &[gn, cg, l], gs + yi + g0 * cg * l);
        let colst = transposed(&view(cols, &[gn, k, l], 0))?;
        matmul_into(&gwv, &gyv, &colst, accumulate)?;
    }
    Ok(())
}

/// [`weight_grad_item`] group by group in slices of column rows: the item's
/// input from element `xs`, its output gradient from `ys`.
fn weight_grad_slices<T: FloatDType>(
    (x, gy, gw, cols): (&CpuData, &CpuData, &mut CpuData, &mut CpuData),
    (xs, ys): (usize, usize),
    g: &ConvGeom,
    accumulate: bool,
) -> Result<()> {
    let (k, l, cg) = (g.k(), g.l(), g.cout_g());
    let x = slice::<T>(x, xs..xs + g.cin * g.h * g.w)?;
    let gy = slice::<T>(gy, ys..ys + g.cout * l)?;
    let gw = slice_mut::<T>(gw, 0..g.cout * k)?;
    // The column buffer's share (the rest is the CUDA kernels' room).
    let n = g.column_buffer_len(T::DTYPE);
    let cols = slice_mut::<T>(cols, 0..n)?;
    let slices = piece_ranges(k, n / l.max(1));
    for gi in 0..g.groups {
        let gyg = &gy[gi * cg * l..][..cg * l];
        let gwg = &mut gw[gi * cg * k..][..cg * k];
        for rows in slices.iter().cloned() {
            let band = &mut cols[..rows.len() * l];
            unfold_into(x, band, g, gi * k + rows.start..gi * k + rows.end);
            // colsᵀ: element (p, r) at band[r·l + p].
            let b = (&*band, 1, l);
            product_columns(gwg, (cg, k), (rows, l), (gyg, l, 1), b, accumulate)?;
        }
    }
    Ok(())
}

/// `0..len` in consecutive pieces of at most `most`, none of one element
/// unless `len` is 1 (or `most` below 3): a last piece of one takes an
/// element from the piece before it, since a product of one row or column
/// takes gemm's matrix-vector path, which adds in another order than the
/// whole product.
fn piece_ranges(len: usize, most: usize) -> Vec<Range<usize>> {
    let most = most.max(1);
    let mut pieces: Vec<Range<usize>> = (0..len)
        .step_by(most)
        .map(|s| s..(s + most).min(len))
        .collect();
    if let [.., before, last] = &mut pieces[..] {
        if last.len() == 1 && before.len() >= 3 {
            before.end -= 1;
            last.start -= 1;
        }
    }
    pieces
}

/// `dst[:, cols] (+)= a·b` for the row-major `m × rs` matrix `dst`, with
/// `a` (`m × depth`) and `b` (`depth × cols.len()`) read through their
/// (row, column) strides: gemm's column block for the types it multiplies
/// (split across threads), bf16 in f32 and rounded once, as `matmul` does.
fn product_columns<T: FloatDType>(
    dst: &mut [T],
    (m, rs): (usize, usize),
    (cols, depth): (Range<usize>, usize),
    a: (&[T], usize, usize),
    b: (&[T], usize, usize),
    accumulate: bool,
) -> Result<()> {
    if T::DTYPE != DType::BF16 {
        let mut blocks = column_blocks(dst, (m, rs), std::slice::from_ref(&cols))?;
        return blocks[0].gemm((0..cols.len(), depth), a, b, (accumulate, true));
    }
    let n = cols.len();
    let wide = |(s, r, c): (&[T], usize, usize), rows: usize, width: usize| -> Vec<f32> {
        (0..rows * width)
            .map(|i| WithDType::to_f64(s[i / width * r + i % width * c]) as f32)
            .collect()
    };
    let (a32, b32) = (wide(a, m, depth), wide(b, depth, n));
    let mut d32: Vec<f32> = match accumulate {
        true => wide((&dst[cols.start..], rs, 1), m, n),
        false => vec![0.0; m * n],
    };
    gemm_slices(
        &mut d32,
        (m, n, depth),
        (&a32, depth, 1),
        (&b32, n, 1),
        (accumulate, true),
    )?;
    for (i, v) in d32.into_iter().enumerate() {
        dst[i / n * rs + cols.start + i % n] = <T as WithDType>::from_f64(f64::from(v));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_is_cut_into_groups_where_one_fits_else_within_a_group() {
        let g = ConvGeom {
            n: 2,
            cin: 8,
            h: 6,
            w: 5,
            cout: 4,
            kh: 3,
            kw: 3,
            stride: [1, 1],
            pad: [1, 1],
            dil: [1, 1],
            groups: 4,
            oh: 6,
            ow: 5,
        };
        // k = 2·9 = 18, l = 30: a group's columns are 540, an item's 2,160.
        assert_eq!(pieces(&g, 2160), None);
        assert_eq!(pieces(&g, 5000), None);
        assert_eq!(pieces(&g, 2159), Some(Pieces::Groups(3)));
        assert_eq!(pieces(&g, 540), Some(Pieces::Groups(1)));
        assert_eq!(pieces(&g, 539), Some(Pieces::InGroup));
        assert_eq!(pieces(&g, 30), Some(Pieces::InGroup));
    }

    #[test]
    fn pieces_cover_the_range_in_order_and_none_is_one_element_long() {
        let lens = |len, most| -> Vec<usize> {
            let p = piece_ranges(len, most);
            assert_eq!(p.first().map_or(0, |r| r.start), 0);
            assert!(p.windows(2).all(|w| w[0].end == w[1].start));
            assert_eq!(p.last().map_or(0, |r| r.end), len);
            p.iter().map(|r| r.len()).collect()
        };
        assert_eq!(lens(45, 4), [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 3, 2]);
        assert_eq!(lens(45, 3), [3; 15]);
        assert_eq!(lens(10, 3), [3, 3, 2, 2]);
        assert_eq!(lens(7, 10), [7]);
        assert_eq!(lens(1, 3), [1]);
        assert_eq!(lens(0, 3), Vec::<usize>::new());
    }
}
