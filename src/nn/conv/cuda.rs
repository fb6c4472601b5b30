//! Every line of the convolutions' CUDA code: the glue from tensors to
//! device buffers (what the seam in `mod.rs` calls for CUDA tensors) and the
//! launch wrappers of `conv.cu` + cuBLAS, mirroring `cpu.rs`: im2col /
//! col2im for 1-d and 2-d with stride, padding, dilation and groups, and the
//! forward, input-gradient and weight-gradient GEMMs over column buffers,
//! the bias fill and the bias gradient's per-channel sum.
//!
//! The column buffer is ledger-counted as [`Category::Workspace`] and
//! bounded by a byte budget ([`crate::cuda::with_conv_workspace`]): the
//! batch is processed in chunks of items so that it stays under the budget
//! (at least one item per chunk). The default budget, 0, is one item's
//! columns: exactly the CPU's buffer, so the ledgers match.

use super::ConvGeom;
use crate::cuda::check::{expect, float_suffix, invalid};
use crate::cuda::gemm::{gemm_sub, SubGemm};
use crate::cuda::launch;
use crate::cuda::{conv_workspace_bytes, CudaBuffer, CudaDevice};
use crate::memory::{with_category, Category};
use crate::tensor::cuda::{dense, wrap};
use crate::{Result, Tensor};
use cudarc::driver::DeviceRepr;

// The kernels take `struct ConvGeom` of 16 `long long`s by value; `usize`
// has their layout only where it is 8 bytes.
const _: () = assert!(std::mem::size_of::<ConvGeom>() == 16 * 8);

// SAFETY: a plain `repr(C)` struct of 16 usizes (8 bytes each, asserted
// above), laid out as `struct ConvGeom` in `conv.cu`.
unsafe impl DeviceRepr for ConvGeom {}

impl ConvGeom {
    /// Column rows of one item (`cin·kh·kw`).
    fn rows(&self) -> usize {
        self.cin * self.kh * self.kw
    }
    /// Elements of the input, weight and output.
    fn sizes(&self) -> (usize, usize, usize) {
        (
            self.n * self.cin * self.h * self.w,
            self.cout * self.k(),
            self.n * self.cout * self.l(),
        )
    }
    /// Items per chunk whose columns fit in `budget` bytes (at least 1).
    fn chunk_items(&self, elem_bytes: usize, budget: usize) -> usize {
        let per = (self.rows() * self.l() * elem_bytes).max(1);
        (budget / per).clamp(1, self.n.max(1))
    }
}

/// Runs a launch wrapper on the whole-buffer dense forms of `a` and `b`
/// (copies, counted as Workspace, when they are views) and wraps its output
/// as `shape`.
fn on_buffers(
    a: &Tensor,
    b: &Tensor,
    shape: &[usize],
    f: impl FnOnce(&CudaBuffer, &CudaBuffer) -> Result<CudaBuffer>,
) -> Result<Tensor> {
    let (a, b) = {
        let _ws = with_category(Category::Workspace);
        (dense(a)?, dense(b)?)
    };
    let out = f(&*a.storage().cuda()?, &*b.storage().cuda()?)?;
    wrap(out, shape)
}

/// A bias as the whole-buffer dense tensor the kernels read (a view copied
/// as Workspace).
fn dense_bias(bias: Option<&Tensor>) -> Result<Option<Tensor>> {
    let _ws = with_category(Category::Workspace);
    bias.map(dense).transpose()
}

/// `cpu::conv2d_forward` on CUDA tensors.
pub(super) fn conv2d_forward(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    g: &ConvGeom,
) -> Result<Tensor> {
    let b = dense_bias(bias)?;
    let bb = b.as_ref().map(|b| b.storage().cuda()).transpose()?;
    on_buffers(x, w, &[g.n, g.cout, g.oh, g.ow], |x, w| {
        conv_forward(x, w, bb.as_deref(), g, conv_workspace_bytes())
    })
}

