//! Matrix products: batched, with NumPy broadcasting of the batch dims.
//! Operands are read through their own strides (a transposed view needs no
//! copy); only a stride pattern gemm cannot use (no unit stride in the
//! matrix, or a broadcast row/column) is copied to contiguous first. f32
//! runs on [`x86_f32`] where the CPU has AVX2 and FMA or AVX-512, and on the `gemm`
//! crate elsewhere; f64 and f16 on the `gemm` crate; bf16 goes through f32
//! and back.

#[cfg(target_arch = "x86_64")]
mod x86_f32;

use super::contiguous_copy;
use super::cuda::matmul as ops_matmul;
use crate::dtype::CpuData;
use crate::memory::host::{try_collect, try_vec, try_zeroed};
use crate::meta::{backend, Backend};
use crate::tensor::{broadcast_shapes, checked_numel, Layout, Tensor};
use crate::{DType, Error, Result};
use gemm::Parallelism;
use half::{bf16, f16};
use rayon::prelude::*;
use std::ops::Range;

/// `m·n·k` from which one product is split across rayon's threads.
const PARALLEL_WORK: usize = 1 << 17;

/// One operand as gemm reads it: where each batch's matrix starts, and its
/// row and column strides in elements.
struct Operand {
    offsets: Vec<usize>,
    rs: usize,
    cs: usize,
}

/// `dst[i] (m×n) = a[i] (m×k) · b[i] (k×n)` for every batch entry `i`, with
/// `dst` contiguous.
struct Plan {
    m: usize,
    n: usize,
    k: usize,
    a: Operand,
    b: Operand,
}

/// The shape of the product of `a` `[.., m, k]` and `b` `[.., k, n]` (both
/// rank ≥ 2): the broadcast batch dims, then `[m, n]`.
pub(crate) fn matmul_shape(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let err = || Error::ShapeMismatch {
        op: "matmul",
        lhs: a.to_vec(),
        rhs: b.to_vec(),
    };
    let (ra, rb) = (a.len(), b.len());
    if ra < 2 || rb < 2 || a[ra - 1] != b[rb - 2] {
        return Err(err());
    }
    let mut out = broadcast_shapes("matmul", &a[..ra - 2], &b[..rb - 2]).map_err(|_| err())?;
    out.extend([a[ra - 2], b[rb - 1]]);
    checked_numel("matmul", &out)?;
    Ok(out)
}

