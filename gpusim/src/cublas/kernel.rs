//! The GEMM's products `acc[i][j] = Σ_p op(A)[i][p]·op(B)[p][j]`, each a
//! strictly sequential chain of fused multiply-adds over p = 0..k from 0,
//! computed fast without changing a single rounding.
//!
//! Speed comes only from reordering *independent* chains: an `MR × NR`
//! tile of C is accumulated at once (register blocking: each loaded A and
//! B value feeds several chains, and the chains of one row block fill a
//! SIMD register), k is cut into blocks of [`KC`] whose partial sums wait
//! in memory (exact: they are stored in the accumulator type) so that the
//! operands stay in cache, and column panels of C go to separate threads.
//! Every chain still sees its k terms in order, one FMA each, so the
//! result is bit-identical to the plain loop.
//!
//! Operands are packed first: op(A) in panels of `MR` rows (element
//! (i, p) of panel `ip` at `ip·MR·k + p·MR + i`), op(B) in panels of
//! [`NR`] columns (element (p, j) of panel `jp` at `jp·NR·k + p·NR + j`),
//! zero-padded to whole panels; padded rows and columns are computed and
//! dropped.

/// Arithmetic of the accumulator type.
pub(super) trait Acc: Copy + Default + Send + Sync + std::ops::Mul<Output = Self> {
    /// `self·b + c`, rounded once.
    fn fma(self, b: Self, c: Self) -> Self;
    /// From f64 (rounded to nearest).
    fn of(v: f64) -> Self;
    /// To f64 (exact).
    fn widen(self) -> f64;
}

impl Acc for f32 {
    #[inline(always)]
    fn fma(self, b: f32, c: f32) -> f32 {
        self.mul_add(b, c)
    }
    fn of(v: f64) -> f32 {
        v as f32
    }
    fn widen(self) -> f64 {
        self as f64
    }
}

impl Acc for f64 {
    #[inline(always)]
    fn fma(self, b: f64, c: f64) -> f64 {
        self.mul_add(b, c)
    }
    fn of(v: f64) -> f64 {
        v
    }
    fn widen(self) -> f64 {
        self
    }
}

/// Columns of a micro-tile: with two SIMD registers of rows, 2·6 = 12
/// accumulator registers plus the operands fit AVX2's 16.
pub(super) const NR: usize = 6;
/// The k block: a B panel block (`NR·KC` values) stays in L1.
const KC: usize = 256;
/// Bytes of packed A per cache block (`KC` by some rows): stays in L2.
const A_BLOCK_BYTES: usize = 256 * 1024;
/// Below this many multiply-adds a product stays on one thread (spawning
/// costs tens of microseconds).
const PARALLEL_MIN: usize = 1 << 22;

/// Rows of a micro-tile for accumulator `T`: two 256-bit registers.
pub(super) const fn mr<T>() -> usize {
    2 * 32 / std::mem::size_of::<T>()
}

/// How a stored matrix (`rows × cols`, column-major) is packed into
/// panels of `w` lanes (the i of op(A), the j of op(B)) by k, zero-padded
/// to whole panels: lane l at step p goes to `(l/w)·w·k + p·w + l%w`. The
/// lanes are the stored rows unless `lanes_are_cols`. Columns are packed
/// as they are read, so the source is walked in memory order.
#[derive(Clone, Copy)]
pub(super) struct Packing {
    lanes_are_cols: bool,
    w: usize,
    k: usize,
}

impl Packing {
    /// Sizes and zeroes `out` for the packing of a `rows × cols` matrix.
    pub(super) fn new<T: Acc>(
        (rows, cols): (usize, usize),
        lanes_are_cols: bool,
        w: usize,
        out: &mut Vec<T>,
    ) -> Packing {
        let (lanes, k) = if lanes_are_cols {
            (cols, rows)
        } else {
            (rows, cols)
        };
        out.clear();
        out.resize(lanes.div_ceil(w) * w * k, T::default());
        Packing {
            lanes_are_cols,
            w,
            k,
        }
    }