/// `cpu::conv2d_input_grad` on CUDA tensors: the bias (conv_transpose2d) is
/// the starting value of every position, the taps added after it, as on
/// the CPU.
pub(super) fn conv2d_input_grad(
    gy: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    g: &ConvGeom,
) -> Result<Tensor> {
    let b = dense_bias(bias)?;
    let bb = b.as_ref().map(|b| b.storage().cuda()).transpose()?;
    on_buffers(gy, w, &[g.n, g.cin, g.h, g.w], |gy, w| {
        conv_input_grad(gy, w, bb.as_deref(), g, conv_workspace_bytes())
    })
}

/// `cpu::conv2d_weight_grad` on CUDA tensors.
pub(super) fn conv2d_weight_grad(gy: &Tensor, x: &Tensor, g: &ConvGeom) -> Result<Tensor> {
    let shape = [g.cout, g.cin / g.groups, g.kh, g.kw];
    on_buffers(gy, x, &shape, |gy, x| {
        conv_weight_grad(gy, x, g, conv_workspace_bytes())
    })
}

/// `cpu::channel_sum` (the bias gradient) on a CUDA tensor.
pub(super) fn channel_sum(gy: &Tensor) -> Result<Tensor> {
    let (n, c) = (gy.shape()[0], gy.shape()[1]);
    let l = gy.shape()[2..].iter().product();
    let gy = {
        let _ws = with_category(Category::Workspace);
        dense(gy)?
    };
    let out = channel_sum_buffer(&*gy.storage().cuda()?, n, c, l)?;
    wrap(out, &[c])
}

/// Writes the columns of items `first .. first + nb` of `x` into `cols`.
fn im2col_into(
    x: &CudaBuffer,
    g: &ConvGeom,
    first: usize,
    nb: usize,
    cols: &mut CudaBuffer,
) -> Result<()> {
    let op = "cuda im2col";
    let sfx = float_suffix(op, x.dtype())?;
    if first + nb > g.n {
        return Err(invalid(op, format!("items {first}+{nb} of {}", g.n)));
    }
    expect(op, x, x.dtype(), g.sizes().0, x)?;
    let len = nb * g.rows() * g.l();
    expect(op, cols, x.dtype(), len, x)?;
    if len > 0 {
        let (f, nb) = (first as i64, nb as i64);
        launch!(x.device(), "conv.cu", format!("im2col_{sfx}"), CudaDevice::grid_for(len);
            g, &f, &nb, cols.slice_mut(), x.slice())?;
    }
    Ok(())
}

/// Folds `cols` (items `first .. first + nb`) into those items of `gx`,
/// overwriting them, or with `accumulate` adding to what they hold (each
/// tap rounded in the dtype, after the held value, as the CPU's bias-first
/// transposed convolution); deterministic (each input gathers its taps in
/// order).
fn col2im_into(
    cols: &CudaBuffer,
    g: &ConvGeom,
    first: usize,
    nb: usize,
    accumulate: bool,
    gx: &mut CudaBuffer,
) -> Result<()> {
    let op = "cuda col2im";
    let sfx = float_suffix(op, cols.dtype())?;
    if first + nb > g.n {
        return Err(invalid(op, format!("items {first}+{nb} of {}", g.n)));
    }
    expect(op, cols, cols.dtype(), nb * g.rows() * g.l(), cols)?;
    expect(op, gx, cols.dtype(), g.sizes().0, cols)?;
    let len = nb * g.cin * g.h * g.w;
    if len > 0 {
        let (f, nb, acc) = (first as i64, nb as i64, i32::from(accumulate));
        // Parameters: (ConvGeom g, i64 first, i64 nb, i32 accumulate, T* gx,
        // const T* cols).
        launch!(cols.device(), "conv.cu", format!("col2im_{sfx}"), CudaDevice::grid_for(len);
            g, &f, &nb, &acc, gx.slice_mut(), cols.slice())?;
    }
    Ok(())
}

/// The column workspace for chunks of `chunk` items.
fn workspace(x: &CudaBuffer, g: &ConvGeom, chunk: usize) -> Result<CudaBuffer> {
    CudaBuffer::alloc_in(
        x.device(),
        x.dtype(),
        chunk * g.rows() * g.l(),
        Category::Workspace,
    )
}

