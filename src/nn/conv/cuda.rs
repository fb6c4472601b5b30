//! Every line of the convolutions' CUDA code: the glue from tensors to
//! device buffers (what the seam in `mod.rs` calls for CUDA tensors) and the
//! launch wrappers of `conv.cu`: forward, input gradient and weight gradient
//! as implicit GEMMs (one launch each, with stride, padding, dilation and
//! groups; the weight gradient's split partial sums added by a second one),
//! and the bias gradient's per-channel sum.
//!
//! No convolution writes im2col columns, yet each holds the CPU kernels'
//! column buffer of Workspace while it runs (see [`workspace`]), so that
//! the ledgers match; the weight gradient keeps its split partial sums
//! there (more with a larger [`super::with_conv_workspace`] budget).

use super::ConvGeom;
use crate::cuda::check::{expect, float_suffix};
use crate::cuda::launch;
use crate::cuda::{conv_tf32_enabled, CudaBuffer, CudaDevice};
use crate::memory::{with_category, Category};
use crate::tensor::cuda::wrap;
use crate::{DType, Result, Tensor};
use cudarc::driver::{DeviceRepr, LaunchConfig};

// The kernels take `struct ConvGeom` of 16 `long long`s by value; `usize`
// has their layout only where it is 8 bytes.
const _: () = assert!(std::mem::size_of::<ConvGeom>() == 16 * 8);

// SAFETY: a plain `repr(C)` struct of 16 usizes (8 bytes each, asserted
// above), laid out as `struct ConvGeom` in `conv.cu`.
unsafe impl DeviceRepr for ConvGeom {}

impl ConvGeom {
    /// Elements of the input, weight and output.
    fn sizes(&self) -> (usize, usize, usize) {
        (
            self.n * self.cin * self.h * self.w,
            self.cout * self.k(),
            self.n * self.cout * self.l(),
        )
    }
}

/// `t` as a whole-buffer dense tensor: itself, or a copy made by
/// `primitives::contiguous_copy`, so that the ledger names it as it names
/// the CPU kernels' copy of the same view.
fn dense(t: &Tensor) -> Result<Tensor> {
    let whole = t.layout().offset() == 0 && t.numel() == t.storage().len();
    if whole && t.is_contiguous() {
        Ok(t.clone())
    } else {
        crate::primitives::contiguous_copy(t)
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
        conv_forward(x, w, bb.as_deref(), g)
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
        conv_input_grad(gy, w, bb.as_deref(), g)
    })
}