/// Strides gemm can use for a `rows × cols` matrix, or `None` when the
/// pattern must be copied: one axis must have unit stride and no axis longer
/// than 1 may have stride 0. The stride of a unit axis is free and is chosen.
pub(crate) fn usable(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<(usize, usize)> {
    if rows == 0 || cols == 0 {
        return Some((cols.max(1), 1));
    }
    let rs = match (rows <= 1, cs == 1) {
        (true, true) => cols.max(1),
        (true, false) => 1,
        (false, _) => rs,
    };
    let cs = match (cols <= 1, rs == 1) {
        (true, true) => rows.max(1),
        (true, false) => 1,
        (false, _) => cs,
    };
    let ok = (rows <= 1 || rs != 0) && (cols <= 1 || cs != 0) && (rs == 1 || cs == 1);
    ok.then_some((rs, cs))
}

fn matrix_usable(l: &Layout) -> bool {
    let (s, t, r) = (l.shape(), l.strides(), l.shape().len());
    usable(s[r - 2], s[r - 1], t[r - 2], t[r - 1]).is_some()
}

/// `t` itself when gemm can read its matrices, else a contiguous copy.
fn usable_operand(t: &Tensor) -> Result<Tensor> {
    if matrix_usable(t.layout()) {
        Ok(t.clone())
    } else {
        contiguous_copy(t)
    }
}

/// The stride of `(size, stride)` dims read as one dim of their product
/// (row-major nesting), if they nest; unit dims are ignored.
pub(super) fn merged_stride(dims: &[(usize, usize)]) -> Option<usize> {
    let dims: Vec<_> = dims.iter().filter(|d| d.0 != 1).collect();
    let Some(&&(size, stride)) = dims.last() else {
        return Some(1);
    };
    let mut need = size * stride;
    for &&(d, s) in dims.iter().rev().skip(1) {
        if s != need {
            return None;
        }
        need *= d;
    }
    Some(stride)
}

fn operand(l: &Layout, batch: &[usize], rows: usize, cols: usize) -> Result<Operand> {
    let nb = batch.len();
    let bl = l.broadcast_to(&[batch, &[rows, cols]].concat())?;
    let (rs, cs) = usable(rows, cols, bl.strides()[nb], bl.strides()[nb + 1]).ok_or(
        Error::InvalidArgument {
            op: "matmul",
            msg: "operand strides unusable by gemm".into(),
        },
    )?;
    let batch_layout = Layout::from_parts(batch.to_vec(), bl.strides()[..nb].to_vec(), bl.offset());
    Ok(Operand {
        offsets: batch_layout.offsets()?,
        rs,
        cs,
    })
}

/// Plans the product of two layouts whose matrices gemm can read. When `b`
/// is the same matrix for every batch entry and `a`'s batch and row dims nest,
/// the batch folds into the rows: one large product instead of many small.
fn plan(a: &Layout, b: &Layout) -> Result<Plan> {
    let out = matmul_shape(a.shape(), b.shape())?;
    let nb = out.len() - 2;
    let batch = &out[..nb];
    let (m, n, k) = (out[nb], out[nb + 1], a.shape()[a.shape().len() - 1]);
    let bl = b.broadcast_to(&[batch, &[k, n]].concat())?;
    let b_shared = bl.strides()[..nb]
        .iter()
        .zip(batch)
        .all(|(&s, &d)| s == 0 || d == 1);
    if nb > 0 && b_shared {
        let al = a.broadcast_to(&[batch, &[m, k]].concat())?;
        let rows: Vec<(usize, usize)> = batch
            .iter()
            .copied()
            .zip(al.strides()[..nb].iter().copied())
            .chain([(m, al.strides()[nb])])
            .collect();
        let m_all = batch.iter().product::<usize>() * m;
        if let Some(rs) = merged_stride(&rows) {
            if usable(m_all, k, rs, al.strides()[nb + 1]).is_some() {
                let folded =
                    Layout::from_parts(vec![m_all, k], vec![rs, al.strides()[nb + 1]], al.offset());
                let shared =
                    Layout::from_parts(vec![k, n], bl.strides()[nb..].to_vec(), bl.offset());
                return Ok(Plan {
                    m: m_all,
                    n,
                    k,
                    a: operand(&folded, &[], m_all, k)?,
                    b: operand(&shared, &[], k, n)?,
                });
            }
        }
    }
    Ok(Plan {
        m,
        n,
        k,
        a: operand(a, batch, m, k)?,
        b: operand(b, batch, k, n)?,
    })
}

/// Checks that every element gemm will read lies inside `len`.
fn check_bounds(o: &Operand, rows: usize, cols: usize, len: usize) -> Result<()> {
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let last = (rows - 1) * o.rs + (cols - 1) * o.cs;
    match o.offsets.iter().max() {
        Some(&max) if max + last >= len => Err(Error::InvalidArgument {
            op: "matmul",
            msg: "operand view reaches outside its storage".into(),
        }),
        _ => Ok(()),
    }
}

/// A pointer that may cross to rayon's threads: each thread of a split
/// product writes its own block of the destination.
struct Ptr<T>(*mut T);

// By hand: a derive would ask `T: Copy`.
impl<T> Clone for Ptr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Ptr<T> {}

// SAFETY: the parts of a split product write disjoint blocks of `dst` and
// only read `a` and `b` (see `Product::run`).
unsafe impl<T> Send for Ptr<T> {}
unsafe impl<T> Sync for Ptr<T> {}

impl<T> Ptr<T> {
    fn add(self, elements: usize) -> Self {
        Ptr(self.0.wrapping_add(elements))
    }
}

/// gemm multiplies a product whose sides are both at most this long in its
/// small-matrix branch, which blocks a depth over 512 otherwise.
const GEMM_SMALL_DIM: usize = 64;

/// Whether gemm adds the terms of every element in the same order in
/// products of shapes `a` and `b` (`(m, n, k)` each, the rows and columns
/// in either order): both past its branches for a depth of 2 or less, a
/// single row or column and at most 16·16 elements, with the same depth,
/// blocked alike. The depth blocking depends on `k` alone, except that a
/// product with both sides at most [`GEMM_SMALL_DIM`] takes 512 at a time
/// where a larger one evens the blocks out (the same for `k ≤ 512`). The
/// convolutions split their products across threads only where this holds,
/// so that results do not depend on the thread count. (The f32 product on
/// AVX2 adds alike in any split, its blocking depending on `k` alone; the
/// rule is the crate's, which the f32 product falls back to elsewhere.)
pub(crate) fn adds_alike(a: (usize, usize, usize), b: (usize, usize, usize)) -> bool {
    let blocking = |(m, n, k): (usize, usize, usize)| {
        let plain = k > 2 && m > 1 && n > 1 && m * n > 256;
        let small = m <= GEMM_SMALL_DIM && n <= GEMM_SMALL_DIM && k > 512;
        plain.then_some((k, small))
    };
    matches!((blocking(a), blocking(b)), (Some(x), Some(y)) if x == y)
}

/// Each part of a split dimension is a multiple of this many rows or
/// columns (gemm's widest micro-tile side), so that parts stay near equal
/// and most of their tiles whole.
const SPLIT_ALIGN: usize = 16;

/// One gemm call, `dst (m×n, rows dst_rs apart) (+)= a (m×k) · b (k×n)`,
/// through raw parts so that it can be split across threads.
#[derive(Clone, Copy)]
struct Product<T> {
    dst: Ptr<T>,
    dst_rs: usize,
    a: Ptr<T>,
    /// Row and column strides.
    a_strides: (usize, usize),
    b: Ptr<T>,
    b_strides: (usize, usize),
    mnk: (usize, usize, usize),
    accumulate: bool,
}

impl<T: Copy + Send + Sync + 'static> Product<T> {
    /// Runs the product, split into one block of rows or columns per rayon
    /// thread when `split` and it is large enough, each block a gemm call
    /// on its own thread. gemm's depth blocking depends on `k` alone for
    /// operands past its small-matrix branches, so every element is the
    /// same sum, added in the same order, as in one call: the split does
    /// not change a bit (and results do not depend on the thread count).
    /// gemm's own threading splits each depth block and joins after it,
    /// which gains far less on the convolutions' products (64 to 512 rows,
    /// 100 to 800 columns).
    ///
    /// # Safety
    ///
    /// `dst`, `a` and `b` must hold every element the product touches.
    unsafe fn run(self, (zero, one): (T, T), split: bool) {
        let (m, n, k) = self.mnk;
        let threads = rayon::current_num_threads();
        // The part length splitting `len` (against `other`), if the first
        // and the last (shortest) part add like the whole product.
        let parts = |len: usize, other: usize| {
            let part = len.div_ceil(threads).next_multiple_of(SPLIT_ALIGN);
            let last = len - (len.div_ceil(part) - 1) * part;
            let whole = (len, other, k);
            (part < len
                && adds_alike(whole, (part, other, k))
                && adds_alike(whole, (last, other, k)))
            .then_some(part)
        };
        let big = split && threads > 1 && k > 2 && m * n * k >= PARALLEL_WORK;
        // A column split packs `a` once per part, a row split `b`: split
        // the dimension whose other operand is the smaller.
        let (by_rows, by_cols) = if big {
            (parts(m, n), parts(n, m))
        } else {
            (None, None)
        };
        let choice = match (by_rows, by_cols) {
            (Some(r), Some(c)) => Some(if m >= n { (true, r) } else { (false, c) }),
            (Some(r), None) => Some((true, r)),
            (None, Some(c)) => Some((false, c)),
            (None, None) => None,
        };
        let Some((rows, part)) = choice else {
            return self.call(zero, one);
        };
        let len = if rows { m } else { n };
        (0..len.div_ceil(part)).into_par_iter().for_each(|i| {
            let (start, size) = (i * part, part.min(len - i * part));
            let mut p = self;
            if rows {
                p.dst = p.dst.add(start * p.dst_rs);
                p.a = p.a.add(start * p.a_strides.0);
                p.mnk.0 = size;
            } else {
                p.dst = p.dst.add(start);
                p.b = p.b.add(start * p.b_strides.1);
                p.mnk.1 = size;
            }
            // SAFETY: a block of the caller's product (same bounds).
            unsafe { p.call(zero, one) }
        });
    }

    /// One product on the caller's thread: f32 on AVX2 + FMA or AVX-512 through
    /// [`x86_f32`], everything else one gemm call.
    ///
    /// # Safety
    ///
    /// As [`Product::run`].
    unsafe fn call(self, zero: T, one: T) {
        let (m, n, k) = self.mnk;
        #[cfg(target_arch = "x86_64")]
        if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
            let matrix = |p: Ptr<T>, (rs, cs): (usize, usize)| x86_f32::Matrix {
                ptr: p.0.cast::<f32>().cast_const(),
                rs,
                cs,
            };
            let (a, b) = (
                matrix(self.a, self.a_strides),
                matrix(self.b, self.b_strides),
            );
            // SAFETY: `T` is f32; the caller's bounds.
            let dst = self.dst.0.cast::<f32>();
            if unsafe { x86_f32::gemm(self.mnk, dst, self.dst_rs, a, b, self.accumulate) } {
                return;
            }
        }
        let alpha = if self.accumulate { one } else { zero };
        // SAFETY: the caller's bounds.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                self.dst.0,
                1,
                self.dst_rs as isize,
                self.accumulate,
                self.a.0,
                self.a_strides.1 as isize,
                self.a_strides.0 as isize,
                self.b.0,
                self.b_strides.1 as isize,
                self.b_strides.0 as isize,
                alpha,
                one,
                false,
                false,
                false,
                Parallelism::None,
            )
        }
    }
}

