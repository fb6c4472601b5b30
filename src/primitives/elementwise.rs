//! Elementwise kernels: any layout in, a contiguous tensor out.

use super::parallel;
use super::strided::Rows;
use crate::dtype::CpuData;
use crate::memory::host::{try_collect, try_par_collect, try_vec};
use crate::meta::{self, backend, Backend};
use crate::tensor::{broadcast_shapes, Layout, Tensor};
use crate::{Error, FloatDType, Result, WithDType};
use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::RwLockReadGuard;

/// A float function of one element, written once for every float dtype.
pub trait UnaryKernel: Sync {
    /// The op name for errors.
    const NAME: &'static str;
    /// The function.
    fn f<T: FloatDType>(&self, x: T) -> T;
    /// `out[i] = f(src[i])` over a block of at most [`KERNEL_BLOCK`] elements (the
    /// two slices have one length). Overridden by kernels that compute a
    /// whole block faster than element by element (GELU); it must give
    /// exactly `f`'s values.
    #[inline(always)]
    fn f_block<T: FloatDType>(&self, src: &[T], out: &mut [T]) {
        for (o, &x) in out.iter_mut().zip(src) {
            *o = self.f(x);
        }
    }
    /// Whether [`UnaryKernel::f_block`] is overridden (the dense loops call
    /// `f` directly otherwise, with no block buffer in between).
    const BLOCKWISE: bool = false;
    /// The same function as a CUDA kernel op, where one exists (`None`:
    /// the kernel is not on CUDA yet, a typed `NotOnCuda` there).
    fn cuda(&self) -> Option<crate::op_code::UnaryOp> {
        None
    }
}

/// A float function of two elements, written once for every float dtype.
pub trait BinaryKernel: Sync {
    /// The op name for errors.
    const NAME: &'static str;
    /// The function.
    fn f<T: FloatDType>(&self, a: T, b: T) -> T;
    /// `out[i] = f(a[i], b[i])` over a block of at most [`KERNEL_BLOCK`] elements
    /// (the three slices have one length). Overridden by kernels that
    /// compute a whole block faster than element by element (GELU's
    /// gradient); it must give exactly `f`'s values.
    #[inline(always)]
    fn f_block<T: FloatDType>(&self, a: &[T], b: &[T], out: &mut [T]) {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = self.f(x, y);
        }
    }
    /// Whether [`BinaryKernel::f_block`] is overridden.
    const BLOCKWISE: bool = false;
    /// The same function as a CUDA kernel op, where one exists (`None`:
    /// the kernel is not on CUDA yet, a typed `NotOnCuda` there).
    fn cuda(&self) -> Option<crate::op_code::BinaryOp> {
        None
    }
}

/// Addition, the one binary kernel the layers below the ops need:
/// `Tensor::add` and gradient accumulation ([`add_assign`]) share it.
pub(crate) struct AddK;

impl BinaryKernel for AddK {
    const NAME: &'static str = "add";
    fn f<T: FloatDType>(&self, a: T, b: T) -> T {
        a + b
    }
    fn cuda(&self) -> Option<crate::op_code::BinaryOp> {
        Some(crate::op_code::BinaryOp::Add)
    }
}

/// `dst += src` in place (src broadcasts to dst; dst contiguous): gradient
/// accumulation. Bumps dst's version.
pub(crate) fn add_assign(dst: &Tensor, src: &Tensor) -> Result<()> {
    binary_assign(dst, src, &AddK)
}