    /// Packs stored column `c` (`col`), converted by `conv`.
    #[inline]
    pub(super) fn column<T: Acc>(
        self,
        out: &mut [T],
        c: usize,
        col: &[f64],
        conv: impl Fn(f64) -> T,
    ) {
        let (w, k) = (self.w, self.k);
        if self.lanes_are_cols {
            // Column c is lane c: its k values go w apart.
            let base = (c / w) * w * k + c % w;
            for (p, &v) in col.iter().enumerate() {
                out[base + p * w] = conv(v);
            }
        } else {
            // Column c is step p = c: each panel takes w consecutive lanes.
            for (pi, lanes) in col.chunks(w).enumerate() {
                let dst = &mut out[pi * w * k + c * w..][..lanes.len()];
                for (d, &v) in dst.iter_mut().zip(lanes) {
                    *d = conv(v);
                }
            }
        }
    }

    /// Packs a whole contiguous stored matrix.
    #[cfg(test)]
    fn all<T: Acc>(src: &[f64], shape: (usize, usize), lanes_are_cols: bool, w: usize) -> Vec<T> {
        let mut out = Vec::new();
        let p = Packing::new(shape, lanes_are_cols, w, &mut out);
        for (c, col) in src.chunks_exact(shape.0.max(1)).take(shape.1).enumerate() {
            p.column(&mut out, c, col, T::of);
        }
        out
    }
}

/// One micro-tile over one k block: `acc` (`NR` columns of `MR`) continues
/// its chains with the `kc` terms of `a` (`kc × MR`) and `b` (`kc × NR`).
#[inline(always)]
fn tile<T: Acc, const MR: usize>(a: &[T], b: &[T], acc: &mut [T]) {
    let mut c = [[T::default(); MR]; NR];
    for (j, col) in c.iter_mut().enumerate() {
        col.copy_from_slice(&acc[j * MR..(j + 1) * MR]);
    }
    for (ap, bp) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        // Fixed-size views: the loops below unroll into SIMD FMAs.
        let ap: &[T; MR] = ap.try_into().expect("MR values");
        let bp: &[T; NR] = bp.try_into().expect("NR values");
        for (col, &bj) in c.iter_mut().zip(bp) {
            for (x, &ai) in col.iter_mut().zip(ap) {
                *x = ai.fma(bj, *x);
            }
        }
    }
    for (j, col) in c.iter().enumerate() {
        acc[j * MR..(j + 1) * MR].copy_from_slice(col);
    }
}

/// The products of all row panels with column panels `jps` into `out`
/// (those columns of C, column-major with leading dimension `m`).
#[inline(always)]
fn panels<T: Acc, const MR: usize>(
    (m, n, k): (usize, usize, usize),
    ap: &[T],
    bp: &[T],
    jps: std::ops::Range<usize>,
    out: &mut [T],
) {
    let ips = m.div_ceil(MR);
    let tile_len = MR * NR;
    // Partial sums of every tile between k blocks, in tile order.
    let mut acc = vec![T::default(); ips * jps.len() * tile_len];
    let mcp = (A_BLOCK_BYTES / (KC * MR * std::mem::size_of::<T>())).max(1);
    for kb in (0..k).step_by(KC) {
        let kc = KC.min(k - kb);
        for mb in (0..ips).step_by(mcp) {
            let mbs = mb..(mb + mcp).min(ips);
            for (jl, jp) in jps.clone().enumerate() {
                let b = &bp[jp * NR * k + kb * NR..][..kc * NR];
                for ip in mbs.clone() {
                    let a = &ap[ip * MR * k + kb * MR..][..kc * MR];
                    let t = (jl * ips + ip) * tile_len;
                    tile::<T, MR>(a, b, &mut acc[t..t + tile_len]);
                }
            }
        }
    }
    let j0 = jps.start * NR;
    for (jl, jp) in jps.enumerate() {
        for jj in 0..NR.min(n - jp * NR) {
            let col = &mut out[(jp * NR + jj - j0) * m..][..m];
            for (i, x) in col.iter_mut().enumerate() {
                *x = acc[(jl * ips + i / MR) * tile_len + jj * MR + i % MR];
            }
        }
    }
}

/// [`panels`] compiled for AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn panels_avx2<T: Acc, const MR: usize>(
    dims: (usize, usize, usize),
    ap: &[T],
    bp: &[T],
    jps: std::ops::Range<usize>,
    out: &mut [T],
) {
    panels::<T, MR>(dims, ap, bp, jps, out)
}