/// Checks that `a` (`m×k`) and `b` (`k×n`), read from the start of slices
/// of `len` elements through their (row, column) strides, lie inside them.
fn check_slices(
    (m, n, k): (usize, usize, usize),
    (a_len, a_rs, a_cs): (usize, usize, usize),
    (b_len, b_rs, b_cs): (usize, usize, usize),
) -> Result<()> {
    let operand = |rs, cs| Operand {
        offsets: vec![0],
        rs,
        cs,
    };
    check_bounds(&operand(a_rs, a_cs), m, k, a_len)?;
    check_bounds(&operand(b_rs, b_cs), k, n, b_len)
}

/// Runs a plan: `dst = a·b`, or `dst += a·b` when `accumulate`.
fn execute<T: Copy + Send + Sync + 'static>(
    p: &Plan,
    dst: &mut [T],
    a: &[T],
    b: &[T],
    accumulate: bool,
    (zero, one): (T, T),
) -> Result<()> {
    let (m, n, k, batch) = (p.m, p.n, p.k, p.a.offsets.len());
    check_bounds(&p.a, m, k, a.len())?;
    check_bounds(&p.b, k, n, b.len())?;
    if m * n == 0 {
        return Ok(());
    }
    if dst.len() != batch * m * n || p.b.offsets.len() != batch {
        return Err(Error::InvalidArgument {
            op: "matmul",
            msg: "destination size does not match the product".into(),
        });
    }
    if k == 0 {
        if !accumulate {
            dst.fill(zero);
        }
        return Ok(());
    }
    let nthreads = rayon::current_num_threads();
    let threads = nthreads > 1;
    let one_product = |i: usize, d: &mut [T], split: bool| {
        let product = Product {
            dst: Ptr(d.as_mut_ptr()),
            dst_rs: n,
            a: Ptr(a.as_ptr().wrapping_add(p.a.offsets[i]).cast_mut()),
            a_strides: (p.a.rs, p.a.cs),
            b: Ptr(b.as_ptr().wrapping_add(p.b.offsets[i]).cast_mut()),
            b_strides: (p.b.rs, p.b.cs),
            mnk: (m, n, k),
            accumulate,
        };
        // SAFETY: `d` holds exactly m·n elements, written row-major; every
        // element read from `a` and `b` lies inside them (check_bounds).
        unsafe { product.run((zero, one), split) }
    };
    let work = m * n * k;
    // One whole product per thread where the entries share the threads out
    // evenly (or are many): splitting each product instead packs the other
    // operand once per part and joins the threads after every entry
    // (attention's 128×128×64 heads). Too small a batch to share is split.
    let shared_out = batch.is_multiple_of(nthreads) || batch >= 4 * nthreads;
    let per_entry = work * batch >= PARALLEL_WORK && (work < PARALLEL_WORK || shared_out);
    if threads && batch > 1 && per_entry {
        dst.par_chunks_mut(m * n)
            .enumerate()
            .for_each(|(i, d)| one_product(i, d, false));
    } else {
        dst.chunks_mut(m * n)
            .enumerate()
            .for_each(|(i, d)| one_product(i, d, threads));
    }
    Ok(())
}