/// Reads a strided view by logical (row-major) index.
pub(crate) enum Source<'a, T> {
    Dense(&'a [T]),
    Strided(&'a [T], Vec<usize>),
}

impl<'a, T: Copy> Source<'a, T> {
    /// A reader of `layout` over `data`; a strided layout lists its offsets
    /// (a host buffer: [`Error::OutOfMemory`] when it cannot be made).
    pub(crate) fn new(data: &'a [T], layout: &Layout) -> Result<Self> {
        Ok(match layout.contiguous_range() {
            Some(r) => Source::Dense(&data[r]),
            None => Source::Strided(data, layout.offsets()?),
        })
    }

    #[inline(always)]
    pub(crate) fn get(&self, i: usize) -> T {
        match self {
            Source::Dense(s) => s[i],
            Source::Strided(s, o) => s[o[i]],
        }
    }
}

/// The typed slice inside `data`, or a dtype error for `op`.
pub(crate) fn typed<'a, T: WithDType>(data: &'a CpuData, op: &'static str) -> Result<&'a [T]> {
    T::cpu_slice(data).ok_or(Error::DTypeMismatch {
        op,
        expected: T::DTYPE,
        got: data.dtype(),
    })
}

/// `at(i)` for `i in 0..n`, in parallel above the threshold
/// ([`Error::OutOfMemory`] when the host cannot hold the result).
pub(crate) fn fill<T: Send + 'static>(
    n: usize,
    at: impl Fn(usize) -> T + Sync + Send,
) -> Result<Vec<T>> {
    if parallel(n) {
        try_par_collect(n, (0..n).into_par_iter().map(at))
    } else {
        try_collect(n, (0..n).map(at))
    }
}

/// `k(x)` for every element of a float tensor.
pub fn unary_map<K: UnaryKernel>(x: &Tensor, k: &K) -> Result<Tensor> {
    match backend(K::NAME, &[x])? {
        Backend::Meta => {
            meta::float(K::NAME, x.dtype())?;
            return meta::empty(x.shape(), x.dtype());
        }
        Backend::Cuda(_) => return crate::primitives::cuda::ops::unary(x, k.cuda(), K::NAME),
        Backend::Cpu => {}
    }
    let data = x.storage().cpu()?;
    fn go<T: FloatDType, K: UnaryKernel>(s: &[T], l: &Layout, k: &K) -> Result<CpuData> {
        if let Some(r) = l.contiguous_range() {
            return Ok(T::wrap(dense_unary(&s[r], k)?));
        }
        let rows = Rows::new([l]);
        let [step] = rows.step();
        Ok(T::wrap(write_rows(&rows, |[at], out| {
            let mut buf = [T::zero(); KERNEL_BLOCK];
            for (j, o) in out.chunks_mut(KERNEL_BLOCK).enumerate() {
                let x = row_block(s, at, step, j * KERNEL_BLOCK, &mut buf, o.len());
                write_unary(x, o, k);
            }
        })?))
    }
    let out = crate::match_float_data!(&*data, K::NAME, v => go(v, x.layout(), k)?);
    drop(data);
    Tensor::from_cpu_data(out, x.shape())
}

/// `k(a, b)` elementwise with NumPy broadcasting; both must share a float dtype.
pub fn binary_map<K: BinaryKernel>(a: &Tensor, b: &Tensor, k: &K) -> Result<Tensor> {
    check_pair(K::NAME, a, b)?;
    let shape = broadcast_shapes(K::NAME, a.shape(), b.shape())?;
    let la = a.layout().broadcast_to(&shape)?;
    let lb = b.layout().broadcast_to(&shape)?;
    match backend(K::NAME, &[a, b])? {
        Backend::Meta => {
            meta::float(K::NAME, a.dtype())?;
            return meta::empty(&shape, a.dtype());
        }
        Backend::Cuda(_) => {
            return crate::primitives::cuda::ops::binary(a, &la, b, &lb, &shape, k.cuda(), K::NAME)
        }
        Backend::Cpu => {}
    }
    let da = a.storage().cpu()?;
    let db = b.storage().cpu()?;
    fn go<T: FloatDType, K: BinaryKernel>(
        sa: &[T],
        la: &Layout,
        db: &CpuData,
        lb: &Layout,
        k: &K,
    ) -> Result<CpuData> {
        let sb = typed::<T>(db, K::NAME)?;
        if let (Some(ra), Some(rb)) = (la.contiguous_range(), lb.contiguous_range()) {
            return Ok(T::wrap(dense_binary(&sa[ra], &sb[rb], k)?));
        }
        let rows = Rows::new([la, lb]);
        let [step_a, step_b] = rows.step();
        Ok(T::wrap(write_rows(&rows, |[at_a, at_b], out| {
            if (step_a, step_b) == (1, 1) {
                let n = out.len();
                return write_binary(&sa[at_a..at_a + n], &sb[at_b..at_b + n], out, k);
            }
            let (mut buf_a, mut buf_b) = ([T::zero(); KERNEL_BLOCK], [T::zero(); KERNEL_BLOCK]);
            for (j, o) in out.chunks_mut(KERNEL_BLOCK).enumerate() {
                let first = j * KERNEL_BLOCK;
                let x = row_block(sa, at_a, step_a, first, &mut buf_a, o.len());
                let y = row_block(sb, at_b, step_b, first, &mut buf_b, o.len());
                write_binary(x, y, o, k);
            }
        })?))
    }
    let out = crate::match_float_data!(&*da, K::NAME, v => go(v, &la, &db, &lb, k)?);
    drop((da, db));
    Tensor::from_cpu_data(out, &shape)
}

