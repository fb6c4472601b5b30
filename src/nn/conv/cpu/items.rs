//! Convolution products that cover several batch items at once, inside the
//! column buffer of one item (so the ledger is that of the one-item
//! products): an item of a late ResNet layer has only 7·7 or 4·4 output
//! positions, too few columns for the gemm kernel's tiles, and a product
//! per item reads the whole weight for each of them.

use super::ConvGeom;
use super::{
    fill_bias, fold_row, for_chunks, neutral_padding, on_meta, slice, slice_mut, unfold_into,
    unfold_items, view,
};
use crate::dtype::CpuData;
use crate::primitives::{gemm_slices, gemm_slices_strided, matmul_into};
use crate::tensor::{Layout, Tensor};
use crate::{DType, Error, FloatDType, Result};
use half::{bf16, f16};
use std::ops::Range;

/// Output positions one batched forward product aims at: enough for the
/// gemm kernel to run whole tiles and to read the weight once for several
/// items rather than once per item (an item of a late ResNet layer has
/// only 7·7 or 4·4 positions).
pub(super) const BATCH_POSITIONS: usize = 384;

/// How many batch items one forward product covers: about
/// [`BATCH_POSITIONS`] positions, at most the `n` items left, and at most
/// `k / cout` (the product's `[cout, items·oh·ow]` result is reordered
/// through the column buffer, which holds `k·oh·ow` elements). Grouped
/// convolutions and large items run one item per product, and so do half
/// types: each slice's partial sums are added into the output in its dtype,
/// which is reassociation only in f32/f64 but would round a half type once
/// per slice (10% L2 after four bf16 layers).
pub(super) fn batch_items(g: &ConvGeom, n: usize, dtype: DType) -> usize {
    let wide = matches!(dtype, DType::F32 | DType::F64);
    if g.groups != 1 || g.l() == 0 || g.cout == 0 || !wide {
        return 1;
    }
    BATCH_POSITIONS
        .div_ceil(g.l())
        .min(g.k() / g.cout)
        .min(n)
        .max(1)
}

/// The forward of the batch items `items` (more than one; groups of 1) in
/// the column buffer of one item: the column rows are split into as many
/// slices as there are items, each slice is unfolded for all the items side
/// by side (`[rows/items, items·oh·ow]`, the buffer's size) and multiplied
/// by the weight's matching columns, accumulating into the items' outputs
/// held as one `[cout, items·oh·ow]` matrix in the output's own storage;
/// that matrix is then reordered to `[items, cout, oh·ow]` through the
/// column buffer. The sums over the column rows are split at the slices
/// (the same terms, added in another grouping than one product per item).
pub(super) fn forward_items(
    (x, xs): (&Tensor, usize),
    (w, ws): (&Tensor, usize),
    bias: Option<(&Tensor, usize)>,
    out: &Tensor,
    cols: &Tensor,
    g: &ConvGeom,
    items: Range<usize>,
) -> Result<()> {
    let (k, l, cout, nb) = (g.k(), g.l(), g.cout, items.len());
    let (width, start) = (nb * l, items.start * cout * l);
    let wide = view(out, &[cout, width], start);
    // Asked first: the op the ledger notes last before the column buffer is
    // freed is then the last product's, as when each item has its own.
    let meta = on_meta("conv2d", &[out, cols])?;
    if let Some((b, bs)) = bias {
        if !on_meta("conv2d", &[out, b])? {
            let bd = b.storage().cpu()?;
            let mut od = out.storage().cpu_mut()?;
            let range = start..start + cout * width;
            by_dtype!(
                x.dtype(),
                fill_bias(&mut od, range, &bd, bs..bs + cout, width)
            )?;
        }
    }
    let slice_rows = k / nb;
    for r0 in (0..k).step_by(slice_rows) {
        let rows = r0..(r0 + slice_rows).min(k);
        let first = xs + items.start * g.cin * g.h * g.w;
        unfold_items(x, first, cols, g, rows.clone(), nb)?;
        let wr = w.view_with_layout(Layout::from_parts(
            vec![cout, rows.len()],
            vec![k, 1],
            ws + r0,
        ));
        let cr = view(cols, &[rows.len(), width], 0);
        matmul_into(&wide, &wr, &cr, r0 > 0 || bias.is_some())?;
    }
    if meta {
        return Ok(());
    }
    let mut od = out.storage().cpu_mut()?;
    let mut cd = cols.storage().cpu_mut()?;
    by_dtype!(
        x.dtype(),
        wide_to_items(&mut od, start, &mut cd, (cout, nb, l))
    )
}

