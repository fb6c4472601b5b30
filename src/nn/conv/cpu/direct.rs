//! Direct 3×3 convolutions (stride 1, padding 1, one group, f32) on AVX2 +
//! FMA: the forward of ResNet's 3×3 layers and their input gradient (which
//! is the same convolution of `gy` by the weight flipped and transposed).
//!
//! im2col first copies the input nine times into the column buffer and then
//! multiplies through the padded taps as well: 9% of the multiply-adds on a
//! 14×14 plane, 18% on 7×7 and 31% on 4×4. Here a tile of output pixels (a
//! few of one row; on narrow planes a few of one column, or the same pixel
//! of a few items) is held in registers for 16 output channels while the
//! input's values are read where they lie; taps that fall on the padding
//! are not computed at all. A column tile of five pixels keeps the two FMA
//! pipes busy where a 7-wide row would be cut into tiles of four and
//! three.
//!
//! Work goes in tasks of 32 output channels and some items, as many tasks
//! at once as rayon has threads. A task packs its weights a chunk of input
//! channels at a time (`[half][chan][tap][16]`, 18 KB: it stays in L1 while
//! every tile reads it) and keeps its outputs as `[item][pixel][32]`, so
//! that a tile's partial sums are two vector loads and stores per pixel
//! between chunks; the finished outputs are then written to `[item][chan]
//! [pixel]`. Both buffers are cut from the column buffer that im2col would
//! have used: the workspace, its size and the ledger are those of the
//! im2col path.
//!
//! On AVX-512 a tile holds all 32 output channels (two 16-lane vectors per
//! pixel) for up to twelve pixels: 24 accumulators of the 32 registers,
//! enough independent multiply-adds for a Xeon's two 512-bit FMA units.
//!
//! Every output element adds its terms in one order, input channel by input
//! channel and tap by tap (row-major), starting from zero or from the bias,
//! with fused multiply-adds: the chunks, item groups and threads change
//! where a partial sum is kept, never the order, so the values do not
//! depend on the thread count.

use super::ConvGeom;
use crate::primitives::avx2_fma;
use std::ops::Range;

/// Output channels of one task (two halves of 16: two AVX vectors).
const BLOCK: usize = 32;
/// Output channels one kernel pass holds per pixel.
const HALF: usize = 16;
/// Taps of a 3×3 kernel.
const TAPS: usize = 9;
/// Input channels packed per chunk: 32·9·16 f32 (18 KB) per half.
const CHUNK: usize = 32;
/// Output pixels a tile holds at most: ten accumulators of the sixteen AVX
/// registers, beside two weight vectors and the broadcast input (twelve
/// make the compiler spill).
const MAX_TILE: usize = 5;
/// The same on AVX-512, whose tiles hold both halves: 24 accumulators of
/// the 32 registers.
const MAX_TILE_512: usize = 12;
/// Planes this wide or wider are tiled along their rows; narrower ones
/// down their columns or across items (see [`tiles`]).
const ROW_TILES_FROM: usize = 8;
/// Bytes of one item's input chunk and outputs above which they do not
/// stay in cache from one output row to the next (half a typical 512 KB
/// L2): row tiles then prefetch what the next tile reads. On ResNet-18's
/// 56² layers this took a quarter off the time.
const PREFETCH_FROM: usize = 256 << 10;

/// Which weight a pass reads, and how it becomes the kernel's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pass {
    /// `y = conv(x, w)`: the kernel's `[outs, ins, 3, 3]` is `w` itself.
    Forward,
    /// `gx = conv(gy, w flipped)`: the kernel's `[o][i][t]` is `w[i][o][8 − t]`.
    InputGrad,
}

/// The sizes of one direct convolution: `input` `[n, ins, h, w]` into
/// `out` `[n, outs, h, w]`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Dims {
    /// Batch items.
    pub n: usize,
    /// Channels read.
    pub ins: usize,
    /// Channels written.
    pub outs: usize,
    /// Plane height.
    pub h: usize,
    /// Plane width.
    pub w: usize,
}

impl Dims {
    fn plane(&self) -> usize {
        self.h * self.w
    }
}

/// Whether `g` (with `outs` output channels for the pass) is a convolution
/// this module runs on this CPU: 3×3, stride 1, padding 1, no dilation, one
/// group, whole blocks of output channels, f32, AVX2 and FMA present.
pub(super) fn applies(g: &ConvGeom, outs: usize, f32_data: bool) -> bool {
    f32_data
        && g.groups == 1
        && (g.kh, g.kw) == (3, 3)
        && g.stride == [1, 1]
        && g.dil == [1, 1]
        && g.pad == [1, 1]
        && outs > 0
        && outs.is_multiple_of(BLOCK)
        && g.n > 0
        && g.h > 0
        && g.w > 0
        && avx2_fma()
}

/// How the lanes share the scratch: the packed chunk's channels, how many
/// lanes, how many whole items a lane's outputs hold at once, and how many
/// output rows (`band`: the plane's height for whole items).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sharing {
    chunk: usize,
    lanes: usize,
    group: usize,
    band: usize,
}

/// Planes wider than this may be cut into bands of rows when a lane's
/// share of the scratch holds less than an item: their one item's tiles
/// run along rows on either kernel (see [`layout`], [`widest_layout`]).
const BANDS_FROM_WIDTH: usize = 16;