/// `dst = a·b` (or `dst += a·b` when `accumulate`) over plain slices, for
/// CPU kernels that keep several operands in disjoint parts of one locked
/// buffer (which [`matmul_into`] would copy apart): `dst` a row-major `m×n`
/// matrix, `a` (`m×k`) and `b` (`k×n`) read from the start of their slices
/// through their (row, column) strides. `split`: the product may be split
/// across rayon's threads (false where the caller already runs one such
/// product per thread). f32, f64 and f16 (gemm's own types); anything else
/// is [`Error::UnsupportedDType`].
pub(crate) fn gemm_slices<T: crate::FloatDType>(
    dst: &mut [T],
    (m, n, k): (usize, usize, usize),
    a: (&[T], usize, usize),
    b: (&[T], usize, usize),
    (accumulate, split): (bool, bool),
) -> Result<()> {
    if dst.len() != m * n {
        return Err(Error::InvalidArgument {
            op: "matmul",
            msg: "destination size does not match the product".into(),
        });
    }
    native_dtype::<T>()?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    // The whole matrix as its one column block.
    let mut blocks = column_blocks(dst, (m, n), std::slice::from_ref(&(0..n)))?;
    blocks[0].gemm((0..n, k), a, b, (accumulate, split))
}

/// `Ok` for the dtypes gemm multiplies natively (f32, f64, f16).
fn native_dtype<T: crate::FloatDType>() -> Result<()> {
    match T::DTYPE {
        DType::F32 | DType::F64 | DType::F16 => Ok(()),
        dtype => Err(Error::UnsupportedDType {
            op: "matmul",
            dtype,
        }),
    }
}