/// `dst = k(dst, src)` in place; `src` broadcasts to `dst`'s shape and `dst`
/// must be contiguous. Bumps `dst`'s version.
pub fn binary_assign<K: BinaryKernel>(dst: &Tensor, src: &Tensor, k: &K) -> Result<()> {
    check_pair(K::NAME, dst, src)?;
    let range = in_place_range(dst, K::NAME)?;
    let lsrc = src.layout().broadcast_to(dst.shape())?;
    if dst.shares_storage_with(src) {
        // Read a private copy first: source and destination overlap.
        let copy = contiguous_copy(src)?;
        return binary_assign(dst, &copy, k);
    }
    match backend(K::NAME, &[dst, src])? {
        Backend::Meta => {
            meta::float(K::NAME, dst.dtype())?;
            meta::touch(dst);
            return Ok(());
        }
        Backend::Cuda(_) => {
            return crate::primitives::cuda::ops::binary_assign(
                dst,
                range.clone(),
                src,
                &lsrc,
                k.cuda(),
                K::NAME,
            )
        }
        Backend::Cpu => {}
    }
    let ds = src.storage().cpu()?;
    let mut dd = dst.storage().cpu_mut()?;
    fn go<T: FloatDType, K: BinaryKernel>(
        d: &mut [T],
        ds: &CpuData,
        l: &Layout,
        k: &K,
    ) -> Result<()> {
        let src = typed::<T>(ds, K::NAME)?;
        if let Some(r) = l.contiguous_range() {
            let src = &src[r];
            let body = |(d, s): (&mut [T], &[T])| assign_binary(d, s, k);
            if parallel(d.len()) {
                d.par_chunks_mut(CHUNK)
                    .zip(src.par_chunks(CHUNK))
                    .for_each(body);
            } else {
                body((d, src));
            }
            return Ok(());
        }
        let rows = Rows::new([l]);
        let [step] = rows.step();
        each_row(&rows, d, |[at], d| {
            let mut buf = [T::zero(); KERNEL_BLOCK];
            for (j, d) in d.chunks_mut(KERNEL_BLOCK).enumerate() {
                let s = row_block(src, at, step, j * KERNEL_BLOCK, &mut buf, d.len());
                assign_binary(d, s, k);
            }
        });
        Ok(())
    }
    crate::match_float_data!(&mut *dd, K::NAME, v => go(&mut v[range], &ds, &lsrc, k))
}

/// A contiguous copy of any tensor's elements.
pub(crate) fn gather(x: &Tensor) -> Result<CpuData> {
    let data = x.storage().cpu()?;
    fn go<T: WithDType>(s: &[T], l: &Layout) -> Result<CpuData> {
        let rows = Rows::new([l]);
        let [step] = rows.step();
        Ok(T::wrap(write_rows(&rows, |[at], out| {
            if step == 1 {
                let n = out.len();
                for (o, &x) in out.iter_mut().zip(&s[at..at + n]) {
                    o.write(x);
                }
            } else {
                for (i, o) in out.iter_mut().enumerate() {
                    o.write(s[at + i * step]);
                }
            }
        })?))
    }
    crate::match_cpu_data!(&*data, v => go(v, x.layout()))
}