/// How a task's buffers share `scratch` (at most `threads` lanes, each
/// with its packed weights and outputs): whole items where that lets as
/// many lanes run as bands of rows would, else bands of one item (on
/// planes wider than [`BANDS_FROM_WIDTH`]); `None` when one lane's buffers
/// for one row do not fit (the caller then runs im2col). Lanes are cut
/// down to what fits rather than falling back, so that the path (and with
/// it the values) never depends on the thread count.
fn sharing(d: &Dims, scratch: usize, threads: usize) -> Option<Sharing> {
    let chunk = d.ins.clamp(1, CHUNK);
    let packed = chunk * TAPS * BLOCK;
    let (item, row) = (d.plane() * BLOCK, d.w * BLOCK);
    let whole = (scratch / (packed + item)).min(threads);
    let banded = match d.w > BANDS_FROM_WIDTH {
        true => (scratch / (packed + row)).min(threads),
        false => 0,
    };
    let (lanes, group, band) = if whole >= banded {
        (
            whole,
            (scratch / whole.max(1)).saturating_sub(packed) / item,
            d.h,
        )
    } else {
        (banded, 1, ((scratch / banded - packed) / row).min(d.h))
    };
    (lanes > 0).then_some(Sharing {
        chunk,
        lanes,
        group,
        band,
    })
}

/// Whether [`run`] can work in a column buffer of `scratch` elements.
pub(super) fn fits(d: &Dims, scratch: usize) -> bool {
    sharing(d, scratch, 1).is_some()
}

/// One task: output channels `32b..32b + 32` of `items`, output rows
/// `rows` (all of them, or a band of one item).
struct Task {
    b: usize,
    items: Range<usize>,
    rows: Range<usize>,
}

impl Task {
    /// The pixels of one item the task holds.
    fn pixels(&self, d: Dims) -> Range<usize> {
        self.rows.start * d.w..self.rows.end * d.w
    }
}

/// The tasks of `d` for sharing `s`: each block of 32 output channels for
/// groups of whole items (split further when there are fewer blocks than
/// lanes), or for bands of rows of each item.
fn tasks(d: Dims, s: Sharing) -> Vec<Task> {
    let blocks = d.outs / BLOCK;
    if s.band < d.h {
        let bands: Vec<Range<usize>> = splits(d.h, s.band)
            .scan(0, |y, len| {
                *y += len;
                Some(*y - len..*y)
            })
            .collect();
        let mut tasks = Vec::with_capacity(blocks * d.n * bands.len());
        for b in 0..blocks {
            for i in 0..d.n {
                tasks.extend(bands.iter().map(|r| Task {
                    b,
                    items: i..i + 1,
                    rows: r.clone(),
                }));
            }
        }
        return tasks;
    }
    // Blocks first, and the items split too when there are fewer blocks
    // than lanes; then no task holds more items than a lane's buffer.
    let splits = s.lanes.div_ceil(blocks).min(d.n).max(d.n.div_ceil(s.group));
    (0..blocks)
        .flat_map(|b| {
            (0..splits).map(move |s| Task {
                b,
                items: d.n * s / splits..d.n * (s + 1) / splits,
                rows: 0..d.h,
            })
        })
        .filter(|t| !t.items.is_empty())
        .collect()
}

/// `out = conv(input, kernel)` (added to `out`'s values when `onto_out`, as
/// a bias written first) for the kernel that `pass` makes of `weight`, with
/// `scratch` for the packed weights and the tasks' outputs. The caller has
/// checked [`applies`] and [`fits`].
pub(super) fn run(
    (input, weight, out): (&[f32], &[f32], &mut [f32]),
    scratch: &mut [f32],
    d: Dims,
    pass: Pass,
    onto_out: bool,
) {
    let threads = rayon::current_num_threads();
    let wide = crate::primitives::avx512();
    let Some(share) = sharing(&d, scratch.len(), threads) else {
        return;
    };
    let chunk = share.chunk;
    let tasks = tasks(d, share);
    let lanes = share.lanes.min(tasks.len());
    let per_lane = scratch.len() / lanes;
    let out_at = OutPtr(out.as_mut_ptr());
    let lane = |(j, buf): (usize, &mut [f32])| {
        let (packed, acc) = buf.split_at_mut(chunk * TAPS * BLOCK);
        for t in tasks.iter().skip(j).step_by(lanes) {
            let acc = &mut acc[..t.items.len() * t.pixels(d).len() * BLOCK];
            let outs = &out_at;
            // SAFETY: tasks own disjoint (block, item) parts of `out`, and
            // `out` outlives the lanes.
            unsafe { outs.gather(acc, t, d, onto_out) };
            for c0 in (0..d.ins).step_by(chunk) {
                let chans = c0..(c0 + chunk).min(d.ins);
                pack(weight, packed, d, pass, t.b, chans.clone());
                let load = onto_out || c0 > 0;
                let half_len = chans.len() * TAPS * HALF;
                // One pass over both halves on AVX-512, one per half else.
                let passes = if wide { 1 } else { BLOCK / HALF };
                for half in 0..passes {
                    let w = &packed[half * half_len..];
                    let accs = Accs {
                        acc: &mut *acc,
                        half,
                        load,
                        second: wide.then_some(half_len),
                    };
                    tiles((input, chans.clone()), w, accs, t, d);
                }
            }
            // SAFETY: as for `gather`.
            unsafe { outs.scatter(acc, t, d) };
        }
    };
    use rayon::prelude::*;
    let buffers = scratch[..lanes * per_lane].chunks_mut(per_lane).enumerate();
    if lanes > 1 {
        buffers.collect::<Vec<_>>().into_par_iter().for_each(lane);
    } else {
        buffers.for_each(lane);
    }
}

/// `out`'s storage, shared by the lanes, which write disjoint parts of it.
struct OutPtr(*mut f32);