/// [`panels`] on the best instructions the CPU has: the host's FMA where
/// present (the portable `mul_add` is a library call, many times slower),
/// else portable; both round identically.
fn panels_dispatch<T: Acc, const MR: usize>(
    dims: (usize, usize, usize),
    ap: &[T],
    bp: &[T],
    jps: std::ops::Range<usize>,
    out: &mut [T],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the AVX2 and FMA instructions.
        return unsafe { panels_avx2::<T, MR>(dims, ap, bp, jps, out) };
    }
    panels::<T, MR>(dims, ap, bp, jps, out)
}

/// `out[i + j·m]` = the product chain of row i and column j, from packed
/// `ap` and `bp` (see the module doc), on several threads when it is big.
pub(super) fn product<T: Acc, const MR: usize>(
    (m, n, k): (usize, usize, usize),
    ap: &[T],
    bp: &[T],
    out: &mut [T],
) {
    let jpanels = n.div_ceil(NR);
    let threads = if m * n * k < PARALLEL_MIN {
        1
    } else {
        // Asked once: the answer reads cgroup files on Linux.
        static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let cores =
            *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |t| t.get()));
        cores.min(jpanels)
    };
    if threads <= 1 {
        return panels_dispatch::<T, MR>((m, n, k), ap, bp, 0..jpanels, out);
    }
    std::thread::scope(|s| {
        let mut rest = out;
        let mut start = 0;
        for t in 0..threads {
            let end = jpanels * (t + 1) / threads;
            let cols = (end * NR).min(n) - start * NR;
            let (mine, tail) = rest.split_at_mut(cols * m);
            rest = tail;
            let jps = start..end;
            s.spawn(move || panels_dispatch::<T, MR>((m, n, k), ap, bp, jps, mine));
            start = end;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain loop: one chain per element.
    fn reference<T: Acc>(m: usize, n: usize, k: usize, a: &[T], b: &[T]) -> Vec<T> {
        let mut out = vec![T::default(); m * n];
        for j in 0..n {
            for i in 0..m {
                let mut acc = T::default();
                for p in 0..k {
                    acc = a[i * k + p].fma(b[p * n + j], acc);
                }
                out[i + j * m] = acc;
            }
        }
        out
    }

    /// Deterministic values of mixed magnitude, so that rounding differs
    /// with the summation order.
    fn values(len: usize, seed: u64) -> Vec<f64> {
        let mut s = seed | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let v = (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
                v * [1.0, 1e3, 1e-3, 7.0][(s % 4) as usize]
            })
            .collect()
    }

    fn check<T: Acc + PartialEq + std::fmt::Debug, const MR: usize>(m: usize, n: usize, k: usize) {
        let (a64, b64) = (values(m * k, 1), values(k * n, 2));
        let a: Vec<T> = a64.iter().map(|&v| T::of(v)).collect();
        let b: Vec<T> = b64.iter().map(|&v| T::of(v)).collect();
        // a is row-major m × k: stored column-major, k × m with lanes as
        // columns; b is row-major k × n: stored n × k, lanes as rows.
        let ap = Packing::all::<T>(&a64, (k, m), true, MR);
        let bp = Packing::all::<T>(&b64, (n, k), false, NR);
        let want = reference(m, n, k, &a, &b);
        let mut fast = vec![T::default(); m * n];
        product::<T, MR>((m, n, k), &ap, &bp, &mut fast);
        let mut portable = vec![T::default(); m * n];
        panels::<T, MR>((m, n, k), &ap, &bp, 0..n.div_ceil(NR), &mut portable);
        let bits = |v: &[T]| v.iter().map(|x| x.widen().to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fast), bits(&want), "{m}×{n}×{k}");
        assert_eq!(bits(&portable), bits(&want), "{m}×{n}×{k} portable");
    }

    #[test]
    fn tiles_blocks_and_threads_keep_every_chain() {
        for (m, n, k) in [
            (1, 1, 1),
            (1, 1, 0),
            (17, 7, 3),
            (33, 13, 257),
            (5, 1, 600),
            (100, 40, 1500),
            (300, 13, 40),
        ] {
            check::<f32, { mr::<f32>() }>(m, n, k);
            check::<f64, { mr::<f64>() }>(m, n, k);
        }
    }
}