/// A tensor's elements in row-major order: its own storage when contiguous,
/// else a gathered copy. For the CPU kernels that read whole tensors
/// (softmax, cross-entropy, `nn::norm`, `nn::attention`).
pub(crate) enum Dense<'a> {
    Borrowed(RwLockReadGuard<'a, CpuData>, Range<usize>),
    Owned(CpuData),
}

impl<'a> Dense<'a> {
    pub(crate) fn new(x: &'a Tensor) -> Result<Dense<'a>> {
        Ok(match x.layout().contiguous_range() {
            Some(r) => Dense::Borrowed(x.storage().cpu()?, r),
            None => Dense::Owned(gather(x)?),
        })
    }

    /// The data and the range of it that holds the elements.
    pub(crate) fn parts(&self) -> (&CpuData, Range<usize>) {
        match self {
            Dense::Borrowed(g, r) => (g, r.clone()),
            Dense::Owned(d) => (d, 0..d.len()),
        }
    }
}

/// Checks that two operands are on one device.
pub(crate) fn check_same_device(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.device() != b.device() {
        return Err(Error::DeviceMismatch {
            op,
            lhs: a.device(),
            rhs: b.device(),
        });
    }
    Ok(())
}

/// Checks that two operands share a device and a dtype.
pub(crate) fn check_pair(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    check_same_device(op, a, b)?;
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            expected: a.dtype(),
            got: b.dtype(),
        });
    }
    Ok(())
}

/// A contiguous copy of `x` (no autograd).
pub fn contiguous_copy(x: &Tensor) -> Result<Tensor> {
    match backend("contiguous_copy", &[x])? {
        Backend::Meta => return meta::empty(x.shape(), x.dtype()),
        Backend::Cuda(_) => return crate::tensor::cuda::contiguous(x),
        Backend::Cpu => {}
    }
    Tensor::from_cpu_data(gather(x)?, x.shape())
}

/// Writes `src`'s elements into the (possibly strided) view `dst`, which
/// must have the same shape and dtype. Bumps `dst`'s version.
pub fn copy_into(dst: &Tensor, src: &Tensor) -> Result<()> {
    if dst.shape() != src.shape() {
        return Err(Error::ShapeMismatch {
            op: "copy_into",
            lhs: dst.shape().to_vec(),
            rhs: src.shape().to_vec(),
        });
    }
    if dst.dtype() != src.dtype() {
        return Err(Error::DTypeMismatch {
            op: "copy_into",
            expected: dst.dtype(),
            got: src.dtype(),
        });
    }
    match backend("copy_into", &[dst, src])? {
        Backend::Meta => {
            meta::touch(dst);
            return Ok(());
        }
        Backend::Cuda(_) => return crate::tensor::cuda::copy_into(dst, src),
        Backend::Cpu => {}
    }
    let values = gather(src)?;
    let rows = Rows::new([dst.layout()]);
    let mut dd = dst.storage().cpu_mut()?;
    fn go<T: WithDType>(d: &mut [T], values: &CpuData, rows: &Rows<1>) -> Result<()> {
        let v = typed::<T>(values, "copy_into")?;
        let (len, [step]) = (rows.len(), rows.step());
        let mut next = v.chunks(len);
        rows.each(0..rows.count(), |[at]| {
            let Some(v) = next.next() else { return };
            if step == 1 {
                d[at..at + len].copy_from_slice(v);
            } else {
                for (i, &x) in v.iter().enumerate() {
                    d[at + i * step] = x;
                }
            }
        });
        Ok(())
    }
    crate::match_cpu_data!(&mut *dd, d => go(d, &values, &rows))
}

/// The element range of an in-place destination, which must be contiguous.
fn in_place_range(dst: &Tensor, op: &'static str) -> Result<Range<usize>> {
    dst.layout()
        .contiguous_range()
        .ok_or(Error::InvalidArgument {
            op,
            msg: "in-place destination must be contiguous".into(),
        })
}