/// Runs `each(first, items, cols)` over the batch in chunks whose im2col
/// columns fit `budget`, reusing one Workspace buffer for every chunk
/// (`cols` holds the columns of items `first..first + items`).
fn for_each_column_chunk(
    x: &CudaBuffer,
    g: &ConvGeom,
    budget: usize,
    mut each: impl FnMut(usize, usize, &CudaBuffer) -> Result<()>,
) -> Result<()> {
    let n = g.n;
    let chunk = g.chunk_items(x.dtype().size_in_bytes(), budget);
    let mut cols = workspace(x, g, chunk)?;
    for first in (0..n).step_by(chunk) {
        let items = chunk.min(n - first);
        im2col_into(x, g, first, items, &mut cols)?;
        each(first, items, &cols)?;
    }
    Ok(())
}

/// A new buffer of `len` elements (`[.., c, l]`) holding `b[ch]` at every
/// position of channel `ch` (`b`: `c` elements of `like`'s dtype).
fn bias_filled(
    op: &'static str,
    like: &CudaBuffer,
    b: &CudaBuffer,
    len: usize,
    c: usize,
    l: usize,
) -> Result<CudaBuffer> {
    let sfx = float_suffix(op, like.dtype())?;
    expect(op, b, like.dtype(), c, like)?;
    let mut y = CudaBuffer::alloc(like.device(), like.dtype(), len)?;
    if len > 0 && c > 0 && l > 0 {
        let (n64, c64, l64) = (len as i64, c as i64, l as i64);
        // Parameters: (i64 n, i64 c, i64 l, T* y, const T* b).
        launch!(like.device(), "conv.cu", format!("conv_fill_bias_{sfx}"), CudaDevice::grid_for(len);
            &n64, &c64, &l64, y.slice_mut(), b.slice())?;
    }
    Ok(y)
}

/// Convolution forward: `y = bias + W ⊛ x` (`[n, cout, oh, ow]`) by
/// im2col + one strided-batched GEMM per group and chunk; the column buffer
/// stays under `budget` bytes.
fn conv_forward(
    x: &CudaBuffer,
    w: &CudaBuffer,
    bias: Option<&CudaBuffer>,
    g: &ConvGeom,
    budget: usize,
) -> Result<CudaBuffer> {
    let op = "cuda conv";
    let (nx, nw, ny) = g.sizes();
    expect(op, x, x.dtype(), nx, x)?;
    expect(op, w, x.dtype(), nw, x)?;
    let mut y = match bias {
        Some(b) => bias_filled(op, x, b, ny, g.cout, g.l())?,
        None => CudaBuffer::zeros(x.device(), x.dtype(), ny)?,
    };
    if ny == 0 || g.rows() == 0 {
        return Ok(y);
    }
    let (l, k, cg, rows, cout) = (g.l(), g.k(), g.cout_g(), g.rows(), g.cout);
    for_each_column_chunk(x, g, budget, |first, nb, cols| {
        for grp in 0..g.groups {
            let s = SubGemm {
                m: cg,
                n: l,
                k,
                batch: nb,
                trans_a: false,
                trans_b: false,
                beta: 1.0,
            };
            gemm_sub(
                (w, grp * cg * k, 0),
                (cols, grp * k * l, rows * l),
                (&mut y, (first * cout + grp * cg) * l, cout * l),
                s,
            )?;
        }
        Ok(())
    })?;
    Ok(y)
}