/// Reorders `out[start..]`, holding `[cout, items·l]`, to `[items, cout,
/// l]`, through the front of `scratch`.
fn wide_to_items<T: FloatDType>(
    out: &mut CpuData,
    start: usize,
    scratch: &mut CpuData,
    (cout, items, l): (usize, usize, usize),
) -> Result<()> {
    let len = cout * items * l;
    let out = slice_mut::<T>(out, start..start + len)?;
    let tmp = slice_mut::<T>(scratch, 0..len)?;
    tmp.copy_from_slice(out);
    for (c, channel) in tmp.chunks(items * l).enumerate() {
        for (i, src) in channel.chunks(l).enumerate() {
            out[(i * cout + c) * l..][..l].copy_from_slice(src);
        }
    }
    Ok(())
}

/// Column rows the input gradient's products take at least per slice (a
/// thinner slice would make each product's depth too small).
const MIN_SLICE_ROWS: usize = 128;

/// How many batch items one input-gradient product covers (1: one product
/// per item). The column buffer of one item (`k·oh·ow` elements) holds the
/// items' output gradients as one `[cout, items·oh·ow]` matrix and a slice
/// of at least [`MIN_SLICE_ROWS`] column rows for every item; about
/// [`BATCH_POSITIONS`] positions, the batch split into equal chunks. Groups
/// of 1 and the dtypes gemm multiplies natively (f32, f64, f16) only.
pub(super) fn input_grad_items(g: &ConvGeom, n: usize, dtype: DType) -> usize {
    let native = matches!(dtype, DType::F32 | DType::F64 | DType::F16);
    if g.groups != 1 || g.l() == 0 || g.cout == 0 || !native || n < 2 {
        return 1;
    }
    let most = BATCH_POSITIONS
        .div_ceil(g.l())
        .min(g.k() / (g.cout + MIN_SLICE_ROWS))
        .min(n);
    if most < 2 {
        return 1;
    }
    // Equal chunks: 8 items at most 6 per product run as 4 + 4.
    n.div_ceil(n.div_ceil(most))
}

/// The input gradient of the batch items `items` (see
/// [`input_grad_items`]): the items' output gradients are copied side by
/// side into the front of the column buffer (`[cout, items·oh·ow]`); then,
/// slice by slice of the column rows, `cols = W[:, rows]ᵀ · gy` for all the
/// items in one product, folded back into each item's input gradient. Each
/// input position receives its taps in the order of the one-item fold
/// (ascending column rows), and each column value is the same sum over the
/// output channels.
pub(super) fn input_grad_of_items(
    (gy, gs): (&Tensor, usize),
    (w, ws): (&Tensor, usize),
    gx: &Tensor,
    cols: &Tensor,
    g: &ConvGeom,
    items: Range<usize>,
) -> Result<()> {
    if on_meta("conv2d_backward", &[gy, gx, cols])? {
        crate::meta::touch(gx);
        return Ok(());
    }
    let (l, cout, item) = (g.l(), g.cout, g.cin * g.h * g.w);
    let gyd = gy.storage().cpu()?;
    let wd = w.storage().cpu()?;
    let mut cd = cols.storage().cpu_mut()?;
    let mut xd = gx.storage().cpu_mut()?;
    let gy_range = gs + items.start * cout * l..gs + items.end * cout * l;
    let gx_range = items.start * item..items.end * item;
    let w_range = ws..ws + cout * g.k();
    fn go<T: FloatDType>(
        (gy, w, cols, gx): (&CpuData, &CpuData, &mut CpuData, &mut CpuData),
        (gy_range, w_range, gx_range): (Range<usize>, Range<usize>, Range<usize>),
        g: &ConvGeom,
        nb: usize,
    ) -> Result<()> {
        let (k, l, cout) = (g.k(), g.l(), g.cout);
        let width = nb * l;
        let gy = slice::<T>(gy, gy_range)?;
        let w = slice::<T>(w, w_range)?;
        let n = cols.len();
        let (wide, rest) = slice_mut::<T>(cols, 0..n)?.split_at_mut(cout * width);
        let gx = slice_mut::<T>(gx, gx_range)?;
        side_by_side(gy, wide, (cout, l));
        let slice_rows = rest.len() / width;
        for r0 in (0..k).step_by(slice_rows) {
            let rows = r0..(r0 + slice_rows).min(k);
            let dst = &mut rest[..rows.len() * width];
            // W[:, rows]ᵀ: element (r, c) at w[c·k + r0 + r].
            let wt = (&w[r0..], 1, k);
            gemm_slices(
                dst,
                (rows.len(), width, cout),
                wt,
                (&*wide, width, 1),
                false,
            )?;
            neutral_padding(dst, g, rows.clone(), width);
            fold_rows(dst, gx, g, rows, nb);
        }
        Ok(())
    }
    let bufs = (&*gyd, &*wd, &mut *cd, &mut *xd);
    let ranges = (gy_range, w_range, gx_range);
    match gy.dtype() {
        DType::F32 => go::<f32>(bufs, ranges, g, items.len()),
        DType::F64 => go::<f64>(bufs, ranges, g, items.len()),
        DType::F16 => go::<f16>(bufs, ranges, g, items.len()),
        dtype => Err(Error::UnsupportedDType {
            op: "conv2d_backward",
            dtype,
        }),
    }
}