/// `x = k(x)` in place on a contiguous float tensor; bumps the version.
pub fn unary_assign<K: UnaryKernel>(x: &Tensor, k: &K) -> Result<()> {
    let range = in_place_range(x, K::NAME)?;
    match backend(K::NAME, &[x])? {
        Backend::Meta => {
            meta::float(K::NAME, x.dtype())?;
            meta::touch(x);
            return Ok(());
        }
        Backend::Cuda(_) => {
            return crate::primitives::cuda::ops::unary_assign(x, k.cuda(), K::NAME)
        }
        Backend::Cpu => {}
    }
    let mut data = x.storage().cpu_mut()?;
    fn go<T: FloatDType, K: UnaryKernel>(d: &mut [T], k: &K) {
        if parallel(d.len()) {
            d.par_chunks_mut(CHUNK).for_each(|d| assign_unary(d, k));
        } else {
            assign_unary(d, k);
        }
    }
    crate::match_float_data!(&mut *data, K::NAME, v => go(&mut v[range], k));
    Ok(())
}

/// Two float functions of one element computed by one evaluation (GELU and
/// its derivative share the normal CDF and density).
pub(crate) trait PairKernel: Sync {
    /// The op name for errors.
    const NAME: &'static str;
    /// `first[i]`, `second[i]` of `x[i]` over a block of at most
    /// [`KERNEL_BLOCK`] elements (the three slices have one length).
    fn pair_block<T: FloatDType>(&self, x: &[T], first: &mut [T], second: &mut [T]);
}

/// `k`'s first function of every element of the contiguous float tensor
/// `x`, as a new tensor, with `x` rewritten in place by the second (its
/// version bumped), in one pass over `x`. The caller checked that nothing
/// else holds `x`. CPU and meta (where only the output is allocated and the
/// version moves); CUDA tensors are a typed error.
pub(crate) fn map_and_assign<K: PairKernel>(x: &Tensor, k: &K) -> Result<Tensor> {
    let range = in_place_range(x, K::NAME)?;
    match backend(K::NAME, &[x])? {
        Backend::Meta => {
            meta::float(K::NAME, x.dtype())?;
            let out = meta::empty(x.shape(), x.dtype())?;
            meta::touch(x);
            return Ok(out);
        }
        Backend::Cuda(n) => return Err(meta::not_on_cuda(K::NAME, n)),
        Backend::Cpu => {}
    }
    let mut data = x.storage().cpu_mut()?;
    fn go<T: FloatDType, K: PairKernel>(d: &mut [T], k: &K) -> Result<CpuData> {
        let mut out: Vec<T> = try_vec(d.len())?;
        let spare = &mut out.spare_capacity_mut()[..d.len()];
        if parallel(d.len()) {
            d.par_chunks_mut(CHUNK)
                .zip(spare.par_chunks_mut(CHUNK))
                .for_each(|(d, o)| pair_in_place(d, o, k));
        } else {
            pair_in_place(d, spare, k);
        }
        // SAFETY: the chunks partition the output and `pair_in_place`
        // writes every slot of the chunk it is given.
        unsafe { out.set_len(d.len()) };
        Ok(T::wrap(out))
    }
    let out = crate::match_float_data!(&mut *data, K::NAME, v => go(&mut v[range], k)?);
    drop(data);
    Tensor::from_cpu_data(out, x.shape())
}

/// `out = first(d)` and `d = second(d)` over one dense chunk.
fn pair_in_place<T: FloatDType, K: PairKernel>(d: &mut [T], out: &mut [MaybeUninit<T>], k: &K) {
    let (mut first, mut second) = ([T::zero(); KERNEL_BLOCK], [T::zero(); KERNEL_BLOCK]);
    for (d, o) in d.chunks_mut(KERNEL_BLOCK).zip(out.chunks_mut(KERNEL_BLOCK)) {
        let (f, s) = (&mut first[..d.len()], &mut second[..d.len()]);
        k.pair_block(d, f, s);
        for (o, &v) in o.iter_mut().zip(f.iter()) {
            o.write(v);
        }
        d.copy_from_slice(s);
    }
}

/// An in-place map that depends on each element's row-major index (a
/// dropout draw, a packed mask bit): rewrites one chunk of elements whose
/// first index is `start`. Host-only (the CUDA ops have their own kernels).
pub(crate) trait IndexedAssign: Sync {
    /// Rewrites `d`, elements `start..start + d.len()`.
    fn chunk<T: FloatDType>(&self, start: usize, d: &mut [T]);
}