// SAFETY: every lane writes only its own tasks' (block, item) parts.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Copies `out`'s values of task `t` into `acc` (`[item][pixel][32]`)
    /// when `onto_out` (the bias); otherwise the first chunk starts from
    /// zero and nothing is read.
    ///
    /// # Safety
    /// `t`'s part of `out` (`[n, outs, h, w]`) is not touched by another
    /// lane meanwhile.
    unsafe fn gather(&self, acc: &mut [f32], t: &Task, d: Dims, onto_out: bool) {
        if !onto_out {
            return;
        }
        let (plane, pixels) = (d.plane(), t.pixels(d));
        let px = pixels.len();
        assert!(acc.len() >= t.items.len() * px * BLOCK);
        for (k, item) in t.items.clone().enumerate() {
            let first = (item * d.outs + t.b * BLOCK) * plane + pixels.start;
            let src = self.0.wrapping_add(first);
            let dst = acc[k * px * BLOCK..].as_mut_ptr();
            // The reverse of `scatter`'s blocks (rows of `out` are
            // channels, of `acc` pixels), then the last few pixels.
            let whole = px / 8 * 8;
            for p in (0..whole).step_by(8) {
                for o in (0..BLOCK).step_by(8) {
                    // SAFETY: an 8×8 block inside this task's part of `out`
                    // and inside this item's `acc`.
                    unsafe {
                        transpose8(
                            (src.add(o * plane + p), plane),
                            (dst.add(p * BLOCK + o), BLOCK as isize),
                        )
                    };
                }
            }
            for p in whole..px {
                for o in 0..BLOCK {
                    // SAFETY: inside `out`, in this task's part.
                    acc[(k * px + p) * BLOCK + o] = unsafe { *src.add(o * plane + p) };
                }
            }
        }
    }

    /// Writes `acc` (`[item][pixel][32]`) to task `t`'s part of `out`.
    ///
    /// # Safety
    /// As [`OutPtr::gather`].
    unsafe fn scatter(&self, acc: &[f32], t: &Task, d: Dims) {
        let (plane, pixels) = (d.plane(), t.pixels(d));
        let px = pixels.len();
        assert!(acc.len() >= t.items.len() * px * BLOCK);
        for (k, item) in t.items.clone().enumerate() {
            let src = acc[k * px * BLOCK..].as_ptr();
            let first = (item * d.outs + t.b * BLOCK) * plane + pixels.start;
            let dst = self.0.wrapping_add(first);
            // Pixels by eights, eight channels at a time (rows of `acc` are
            // pixels, of `out` channels), then the last few pixels.
            let whole = px / 8 * 8;
            for p in (0..whole).step_by(8) {
                for o in (0..BLOCK).step_by(8) {
                    // SAFETY: an 8×8 block inside this item's `acc` and
                    // inside this task's part of `out`.
                    unsafe {
                        transpose8(
                            (src.add(p * BLOCK + o), BLOCK),
                            (dst.add(o * plane + p), plane as isize),
                        )
                    };
                }
            }
            for p in whole..px {
                for o in 0..BLOCK {
                    // SAFETY: inside `out`, in this task's part.
                    unsafe { *dst.add(o * plane + p) = acc[(k * px + p) * BLOCK + o] };
                }
            }
        }
    }
}

/// Asks the CPU to bring `run` into cache, a line at a time (a hint: no
/// effect on values).
fn prefetch(run: &[f32]) {
    for line in run.chunks(16) {
        prefetch_line(line.as_ptr());
    }
}

/// Asks the CPU to bring the cache line holding `at` into cache (a hint:
/// it never faults, wherever `at` points, and has no effect on values).
fn prefetch_line(at: *const f32) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// `dst[j·ds + r] = src[r·ss + j]` for `r, j < 8`: an 8×8 block transposed
/// (`ds` may be negative: columns written downwards).
///
/// # Safety
/// Every address named lies in its buffer, which do not overlap.
unsafe fn transpose8((src, ss): (*const f32, usize), (dst, ds): (*mut f32, isize)) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: only reached from the direct kernels, which `applies` allows
    // only with AVX2 present; the addresses as the caller promises.
    unsafe {
        avx::transpose8((src, ss), (dst, ds))
    };
    #[cfg(not(target_arch = "x86_64"))]
    for r in 0..8 {
        for j in 0..8 {
            // SAFETY: as the caller promises.
            unsafe { *dst.offset(j as isize * ds + r as isize) = *src.add(r * ss + j) };
        }
    }
}