/// One lane's block of columns of a row-major matrix shared by several
/// lanes (see [`column_blocks`]): the only writer of those columns, so that
/// lanes on rayon's threads can each multiply into their own columns of
/// one destination (the convolutions' weight gradient, whose lanes own
/// bands of the weight's columns).
pub(crate) struct ColumnBlock<'a, T> {
    /// The block's first column of row 0.
    start: Ptr<T>,
    rows: usize,
    /// Elements from one row to the next.
    rs: usize,
    cols: usize,
    _dst: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: a block writes only its own columns (disjoint from every other
// block of the same matrix, checked by `column_blocks`), within the borrow.
unsafe impl<T: Send> Send for ColumnBlock<'_, T> {}

/// Splits the `rows × rs` row-major matrix `dst` into blocks of the column
/// ranges `ranges` (ascending and disjoint, within `rs`), one per lane.
pub(crate) fn column_blocks<'a, T>(
    dst: &'a mut [T],
    (rows, rs): (usize, usize),
    ranges: &[Range<usize>],
) -> Result<Vec<ColumnBlock<'a, T>>> {
    let ascending = ranges.windows(2).all(|p| p[0].end <= p[1].start);
    let end = ranges.last().map_or(0, |r| r.end);
    let fits = rows == 0 || (end <= rs && (rows - 1) * rs + end <= dst.len());
    if !ascending || !fits || ranges.iter().any(|r| r.start > r.end) {
        return Err(Error::InvalidArgument {
            op: "matmul",
            msg: "destination blocks overlap or reach outside their storage".into(),
        });
    }
    let base = Ptr(dst.as_mut_ptr());
    Ok(ranges
        .iter()
        .map(|r| ColumnBlock {
            start: base.add(r.start),
            rows,
            rs,
            cols: r.len(),
            _dst: std::marker::PhantomData,
        })
        .collect())
}

