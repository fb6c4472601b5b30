//! Convolution products that cover several batch items at once, inside the
//! column buffer of one item (so the ledger is that of the one-item
//! products): an item of a late ResNet layer has only 7·7 or 4·4 output
//! positions, too few columns for the gemm kernel's tiles, and a product
//! per item reads the whole weight for each of them.

use super::ConvGeom;
use super::{
    fold_row, for_chunks, neutral_padding, on_meta, read_both, slice, slice_mut, unfold_into,
    unfold_items, view,
};
use crate::dtype::CpuData;
use crate::primitives::{adds_alike, column_blocks, gemm_slices, matmul_into};
use crate::tensor::{Layout, Tensor};
use crate::{DType, Error, FloatDType, Result, WithDType};
use half::{bf16, f16};
use rayon::prelude::*;
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
    if !on_meta("conv2d", &[out, cols])? {
        return forward_items_cpu((x, xs), (w, ws), bias, out, cols, g, items);
    }
    // Meta: the same buffers touched, and the products' op noted last (as
    // the CPU run notes it), so the ledger moves as on the CPU.
    let (k, l, cout, nb) = (g.k(), g.l(), g.cout, items.len());
    let wide = view(out, &[cout, nb * l], items.start * cout * l);
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
        let cr = view(cols, &[rows.len(), nb * l], 0);
        matmul_into(&wide, &wr, &cr, r0 > 0 || bias.is_some())?;
    }
    Ok(())
}

/// [`forward_items`] on the CPU, in lanes: the items are split into one
/// consecutive range per rayon thread, each with its own part of the
/// column buffer (its share of the slice's columns) and its own outputs,
/// and each lane runs the whole pipeline (unfold a slice, multiply, and
/// finally reorder its outputs) without waiting for the others. The
/// slices are those of the whole product, and lanes are used only where
/// gemm adds a lane's columns like the whole product's ([`adds_alike`]),
/// so the values are the same for any thread count.
fn forward_items_cpu(
    (x, xs): (&Tensor, usize),
    (w, ws): (&Tensor, usize),
    bias: Option<(&Tensor, usize)>,
    out: &Tensor,
    cols: &Tensor,
    g: &ConvGeom,
    items: Range<usize>,
) -> Result<()> {
    // The op the ledger notes last before the column buffer is freed.
    crate::memory::note_op("matmul_into");
    let (cout, l, item) = (g.cout, g.l(), g.cin * g.h * g.w);
    let nb = items.len();
    let (xd, wd) = read_both(x, w)?;
    let wd: &CpuData = wd.as_deref().unwrap_or(&xd);
    let mut od = out.storage().cpu_mut()?;
    let mut cd = cols.storage().cpu_mut()?;
    let x_range = xs + items.start * item..xs + items.end * item;
    let out_range = items.start * cout * l..items.end * cout * l;
    fn go<T: FloatDType>(
        (x, w, bias, out, cols): (
            &CpuData,
            &CpuData,
            Option<Vec<f64>>,
            &mut CpuData,
            &mut CpuData,
        ),
        (x_range, ws, out_range): (Range<usize>, usize, Range<usize>),
        g: &ConvGeom,
        nb: usize,
    ) -> Result<()> {
        let (k, l, cout) = (g.k(), g.l(), g.cout);
        let x = slice::<T>(x, x_range)?;
        let w = slice::<T>(w, ws..ws + cout * k)?;
        let bias: Option<Vec<T>> = bias.map(|b| b.iter().map(|&v| T::from_f64(v)).collect());
        let out = slice_mut::<T>(out, out_range)?;
        let slice_rows = k / nb;
        let cols = slice_mut::<T>(cols, 0..slice_rows * nb * l)?;
        // Every slice's depth: slice_rows, and the last one's.
        let last = k - (k.div_ceil(slice_rows) - 1) * slice_rows;
        let alike = |lanes: &[Range<usize>]| {
            lanes.iter().all(|r| {
                [slice_rows, last]
                    .iter()
                    .all(|&d| adds_alike((cout, nb * l, d), (cout, r.len() * l, d)))
            })
        };
        // One lane (whose products may be split) when lanes would add
        // otherwise.
        let lanes = lane_ranges(nb).filter(|lanes| alike(lanes));
        let split = lanes.is_none();
        let lanes = lanes.unwrap_or_else(|| std::iter::once(0..nb).collect());
        let item = g.cin * g.h * g.w;
        let parts = split_lanes(&lanes, (out, cout * l), (cols, slice_rows * l));
        parts
            .into_par_iter()
            .zip(lanes)
            .try_for_each(|((out, cols), r)| {
                let x = &x[r.start * item..r.end * item];
                forward_lane((x, w, bias.as_deref()), out, cols, g, (slice_rows, split))
            })
    }
    // The bias as f64 (exact for every float dtype), copied out of its
    // storage, which may be the weight's.
    let bias = match bias {
        Some((b, bs)) => {
            let bd = b.storage().cpu()?;
            Some(by_dtype!(x.dtype(), bias_values(&bd, bs..bs + cout))?)
        }
        None => None,
    };
    let bufs = (&*xd, wd, bias, &mut *od, &mut *cd);
    let ranges = (x_range, ws, out_range);
    match x.dtype() {
        DType::F32 => go::<f32>(bufs, ranges, g, nb),
        DType::F64 => go::<f64>(bufs, ranges, g, nb),
        dtype => Err(Error::UnsupportedDType {
            op: "conv2d",
            dtype,
        }),
    }
}

