//! Convolution on the GPU (`conv.cu` + cuBLAS), as `cpu::conv`: im2col /
//! col2im for 1-d and 2-d with stride, padding, dilation and groups, and the
//! forward, input-gradient and weight-gradient GEMMs over column buffers.
//! The column buffer is ledger-counted as [`Category::Workspace`] and
//! bounded by a byte budget: the batch is processed in chunks of items so
//! that it stays under the budget (at least one item per chunk).

use super::check::float_suffix;
use super::layers_gemm::{gemm_sub, SubGemm};
use super::layers_util::{expect, invalid};
use super::{CudaBuffer, CudaDevice};
use crate::memory::Category;
use crate::Result;
use cudarc::driver::DeviceRepr;

/// A column-buffer budget for speed over memory parity (256 MiB): pass it
/// to [`super::with_conv_workspace`] (the default budget is one item's
/// columns, as on the CPU).
pub const LARGE_WORKSPACE_BYTES: usize = 256 << 20;

/// The geometry of a 2-d convolution (1-d: `h = kh = 1`); laid out as
/// `struct ConvGeo` in `kernels/conv.cu`. Input `[n, cin, h, w]`, weight
/// `[cout, cin/groups, kh, kw]`, output `[n, cout, oh, ow]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvGeom {
    /// Batch size.
    pub n: i64,
    /// Input channels.
    pub cin: i64,
    /// Input height.
    pub h: i64,
    /// Input width.
    pub w: i64,
    /// Output channels.
    pub cout: i64,
    /// Kernel height.
    pub kh: i64,
    /// Kernel width.
    pub kw: i64,
    /// Stride (row, column).
    pub stride: [i64; 2],
    /// Zero padding (row, column).
    pub pad: [i64; 2],
    /// Dilation (row, column).
    pub dil: [i64; 2],
    /// Channel groups.
    pub groups: i64,
    /// Output height.
    pub oh: i64,
    /// Output width.
    pub ow: i64,
}

// SAFETY: a plain `repr(C)` struct of i64s, laid out as `struct ConvGeo`.
unsafe impl DeviceRepr for ConvGeom {}

impl ConvGeom {
    /// A 2-d geometry; errors on zero sizes, channels not divisible by
    /// `groups`, or a kernel larger than the padded input.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        n: usize,
        cin: usize,
        hw: [usize; 2],
        cout: usize,
        k: [usize; 2],
        stride: [usize; 2],
        pad: [usize; 2],
        dil: [usize; 2],
        groups: usize,
    ) -> Result<ConvGeom> {
        let op = "cuda conv";
        if groups == 0 || !cin.is_multiple_of(groups) || !cout.is_multiple_of(groups) {
            return Err(invalid(
                op,
                format!("{cin} → {cout} channels in {groups} groups"),
            ));
        }
        if k.contains(&0) || stride.contains(&0) || dil.contains(&0) {
            return Err(invalid(
                op,
                format!("kernel {k:?}, stride {stride:?}, dilation {dil:?}"),
            ));
        }
        let out = |a: usize| {
            let span = dil[a] * (k[a] - 1) + 1;
            (hw[a] + 2 * pad[a])
                .checked_sub(span)
                .map(|v| v / stride[a] + 1)
        };
        let (Some(oh), Some(ow)) = (out(0), out(1)) else {
            return Err(invalid(
                op,
                format!("kernel {k:?} larger than the padded input {hw:?}"),
            ));
        };
        let c = |v: usize| v as i64;
        Ok(ConvGeom {
            n: c(n),
            cin: c(cin),
            h: c(hw[0]),
            w: c(hw[1]),
            cout: c(cout),
            kh: c(k[0]),
            kw: c(k[1]),
            stride: stride.map(c),
            pad: pad.map(c),
            dil: dil.map(c),
            groups: c(groups),
            oh: c(oh),
            ow: c(ow),
        })
    }

    /// A 1-d geometry: input `[n, cin, len]`, kernel `k`.
    #[allow(clippy::too_many_arguments)]
    pub fn conv1d(
        n: usize,
        cin: usize,
        len: usize,
        cout: usize,
        k: usize,
        stride: usize,
        pad: usize,
        dil: usize,
        groups: usize,
    ) -> Result<ConvGeom> {
        ConvGeom::new(
            n,
            cin,
            [1, len],
            cout,
            [1, k],
            [1, stride],
            [0, pad],
            [1, dil],
            groups,
        )
    }

    /// Column rows of one item (`cin·kh·kw`).
    pub fn rows(&self) -> usize {
        (self.cin * self.kh * self.kw) as usize
    }
    /// Output positions per channel (`oh·ow`).
    pub fn l(&self) -> usize {
        (self.oh * self.ow) as usize
    }
    /// Column rows of one group (`cin/groups·kh·kw`).
    fn k(&self) -> usize {
        self.rows() / self.groups as usize
    }
    fn cout_g(&self) -> usize {
        (self.cout / self.groups) as usize
    }
    /// Elements of the input, weight and output.
    pub fn sizes(&self) -> (usize, usize, usize) {
        let n = self.n as usize;
        (
            n * (self.cin * self.h * self.w) as usize,
            self.cout as usize * self.k(),
            n * self.cout as usize * self.l(),
        )
    }
    /// Items per chunk whose columns fit in `budget` bytes (at least 1).
    pub fn chunk_items(&self, elem_bytes: usize, budget: usize) -> usize {
        let per = (self.rows() * self.l() * elem_bytes).max(1);
        (budget / per).clamp(1, (self.n as usize).max(1))
    }
}