/// Packs the kernel's block `b` (output channels `32b..32b + 32`) for input
/// channels `chans` into `packed` as `[half][chan][tap][16]`.
fn pack(weight: &[f32], packed: &mut [f32], d: Dims, pass: Pass, b: usize, chans: Range<usize>) {
    let half_len = chans.len() * TAPS * HALF;
    let packed = &mut packed[..2 * half_len];
    match pass {
        Pass::Forward => {
            // Eight rows of the weight (output channels) at a time, eight
            // of their consecutive (channel, tap) entries transposed into
            // eight 16-float lines; then the last few entries.
            let taps = chans.len() * TAPS;
            let stride = d.ins * TAPS;
            let whole = taps / 8 * 8;
            for o in (0..BLOCK).step_by(8) {
                let row = ((b * BLOCK + o) * d.ins + chans.start) * TAPS;
                assert!(row + 7 * stride + taps <= weight.len());
                let (dst, lane) = (&mut packed[(o / HALF) * half_len..][..half_len], o % HALF);
                // The next chunk's runs of these rows (each a row apart).
                for r in 0..8 {
                    if let Some(next) = weight.get(row + r * stride + taps..) {
                        prefetch(&next[..next.len().min(taps)]);
                    }
                }
                for i in (0..whole).step_by(8) {
                    // SAFETY: rows o..o + 8 of the weight, entries i..i + 8
                    // (asserted above); lines i..i + 8 of the half.
                    unsafe {
                        transpose8(
                            (weight[row + i..].as_ptr(), stride),
                            (dst[i * HALF + lane..].as_mut_ptr(), HALF as isize),
                        )
                    };
                }
                for i in whole..taps {
                    for r in 0..8 {
                        dst[i * HALF + lane + r] = weight[row + r * stride + i];
                    }
                }
            }
        }
        Pass::InputGrad => {
            // Per input channel the block's `[32][9]` weights are one run;
            // eight output channels' first eight taps are transposed at a
            // time, downwards (the kernel's taps are reversed), and the last
            // tap is copied.
            for (c, ci) in chans.clone().enumerate() {
                let row = (ci * d.outs + b * BLOCK) * TAPS;
                let src = &weight[row..row + BLOCK * TAPS];
                // The runs are a weight row apart: fetch the next ones
                // early (the hardware prefetcher starts each run cold).
                if let Some(next) = weight.get(row + 2 * d.outs * TAPS..) {
                    prefetch(&next[..next.len().min(BLOCK * TAPS)]);
                }
                for o in (0..BLOCK).step_by(8) {
                    let dst = &mut packed[(o / HALF) * half_len + c * TAPS * HALF..][..TAPS * HALF];
                    let lane = o % HALF;
                    // SAFETY: rows o..o + 8 of `src` (9 apart), entries
                    // 0..8; kernel taps 8 down to 1 of lanes lane..lane + 8.
                    unsafe {
                        transpose8(
                            (src[o * TAPS..].as_ptr(), TAPS),
                            (dst[8 * HALF + lane..].as_mut_ptr(), -(HALF as isize)),
                        )
                    };
                    for r in 0..8 {
                        dst[lane + r] = src[(o + r) * TAPS + 8];
                    }
                }
            }
        }
    }
}

/// A task's outputs as the tiles see them: `acc` `[item][pixel][32]`, of
/// which a pass holds channels `16·half..16·half + 16`, or all 32 on
/// AVX-512 (`second`: elements from a tap's weights for the first half to
/// those for the second); the tiles start from its values when `load`,
/// else from zero.
struct Accs<'a> {
    acc: &'a mut [f32],
    half: usize,
    load: bool,
    second: Option<usize>,
}

/// One pass over task `t`'s items (or its band of one item's rows) for one
/// half and one chunk of input channels `chans` (`w`: their packed
/// weights). Planes narrower than
/// [`ROW_TILES_FROM`] are tiled down their columns where they have at
/// least [`MAX_TILE`] interior rows (the pixels of a column in those rows
/// read the same kernel rows and column edges), else across items where
/// there are as many items as columns (the same pixel of a few items);
/// everything else is tiled along rows, item by item.
fn tiles((x, chans): (&[f32], Range<usize>), w: &[f32], a: Accs, t: &Task, d: Dims) {
    let (plane, items, pixels) = (d.plane(), t.items.clone(), t.pixels(d));
    assert!(!chans.is_empty() && chans.end <= d.ins && items.end <= d.n);
    assert!(t.rows.start < t.rows.end && t.rows.end <= d.h);
    let half_len = chans.len() * TAPS * HALF;
    assert!(w.len() >= a.second.unwrap_or(0) + half_len && x.len() >= d.n * d.ins * plane);
    assert!(a.acc.len() >= items.len() * pixels.len() * BLOCK);
    // Pixel `col` of row 0 of item `k` of the task, at channel chans.start.
    let input = |k: usize, col: usize| {
        x[((items.start + k) * d.ins + chans.start) * plane + col..].as_ptr()
    };
    let acc = a.acc.as_mut_ptr().wrapping_add(a.half * HALF);
    // Pixels per tile at most, and the floats of a pixel a tile holds.
    let (most, width) = match a.second {
        Some(_) => (MAX_TILE_512, BLOCK),
        None => (MAX_TILE, HALF),
    };
    // Pixel `pixel` of item `k`'s plane, in the task's outputs (the band's
    // pixels of each item).
    let px = pixels.len();
    let slot = |k: usize, pixel: usize| {
        acc.wrapping_add((k * px + pixel).wrapping_sub(pixels.start) * BLOCK)
    };
    let at = |y: usize, x0: usize, last: usize, across: bool| Tile {
        y,
        // The kernel rows that read inside the plane.
        rows: usize::from(y == 0)..if y + 1 == d.h { 2 } else { 3 },
        chans: chans.len(),
        second: a.second,
        load: a.load,
        left: x0 == 0,
        right: last + 1 == d.w,
        across,
    };
    // Row `y` of item `k` in tiles of at most `most` pixels. With
    // `ahead`, each tile first asks for the next one's outputs and for the
    // inputs of the row below that the next tile's taps will reach.
    let row = |k: usize, y: usize, ahead: bool| {
        let mut xs = [std::ptr::null::<f32>(); MAX_TILE_512];
        let mut os = [std::ptr::null_mut::<f32>(); MAX_TILE_512];
        let mut x0 = 0;
        for p in splits(d.w, most) {
            for i in 0..p {
                xs[i] = input(k, x0 + i);
                os[i] = slot(k, y * d.w + x0 + i);
            }
            if ahead {
                for i in 0..most {
                    let next = slot(k, y * d.w + x0 + p + i).cast_const();
                    for line in (0..width).step_by(16) {
                        prefetch_line(next.wrapping_add(line));
                    }
                    prefetch_line(next.wrapping_add(width - 1));
                }
                let below = (y + 1).min(d.h - 1) * d.w + (x0 + p + most).min(d.w - 1);
                for c in 0..chans.len() {
                    prefetch_line(input(k, 0).wrapping_add(c * plane + below));
                }
            }
            tile(&xs[..p], &os[..p], w, d, &at(y, x0, x0 + p - 1, false));
            x0 += p;
        }
    };
    let layout = match a.second {
        Some(_) => widest_layout(d, items.len(), most),
        None => layout(d, items.len()),
    };
    // Bands of rows are cut only where one item's tiles run along rows.
    assert!(layout == Layout::Rows || t.rows == (0..d.h));
    if layout == Layout::Columns {
        let mut xs = [std::ptr::null::<f32>(); MAX_TILE_512];
        let mut os = [std::ptr::null_mut::<f32>(); MAX_TILE_512];
        for k in 0..items.len() {
            let mut y0 = 1;
            for p in splits(d.h - 2, most) {
                for x0 in 0..d.w {
                    for i in 0..p {
                        // Row y0 + i's pixel, read as if it were in row y0.
                        xs[i] = input(k, x0 + i * d.w);
                        os[i] = slot(k, (y0 + i) * d.w + x0);
                    }
                    tile(&xs[..p], &os[..p], w, d, &at(y0, x0, x0, true));
                }
                y0 += p;
            }
            row(k, 0, false);
            row(k, d.h - 1, false);
        }
    } else if layout == Layout::Items {
        let mut xs = [std::ptr::null::<f32>(); MAX_TILE_512];
        let mut os = [std::ptr::null_mut::<f32>(); MAX_TILE_512];
        for y in 0..d.h {
            for x0 in 0..d.w {
                let mut k0 = 0;
                for p in splits(items.len(), most - 1) {
                    for i in 0..p {
                        xs[i] = input(k0 + i, x0);
                        os[i] = slot(k0 + i, y * d.w + x0);
                    }
                    tile(&xs[..p], &os[..p], w, d, &at(y, x0, x0, true));
                    k0 += p;
                }
            }
        }
    } else {
        // Item by item, so that the rows one output row reads are still in
        // cache for the next.
        let ahead = plane * (chans.len() + BLOCK) * std::mem::size_of::<f32>() > PREFETCH_FROM;
        for k in 0..items.len() {
            for y in t.rows.clone() {
                row(k, y, ahead);
            }
        }
    }
}