/// Folds the column rows `rows` of `items` items (`cols`: `[rows,
/// items·oh·ow]`, the items side by side) back into their input gradients
/// `gx` (`[items, cin, h, w]`), adding each plane's taps in ascending row
/// order.
fn fold_rows<T: FloatDType>(
    cols: &[T],
    gx: &mut [T],
    g: &ConvGeom,
    rows: Range<usize>,
    items: usize,
) {
    let (kk, l, width) = (g.kh * g.kw, g.l(), items * g.l());
    for_chunks(gx, g.h * g.w, |p, plane| {
        let (b, c) = (p / g.cin, p % g.cin);
        let taps = (c * kk).max(rows.start)..((c + 1) * kk).min(rows.end);
        for r in taps {
            let row = &cols[(r - rows.start) * width + b * l..][..l];
            fold_row(row, plane, g, r % kk / g.kw, r % g.kw);
        }
    });
}

/// The weight gradient's share of the batch items `items` (see
/// [`input_grad_items`], whose buffer layout it shares): the items' output
/// gradients are copied side by side into the front of the column buffer
/// (`[cout, items·oh·ow]`); then, slice by slice of the column rows, the
/// rows are unfolded for all the items side by side and
/// `gW[:, rows] (+)= gy · cols[rows]ᵀ` is one product of depth
/// `items·oh·ow`, where one product per item would read and write the
/// whole `[cout, k]` gradient for only `oh·ow` terms each. The sums over
/// the items are added in another grouping (reassociation only).
pub(super) fn weight_grad_of_items(
    (gy, gs): (&Tensor, usize),
    (x, xs): (&Tensor, usize),
    gw: &Tensor,
    cols: &Tensor,
    g: &ConvGeom,
    items: Range<usize>,
) -> Result<()> {
    // The op the ledger notes last before the column buffer is freed is the
    // products', as when each item has its own (`matmul_into`).
    if on_meta("matmul_into", &[gy, x, gw, cols])? {
        crate::meta::touch(gw);
        return Ok(());
    }
    let (l, cout, item) = (g.l(), g.cout, g.cin * g.h * g.w);
    let gyd = gy.storage().cpu()?;
    let xd = x.storage().cpu()?;
    let mut cd = cols.storage().cpu_mut()?;
    let mut wd = gw.storage().cpu_mut()?;
    let gy_range = gs + items.start * cout * l..gs + items.end * cout * l;
    let x_range = xs + items.start * item..xs + items.end * item;
    let accumulate = items.start > 0;
    fn go<T: FloatDType>(
        (gy, x, cols, gw): (&CpuData, &CpuData, &mut CpuData, &mut CpuData),
        (gy_range, x_range): (Range<usize>, Range<usize>),
        g: &ConvGeom,
        (nb, accumulate): (usize, bool),
    ) -> Result<()> {
        let (k, l, cout) = (g.k(), g.l(), g.cout);
        let width = nb * l;
        let gy = slice::<T>(gy, gy_range)?;
        let x = slice::<T>(x, x_range)?;
        let n = cols.len();
        let (wide, rest) = slice_mut::<T>(cols, 0..n)?.split_at_mut(cout * width);
        let gw = slice_mut::<T>(gw, 0..cout * k)?;
        side_by_side(gy, wide, (cout, l));
        let slice_rows = rest.len() / width;
        for r0 in (0..k).step_by(slice_rows) {
            let rows = r0..(r0 + slice_rows).min(k);
            let band = &mut rest[..rows.len() * width];
            unfold_into(x, band, g, rows.clone());
            // cols[rows]ᵀ: element (p, r) at band[r·width + p].
            gemm_slices_strided(
                (&mut gw[r0..], k),
                (cout, rows.len(), width),
                (&*wide, width, 1),
                (&*band, 1, width),
                accumulate,
            )?;
        }
        Ok(())
    }
    let bufs = (&*gyd, &*xd, &mut *cd, &mut *wd);
    let nb = (items.len(), accumulate);
    match gy.dtype() {
        DType::F32 => go::<f32>(bufs, (gy_range, x_range), g, nb),
        DType::F64 => go::<f64>(bufs, (gy_range, x_range), g, nb),
        DType::F16 => go::<f16>(bufs, (gy_range, x_range), g, nb),
        dtype => Err(Error::UnsupportedDType {
            op: "conv2d_weight_grad",
            dtype,
        }),
    }
}

/// Copies the items' output gradients `gy` (`[items, cout, l]`) into
/// `wide` as one `[cout, items·l]` matrix (the items side by side).
fn side_by_side<T: Copy>(gy: &[T], wide: &mut [T], (cout, l): (usize, usize)) {
    let width = gy.len() / cout.max(1);
    for (b, item) in gy.chunks(cout * l).enumerate() {
        for (c, src) in item.chunks(l).enumerate() {
            wide[c * width + b * l..][..l].copy_from_slice(src);
        }
    }
}