/// Writes the columns of items `first .. first + nb` of `x` into `cols`.
pub fn im2col_into(
    x: &CudaBuffer,
    g: &ConvGeom,
    first: usize,
    nb: usize,
    cols: &mut CudaBuffer,
) -> Result<()> {
    let op = "cuda im2col";
    let sfx = float_suffix(op, x.dtype())?;
    if first + nb > g.n as usize {
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
pub fn col2im_into(
    cols: &CudaBuffer,
    g: &ConvGeom,
    first: usize,
    nb: usize,
    accumulate: bool,
    gx: &mut CudaBuffer,
) -> Result<()> {
    let op = "cuda col2im";
    let sfx = float_suffix(op, cols.dtype())?;
    if first + nb > g.n as usize {
        return Err(invalid(op, format!("items {first}+{nb} of {}", g.n)));
    }
    expect(op, cols, cols.dtype(), nb * g.rows() * g.l(), cols)?;
    expect(op, gx, cols.dtype(), g.sizes().0, cols)?;
    let len = nb * (g.cin * g.h * g.w) as usize;
    if len > 0 {
        let (f, nb, acc) = (first as i64, nb as i64, i32::from(accumulate));
        // Parameters: (ConvGeo g, i64 first, i64 nb, i32 accumulate, T* gx,
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
    let n = g.n as usize;
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
pub fn conv_forward(
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
        Some(b) => bias_filled(op, x, b, ny, g.cout as usize, g.l())?,
        None => CudaBuffer::zeros(x.device(), x.dtype(), ny)?,
    };
    if ny == 0 || g.rows() == 0 {
        return Ok(y);
    }
    let (l, k, cg, rows, cout) = (g.l(), g.k(), g.cout_g(), g.rows(), g.cout as usize);
    for_each_column_chunk(x, g, budget, |first, nb, cols| {
        for grp in 0..g.groups as usize {
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
/// gradient `gy`: per chunk, `cols = Wᵀ·gy` per group, then col2im.
pub fn conv_input_grad(
    gy: &CudaBuffer,
    w: &CudaBuffer,
    g: &ConvGeom,
    budget: usize,
) -> Result<CudaBuffer> {
    conv_input_grad_bias(gy, w, None, g, budget)
}

/// The input gradient `[n, cin, h, w]` of a convolution from the output
/// gradient `gy` ([`conv_input_grad`]) with an optional bias. This is
/// also the transposed convolution of `gy` by `w`; with `bias` (`[cin]`)
/// every position starts from its channel's bias and the taps are added
/// after it, as on the CPU.
pub fn conv_input_grad_bias(
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
    let plane = (g.h * g.w) as usize;
    let mut gx = match bias {
        Some(b) => bias_filled(op, gy, b, nx, g.cin as usize, plane)?,
        None if g.rows() == 0 || g.l() == 0 || g.cout == 0 => {
            return CudaBuffer::zeros(gy.device(), gy.dtype(), nx)
        }
        None => CudaBuffer::alloc(gy.device(), gy.dtype(), nx)?,
    };
    if g.rows() == 0 || g.l() == 0 || g.cout == 0 {
        return Ok(gx);
    }
    let (n, l, k, cg, rows, cout) = (
        g.n as usize,
        g.l(),
        g.k(),
        g.cout_g(),
        g.rows(),
        g.cout as usize,
    );
    let chunk = g.chunk_items(gy.dtype().size_in_bytes(), budget);
    let mut cols = workspace(gy, g, chunk)?;
    for first in (0..n).step_by(chunk) {
        let nb = chunk.min(n - first);
        for grp in 0..g.groups as usize {
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
pub fn conv_weight_grad(
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
    let (l, k, cg, rows, cout) = (g.l(), g.k(), g.cout_g(), g.rows(), g.cout as usize);
    for_each_column_chunk(x, g, budget, |first, nb, cols| {
        for j in 0..nb {
            for grp in 0..g.groups as usize {
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