/// `b[range]` as f64.
fn bias_values<T: FloatDType>(b: &CpuData, range: Range<usize>) -> Result<Vec<f64>> {
    Ok(slice::<T>(b, range)?
        .iter()
        .map(|&v| WithDType::to_f64(v))
        .collect())
}

/// `0..n` (batch items, channels or column rows) as one consecutive range
/// per rayon thread (near-equal), or `None` with one thread or `n` < 2.
fn lane_ranges(nb: usize) -> Option<Vec<Range<usize>>> {
    let lanes = rayon::current_num_threads().min(nb);
    (lanes > 1).then(|| {
        (0..lanes)
            .map(|j| nb * j / lanes..nb * (j + 1) / lanes)
            .collect()
    })
}

/// Splits two buffers into the lanes' disjoint parts: `per` elements of
/// each per unit (item or channel) of the lane. (What the lanes only read
/// is sliced by their ranges.)
fn split_lanes<'a, T>(
    lanes: &[Range<usize>],
    (mut a, a_per): (&'a mut [T], usize),
    (mut b, b_per): (&'a mut [T], usize),
) -> Vec<(&'a mut [T], &'a mut [T])> {
    let mut parts = Vec::with_capacity(lanes.len());
    for r in lanes {
        let (aj, ar) = std::mem::take(&mut a).split_at_mut(r.len() * a_per);
        let (bj, br) = std::mem::take(&mut b).split_at_mut(r.len() * b_per);
        parts.push((aj, bj));
        (a, b) = (ar, br);
    }
    parts
}

/// One lane of [`forward_items_cpu`]: its items' outputs `out` (`[items,
/// cout, l]`) computed as one `[cout, items·l]` matrix in place (the bias
/// first, then for each slice of the column rows: unfold the slice for the
/// lane's items side by side, multiply by the weight's matching columns,
/// accumulate), then reordered to `[items, cout, l]` through the front of
/// `cols`. `split`: the products may be split across threads (one lane).
fn forward_lane<T: FloatDType>(
    (x, w, bias): (&[T], &[T], Option<&[T]>),
    out: &mut [T],
    cols: &mut [T],
    g: &ConvGeom,
    (slice_rows, split): (usize, bool),
) -> Result<()> {
    let (k, l, cout) = (g.k(), g.l(), g.cout);
    let width = out.len() / cout;
    if let Some(b) = bias {
        for (row, &v) in out.chunks_mut(width).zip(b) {
            row.fill(v);
        }
    }
    for r0 in (0..k).step_by(slice_rows) {
        let rows = r0..(r0 + slice_rows).min(k);
        let band = &mut cols[..rows.len() * width];
        unfold_into(x, band, g, rows.clone());
        let accumulate = r0 > 0 || bias.is_some();
        gemm_slices(
            out,
            (cout, width, rows.len()),
            (&w[r0..], k, 1),
            (&*band, width, 1),
            (accumulate, split),
        )?;
    }
    let tmp = &mut cols[..out.len()];
    tmp.copy_from_slice(out);
    for (c, channel) in tmp.chunks(width).enumerate() {
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
        let gy = slice::<T>(gy, gy_range)?;
        let w = slice::<T>(w, w_range)?;
        let n = cols.len();
        let cols = slice_mut::<T>(cols, 0..n)?;
        let gx = slice_mut::<T>(gx, gx_range)?;
        // Each lane takes its items' share of the buffer (whole items'
        // worth, so its column slices are as deep as the whole product's
        // or one row less).
        let per_item = n / nb;
        // The products' shapes (the first slice's and the last's) for
        // `items` items in `len` elements of the buffer.
        let shapes = |items: usize, len: usize| {
            let width = items * l;
            let slice_rows = len.saturating_sub(cout * width) / width;
            let last = k - (k.div_ceil(slice_rows.max(1)) - 1) * slice_rows;
            [(slice_rows, width, cout), (last, width, cout)]
        };
        let whole = shapes(nb, n)[0];
        let lanes = lane_ranges(nb).filter(|lanes| {
            lanes
                .iter()
                .flat_map(|r| shapes(r.len(), per_item * r.len()))
                .chain(shapes(nb, n))
                .all(|s| s.0 > 0 && adds_alike(whole, s))
        });
        let Some(lanes) = lanes else {
            return input_grad_lane((gy, w), gx, cols, g, true);
        };
        let item = g.cin * g.h * g.w;
        let parts = split_lanes(&lanes, (gx, item), (cols, per_item));
        parts
            .into_par_iter()
            .zip(lanes)
            .try_for_each(|((gx, cols), r)| {
                let gy = &gy[r.start * cout * l..r.end * cout * l];
                input_grad_lane((gy, w), gx, cols, g, false)
            })
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

/// One lane of [`input_grad_of_items`]: its items' output gradients `gy`
/// (`[items, cout, l]`) side by side at the front of `cols`, then slice by
/// slice of the column rows (as many as the rest of `cols` holds):
/// `W[:, rows]ᵀ · gy`, folded into the items' input gradients `gx`.
/// `split`: the products may be split across threads (one lane).
fn input_grad_lane<T: FloatDType>(
    (gy, w): (&[T], &[T]),
    gx: &mut [T],
    cols: &mut [T],
    g: &ConvGeom,
    split: bool,
) -> Result<()> {
    let (k, l, cout) = (g.k(), g.l(), g.cout);
    let nb = gy.len() / (cout * l);
    let width = nb * l;
    let (wide, rest) = cols.split_at_mut(cout * width);
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
            (false, split),
        )?;
        neutral_padding(dst, g, rows.clone(), width);
        fold_rows(dst, gx, g, rows, nb);
    }
    Ok(())
}

/// The input gradient of the one batch item `item` (groups of 1, f32, f64
/// or f16) on the CPU, in lanes of input channels, one per rayon thread:
/// each lane computes its channels' column rows (`W[:, rows]ᵀ · gy`, rows
/// `c0·kh·kw..c1·kh·kw` of the one-item buffer) and folds them into its
/// channels' planes of `gx`, without waiting for the other lanes. Returns
/// `false` (nothing done) on meta, for other dtypes, or where gemm would
/// add a lane's rows otherwise than the whole product's (one product and
/// col2im then run instead: the same values).
pub(super) fn input_grad_of_item_in_lanes(
    (gy, gs): (&Tensor, usize),
    (w, ws): (&Tensor, usize),
    gx: &Tensor,
    cols: &Tensor,
    g: &ConvGeom,
    item: usize,
) -> Result<bool> {
    let (k, l, cout, kk) = (g.k(), g.l(), g.cout, g.kh * g.kw);
    let native = matches!(gy.dtype(), DType::F32 | DType::F64 | DType::F16);
    let Some(lanes) = lane_ranges(g.cin) else {
        return Ok(false);
    };
    let alike = lanes
        .iter()
        .all(|r| adds_alike((k, l, cout), (r.len() * kk, l, cout)));
    if g.groups != 1 || !native || !alike || gy.shares_storage_with(w) {
        return Ok(false);
    }
    if on_meta("conv2d_backward", &[gy, gx, cols])? {
        return Ok(false);
    }
    let plane = g.h * g.w;
    let gyd = gy.storage().cpu()?;
    let wd = w.storage().cpu()?;
    let mut cd = cols.storage().cpu_mut()?;
    let mut xd = gx.storage().cpu_mut()?;
    let gy_range = gs + item * cout * l..gs + (item + 1) * cout * l;
    let gx_range = item * g.cin * plane..(item + 1) * g.cin * plane;
    fn go<T: FloatDType>(
        (gy, w, cols, gx): (&CpuData, &CpuData, &mut CpuData, &mut CpuData),
        (gy_range, ws, gx_range): (Range<usize>, usize, Range<usize>),
        g: &ConvGeom,
        lanes: &[Range<usize>],
    ) -> Result<()> {
        let (k, l, cout, kk) = (g.k(), g.l(), g.cout, g.kh * g.kw);
        let gy = slice::<T>(gy, gy_range)?;
        let w = slice::<T>(w, ws..ws + cout * k)?;
        let cols = slice_mut::<T>(cols, 0..k * l)?;
        let gx = slice_mut::<T>(gx, gx_range)?;
        let plane = g.h * g.w;
        // Each lane's channels: its column rows and its input planes.
        let parts = split_lanes(lanes, (cols, kk * l), (gx, plane));
        parts
            .into_par_iter()
            .zip(lanes)
            .try_for_each(|((dst, gx), c)| {
                let rows = c.start * kk..c.end * kk;
                // W[:, rows]ᵀ: element (r, c) at w[c·k + rows.start + r].
                gemm_slices(
                    dst,
                    (rows.len(), l, cout),
                    (&w[rows.start..], 1, k),
                    (gy, l, 1),
                    (false, false),
                )?;
                neutral_padding(dst, g, rows.clone(), l);
                for (c, plane) in gx.chunks_mut(plane).enumerate() {
                    let taps = &dst[c * kk * l..][..kk * l];
                    for (t, row) in taps.chunks(l).enumerate() {
                        fold_row(row, plane, g, t / g.kw, t % g.kw);
                    }
                }
                Ok(())
            })
    }
    let bufs = (&*gyd, &*wd, &mut *cd, &mut *xd);
    let ranges = (gy_range, ws, gx_range);
    match gy.dtype() {
        DType::F32 => go::<f32>(bufs, ranges, g, &lanes),
        DType::F64 => go::<f64>(bufs, ranges, g, &lanes),
        DType::F16 => go::<f16>(bufs, ranges, g, &lanes),
        dtype => Err(Error::UnsupportedDType {
            op: "conv2d_backward",
            dtype,
        }),
    }?;
    Ok(true)
}

/// Folds the column rows `rows` of `items` items (`cols`: `[rows,
/// items·oh·ow]`, the items side by side) back into their input gradients
/// `gx` (`[items, cin, h, w]`), adding each plane's taps in ascending row
/// order.
pub(super) fn fold_rows<T: FloatDType>(
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
        // The column buffer's share (the rest is the CUDA kernels' room).
        let n = g.column_buffer_len(T::DTYPE);
        let (wide, rest) = slice_mut::<T>(cols, 0..n)?.split_at_mut(cout * width);
        let gw = slice_mut::<T>(gw, 0..cout * k)?;
        side_by_side(gy, wide, (cout, l));
        weight_grad_rows(&*wide, x, gw, rest, g, accumulate)
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

/// `gW (+)= gy · colsᵀ` over all the column rows: `gy` `[cout, width]`
/// (the items' output gradients side by side), `x` the items whose
/// unfolded rows (`[rows, width]`) are `cols`, `gw` `[cout, k]`, `buf` the
/// scratch the rows are unfolded into, as many at a time as it holds.
/// With several rayon threads the rows run in lanes (one contiguous range
/// of rows per thread, each with its share of `buf` and its own columns of
/// `gw`), where gemm adds each lane's products like the one-lane ones
/// ([`adds_alike`]); else one lane, whose products may be split.
fn weight_grad_rows<T: FloatDType>(
    gy: &[T],
    x: &[T],
    gw: &mut [T],
    buf: &mut [T],
    g: &ConvGeom,
    accumulate: bool,
) -> Result<()> {
    let (k, cout) = (g.k(), g.cout);
    let width = gy.len() / cout;
    // A lane of `rows` rows in `len` elements of `buf`: its slices' rows,
    // and its products' shapes (the first and the last).
    let shapes = |rows: usize, len: usize| {
        let slice_rows = (len / width).min(rows);
        let last = rows - (rows.div_ceil(slice_rows.max(1)) - 1) * slice_rows;
        (slice_rows, [(cout, slice_rows, width), (cout, last, width)])
    };
    let whole = shapes(k, buf.len()).1;
    let lanes = lane_ranges(k).filter(|lanes| {
        let part = buf.len() / lanes.len();
        lanes.iter().all(|r| {
            let (rows, lane) = shapes(r.len(), part);
            rows > 0 && whole.iter().chain(&lane).all(|&s| adds_alike(whole[0], s))
        })
    });
    // One lane (whose products may be split) when lanes would add
    // otherwise.
    let split = lanes.is_none();
    let lanes = lanes.unwrap_or_else(|| std::iter::once(0..k).collect());
    let part = buf.len() / lanes.len();
    let blocks = column_blocks(gw, (cout, k), &lanes)?;
    let parts: Vec<_> = buf.chunks_mut(part.max(1)).zip(blocks).zip(lanes).collect();
    parts
        .into_par_iter()
        .try_for_each(|((buf, mut block), lane)| {
            let (slice_rows, _) = shapes(lane.len(), part);
            for r0 in lane.clone().step_by(slice_rows.max(1)) {
                let rows = r0..(r0 + slice_rows).min(lane.end);
                let band = &mut buf[..rows.len() * width];
                unfold_into(x, band, g, rows.clone());
                // cols[rows]ᵀ: element (p, r) at band[r·width + p].
                let cols = rows.start - lane.start..rows.end - lane.start;
                block.gemm(
                    (cols, width),
                    (gy, width, 1),
                    (&*band, 1, width),
                    (accumulate, split),
                )?;
            }
            Ok(())
        })
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