impl<T: crate::FloatDType> ColumnBlock<'_, T> {
    /// Its columns `cols` (relative to the block) `= a·b`, or `+= a·b` when
    /// `accumulate`: `a` (`rows×k`) and `b` (`k×cols.len()`) read from the
    /// start of their slices through their (row, column) strides. `split`:
    /// the product may be split across rayon's threads (false where each
    /// thread already runs a block of its own).
    pub(crate) fn gemm(
        &mut self,
        (cols, k): (Range<usize>, usize),
        (a, a_rs, a_cs): (&[T], usize, usize),
        (b, b_rs, b_cs): (&[T], usize, usize),
        (accumulate, split): (bool, bool),
    ) -> Result<()> {
        native_dtype::<T>()?;
        let (m, n) = (self.rows, cols.len());
        if cols.start > cols.end || cols.end > self.cols {
            return Err(Error::InvalidArgument {
                op: "matmul",
                msg: "columns outside the block".into(),
            });
        }
        if m == 0 || n == 0 {
            return Ok(());
        }
        check_slices((m, n, k), (a.len(), a_rs, a_cs), (b.len(), b_rs, b_cs))?;
        let dst = self.start.add(cols.start);
        if k == 0 {
            if !accumulate {
                for i in 0..m {
                    // SAFETY: row i of the block's columns, inside `dst`
                    // (checked by `column_blocks`) and written only here.
                    unsafe { std::slice::from_raw_parts_mut(dst.add(i * self.rs).0, n) }
                        .fill(T::zero());
                }
            }
            return Ok(());
        }
        let product = Product {
            dst,
            dst_rs: self.rs,
            a: Ptr(a.as_ptr().cast_mut()),
            a_strides: (a_rs, a_cs),
            b: Ptr(b.as_ptr().cast_mut()),
            b_strides: (b_rs, b_cs),
            mnk: (m, n, k),
            accumulate,
        };
        // SAFETY: the block's columns lie inside the matrix and no other
        // block writes them (`column_blocks`); `a` and `b` hold every
        // element read (check_bounds).
        unsafe { product.run((T::zero(), T::one()), split) };
        Ok(())
    }
}

fn to_f32(data: &[bf16], l: &Layout) -> Result<Vec<f32>> {
    let mut v = try_vec(l.numel())?;
    l.for_each_offset(|o| v.push(data[o].to_f32()));
    Ok(v)
}

/// `dst[range] = a·b` (or `+=`), for operands gemm can read.
fn product_into(
    dst: &mut CpuData,
    range: Range<usize>,
    a: &Tensor,
    b: &Tensor,
    accumulate: bool,
) -> Result<()> {
    let da = a.storage().cpu()?;
    let db_guard = if a.shares_storage_with(b) {
        None
    } else {
        Some(b.storage().cpu()?)
    };
    let db: &CpuData = db_guard.as_deref().unwrap_or(&da);
    let (la, lb) = (a.layout(), b.layout());
    match (dst, &*da, db) {
        (CpuData::F32(d), CpuData::F32(x), CpuData::F32(y)) => {
            execute(&plan(la, lb)?, &mut d[range], x, y, accumulate, (0.0, 1.0))
        }
        (CpuData::F64(d), CpuData::F64(x), CpuData::F64(y)) => {
            execute(&plan(la, lb)?, &mut d[range], x, y, accumulate, (0.0, 1.0))
        }
        (CpuData::F16(d), CpuData::F16(x), CpuData::F16(y)) => execute(
            &plan(la, lb)?,
            &mut d[range],
            x,
            y,
            accumulate,
            (f16::ZERO, f16::ONE),
        ),
        (CpuData::BF16(d), CpuData::BF16(x), CpuData::BF16(y)) => {
            let (x, y) = (to_f32(x, la)?, to_f32(y, lb)?);
            let p = plan(
                &Layout::contiguous(a.shape()),
                &Layout::contiguous(b.shape()),
            )?;
            let d = &mut d[range];
            let mut acc: Vec<f32> = if accumulate {
                try_collect(d.len(), d.iter().map(|v| v.to_f32()))?
            } else {
                try_zeroed(d.len())?
            };
            execute(&p, &mut acc, &x, &y, accumulate, (0.0, 1.0))?;
            d.iter_mut()
                .zip(acc)
                .for_each(|(o, v)| *o = bf16::from_f32(v));
            Ok(())
        }
        (_, x, _) => Err(Error::UnsupportedDType {
            op: "matmul",
            dtype: x.dtype(),
        }),
    }
}

/// Operands must share a float dtype.
pub(crate) fn check_operands(a: &Tensor, b: &Tensor) -> Result<()> {
    if !a.dtype().is_float() {
        return Err(Error::UnsupportedDType {
            op: "matmul",
            dtype: a.dtype(),
        });
    }
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch {
            op: "matmul",
            expected: a.dtype(),
            got: b.dtype(),
        });
    }
    // Devices are checked by the dispatch (`Error::DeviceMismatch`).
    Ok(())
}