/// How [`tiles`] cuts a plane into tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// Down the columns, in the rows between the first and the last.
    Columns,
    /// The same pixel of a few items.
    Items,
    /// Along the rows.
    Rows,
}

/// The AVX2 kernel's layout: narrow planes down their columns where they
/// have [`MAX_TILE`] interior rows, else across items where there are as
/// many items as columns; the rest along rows.
fn layout(d: Dims, items: usize) -> Layout {
    let narrow = d.w < ROW_TILES_FROM;
    if narrow && d.h >= MAX_TILE + 2 {
        Layout::Columns
    } else if narrow && items >= d.w {
        Layout::Items
    } else {
        Layout::Rows
    }
}

/// The AVX-512 kernel's layout (tiles of up to `most` pixels): of the
/// layouts that apply, the one with the largest tiles on average (more
/// accumulators in flight), columns first on a tie, then items. Columns
/// apply to planes up to 16 wide with [`MAX_TILE`] interior rows (a 14×14
/// plane takes one tile of 12 per column instead of two of 7 per row);
/// items to narrow planes, as on AVX2.
fn widest_layout(d: Dims, items: usize, most: usize) -> Layout {
    // The mean tile, in 1/len(pieces) units: len / pieces, compared exactly.
    let mean = |len: usize, most: usize| (len, len.div_ceil(most).max(1));
    let more = |(a, pa): (usize, usize), (b, pb): (usize, usize)| a * pb > b * pa;
    let narrow = d.w < ROW_TILES_FROM;
    let mut best = (Layout::Rows, mean(d.w, most));
    if narrow && items >= d.w && !more(best.1, mean(items, most - 1)) {
        best = (Layout::Items, mean(items, most - 1));
    }
    if d.w <= 16 && d.h >= MAX_TILE + 2 && !more(best.1, mean(d.h - 2, most)) {
        best = (Layout::Columns, mean(d.h - 2, most));
    }
    best.0
}

/// The sizes of `len` cut into near-equal consecutive pieces of at most
/// `most`.
fn splits(len: usize, most: usize) -> impl Iterator<Item = usize> {
    let pieces = len.div_ceil(most);
    (0..pieces).map(move |t| len / pieces + usize::from(t < len % pieces))
}

/// How one tile reads: output row `y`, kernel rows `rows` (those inside
/// the plane), `chans` input channels, starting from its outputs when
/// `load`. `left`/`right`: the tile touches the plane's left or right
/// edge, whose column of taps is skipped, for its first or last pixel (a
/// row's pixels) or for all of them (`across` items at one pixel).
struct Tile {
    y: usize,
    rows: Range<usize>,
    chans: usize,
    /// Both halves at once (AVX-512): the elements from a tap's weights for
    /// the first half to those for the second.
    second: Option<usize>,
    load: bool,
    left: bool,
    right: bool,
    across: bool,
}

