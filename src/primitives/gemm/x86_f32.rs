//! The f32 matrix product on x86: `dst (m×n, row-major) = a·b` or `+= a·b`,
//! packed and blocked as BLIS does, with software prefetching of what the
//! next steps read, and one micro-kernel per instruction set ([`Kernel`]):
//! 6×16 on AVX2 + FMA (twelve 8-lane accumulators), 12×32 on AVX-512
//! (twenty-four 16-lane accumulators, as many as a Xeon's two 512-bit FMA
//! units need to stay busy; its 32 vector registers hold them with the two
//! `b` vectors and the broadcast). Packing and blocking are shared.
//!
//! Why not only the `gemm` crate: on the products of a transformer step it
//! spends 11–14% of its time packing. It packs a transposed operand (a
//! Linear's weight read as `Wᵀ`) one element at a time, and it packs a whole
//! block before multiplying, so that a weight read from memory waits for
//! each cache miss in turn. Here a transposed operand is packed eight by
//! eight through register transposes, each column panel of `b` is packed
//! just before the micro-kernel uses it (so it is still in L1), the next
//! panel's source lines are prefetched while this one is multiplied, and
//! each destination tile is prefetched while the tile before it is summed. Called
//! alternately with the crate in one process on the products of the
//! BERT-base step, with the weights coming from memory, the AVX2 kernel
//! takes 0.86–0.99 of the crate's time at one thread and 0.77–0.97 at two
//! (AMD Zen 3). One attention head's product (128×64·64×128) with
//! everything in cache is the exception: 1.04–1.16 of the crate's time.
//!
//! Every element adds its terms in one order that depends on `k` alone:
//! blocks of [`KC`] terms in turn, each summed from zero with fused
//! multiply-adds and then added to the destination (or written, for the
//! first block of a product that does not accumulate). So a product split
//! into blocks of rows or columns gives the same bits as the whole, on any
//! number of threads, and the AVX2 and AVX-512 kernels give the same bits
//! as each other: only the tile an element falls in differs.