/// Runs `m` over the CPU tensor `x` (contiguous; the caller checked that
/// nothing else holds it) in parallel chunks, bumping its version; on the
/// meta device only the version moves.
pub(crate) fn assign_indexed<M: IndexedAssign>(x: &Tensor, op: &'static str, m: &M) -> Result<()> {
    let range = in_place_range(x, op)?;
    match backend(op, &[x])? {
        Backend::Meta => {
            meta::float(op, x.dtype())?;
            meta::touch(x);
            return Ok(());
        }
        Backend::Cuda(n) => return Err(meta::not_on_cuda(op, n)),
        Backend::Cpu => {}
    }
    let mut data = x.storage().cpu_mut()?;
    fn go<T: FloatDType, M: IndexedAssign>(d: &mut [T], m: &M) {
        if parallel(d.len()) {
            d.par_chunks_mut(CHUNK)
                .enumerate()
                .for_each(|(c, d)| m.chunk(c * CHUNK, d));
        } else {
            m.chunk(0, d);
        }
    }
    crate::match_float_data!(&mut *data, op, v => go(&mut v[range], m));
    Ok(())
}

/// Elements one rayon task maps in the dense loops (big enough that the
/// task's overhead vanishes, small enough to balance the threads).
const CHUNK: usize = 1 << 14;

/// Elements of one block of [`UnaryKernel::f_block`] /
/// [`BinaryKernel::f_block`] (a stack buffer that stays in L1).
pub const KERNEL_BLOCK: usize = 256;

/// A vector of `n` elements whose every slot `body` writes, chunk by chunk
/// (in parallel above the threshold): no zero-fill before the values are
/// written.
fn write_all<T: Send + 'static>(
    n: usize,
    body: impl Fn(usize, &mut [MaybeUninit<T>]) + Sync,
) -> Result<Vec<T>> {
    let mut out: Vec<T> = try_vec(n)?;
    let spare = &mut out.spare_capacity_mut()[..n];
    if parallel(n) {
        spare
            .par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(c, o)| body(c * CHUNK, o));
    } else {
        body(0, spare);
    }
    // SAFETY: the chunks partition `0..n` and `body` (the two callers
    // below) writes every slot of the chunk it is given.
    unsafe { out.set_len(n) };
    Ok(out)
}

/// `k(x)` over a dense slice: a monomorphised loop (vectorised where `k`
/// allows), no per-element indirection, no zero-fill.
fn dense_unary<T: FloatDType, K: UnaryKernel>(src: &[T], k: &K) -> Result<Vec<T>> {
    write_all(src.len(), |start, out: &mut [MaybeUninit<T>]| {
        write_unary(&src[start..start + out.len()], out, k)
    })
}

/// `out[i] = k(src[i])` (one length).
#[inline(always)]
fn write_unary<T: FloatDType, K: UnaryKernel>(src: &[T], out: &mut [MaybeUninit<T>], k: &K) {
    if K::BLOCKWISE {
        let mut buf = [T::zero(); KERNEL_BLOCK];
        for (o, s) in out.chunks_mut(KERNEL_BLOCK).zip(src.chunks(KERNEL_BLOCK)) {
            let b = &mut buf[..s.len()];
            k.f_block(s, b);
            for (o, &v) in o.iter_mut().zip(b.iter()) {
                o.write(v);
            }
        }
    } else {
        for (o, &x) in out.iter_mut().zip(src) {
            o.write(k.f(x));
        }
    }
}

/// `k(a, b)` over two dense slices of one length.
fn dense_binary<T: FloatDType, K: BinaryKernel>(a: &[T], b: &[T], k: &K) -> Result<Vec<T>> {
    write_all(a.len(), |start, out: &mut [MaybeUninit<T>]| {
        let r = start..start + out.len();
        write_binary(&a[r.clone()], &b[r], out, k)
    })
}