/// Runs one tile: pixel `p` reads from `xs[p]` (its input at the chunk's
/// first channel, row 0, the pixel's column) and adds into `os[p]` (16
/// floats, or 32 with both halves). The pointers come from [`tiles`],
/// which checked the buffers' lengths; every read is a tap inside the
/// plane.
fn tile(xs: &[*const f32], os: &[*mut f32], w: &[f32], d: Dims, t: &Tile) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `applies` found AVX2 and FMA on this CPU, and `run` asks for
    // both halves only where the path is AVX-512; the pointers lie in
    // buffers `tiles` checked, and the kernel reads only taps inside the
    // plane.
    unsafe {
        match t.second {
            Some(second) => avx512::tile(xs, os, (w.as_ptr(), second), d, t),
            None => avx::tile(xs, os, w.as_ptr(), d, t),
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (xs, os, w, d, t);
}

/// Adds a tile's taps into its accumulators `acc` (two vectors a pixel):
/// input channel by channel, tap by tap, one fused multiply-add per vector,
/// skipping the taps on the padding (the left column for the first pixel,
/// the right for the last, or for every pixel when `each`). `second` is
/// the distance from a tap's first weight vector to its second. Written once
/// for both instruction sets, given their intrinsics; a macro, so that it is
/// compiled inside each kernel's `target_feature` function.
///
/// Safety (of the expansion): the pointers as [`tile`] says.
#[cfg(target_arch = "x86_64")]
macro_rules! sum_taps {
    (
        ($acc:ident, $xs:ident, $w:ident, $p:ident),
        ($d:ident, $t:ident, $second:expr),
        ($left:expr, $right:expr, $each:expr),
        ($load:ident, $splat:ident, $fmadd:ident)
    ) => {{
        let plane = $d.plane();
        for c in 0..$t.chans {
            let wc = $w.wrapping_add(c * TAPS * HALF);
            for ky in $t.rows.clone() {
                // Row y + ky − 1 (≥ 0 here) of channel c, at the pixel's
                // column, less one: the left tap.
                let at = (c * plane + ($t.y + ky - 1) * $d.w).wrapping_sub(1);
                for kx in 0..3 {
                    let wt = wc.wrapping_add((ky * 3 + kx) * HALF);
                    // Inside the packed chunk.
                    let wv = [$load(wt), $load(wt.add($second))];
                    for (p, (a, x)) in $acc.iter_mut().zip($xs.iter()).enumerate() {
                        let first = $each || p == 0;
                        let last = $each || p == $p - 1;
                        if ($left && kx == 0 && first) || ($right && kx == 2 && last) {
                            continue;
                        }
                        // A tap inside the plane (those outside are exactly
                        // the ones skipped).
                        let b = $splat(*x.wrapping_add(at.wrapping_add(kx)));
                        a[0] = $fmadd(b, wv[0], a[0]);
                        a[1] = $fmadd(b, wv[1], a[1]);
                    }
                }
            }
        }
    }};
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use super::{Dims, Tile, HALF, TAPS};
    use std::arch::x86_64::*;

    /// [`super::transpose8`] in AVX registers.
    ///
    /// # Safety
    /// AVX2 present; the addresses as [`super::transpose8`] says.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn transpose8((src, ss): (*const f32, usize), (dst, ds): (*mut f32, isize)) {
        // SAFETY: the caller's addresses.
        let r: [__m256; 8] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(src.add(i * ss)) });
        // SAFETY: AVX2 is present.
        let cols = unsafe { crate::primitives::transpose8x8(r) };
        for (j, c) in cols.into_iter().enumerate() {
            // SAFETY: the caller's addresses.
            unsafe { _mm256_storeu_ps(dst.offset(j as isize * ds), c) };
        }
    }

    /// Runs the tile with the kernel instance for its width and edges.
    ///
    /// # Safety
    /// AVX2 and FMA must be present; the pointers as [`super::tile`] says.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile(
        xs: &[*const f32],
        os: &[*mut f32],
        w: *const f32,
        d: Dims,
        t: &Tile,
    ) {
        macro_rules! widths {
            ($($p:literal)*) => {
                match (xs.len(), t.left, t.right, t.across) {
                    $(
                        ($p, false, false, _) => run::<$p, false, false, false>(xs, os, w, d, t),
                        ($p, true, false, false) => run::<$p, true, false, false>(xs, os, w, d, t),
                        ($p, false, true, false) => run::<$p, false, true, false>(xs, os, w, d, t),
                        ($p, true, true, false) => run::<$p, true, true, false>(xs, os, w, d, t),
                        ($p, true, false, true) => run::<$p, true, false, true>(xs, os, w, d, t),
                        ($p, false, true, true) => run::<$p, false, true, true>(xs, os, w, d, t),
                        ($p, true, true, true) => run::<$p, true, true, true>(xs, os, w, d, t),
                    )*
                    _ => unreachable!("tiles have 1 to 5 pixels"),
                }
            };
        }
        // SAFETY (every arm): as this function's contract says.
        unsafe { widths!(1 2 3 4 5) }
    }

    /// 16 output channels × `P` pixels. `L` and `R` say that the left or
    /// right column of taps falls on the padding: for every pixel when
    /// `EACH`, else for the first or the last one.
    ///
    /// # Safety
    /// As [`tile`].
    #[inline(always)]
    unsafe fn run<const P: usize, const L: bool, const R: bool, const EACH: bool>(
        xs: &[*const f32],
        os: &[*mut f32],
        w: *const f32,
        d: Dims,
        t: &Tile,
    ) {
        let xs: [*const f32; P] = std::array::from_fn(|p| xs[p]);
        let os: [*mut f32; P] = std::array::from_fn(|p| os[p]);
        let mut acc = [[_mm256_setzero_ps(); 2]; P];
        if t.load {
            for (a, o) in acc.iter_mut().zip(os.iter()) {
                // SAFETY: the pixel's 16 floats.
                *a = unsafe { [_mm256_loadu_ps(*o), _mm256_loadu_ps(o.add(8))] };
            }
        }
        // SAFETY: as this function's contract says.
        unsafe {
            sum_taps!(
                (acc, xs, w, P),
                (d, t, 8),
                (L, R, EACH),
                (_mm256_loadu_ps, _mm256_set1_ps, _mm256_fmadd_ps)
            )
        };
        for (a, o) in acc.iter().zip(os.iter()) {
            // SAFETY: the pixel's 16 floats.
            unsafe {
                _mm256_storeu_ps(*o, a[0]);
                _mm256_storeu_ps(o.add(8), a[1]);
            }
        }
    }
}