use crate::primitives::transpose8x8 as transpose8;
use crate::primitives::{cpu_path, CpuPath};
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Terms summed per block: a packed `b` panel of `KC × NR` (16 KB on AVX2,
/// 32 KB on AVX-512) stays in L1 while a block of rows passes over it. The
/// same on every path, so that every path gives the same bits.
const KC: usize = 256;
/// Most rows packed at once: `MC_MAX × KC` of `a` (264 KB) stays in L2.
const MC_MAX: usize = 264;
/// Most columns of `b` packed per pass (3 MB of panels at `KC`).
const NC: usize = 3072;

/// One instruction set's micro-tile: `MR` rows (broadcasts of `a`) by `NR`
/// columns (vectors of `b`), and the kernel that sums one.
pub(super) trait Kernel {
    /// Rows of a micro-tile.
    const MR: usize;
    /// Columns of a micro-tile.
    const NR: usize;

    /// The `mr × nr` corner of a tile of `c` (rows `c.1` apart) `= Σ_k
    /// a[k]·b[k]` over the packed panels (`[k][MR]`, `[k][NR]`), or `+=`
    /// when `add`.
    ///
    /// # Safety
    ///
    /// The CPU has this instruction set; the panels hold `kc` steps; the
    /// corner lies inside `c`.
    unsafe fn tile(
        mr: usize,
        kc: usize,
        panels: (*const f32, *const f32),
        c: (*mut f32, usize),
        nr: usize,
        add: bool,
    );
}

/// The AVX2 + FMA micro-tile: 6 rows by two 8-lane vectors.
pub(super) struct Avx2;

/// The AVX-512 micro-tile: 12 rows by two 16-lane vectors.
pub(super) struct Avx512;

thread_local! {
    /// This thread's packing buffers (`a`'s rows, `b`'s panels), kept
    /// between products as the `gemm` crate keeps its own.
    static PACKED: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// A matrix read through its row and column strides (in elements).
#[derive(Clone, Copy)]
pub(super) struct Matrix {
    pub ptr: *const f32,
    pub rs: usize,
    pub cs: usize,
}

/// Whether a product of `m` rows packs every `b` panel into one slot: its
/// rows are one block, so no panel is read again. `with_kernel` sizes the
/// panel buffer by this and `blocked` places the panels by it.
fn one_panel_slot(m: usize) -> bool {
    m <= MC_MAX
}

/// Bytes in a cache line.
const LINE: usize = 64;

/// The first element of `v` that starts a cache line. The micro-kernel
/// reads a packed `b` row (16 floats, one line) per step: from a buffer
/// that `malloc` put 16 bytes past a line, one of its two loads crossed
/// into the next line at every step (alternately measured, aligned took
/// 0.96–0.99 of the time). `v` holds [`LINE`] spare bytes for this.
fn line_start(v: &mut [f32]) -> *mut f32 {
    let p = v.as_mut_ptr();
    // By hand: `align_offset` may answer "impossible" (usize::MAX).
    let past = p as usize % LINE;
    let skip = (LINE - past) % LINE / std::mem::size_of::<f32>();
    p.wrapping_add(skip)
}

/// Grows `v` to at least `len` elements; false where memory ran out.
fn reserve(v: &mut Vec<f32>, len: usize) -> bool {
    if v.len() >= len {
        return true;
    }
    if v.try_reserve_exact(len - v.len()).is_err() {
        return false;
    }
    v.resize(len, 0.0);
    true
}

/// `dst (m×n, rows dst_rs apart, columns adjacent) = a (m×k) · b (k×n)`, or
/// `+=` when `accumulate`, on the widest kernel of [`cpu_path`]. Returns
/// false, having written nothing, where that path is the portable one or
/// the packing buffers cannot be allocated (the caller then uses the
/// `gemm` crate).
///
/// # Safety
///
/// `dst`, `a` and `b` must hold every element the product touches through
/// their strides, and `dst` must not overlap `a` or `b`.
pub(super) unsafe fn gemm(
    mnk: (usize, usize, usize),
    dst: *mut f32,
    dst_rs: usize,
    a: Matrix,
    b: Matrix,
    accumulate: bool,
) -> bool {
    let out = Out {
        ptr: dst,
        rs: dst_rs,
        accumulate,
    };
    // SAFETY: the path is one the CPU has; the caller's bounds.
    match cpu_path() {
        CpuPath::Avx512 => unsafe { with_kernel::<Avx512>(mnk, out, a, b) },
        CpuPath::Avx2 => unsafe { with_kernel::<Avx2>(mnk, out, a, b) },
        CpuPath::Portable => false,
    }
}

/// [`gemm`] on the kernel `K`.
///
/// # Safety
///
/// The CPU has `K`'s instruction set; [`gemm`]'s bounds.
pub(super) unsafe fn with_kernel<K: Kernel>(
    (m, n, k): (usize, usize, usize),
    out: Out,
    a: Matrix,
    b: Matrix,
) -> bool {
    if m == 0 || n == 0 {
        return true;
    }
    if k == 0 {
        if !out.accumulate {
            for i in 0..m {
                // SAFETY: row i of the destination (the caller's bounds).
                unsafe { std::slice::from_raw_parts_mut(out.ptr.add(i * out.rs), n) }.fill(0.0);
            }
        }
        return true;
    }
    PACKED.with(|packed| {
        let Ok(mut packed) = packed.try_borrow_mut() else {
            return false;
        };
        let (pa, pb) = &mut *packed;
        let kc = k.min(KC);
        // Eight spare elements: `pack_a` stores whole vectors past a
        // panel's last rows (see there).
        let a_len = m.min(MC_MAX).next_multiple_of(K::MR) * kc + 8;
        let b_len = if one_panel_slot(m) {
            KC * K::NR
        } else {
            n.min(NC).next_multiple_of(K::NR) * kc
        };
        // Room to start each buffer on a cache line (see `line_start`).
        let spare = LINE / std::mem::size_of::<f32>();
        if !reserve(pa, a_len + spare) || !reserve(pb, b_len + spare) {
            return false;
        }
        // SAFETY: the CPU has K's instruction set (and AVX2, which every
        // AVX-512 CPU has); the buffers hold what the blocking packs; the
        // caller's bounds.
        unsafe {
            let (pa, pb) = (line_start(pa), line_start(pb));
            blocked::<K>((m, n, k), out, a, b, (pa, pb))
        };
        true
    })
}

/// The destination of a product.
#[derive(Clone, Copy)]
pub(super) struct Out {
    pub ptr: *mut f32,
    pub rs: usize,
    pub accumulate: bool,
}

/// The loops around the micro-kernel: columns of `b` by [`NC`], depth by
/// [`KC`], rows of `a` by up to [`MC_MAX`], then `NR`-column panels and
/// `MR`-row panels. The first pass over a block's rows packs each `b` panel
/// (into `pb`) and each `a` panel (into `pa`) just before it is first used.
/// Where all rows are one block (`m ≤ MC_MAX`, every product of a
/// transformer's tokens), no panel is used twice, so each is packed over
/// the last in one panel-sized slot that stays in L1; keeping them all
/// (the whole block's width, 768 KB to 3 MB) wrote a fresh line to memory
/// for every line packed. Called alternately in one process on the
/// BERT-base products, the slot took 0.93–0.98 of the time.
#[target_feature(enable = "avx2,fma")]
unsafe fn blocked<K: Kernel>(
    (m, n, k): (usize, usize, usize),
    out: Out,
    a: Matrix,
    b: Matrix,
    (pa, pb): (*mut f32, *mut f32),
) {
    let (mr_full, nr_full) = (K::MR, K::NR);
    // Row blocks of equal size (rounded to whole panels).
    let mc_step = m.div_ceil(m.div_ceil(MC_MAX)).next_multiple_of(mr_full);
    for jc in (0..n).step_by(NC) {
        let nc = (n - jc).min(NC);
        for pc in (0..k).step_by(KC) {
            let kc = (k - pc).min(KC);
            let add = out.accumulate || pc > 0;
            let b_block = b.ptr.add(pc * b.rs + jc * b.cs);
            for ic in (0..m).step_by(mc_step) {
                let mc = (m - ic).min(mc_step);
                let a_block = a.ptr.add(ic * a.rs + pc * a.cs);
                for jr in (0..nc).step_by(nr_full) {
                    let nr = (nc - jr).min(nr_full);
                    let bp = if one_panel_slot(m) {
                        pb
                    } else {
                        pb.add(jr * kc)
                    };
                    let first_rows = ic == 0;
                    if first_rows {
                        pack_b(kc, (nr, nr_full), b_block.add(jr * b.cs), (b.rs, b.cs), bp);
                    }
                    let next = (jr + nr_full, nc);
                    let mut ahead = Prefetch::next_panel(b_block, (b.rs, b.cs), kc, next, nr_full);
                    if !first_rows {
                        ahead.lines = 0;
                    }
                    let per_tile = ahead.lines.div_ceil(mc.div_ceil(mr_full));
                    for ir in (0..mc).step_by(mr_full) {
                        ahead.issue(per_tile);
                        let mr = (mc - ir).min(mr_full);
                        let ap = pa.add(ir * kc);
                        if jr == 0 {
                            pack_a(kc, (mr, mr_full), a_block.add(ir * a.rs), (a.rs, a.cs), ap);
                        }
                        let tile = out.ptr.add((ic + ir) * out.rs + jc + jr);
                        // Each tile's lines are fetched while the tile
                        // before it is summed: a product of small depth
                        // (64 for a head or the stem's input gradient)
                        // ends a tile before memory could answer.
                        if ir == 0 {
                            prefetch_tile(tile, out.rs, mr, nr);
                        }
                        if ir + mr_full < mc {
                            let next = tile.add(mr_full * out.rs);
                            let rows = (mc - ir - mr_full).min(mr_full);
                            prefetch_tile(next, out.rs, rows, nr);
                        }
                        K::tile(mr, kc, (ap, bp), (tile, out.rs), nr, add);
                    }
                }
            }
        }
    }
}

/// The source cache lines of the next `b` panel, prefetched a few per
/// micro-tile while the current panel is multiplied (the first row block
/// only: later ones read the packed panels).
struct Prefetch {
    base: *const f32,
    /// Elements from one line to the next within a run of lines, and from
    /// one run to the next.
    step: (usize, usize),
    /// Lines per run.
    run: usize,
    lines: usize,
    /// Lines issued so far, and where the next one is in its run.
    next: usize,
    within: usize,
    at: *const f32,
}

impl Prefetch {
    /// The lines of `b`'s panel of up to `panel` columns at column `start`
    /// (of `nc`): where rows are contiguous, those of elements spread
    /// evenly from each row's first to its last, at most 16 apart (a row
    /// of 16 elements straddles two lines unless aligned, one of 32
    /// three); where columns are, one per 16 elements down each column and
    /// one more; none for other strides.
    fn next_panel(
        b: *const f32,
        (rs, cs): (usize, usize),
        kc: usize,
        (start, nc): (usize, usize),
        panel: usize,
    ) -> Prefetch {
        let width = nc.saturating_sub(start).min(panel);
        let base = b.wrapping_add(start * cs);
        let (step, run, lines) = if width == 0 {
            ((0, 0), 1, 0)
        } else if cs == 1 {
            let run = (width - 1) / 16 + 2;
            (((width - 1) / (run - 1), rs), run, run * kc)
        } else if rs == 1 {
            let per_column = kc.div_ceil(16) + 1;
            ((16, cs), per_column, per_column * width)
        } else {
            ((0, 0), 1, 0)
        };
        Prefetch {
            base,
            step,
            run,
            lines,
            next: 0,
            within: 0,
            at: base,
        }
    }

    /// Prefetches the next `count` lines.
    #[inline(always)]
    fn issue(&mut self, count: usize) {
        let end = (self.next + count).min(self.lines);
        while self.next < end {
            // SAFETY: a prefetch is a hint; it never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(self.at.cast()) };
            self.next += 1;
            self.within += 1;
            if self.within == self.run {
                self.within = 0;
                self.base = self.base.wrapping_add(self.step.1);
                self.at = self.base;
            } else {
                self.at = self.at.wrapping_add(self.step.0);
            }
        }
    }
}

/// Packs `nr` columns of `b` (`kc` rows) as `[k][panel]`, zero beyond `nr`
/// (`panel` a multiple of 8).
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_b(
    kc: usize,
    (nr, panel): (usize, usize),
    b: *const f32,
    (rs, cs): (usize, usize),
    out: *mut f32,
) {
    if nr == panel && cs == 1 {
        for p in 0..kc {
            let (src, dst) = (b.add(p * rs), out.add(p * panel));
            for j in (0..panel).step_by(8) {
                _mm256_storeu_ps(dst.add(j), _mm256_loadu_ps(src.add(j)));
            }
        }
    } else if nr == panel && rs == 1 {
        // Columns run down the depth (a weight read as its transpose):
        // eight columns by eight rows at a time through a transpose.
        let whole = kc / 8 * 8;
        for p in (0..whole).step_by(8) {
            for j in (0..panel).step_by(8) {
                let src = b.add(j * cs + p);
                let rows = transpose8(load_rows(src, cs, 8));
                for (q, v) in rows.into_iter().enumerate() {
                    _mm256_storeu_ps(out.add((p + q) * panel + j), v);
                }
            }
        }
        for p in whole..kc {
            for j in 0..panel {
                *out.add(p * panel + j) = *b.add(j * cs + p);
            }
        }
    } else {
        for p in 0..kc {
            for j in 0..panel {
                *out.add(p * panel + j) = if j < nr { *b.add(p * rs + j * cs) } else { 0.0 };
            }
        }
    }
}

/// Most rows of an `a` panel that [`pack_a`] packs through transposes.
const PACK_A_ROWS: usize = 16;

/// Packs `mr` rows of `a` (`kc` columns) as `[k][panel]`, zero beyond `mr`
/// (`panel ≤ 16`). Writes up to seven elements past the panel (the next
/// panel's first, or the buffer's spare ones), which are packed over
/// afterwards.
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_a(
    kc: usize,
    (mr, panel): (usize, usize),
    a: *const f32,
    (rs, cs): (usize, usize),
    out: *mut f32,
) {
    if mr == panel && cs == 1 && panel <= PACK_A_ROWS {
        // Rows run along the depth: up to eight rows by eight columns at a
        // time through a transpose; each transposed column is stored as a
        // whole vector whose lanes past the panel's rows the next store
        // overwrites (so a column's groups are stored in order, and each
        // column after the one before).
        let whole = kc / 8 * 8;
        for p in (0..whole).step_by(8) {
            let mut cols = [[_mm256_setzero_ps(); 8]; PACK_A_ROWS / 8];
            for (g, group) in cols.iter_mut().enumerate().take(panel.div_ceil(8)) {
                let rows = (panel - 8 * g).min(8);
                *group = transpose8(load_rows(a.add(8 * g * rs + p), rs, rows));
            }
            for q in 0..8 {
                for (g, group) in cols.iter().enumerate().take(panel.div_ceil(8)) {
                    _mm256_storeu_ps(out.add((p + q) * panel + 8 * g), group[q]);
                }
            }
        }
        for p in whole..kc {
            for r in 0..panel {
                *out.add(p * panel + r) = *a.add(r * rs + p);
            }
        }
    } else if mr == panel && rs == 1 {
        // Columns run down the rows (a weight read as its transpose in an
        // input gradient): each column's rows are masked loads of up to
        // eight, which read nothing past them, stored as whole vectors as
        // above.
        for p in 0..kc {
            for g in (0..panel).step_by(8) {
                let lanes = (panel - g).min(8) as i32;
                let mask = _mm256_cmpgt_epi32(
                    _mm256_set1_epi32(lanes),
                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                );
                let column = _mm256_maskload_ps(a.add(p * cs + g), mask);
                _mm256_storeu_ps(out.add(p * panel + g), column);
            }
        }
    } else {
        for p in 0..kc {
            for r in 0..panel {
                *out.add(p * panel + r) = if r < mr { *a.add(r * rs + p * cs) } else { 0.0 };
            }
        }
    }
}

/// Prefetches the lines of the `mr × nr` corner of a tile of `c` (rows
/// `rs` apart): in each row, every 16th element and the last.
#[inline(always)]
unsafe fn prefetch_tile(c: *mut f32, rs: usize, mr: usize, nr: usize) {
    for r in 0..mr {
        let row = c.add(r * rs);
        for j in (0..nr).step_by(16) {
            _mm_prefetch::<_MM_HINT_T0>(row.add(j).cast());
        }
        _mm_prefetch::<_MM_HINT_T0>(row.add(nr - 1).cast());
    }
}

/// Eight vectors of eight floats from `src`, `stride` apart: the first
/// `rows` loaded, the rest zero. (A plain loop, not `array::from_fn`: a
/// closure is not compiled with the caller's target features.)
#[inline(always)]
unsafe fn load_rows(src: *const f32, stride: usize, rows: usize) -> [__m256; 8] {
    let mut v = [_mm256_setzero_ps(); 8];
    for (r, v) in v.iter_mut().enumerate().take(rows) {
        *v = _mm256_loadu_ps(src.add(r * stride));
    }
    v
}

/// Calls `$kernel::<R, $v>` for the row count `$mr` (1 to `$max`).
macro_rules! by_rows {
    ($kernel:ident, $v:literal, $mr:expr, $args:tt, [$($r:literal)*]) => {
        match $mr {
            $($r => $kernel::<$r, $v> $args,)*
            _ => unreachable!("a micro-tile has 1 to MR rows"),
        }
    };
}

impl Kernel for Avx2 {
    const MR: usize = 6;
    const NR: usize = 16;

    unsafe fn tile(
        mr: usize,
        kc: usize,
        (a, b): (*const f32, *const f32),
        c: (*mut f32, usize),
        nr: usize,
        add: bool,
    ) {
        // One kernel per row count and vector count: a panel of at most 8
        // columns (the last of 49) takes one vector per row.
        if nr > 8 {
            by_rows!(avx2_tile, 2, mr, (kc, a, b, c, nr, add), [1 2 3 4 5 6])
        } else {
            by_rows!(avx2_tile, 1, mr, (kc, a, b, c, nr, add), [1 2 3 4 5 6])
        }
    }
}

impl Kernel for Avx512 {
    const MR: usize = 12;
    const NR: usize = 32;

    unsafe fn tile(
        mr: usize,
        kc: usize,
        (a, b): (*const f32, *const f32),
        c: (*mut f32, usize),
        nr: usize,
        add: bool,
    ) {
        if nr > 16 {
            by_rows!(avx512_tile, 2, mr, (kc, a, b, c, nr, add), [1 2 3 4 5 6 7 8 9 10 11 12])
        } else {
            by_rows!(avx512_tile, 1, mr, (kc, a, b, c, nr, add), [1 2 3 4 5 6 7 8 9 10 11 12])
        }
    }
}

/// One step of [`sum_panels`]: a row of `b`'s panel times each row's
/// broadcast `a`, into the accumulators; both panels advance.
macro_rules! panel_step {
    (
        $acc:ident,
        $a:ident,
        $b:ident,
        ($mr:expr, $nr:expr, $lanes:expr),
        ($zero:ident, $load:ident, $splat:ident, $fmadd:ident)
    ) => {{
        let mut bv = [$zero(); V];
        for (h, v) in bv.iter_mut().enumerate() {
            *v = $load($b.add($lanes * h));
        }
        for (r, row) in $acc.iter_mut().enumerate() {
            let x = $splat(*$a.add(r));
            for (sum, &bh) in row.iter_mut().zip(&bv) {
                *sum = $fmadd(x, bh, *sum);
            }
        }
        $a = $a.add($mr);
        $b = $b.add($nr);
    }};
}

/// The `R × V` vector accumulators of one micro-tile, `Σ_k a[k]·b[k]` over
/// `kc` steps of the packed panels (`a` `[k][mr]`, `b` `[k][nr]`, vectors
/// of `lanes`), each summed from zero with one fused multiply-add per step:
/// the loop both kernels share, given their intrinsics. A macro, not a
/// generic function or a closure, so that it is compiled inside each
/// kernel's `target_feature` function.
macro_rules! sum_panels {
    (
        $kc:expr,
        ($a:expr, $b:expr),
        ($mr:expr, $nr:expr, $lanes:expr),
        ($zero:ident, $load:ident, $splat:ident, $fmadd:ident)
    ) => {{
        let mut acc = [[$zero(); V]; R];
        let (mut a, mut b) = ($a, $b);
        // Four steps written out a pass: the unrolled loop was measured
        // 6–11% faster than a loop the compiler left rolled.
        for _ in 0..$kc / 4 {
            panel_step!(
                acc,
                a,
                b,
                ($mr, $nr, $lanes),
                ($zero, $load, $splat, $fmadd)
            );
            panel_step!(
                acc,
                a,
                b,
                ($mr, $nr, $lanes),
                ($zero, $load, $splat, $fmadd)
            );
            panel_step!(
                acc,
                a,
                b,
                ($mr, $nr, $lanes),
                ($zero, $load, $splat, $fmadd)
            );
            panel_step!(
                acc,
                a,
                b,
                ($mr, $nr, $lanes),
                ($zero, $load, $splat, $fmadd)
            );
        }
        for _ in 0..$kc % 4 {
            panel_step!(
                acc,
                a,
                b,
                ($mr, $nr, $lanes),
                ($zero, $load, $splat, $fmadd)
            );
        }
        acc
    }};
}

/// One AVX2 micro-tile: the `R × nr` corner of a 6×16 tile (`nr ≤ 8V`).
/// The `R·V` accumulators stay in registers. A panel's last rows (`R < 6`,
/// e.g. 2 of a head's 128) or narrow last columns (`V = 1`) take no
/// multiply-adds for what they lack; every element's sum is the same as in
/// a whole tile.
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_tile<const R: usize, const V: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    (c, rs): (*mut f32, usize),
    nr: usize,
    add: bool,
) {
    const MR: usize = Avx2::MR;
    const NR: usize = Avx2::NR;
    let acc = sum_panels!(
        kc,
        (a, b),
        (MR, NR, 8),
        (
            _mm256_setzero_ps,
            _mm256_loadu_ps,
            _mm256_set1_ps,
            _mm256_fmadd_ps
        )
    );
    if nr == 8 * V {
        for (r, row) in acc.iter().enumerate() {
            let d = c.add(r * rs);
            for (h, &v) in row.iter().enumerate() {
                let d = d.add(h * 8);
                let v = if add {
                    _mm256_add_ps(_mm256_loadu_ps(d), v)
                } else {
                    v
                };
                _mm256_storeu_ps(d, v);
            }
        }
    } else {
        let mut tile = [0f32; MR * NR];
        for (r, row) in acc.iter().enumerate() {
            for (h, &v) in row.iter().enumerate() {
                _mm256_storeu_ps(tile.as_mut_ptr().add(r * NR + 8 * h), v);
            }
        }
        for r in 0..R {
            for j in 0..nr {
                let d = c.add(r * rs + j);
                let v = tile[r * NR + j];
                *d = if add { *d + v } else { v };
            }
        }
    }
}

/// One AVX-512 micro-tile: the `R × nr` corner of a 12×32 tile (`nr ≤
/// 16V`), as [`avx2_tile`]; a narrow tile's columns are stored through
/// lane masks.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn avx512_tile<const R: usize, const V: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    (c, rs): (*mut f32, usize),
    nr: usize,
    add: bool,
) {
    let acc = sum_panels!(
        kc,
        (a, b),
        (Avx512::MR, Avx512::NR, 16),
        (
            _mm512_setzero_ps,
            _mm512_loadu_ps,
            _mm512_set1_ps,
            _mm512_fmadd_ps
        )
    );
    for (r, row) in acc.iter().enumerate() {
        let d = c.add(r * rs);
        for (h, &v) in row.iter().enumerate() {
            let d = d.add(h * 16);
            let lanes = nr.saturating_sub(16 * h).min(16);
            let mask: __mmask16 = if lanes == 16 { !0 } else { (1u16 << lanes) - 1 };
            let v = if add {
                _mm512_add_ps(_mm512_maskz_loadu_ps(mask, d), v)
            } else {
                v
            };
            _mm512_mask_storeu_ps(d, mask, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::primitives::test_values as values;

    /// A `rows × cols` operand in one of three layouts: row-major,
    /// column-major, or rows 3 apart with columns `3·rows + 1` apart.
    fn operand(rows: usize, cols: usize, layout: usize, seed: u64) -> (Vec<f32>, usize, usize) {
        let (rs, cs) = match layout {
            0 => (cols, 1),
            1 => (1, rows),
            _ => (3, 3 * rows + 1),
        };
        let len = (rows.max(1) - 1) * rs + (cols.max(1) - 1) * cs + 1;
        (values(len, seed), rs, cs)
    }

    /// Runs the product on the kernel `K`; panics where it did not run.
    fn product<K: Kernel>(
        mnk: (usize, usize, usize),
        dst: &mut [f32],
        dst_rs: usize,
        (a, ars, acs): (&[f32], usize, usize),
        (b, brs, bcs): (&[f32], usize, usize),
        accumulate: bool,
    ) {
        let a = Matrix {
            ptr: a.as_ptr(),
            rs: ars,
            cs: acs,
        };
        let b = Matrix {
            ptr: b.as_ptr(),
            rs: brs,
            cs: bcs,
        };
        let out = Out {
            ptr: dst.as_mut_ptr(),
            rs: dst_rs,
            accumulate,
        };
        // SAFETY: the CPU has K's instruction set (the callers check); the
        // operands hold every element through their strides.
        let ran = unsafe { with_kernel::<K>(mnk, out, a, b) };
        assert!(ran, "the product did not run");
    }

    /// Runs `check::<K>` for each kernel the CPU has, and says which it
    /// could not run.
    macro_rules! on_every_kernel {
        ($check:ident) => {
            if CpuPath::Avx2.available() {
                $check::<Avx2>();
            } else {
                eprintln!(
                    "{}: this CPU has no AVX2 + FMA; not run",
                    stringify!($check)
                );
            }
            if CpuPath::Avx512.available() {
                $check::<Avx512>();
            } else {
                eprintln!("{}: this CPU has no AVX-512; not run", stringify!($check));
            }
        };
    }

    #[test]
    fn matches_an_f64_product_in_every_layout() {
        on_every_kernel!(matches_f64);
    }

    fn matches_f64<K: Kernel>() {
        let shapes = [
            (1, 1, 1),
            (5, 17, 3),
            (6, 16, 8),
            (7, 33, 9),
            (12, 32, 16),
            (13, 40, 257),
            (25, 70, 11),
            (37, 53, 70),
            (100, 150, 513),
            (300, 20, 31),
        ];
        let u = f64::from(f32::EPSILON) / 2.0;
        for (si, &(m, n, k)) in shapes.iter().enumerate() {
            for layouts in 0..9 {
                for accumulate in [false, true] {
                    let seed = (si * 100 + layouts * 2) as u64;
                    let (a, ars, acs) = operand(m, k, layouts / 3, seed);
                    let (b, brs, bcs) = operand(k, n, layouts % 3, seed + 1);
                    let start = values(m * n, seed + 2);
                    let mut dst = if accumulate {
                        start.clone()
                    } else {
                        vec![f32::NAN; m * n]
                    };
                    product::<K>(
                        (m, n, k),
                        &mut dst,
                        n,
                        (&a, ars, acs),
                        (&b, brs, bcs),
                        accumulate,
                    );
                    for i in 0..m {
                        for j in 0..n {
                            let (mut sum, mut size) = (0.0f64, 0.0f64);
                            for p in 0..k {
                                let t = f64::from(a[i * ars + p * acs])
                                    * f64::from(b[p * brs + j * bcs]);
                                sum += t;
                                size += t.abs();
                            }
                            let c0 = if accumulate {
                                f64::from(start[i * n + j])
                            } else {
                                0.0
                            };
                            let bound = 2.0 * (k as f64 + 2.0) * u * (size + c0.abs());
                            let got = f64::from(dst[i * n + j]);
                            assert!(
                                (got - (sum + c0)).abs() <= bound,
                                "{m}×{n}×{k}, layouts {layouts}, accumulate {accumulate}: \
                                 [{i},{j}] = {got}, want {} ± {bound}",
                                sum + c0
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn blocks_of_rows_or_columns_give_the_whole_products_bits() {
        on_every_kernel!(blocks_match_whole);
    }

    fn blocks_match_whole<K: Kernel>() {
        // Several depth blocks, row blocks and column passes.
        for &(m, n, k) in &[(600, 40, 700), (7, 3100, 300), (50, 77, 256)] {
            let (a, ars, acs) = operand(m, k, 0, 1);
            let (b, brs, bcs) = operand(k, n, 1, 2);
            let mut whole = vec![0.0; m * n];
            product::<K>(
                (m, n, k),
                &mut whole,
                n,
                (&a, ars, acs),
                (&b, brs, bcs),
                false,
            );
            let mut parts = vec![0.0; m * n];
            let (rows, cols) = (m * 2 / 5, n * 3 / 7);
            // Rows `..rows` whole; the rest in two column blocks.
            product::<K>(
                (rows, n, k),
                &mut parts,
                n,
                (&a, ars, acs),
                (&b, brs, bcs),
                false,
            );
            let rest = &a[rows * ars..];
            let dst = &mut parts[rows * n..];
            product::<K>(
                (m - rows, cols, k),
                dst,
                n,
                (rest, ars, acs),
                (&b, brs, bcs),
                false,
            );
            let b_right = &b[cols * bcs..];
            product::<K>(
                (m - rows, n - cols, k),
                &mut dst[cols..],
                n,
                (rest, ars, acs),
                (b_right, brs, bcs),
                false,
            );
            let same = whole
                .iter()
                .zip(&parts)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{m}×{n}×{k}: blocks differ from the whole product");
        }
    }

    #[test]
    fn every_kernel_gives_the_same_bits() {
        if !(CpuPath::Avx2.available() && CpuPath::Avx512.available()) {
            eprintln!("every_kernel_gives_the_same_bits: needs AVX2 and AVX-512; not run");
            return;
        }
        for &(m, n, k) in &[(600, 40, 700), (13, 3100, 300), (50, 77, 256), (7, 5, 3)] {
            for layouts in 0..9 {
                for accumulate in [false, true] {
                    let (a, ars, acs) = operand(m, k, layouts / 3, 5);
                    let (b, brs, bcs) = operand(k, n, layouts % 3, 6);
                    let start = values(m * n, 7);
                    let run = |avx512: bool| {
                        let mut dst = start.clone();
                        let args = ((m, n, k), &mut dst[..], n);
                        let (a, b) = ((&a[..], ars, acs), (&b[..], brs, bcs));
                        if avx512 {
                            product::<Avx512>(args.0, args.1, args.2, a, b, accumulate);
                        } else {
                            product::<Avx2>(args.0, args.1, args.2, a, b, accumulate);
                        }
                        dst
                    };
                    let (x, y) = (run(false), run(true));
                    let same = x.iter().zip(&y).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(
                        same,
                        "{m}×{n}×{k}, layouts {layouts}: AVX2 and AVX-512 differ"
                    );
                }
            }
        }
    }
}