/// `cpu::conv2d_weight_grad` on CUDA tensors.
pub(super) fn conv2d_weight_grad(gy: &Tensor, x: &Tensor, g: &ConvGeom) -> Result<Tensor> {
    let shape = [g.cout, g.cin / g.groups, g.kh, g.kw];
    on_buffers(gy, x, &shape, |gy, x| conv_weight_grad(gy, x, g))
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

/// Threads per block of the implicit-GEMM kernels (`LG_IG_THREADS`).
const THREADS: usize = 128;
/// Columns of one block's output tile (`LG_IG_BN`).
const TILE: usize = 64;
/// The tile heights `conv.cu` instantiates (`conv_*_m{rows}_*`), smallest
/// first: a layer takes the smallest that holds its rows, so that a
/// 3-channel or depthwise layer does not compute 64 rows of zeros, and the
/// tallest only where its tiles still fill the GPU (see [`tile_rows`]).
const TILE_ROWS: [usize; 5] = [8, 16, 32, 64, 128];
/// Fewest blocks a layer's 128-row tiles must make to be taken over 64-row
/// ones (about four per SM of a 132-SM GPU): a taller tile gathers fewer
/// operands per multiply-add but leaves fewer warps to hide latency where
/// there are few tiles. A constant, so that the choice is the same on every
/// GPU (the values are the same at every height: each element sums its K
/// in the same order).
const TALL_TILE_BLOCKS: usize = 512;
/// The launch shape of `blocks` tiles (the kernels loop over tiles beyond
/// the grid's 65,536 blocks).
fn tile_grid(blocks: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks.clamp(1, 65_536) as u32, 1, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The tile height for a product of `m` rows and `n` columns per group in
/// `groups` groups: the smallest that holds `m` up to 64 rows; 128 beyond
/// that where those tiles number at least [`TALL_TILE_BLOCKS`].
fn tile_rows(groups: usize, m: usize, n: usize) -> usize {
    let (short, tall) = TILE_ROWS.split_at(TILE_ROWS.len() - 1);
    let widest = short[short.len() - 1];
    let rows = short.iter().copied().find(|&r| m <= r).unwrap_or(widest);
    let tall = tall[0];
    match m > rows && groups * m.div_ceil(tall) * n.div_ceil(TILE) >= TALL_TILE_BLOCKS {
        true => tall,
        false => rows,
    }
}

/// The suffix of the tile kernel of `rows` rows for `dtype` (its float
/// suffix `sfx`): `tf32`, the TF32 tensor-core kernels, for f32 with
/// [`crate::cuda::with_conv_tf32`] on (the default) where the tile is at
/// least one m16 fragment high; `sfx` otherwise.
fn tile_suffix(sfx: &'static str, dtype: DType, rows: usize) -> &'static str {
    if dtype == DType::F32 && rows >= 16 && conv_tf32_enabled() {
        "tf32"
    } else {
        sfx
    }
}

/// Tiles of `m × n` in `groups` groups.
fn tiles(groups: usize, m: usize, n: usize) -> usize {
    groups * m.div_ceil(tile_rows(groups, m, n)) * n.div_ceil(TILE)
}

/// One axis of the input gradient's stride phases (as `IgAxisPhase` in
/// `conv.cu`): for each phase `q < stride`, the input coordinates it holds
/// and, for each tap that reaches them, the output offset it reads
/// (`base - (k·dil - q)/stride`).
fn axis_phases(len: usize, k: usize, s: usize, p: usize, d: usize) -> Vec<(usize, Vec<isize>)> {
    (0..s)
        .map(|q| {
            let first = (q + s - p % s) % s;
            let count = len.saturating_sub(first).div_ceil(s);
            let base = ((first + p - q) / s) as isize;
            let offsets = (0..k)
                .filter(|ki| ki * d % s == q)
                .map(|ki| base - ((ki * d - q) / s) as isize)
                .collect();
            (count, offsets)
        })
        .collect()
}

/// The input positions of the batch in its largest stride phase: the
/// columns of the input gradient's products.
fn phase_columns(g: &ConvGeom) -> usize {
    g.n * g.h.div_ceil(g.stride[0]) * g.w.div_ceil(g.stride[1])
}

/// How the input gradient runs (both layouts in `conv.cu`).
#[derive(Debug, PartialEq)]
enum InputGradPlan {
    /// `conv_dgrad_*`: one dense product per stride phase with only its
    /// taps (every phase given the tiles of the largest).
    PerPhase { tiles: usize },
    /// `conv_dgrad_phase_rows_*`: the phases as rows of one product over
    /// the output offsets `max - j` (`j < count`) on each axis.
    PhaseRows {
        tiles: usize,
        offsets: [(isize, usize); 2],
    },
}

/// Picks the input gradient's layout with fewer multiply-add slots (tile
/// rows padded): the phases as rows wins where few input channels would
/// leave a per-phase tile mostly empty (a 3-channel stem), per phase
/// everywhere else.
fn input_grad_plan(g: &ConvGeom) -> InputGradPlan {
    let [sy, sx] = g.stride;
    let (cig, cg) = (g.cin / g.groups, g.cout / g.groups);
    let ys = axis_phases(g.h, g.kh, sy, g.pad[0], g.dil[0]);
    let xs = axis_phases(g.w, g.kw, sx, g.pad[1], g.dil[1]);
    let largest = phase_columns(g);
    let padded = |rows: usize| {
        let tile = tile_rows(g.groups, rows, largest);
        rows.div_ceil(tile) * tile
    };
    let work = |axis: &[(usize, Vec<isize>)]| -> usize {
        axis.iter().map(|(count, taps)| count * taps.len()).sum()
    };
    let per_phase = padded(cig) * g.n * cg * work(&ys) * work(&xs);
    let span = |axis: &[(usize, Vec<isize>)]| -> (isize, usize) {
        let all = axis.iter().flat_map(|(_, taps)| taps.iter().copied());
        let (lo, hi) = all.fold((isize::MAX, isize::MIN), |(lo, hi), d| {
            (lo.min(d), hi.max(d))
        });
        (hi, (hi - lo + 1) as usize)
    };
    let (oy, ox) = (span(&ys), span(&xs));
    let phase_rows = padded(cig * sy * sx) * largest * cg * oy.1 * ox.1;
    if g.dil == [1, 1] && sy * sx > 1 && phase_rows < per_phase {
        let tiles = tiles(g.groups, cig * sy * sx, largest);
        InputGradPlan::PhaseRows {
            tiles,
            offsets: [oy, ox],
        }
    } else {
        InputGradPlan::PerPhase {
            tiles: sy * sx * tiles(g.groups, cig, largest),
        }
    }
}

/// The Workspace a convolution holds while it runs, `len` elements of
/// `like`'s dtype: what the CPU kernels hold for the same pass (the column
/// buffer, [`ConvGeom::column_buffer_len`]; for a weight gradient
/// [`ConvGeom::weight_grad_workspace_len`]), so that a CUDA step's ledger
/// equals the CPU's and the meta prediction byte for byte. The implicit
/// GEMMs gather their tiles from the input directly and use none of it
/// except for the weight gradient's split partial sums.
fn workspace(like: &CudaBuffer, len: usize) -> Result<CudaBuffer> {
    CudaBuffer::alloc_in(like.device(), like.dtype(), len, Category::Workspace)
}

/// The address of an optional bias (null when absent).
fn bias_address(
    op: &'static str,
    bias: Option<&CudaBuffer>,
    like: &CudaBuffer,
    c: usize,
) -> Result<u64> {
    match bias {
        Some(b) => {
            expect(op, b, like.dtype(), c, like)?;
            Ok(b.address())
        }
        None => Ok(0),
    }
}

/// Convolution forward: `y = bias + W ⊛ x` (`[n, cout, oh, ow]`), one
/// implicit-GEMM launch (`conv_fwd_*`).
fn conv_forward(
    x: &CudaBuffer,
    w: &CudaBuffer,
    bias: Option<&CudaBuffer>,
    g: &ConvGeom,
) -> Result<CudaBuffer> {
    let op = "cuda conv";
    let sfx = float_suffix(op, x.dtype())?;
    let (nx, nw, ny) = g.sizes();
    expect(op, x, x.dtype(), nx, x)?;
    expect(op, w, x.dtype(), nw, x)?;
    let b = bias_address(op, bias, x, g.cout)?;
    let mut y = CudaBuffer::alloc(x.device(), x.dtype(), ny)?;
    let _reserved = workspace(x, g.column_buffer_len(x.dtype()))?;
    if ny > 0 {
        let cfg = tile_grid(tiles(g.groups, g.cout_g(), g.n * g.l()));
        let rows = tile_rows(g.groups, g.cout_g(), g.n * g.l());
        let tsfx = tile_suffix(sfx, x.dtype(), rows);
        // Parameters: (ConvGeom g, T* y, const T* x, const T* w, const T* bias).
        launch!(x.device(), "conv.cu", format!("conv_fwd_m{rows}_{tsfx}"), cfg;
            g, y.slice_mut(), x.slice(), w.slice(), &b)?;
    }
    Ok(y)
}

/// The input gradient `[n, cin, h, w]` of a convolution from the output
/// gradient `gy`, one implicit-GEMM launch over the stride phases of the
/// input, each with only the taps that reach it (see [`input_grad_plan`]).
/// This is also the transposed convolution of `gy` by `w`; with `bias`
/// (`[cin]`) every position starts from its channel's bias.
fn conv_input_grad(
    gy: &CudaBuffer,
    w: &CudaBuffer,
    bias: Option<&CudaBuffer>,
    g: &ConvGeom,
) -> Result<CudaBuffer> {
    let op = "cuda conv input grad";
    let sfx = float_suffix(op, gy.dtype())?;
    let (nx, nw, ny) = g.sizes();
    expect(op, gy, gy.dtype(), ny, gy)?;
    expect(op, w, gy.dtype(), nw, gy)?;
    let b = bias_address(op, bias, gy, g.cin)?;
    let mut gx = CudaBuffer::alloc(gy.device(), gy.dtype(), nx)?;
    let _reserved = workspace(gy, g.column_buffer_len(gy.dtype()))?;
    if nx > 0 {
        let cig = g.cin / g.groups;
        match input_grad_plan(g) {
            InputGradPlan::PerPhase { tiles } => {
                let rows = tile_rows(g.groups, cig, phase_columns(g));
                let tsfx = tile_suffix(sfx, gy.dtype(), rows);
                // Parameters: (ConvGeom g, T* gx, const T* gy, const T* w, const T* bias).
                launch!(gy.device(), "conv.cu", format!("conv_dgrad_m{rows}_{tsfx}"), tile_grid(tiles);
                    g, gx.slice_mut(), gy.slice(), w.slice(), &b)?;
            }
            InputGradPlan::PhaseRows { tiles, offsets } => {
                let rows = tile_rows(g.groups, cig * g.stride[0] * g.stride[1], phase_columns(g));
                let tsfx = tile_suffix(sfx, gy.dtype(), rows);
                let [(y_max, y_count), (x_max, x_count)] = offsets;
                let dy_max = y_max as i64;
                let dys = y_count as i64;
                let dx_max = x_max as i64;
                let dxs = x_count as i64;
                // Parameters: (ConvGeom g, i64 dy_max, i64 dys, i64 dx_max,
                // i64 dxs, T* gx, const T* gy, const T* w, const T* bias).
                launch!(gy.device(), "conv.cu", format!("conv_dgrad_phase_rows_m{rows}_{tsfx}"), tile_grid(tiles);
                    g, &dy_max, &dys, &dx_max, &dxs, gx.slice_mut(), gy.slice(), w.slice(), &b)?;
            }
        }
    }
    Ok(gx)
}

/// The weight gradient `[cout, cin/groups, kh, kw]` = `Σ_items gy·colsᵀ`
/// per group: one implicit-GEMM launch (`conv_wgrad_*`), its reduction
/// split in ranges of the batch when the output has few tiles
/// ([`ConvGeom::weight_grad_split`]), summed into partial sums in its
/// Workspace (a sum's ranges one after another, counted by a counter per
/// tile after them), which `conv_split_sum_*` adds in order.
fn conv_weight_grad(gy: &CudaBuffer, x: &CudaBuffer, g: &ConvGeom) -> Result<CudaBuffer> {
    let op = "cuda conv weight grad";
    let sfx = float_suffix(op, x.dtype())?;
    let (nx, nw, ny) = g.sizes();
    expect(op, gy, x.dtype(), ny, x)?;
    expect(op, x, x.dtype(), nx, x)?;
    let mut gw = match nw > 0 && g.n * g.l() == 0 {
        true => CudaBuffer::zeros(x.device(), x.dtype(), nw)?,
        false => CudaBuffer::alloc(x.device(), x.dtype(), nw)?,
    };
    let mut ws = workspace(x, g.weight_grad_workspace_len(x.dtype()))?;
    let split = g.weight_grad_split(x.dtype());
    if nw == 0 || g.n * g.l() == 0 {
        return Ok(gw);
    }
    let cfg = tile_grid(split.splits * tiles(g.groups, g.cout_g(), g.k()));
    let rows = tile_rows(g.groups, g.cout_g(), g.k());
    let tsfx = tile_suffix(sfx, x.dtype(), rows);
    // The partial sums first, then the chains' counters, zeroed here.
    let sums_bytes = split.sums_bytes();
    if split.counter_bytes() > 0 {
        ws.zero_bytes(sums_bytes..sums_bytes + split.counter_bytes())?;
    }
    let counters = ws.address() + sums_bytes as u64;
    let (s64, slots64) = (split.splits as i64, split.slots as i64);
    // Parameters: (ConvGeom g, i64 splits, i64 slots, T* gw, A* part,
    // unsigned* counters, const T* gy, const T* x).
    launch!(x.device(), "conv.cu", format!("conv_wgrad_m{rows}_{tsfx}"), cfg;
        g, &s64, &slots64, gw.slice_mut(), ws.slice_mut(), &counters, gy.slice(), x.slice())?;
    if split.splits > 1 {
        let n64 = nw as i64;
        // Parameters: (i64 n, i64 splits, T* gw, const A* part).
        launch!(x.device(), "conv.cu", format!("conv_split_sum_{sfx}"), CudaDevice::grid_for(nw);
            &n64, &slots64, gw.slice_mut(), ws.slice())?;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The tile sizes the launch code plans with are those `conv.cu`
    /// defines (one source each side, checked here).
    #[test]
    fn tile_constants_match_the_kernels() {
        let src = include_str!("conv.cu");
        let define = |name: &str| crate::cuda::testing::cu_define(src, name);
        assert_eq!(define("LG_IG_THREADS"), THREADS);
        assert_eq!(define("LG_IG_BN"), TILE);
        // The weight gradient's split counts tiles of these columns.
        assert_eq!(define("LG_IG_BN"), super::super::workspace::SPLIT_TILE);
        for rows in TILE_ROWS {
            let tc = if rows >= 16 { "TC" } else { "false" };
            let tile = format!("LG_CONV_TILE_AS(sfx, T, {rows}, {}, {tc})", rows / 8);
            assert!(src.contains(&tile), "conv.cu instantiates {tile}");
            if rows >= 16 {
                let tf32 = format!("LG_CONV_TILE_AS(tf32, float, {rows}, {}, true)", rows / 8);
                assert!(src.contains(&tf32), "conv.cu instantiates {tf32}");
            }
        }
        assert_eq!(
            (
                tile_rows(1, 3, 64),
                tile_rows(1, 12, 64),
                tile_rows(1, 17, 64),
                tile_rows(1, 64, 1 << 20)
            ),
            (8, 16, 32, 64)
        );
        // Past 64 rows, 128 where those tiles make at least 512 blocks:
        // ResNet-18's layer2 at batch 64 (784 blocks) but not its layer4
        // (196: 64-row tiles, 392 blocks, keep more warps resident).
        assert_eq!(tile_rows(1, 128, 64 * 28 * 28), 128);
        assert_eq!(tile_rows(1, 512, 64 * 7 * 7), 64);
        assert_eq!(tile_rows(2, 65, 256 * 64), 128);
        assert_eq!(tile_rows(1, 65, 255 * 64), 64);
    }

    /// A 2-d geometry `[n, cin, h, w]` by `[cout, cin/groups, kh, kw]`.
    fn geom(x: [usize; 4], w: [usize; 4], stride: usize, pad: usize, dil: usize) -> ConvGeom {
        let out = |len: usize, k: usize| (len + 2 * pad - dil * (k - 1) - 1) / stride + 1;
        ConvGeom {
            n: x[0],
            cin: x[1],
            h: x[2],
            w: x[3],
            cout: w[0],
            kh: w[2],
            kw: w[3],
            stride: [stride; 2],
            pad: [pad; 2],
            dil: [dil; 2],
            groups: x[1] / w[1],
            oh: out(x[2], w[2]),
            ow: out(x[3], w[3]),
        }
    }

    /// The stride phases of one axis: ResNet's 7×7 stride-2 stem (pad 3)
    /// reads output offsets 2..-1 in phase 0 (taps 0, 2, 4, 6) and 1..-1 in
    /// phase 1 (taps 1, 3, 5); a 1×1 stride-2 layer reaches phase 0 only.
    #[test]
    fn axis_phases_list_each_phases_taps() {
        assert_eq!(
            axis_phases(224, 7, 2, 3, 1),
            vec![(112, vec![2, 1, 0, -1]), (112, vec![1, 0, -1])]
        );
        assert_eq!(axis_phases(9, 1, 2, 0, 1), vec![(5, vec![0]), (4, vec![])]);
        // Dilation 2 at stride 2: every tap in phase 0.
        assert_eq!(axis_phases(11, 3, 2, 2, 2)[1].1, Vec::<isize>::new());
    }

    /// The stem's 3 input channels take the phases as rows (12 rows in a
    /// 16-row tile, 4×4 offsets); wide layers, 1×1 downsamples, dilated
    /// and unit-stride layers one product per phase.
    #[test]
    fn input_grad_plan_puts_phases_in_rows_for_few_channels() {
        let stem = geom([64, 3, 224, 224], [64, 3, 7, 7], 2, 3, 1);
        let tiles = 12usize.div_ceil(16) * (64 * 112 * 112usize).div_ceil(TILE);
        assert_eq!(
            input_grad_plan(&stem),
            InputGradPlan::PhaseRows {
                tiles,
                offsets: [(2, 4), (2, 4)]
            }
        );
        let per_phase = |g: &ConvGeom| matches!(input_grad_plan(g), InputGradPlan::PerPhase { .. });
        assert!(per_phase(&geom([64, 64, 56, 56], [128, 64, 3, 3], 2, 1, 1)));
        assert!(per_phase(&geom([64, 64, 56, 56], [128, 64, 1, 1], 2, 0, 1)));
        assert!(per_phase(&geom([2, 3, 20, 20], [8, 3, 7, 7], 2, 6, 2)));
        assert!(per_phase(&geom([2, 3, 20, 20], [8, 3, 7, 7], 1, 3, 1)));
        // The device suite's stem case (tests/device_conv.rs).
        assert!(!per_phase(&geom([2, 3, 17, 15], [8, 3, 7, 7], 2, 3, 1)));
        let grouped = ConvGeom {
            stride: [3, 2],
            pad: [1, 1],
            oh: 5,
            ow: 5,
            ..geom([2, 6, 14, 9], [6, 2, 4, 3], 1, 1, 1)
        };
        assert!(!per_phase(&grouped));
    }
}