/// The AVX-512 tiles: 32 output channels (two 16-lane vectors) per pixel.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Dims, Tile, HALF, TAPS};
    use std::arch::x86_64::*;

    /// Runs the tile with the kernel instance for its width (its edges are
    /// tested as it runs: a few scalar tests per broadcast, against 84
    /// instances of the kernel).
    ///
    /// # Safety
    /// AVX-512F, AVX2 and FMA must be present; `w.1` is the distance from
    /// the first half's packed weights to the second's; the pointers as
    /// [`super::tile`] says, each output 32 floats.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn tile(
        xs: &[*const f32],
        os: &[*mut f32],
        w: (*const f32, usize),
        d: Dims,
        t: &Tile,
    ) {
        macro_rules! widths {
            ($($p:literal)*) => {
                match xs.len() {
                    $($p => run::<$p>(xs, os, w, d, t),)*
                    _ => unreachable!("tiles have 1 to 12 pixels"),
                }
            };
        }
        // SAFETY (every arm): as this function's contract says.
        unsafe { widths!(1 2 3 4 5 6 7 8 9 10 11 12) }
    }

    /// 32 output channels × `P` pixels, in [`super::avx::run`]'s order.
    ///
    /// # Safety
    /// As [`tile`].
    #[inline(always)]
    unsafe fn run<const P: usize>(
        xs: &[*const f32],
        os: &[*mut f32],
        (w, second): (*const f32, usize),
        d: Dims,
        t: &Tile,
    ) {
        let xs: [*const f32; P] = std::array::from_fn(|p| xs[p]);
        let os: [*mut f32; P] = std::array::from_fn(|p| os[p]);
        let mut acc = [[_mm512_setzero_ps(); 2]; P];
        if t.load {
            for (a, o) in acc.iter_mut().zip(os.iter()) {
                // SAFETY: the pixel's 32 floats.
                *a = unsafe { [_mm512_loadu_ps(*o), _mm512_loadu_ps(o.add(16))] };
            }
        }
        // SAFETY: as this function's contract says.
        unsafe {
            sum_taps!(
                (acc, xs, w, P),
                (d, t, second),
                (t.left, t.right, t.across),
                (_mm512_loadu_ps, _mm512_set1_ps, _mm512_fmadd_ps)
            )
        };
        for (a, o) in acc.iter().zip(os.iter()) {
            // SAFETY: the pixel's 32 floats.
            unsafe {
                _mm512_storeu_ps(*o, a[0]);
                _mm512_storeu_ps(o.add(16), a[1]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::primitives::test_values as values;

    /// The kernel's `[o][i][tap]` value for `pass`.
    fn kernel(w: &[f32], d: Dims, pass: Pass, o: usize, i: usize, t: usize) -> f32 {
        match pass {
            Pass::Forward => w[(o * d.ins + i) * TAPS + t],
            Pass::InputGrad => w[(i * d.outs + o) * TAPS + TAPS - 1 - t],
        }
    }

    /// The order the module promises, one element at a time: from the
    /// starting value, input channel by channel, tap by tap, fused
    /// multiply-adds, the padding's taps skipped.
    fn reference(x: &[f32], w: &[f32], start: &[f32], d: Dims, pass: Pass) -> Vec<f32> {
        let mut out = start.to_vec();
        for n in 0..d.n {
            for o in 0..d.outs {
                for y in 0..d.h {
                    for xo in 0..d.w {
                        let at = ((n * d.outs + o) * d.h + y) * d.w + xo;
                        let mut a = out[at];
                        for i in 0..d.ins {
                            for t in 0..TAPS {
                                let (yy, xx) =
                                    ((y + t / 3).wrapping_sub(1), (xo + t % 3).wrapping_sub(1));
                                if yy < d.h && xx < d.w {
                                    let v = x[((n * d.ins + i) * d.h + yy) * d.w + xx];
                                    a = v.mul_add(kernel(w, d, pass, o, i, t), a);
                                }
                            }
                        }
                        out[at] = a;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn direct_kernels_add_in_the_promised_order_for_any_chunking_and_thread_count() {
        if !avx2_fma() {
            eprintln!("no AVX2+FMA on this CPU: the direct kernels are not used here");
            return;
        }
        // (h, w, items): planes tiled along rows and across items.
        let planes = [
            (1, 1, 1),
            (1, 5, 2),
            (2, 3, 3),
            (3, 2, 2),
            (4, 4, 4),
            (5, 7, 3),
            (7, 7, 8),
            (8, 13, 1),
            (14, 14, 2),
            // Down the columns (7 and 10 interior rows), and rows that
            // prefetch (1,320 pixels: the first chunk's 32 channels).
            (9, 5, 2),
            (12, 3, 1),
            (33, 40, 1),
            // AVX-512's widest tiles: rows of 12, and of 12 and 11.
            (3, 24, 1),
            (2, 23, 2),
            // Bands of rows: 25 rows in bands of 1 and 3 (the last of 4).
            (25, 19, 2),
        ];
        let mut case = 0u64;
        for (k, &(h, w, n)) in planes.iter().enumerate() {
            for pass in [Pass::Forward, Pass::InputGrad] {
                case += 1;
                let (ins, outs) = ([1, 3, 17, 40][k % 4], [32, 64][k % 2]);
                let d = Dims { n, ins, outs, h, w };
                let x = values(n * ins * h * w, case);
                let wt = values(outs * ins * TAPS, case + 100);
                let onto = k % 2 == 1;
                let start = match onto {
                    true => values(n * outs * h * w, case + 200),
                    false => vec![0.0; n * outs * h * w],
                };
                let want = reference(&x, &wt, &start, d, pass);
                // Scratch for every item at once in three lanes, and for
                // one item at a time in one lane; on wide planes for bands
                // of one row in one lane and of three rows in two.
                let (item, row) = (h * w * BLOCK, w * BLOCK);
                let chunk = ins.min(CHUNK) * TAPS * BLOCK;
                let mut scratches = vec![3 * (chunk + n * item), chunk + item];
                if w > BANDS_FROM_WIDTH {
                    scratches.extend([chunk + row, 2 * (chunk + 3 * row) + 5]);
                }
                for scratch in scratches {
                    assert!(fits(&d, scratch));
                    for threads in [1, 2, 3] {
                        let pool = rayon::ThreadPoolBuilder::new()
                            .num_threads(threads)
                            .build()
                            .unwrap();
                        let mut out = start.clone();
                        let mut buf = vec![f32::NAN; scratch];
                        pool.install(|| run((&x, &wt, &mut out), &mut buf, d, pass, onto));
                        let bad = out
                            .iter()
                            .zip(&want)
                            .filter(|(a, b)| a.to_bits() != b.to_bits())
                            .count();
                        assert_eq!(bad, 0, "{pass:?} {d:?} scratch {scratch} threads {threads}");
                    }
                }
            }
        }
    }

    #[test]
    fn avx512_tiles_take_the_layout_with_the_largest_tiles() {
        let plane = |h: usize, w: usize| Dims {
            n: 8,
            ins: 64,
            outs: 64,
            h,
            w,
        };
        // ResNet-18's planes at batch 8: 56 and 28 along rows (tiles of
        // 11–12 and 9–10), 14 down columns (12), 7 and 4 across items (8).
        let layouts: Vec<Layout> = [56, 28, 14, 7, 4]
            .iter()
            .map(|&s| widest_layout(plane(s, s), 8, MAX_TILE_512))
            .collect();
        use Layout::*;
        assert_eq!(layouts, [Rows, Rows, Columns, Items, Items]);
        // Fewer items than columns: rows of 7 in one tile beat columns
        // of 5 interior rows; a tall narrow plane goes down its columns.
        assert_eq!(widest_layout(plane(7, 7), 2, MAX_TILE_512), Rows);
        assert_eq!(widest_layout(plane(16, 3), 1, MAX_TILE_512), Columns);
        // The AVX2 layouts stay as they were.
        assert_eq!(layout(plane(14, 14), 8), Rows);
        assert_eq!(layout(plane(7, 7), 8), Columns);
        assert_eq!(layout(plane(4, 4), 8), Items);
    }

    #[test]
    fn a_buffer_short_of_one_item_sends_the_convolution_to_im2col() {
        let d = Dims {
            n: 4,
            ins: 64,
            outs: 32,
            h: 2,
            w: 3,
        };
        let one = CHUNK * TAPS * BLOCK + 6 * BLOCK;
        assert!(fits(&d, one));
        assert!(!fits(&d, one - 1));
        // Fewer channels than a chunk pack only theirs.
        assert!(fits(&Dims { ins: 3, ..d }, 3 * TAPS * BLOCK + 6 * BLOCK));
        // Lanes are cut to what fits, never below one, and the rest of a
        // lane's share holds whole items.
        let share = |lanes, group, band| Sharing {
            chunk: CHUNK,
            lanes,
            group,
            band,
        };
        assert_eq!(sharing(&d, one, 4), Some(share(1, 1, 2)));
        assert_eq!(sharing(&d, 2 * one + 6 * BLOCK, 2), Some(share(2, 1, 2)));
        assert_eq!(sharing(&d, 2 * one + 12 * BLOCK, 2), Some(share(2, 2, 2)));
        // A wide plane: bands of rows where a lane cannot hold an item
        // (VGG's 224² at 64 channels in the default 4 MiB of f32), whole
        // items where they let as many lanes run.
        let vgg = Dims {
            n: 1,
            ins: 64,
            outs: 64,
            h: 224,
            w: 224,
        };
        let packed = CHUNK * TAPS * BLOCK;
        let (row, item) = (224 * BLOCK, 224 * 224 * BLOCK);
        let band = ((1 << 20) / 2 - packed) / row;
        assert_eq!(sharing(&vgg, 1 << 20, 2), Some(share(2, 1, band)));
        assert_eq!(band, 71);
        assert_eq!(sharing(&vgg, packed + row, 2), Some(share(1, 1, 1)));
        assert_eq!(sharing(&vgg, packed + row - 1, 2), None);
        let whole = 2 * (packed + item);
        assert_eq!(sharing(&vgg, whole, 2), Some(share(2, 1, 224)));
        // Narrow planes are never cut: one lane holds an item or none.
        let narrow = Dims {
            w: 16,
            h: 300,
            ..vgg
        };
        assert_eq!(sharing(&narrow, packed + 16 * BLOCK, 2), None);
    }
}