/// The input gradient `[n, cin, h, w]` of a convolution from the output
/// gradient `gy`: per chunk, `cols = Wᵀ·gy` per group, then col2im. This is
/// also the transposed convolution of `gy` by `w`; with `bias` (`[cin]`)
/// every position starts from its channel's bias and the taps are added
/// after it, as on the CPU.
fn conv_input_grad(
    gy: &CudaBuffer,
    w: &CudaBuffer,
    bias: Option<&CudaBuffer>,
    g: &ConvGeom,
    budget: usize,
) -> Result<CudaBuffer> {
    let op = "cuda conv input grad";
    let (nx, nw, ny) = g.sizes();
    expect(op, gy, gy.dtype(), ny, gy)?;
    expect(op, w, gy.dtype(), nw, gy)?;
    let plane = g.h * g.w;
    let mut gx = match bias {
        Some(b) => bias_filled(op, gy, b, nx, g.cin, plane)?,
        None if g.rows() == 0 || g.l() == 0 || g.cout == 0 => {
            return CudaBuffer::zeros(gy.device(), gy.dtype(), nx)
        }
        None => CudaBuffer::alloc(gy.device(), gy.dtype(), nx)?,
    };
    if g.rows() == 0 || g.l() == 0 || g.cout == 0 {
        return Ok(gx);
    }
    let (n, l, k, cg, rows, cout) = (g.n, g.l(), g.k(), g.cout_g(), g.rows(), g.cout);
    let chunk = g.chunk_items(gy.dtype().size_in_bytes(), budget);
    let mut cols = workspace(gy, g, chunk)?;
    for first in (0..n).step_by(chunk) {
        let nb = chunk.min(n - first);
        for grp in 0..g.groups {
            let s = SubGemm {
                m: k,
                n: l,
                k: cg,
                batch: nb,
                trans_a: true,
                trans_b: false,
                beta: 0.0,
            };
            gemm_sub(
                (w, grp * cg * k, 0),
                (gy, (first * cout + grp * cg) * l, cout * l),
                (&mut cols, grp * k * l, rows * l),
                s,
            )?;
        }
        col2im_into(&cols, g, first, nb, bias.is_some(), &mut gx)?;
    }
    Ok(gx)
}

/// The weight gradient `[cout, cin/groups, kh, kw]`: `Σ_items gy·colsᵀ`
/// per group, accumulated into a zeroed buffer.
fn conv_weight_grad(
    gy: &CudaBuffer,
    x: &CudaBuffer,
    g: &ConvGeom,
    budget: usize,
) -> Result<CudaBuffer> {
    let op = "cuda conv weight grad";
    let (nx, nw, ny) = g.sizes();
    expect(op, gy, x.dtype(), ny, x)?;
    expect(op, x, x.dtype(), nx, x)?;
    let mut gw = CudaBuffer::zeros(x.device(), x.dtype(), nw)?;
    if nw == 0 || g.l() == 0 {
        return Ok(gw);
    }
    let (l, k, cg, rows, cout) = (g.l(), g.k(), g.cout_g(), g.rows(), g.cout);
    for_each_column_chunk(x, g, budget, |first, nb, cols| {
        for j in 0..nb {
            for grp in 0..g.groups {
                let s = SubGemm {
                    m: cg,
                    n: k,
                    k: l,
                    batch: 1,
                    trans_a: false,
                    trans_b: true,
                    beta: 1.0,
                };
                let a = (gy, ((first + j) * cout + grp * cg) * l, 0);
                gemm_sub(
                    a,
                    (cols, j * rows * l + grp * k * l, 0),
                    (&mut gw, grp * cg * k, 0),
                    s,
                )?;
            }
        }
        Ok(())
    })?;
    Ok(gw)
}

/// Per channel of `gy` (`[n, c, l]`): the sum over `n` and `l` in f64 (the
/// bias gradient), in `gy`'s dtype.
fn channel_sum_buffer(gy: &CudaBuffer, n: usize, c: usize, l: usize) -> Result<CudaBuffer> {
    let op = "cuda channel_sum";
    let sfx = float_suffix(op, gy.dtype())?;
    expect(op, gy, gy.dtype(), n * c * l, gy)?;
    let mut out = CudaBuffer::alloc(gy.device(), gy.dtype(), c)?;
    if c > 0 {
        let (n64, c64, l64) = (n as i64, c as i64, l as i64);
        // Parameters: (i64 n, i64 c, i64 l, T* out, const T* gy).
        launch!(gy.device(), "conv.cu", format!("channel_sum_{sfx}"), CudaDevice::grid_per_row(c);
            &n64, &c64, &l64, out.slice_mut(), gy.slice())?;
    }
    Ok(out)
}