/// `out[i] = k(a[i], b[i])` (one length).
#[inline(always)]
fn write_binary<T: FloatDType, K: BinaryKernel>(
    a: &[T],
    b: &[T],
    out: &mut [MaybeUninit<T>],
    k: &K,
) {
    if K::BLOCKWISE {
        let mut buf = [T::zero(); KERNEL_BLOCK];
        for ((o, x), y) in out
            .chunks_mut(KERNEL_BLOCK)
            .zip(a.chunks(KERNEL_BLOCK))
            .zip(b.chunks(KERNEL_BLOCK))
        {
            let t = &mut buf[..x.len()];
            k.f_block(x, y, t);
            for (o, &v) in o.iter_mut().zip(t.iter()) {
                o.write(v);
            }
        }
    } else {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            o.write(k.f(x, y));
        }
    }
}

/// A vector of the elements of every row of `rows` (row-major), written
/// by `row(starts, out)` one row at a time, in parallel chunks of whole
/// rows above the threshold; no zero-fill.
fn write_rows<T: Send + 'static, const N: usize>(
    rows: &Rows<N>,
    row: impl Fn([usize; N], &mut [MaybeUninit<T>]) + Sync,
) -> Result<Vec<T>> {
    let n = rows.len() * rows.count();
    let mut out: Vec<T> = try_vec(n)?;
    each_row(rows, &mut out.spare_capacity_mut()[..n], row);
    // SAFETY: `each_row` hands `row` every row of `0..n` once, and `row`
    // (the callers below) writes every slot of the row it is given.
    unsafe { out.set_len(n) };
    Ok(out)
}

/// Calls `row(starts, out_row)` for every row of `rows`, `out` holding the
/// rows back to back, in parallel chunks of whole rows above the threshold.
fn each_row<X: Send, const N: usize>(
    rows: &Rows<N>,
    out: &mut [X],
    row: impl Fn([usize; N], &mut [X]) + Sync,
) {
    let len = rows.len();
    if out.is_empty() {
        return;
    }
    let per_task = (CHUNK / len).max(1);
    let body = |(task, o): (usize, &mut [X])| {
        let first = task * per_task;
        let count = o.len() / len;
        let mut outs = o.chunks_mut(len);
        rows.each(first..first + count, |at| {
            if let Some(o) = outs.next() {
                row(at, o);
            }
        });
    };
    if parallel(out.len()) {
        out.par_chunks_mut(per_task * len)
            .enumerate()
            .for_each(body);
    } else {
        body((0, out));
    }
}

/// Elements `first..first + m` of a row starting at `at` with stride
/// `step` in `s`: the slice itself when the elements are adjacent, else
/// gathered into `buf`.
#[inline(always)]
fn row_block<'a, T: Copy>(
    s: &'a [T],
    at: usize,
    step: usize,
    first: usize,
    buf: &'a mut [T; KERNEL_BLOCK],
    m: usize,
) -> &'a [T] {
    let at = at + first * step;
    match step {
        1 => &s[at..at + m],
        0 => {
            buf[..m].fill(s[at]);
            &buf[..m]
        }
        _ => {
            for (i, b) in buf[..m].iter_mut().enumerate() {
                *b = s[at + i * step];
            }
            &buf[..m]
        }
    }
}

/// `d = k(d)` over a dense slice.
fn assign_unary<T: FloatDType, K: UnaryKernel>(d: &mut [T], k: &K) {
    if K::BLOCKWISE {
        let mut buf = [T::zero(); KERNEL_BLOCK];
        for d in d.chunks_mut(KERNEL_BLOCK) {
            let b = &mut buf[..d.len()];
            k.f_block(d, b);
            d.copy_from_slice(b);
        }
    } else {
        d.iter_mut().for_each(|v| *v = k.f(*v));
    }
}

/// `d = k(d, s)` over two dense slices of one length.
fn assign_binary<T: FloatDType, K: BinaryKernel>(d: &mut [T], s: &[T], k: &K) {
    if K::BLOCKWISE {
        let mut buf = [T::zero(); KERNEL_BLOCK];
        for (d, s) in d.chunks_mut(KERNEL_BLOCK).zip(s.chunks(KERNEL_BLOCK)) {
            let b = &mut buf[..d.len()];
            k.f_block(d, s, b);
            d.copy_from_slice(b);
        }
    } else {
        for (x, &y) in d.iter_mut().zip(s) {
            *x = k.f(*x, y);
        }
    }
}