/// `a · b` for `a` `[.., m, k]` and `b` `[.., k, n]` (rank ≥ 2, batch dims
/// broadcast): a new contiguous `[batch.., m, n]` tensor (no autograd).
pub(crate) fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    check_operands(a, b)?;
    let shape = matmul_shape(a.shape(), b.shape())?;
    let (a, b) = (usable_operand(a)?, usable_operand(b)?);
    match backend("matmul", &[&a, &b])? {
        Backend::Meta => return crate::meta::empty(&shape, a.dtype()),
        Backend::Cuda(_) => return ops_matmul::matmul(&a, &b, &shape),
        Backend::Cpu => {}
    }
    let n = checked_numel("matmul", &shape)?;
    // The product writes every element (no accumulation).
    let mut data = CpuData::for_overwrite(a.dtype(), n)?;
    product_into(&mut data, 0..n, &a, &b, false)?;
    Tensor::from_cpu_data(data, &shape)
}

/// `dst = a · b` (`accumulate == false`) or `dst += a · b` (`true`), where
/// `dst` is contiguous with the product's shape and dtype: gemm's
/// `alpha·dst + beta·a·b` with beta = 1 and alpha = 0 or 1, so accumulation
/// needs no temporary. Operands may be any views (see [`matmul`]); one that
/// shares `dst`'s storage is copied first. Bumps `dst`'s version.
pub(crate) fn matmul_into(dst: &Tensor, a: &Tensor, b: &Tensor, accumulate: bool) -> Result<()> {
    check_operands(a, b)?;
    check_operands(dst, a)?;
    let shape = matmul_shape(a.shape(), b.shape())?;
    if dst.shape() != shape {
        return Err(Error::ShapeMismatch {
            op: "matmul_into",
            lhs: dst.shape().to_vec(),
            rhs: shape,
        });
    }
    let range = dst
        .layout()
        .contiguous_range()
        .ok_or(Error::InvalidArgument {
            op: "matmul_into",
            msg: "destination must be contiguous".into(),
        })?;
    let prepare = |t: &Tensor| {
        if dst.shares_storage_with(t) {
            contiguous_copy(t)
        } else {
            usable_operand(t)
        }
    };
    let (a, b) = (prepare(a)?, prepare(b)?);
    match backend("matmul_into", &[dst, &a, &b])? {
        Backend::Meta => {
            crate::meta::touch(dst);
            return Ok(());
        }
        Backend::Cuda(_) => return ops_matmul::matmul_into(dst, &a, &b, accumulate),
        Backend::Cpu => {}
    }
    let mut dd = dst.storage().cpu_mut()?;
    product_into(&mut dd, range, &a, &b, accumulate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::single_range_in_vec_init)] // one block of columns is meant
    fn column_blocks_write_only_their_columns_and_refuse_overlaps() {
        let (m, k, n) = (3, 4, 10);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.5 - 2.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 7) as f32 - 3.0).collect();
        let mut whole = vec![0f32; m * n];
        gemm_slices(
            &mut whole,
            (m, n, k),
            (&a, k, 1),
            (&b, n, 1),
            (false, false),
        )
        .unwrap();
        let mut dst = vec![f32::NAN; m * n];
        let ranges = [0..4, 4..9];
        for (mut block, r) in column_blocks(&mut dst, (m, n), &ranges)
            .unwrap()
            .into_iter()
            .zip(ranges.clone())
        {
            let cols = 0..r.len();
            block
                .gemm((cols, k), (&a, k, 1), (&b[r.start..], n, 1), (false, false))
                .unwrap();
        }
        for (i, (d, w)) in dst.iter().zip(&whole).enumerate() {
            if i % n == 9 {
                assert!(d.is_nan(), "column 9 belongs to no block");
            } else {
                assert_eq!(d.to_bits(), w.to_bits(), "element {i}");
            }
        }
        for bad in [vec![0..5, 4..9], vec![4..9, 0..4], vec![0..11]] {
            assert!(column_blocks(&mut dst, (m, n), &bad).is_err(), "{bad:?}");
        }
        let mut blocks = column_blocks(&mut dst, (m, n), &[2..5]).unwrap();
        assert!(blocks[0]
            .gemm((2..4, k), (&a, k, 1), (&b, n, 1), (false, false))
            .is_err());
    }
}
