//! Bilinear interpolation of `[N, C, H, W]` inputs to `[N, C, oh, ow]`
//! (`torch.nn.functional.interpolate(x, size | scale_factor,
//! mode="bilinear", align_corners)` and `torch.nn.Upsample`): output
//! `(i, j)` of each plane is the weighted mean of the four inputs around
//! its source point, found per axis by PyTorch's
//! `area_pixel_compute_source_index`:
//!
//! ```text
//! align_corners:   src = i · (in − 1)/(out − 1)            (0 when out = 1)
//! otherwise:       src = max((i + ½) · scale − ½, 0),  scale = in/out,
//!                  or 1/scale_factor when a scale factor was given
//! i0 = min(⌊src⌋, in − 1),  i1 = i0 + (i0 < in − 1),  λ1 = clamp(src − i0, 0, 1),  λ0 = 1 − λ1
//! ```
//!
//! (an axis whose output size equals its input size copies: `i0 = i1 = i`,
//! `λ = (1, 0)`). Everything is computed in the accumulate type (f32 for
//! f32, f16 and bf16; f64 for f64) with PyTorch's CPU kernels' roundings,
//! fused multiply-adds included (where GCC contracts them in PyTorch's x86
//! Linux build), so results are PyTorch's CPU bits. PyTorch
//! has two CPU kernels with different orders of products and sums, and
//! picks one per call; [`InterpCode`] names them and the same rule picks
//! one here: the channels-last kernel ([`InterpCode::Corners`]) when the
//! input's strides are channels-last dense (dims of size 1 ignored, so a
//! contiguous `[N, C, 1, 1]` is) with `C > 3`, or when `oh + ow ≤ 128`;
//! the generic one ([`InterpCode::Separable`]) otherwise. (PyTorch also
//! takes the channels-last kernel for `C = 3` when it runs on one thread;
//! leangrad's results never depend on the thread count, so it does not.)
//! The forward formulas are in `cpu.rs`; `upsample.cu` computes the same
//! ones on CUDA.
//!
//! The op is linear in `x`: backward scatters each output gradient to its
//! four inputs with the weights `λh·λw` (PyTorch's input gradient: the
//! products accumulated in the accumulate type in output order, plane by
//! plane, a half-precision gradient rounded once at the end). It needs
//! only the geometry: **nothing is saved**, under either policy (PyTorch's
//! `upsample_bilinear2d` keeps only sizes too).
//!
//! | op | requires grad | saved for backward | why |
//! |---|---|---|---|
//! | `interpolate_bilinear` (both policies) | input | nothing (the geometry: sizes, scales, `align_corners`) | linear in `x`: `dx` scatters each output gradient with the forward's weights |
//! | any | nothing | — (no node) | |
//!
//! Deterministic on every device: the CPU runs planes in parallel, each
//! summed in output order; CUDA gathers, one thread per input element
//! visiting the outputs that read it in that same order (no atomics), so
//! both give the same bits.
//!
//! Files: `layers.rs` (the [`Upsample`] module), `cpu.rs` (the CPU
//! kernels; the meta device only plans outputs), `cuda.rs` (launches),
//! `upsample.cu` (the kernels), `tests.rs`.

mod cpu;
mod cuda;
mod layers;
#[cfg(test)]
mod tests;

pub use crate::op_code::InterpCode;
pub use layers::{Upsample, UpsampleSize};

use super::attention::View4;
use crate::autograd::{attach, needs_grad, BackwardOp};
use crate::meta::{backend, Backend};
use crate::ops::expect_float;
use crate::{DType, Error, Result, Tensor};

const OP: &str = "interpolate_bilinear";

/// The geometry of one bilinear interpolation, the family's one geometry
/// type: the sizes, where the operand's elements lie (`x`: the input in
/// forward, the output's gradient in backward), PyTorch's scales in the
/// accumulate type, and which of PyTorch's kernels it follows.
/// `#[repr(C)]` as `struct InterpGeom` in `upsample.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InterpGeom {
    /// Batch size `N`.
    pub batch: i64,
    /// Channels `C`.
    pub channels: i64,
    /// Input height.
    pub h: i64,
    /// Input width.
    pub w: i64,
    /// Output height.
    pub oh: i64,
    /// Output width.
    pub ow: i64,
    /// Where the operand's elements lie, as `[n, c, row, col]` strides.
    pub x: View4,
    /// The height's scale (`area_pixel_compute_scale`) in the accumulate
    /// type (an f32 value, exactly, unless the dtype is f64).
    pub scale_h: f64,
    /// The width's scale, likewise.
    pub scale_w: f64,
    /// 1 for `align_corners`, else 0.
    pub align_corners: i64,
    /// The formula, an [`InterpCode`].
    pub mode: i64,
    /// Under [`InterpCode::Corners`], the channels below this one are
    /// summed in the order of PyTorch's vector loop, the rest in its scalar
    /// tail's order: `C − C mod (32 / element size)`, the lanes of the
    /// 256-bit vectors of its AVX2 kernels (which x86 builds of PyTorch run
    /// on AVX-512 CPUs too).
    pub lanes: i64,
}

impl InterpGeom {
    /// Planes `N·C`.
    pub fn planes(&self) -> usize {
        (self.batch * self.channels) as usize
    }

    /// Elements of the input (and of its gradient).
    pub fn input_len(&self) -> usize {
        self.planes() * (self.h * self.w) as usize
    }

    /// Elements of the output.
    pub fn output_len(&self) -> usize {
        self.planes() * (self.oh * self.ow) as usize
    }

    /// The input's shape `[N, C, H, W]`.
    pub fn input_shape(&self) -> [usize; 4] {
        [self.batch, self.channels, self.h, self.w].map(|v| v as usize)
    }

    /// The output's shape `[N, C, oh, ow]`.
    pub fn output_shape(&self) -> [usize; 4] {
        [self.batch, self.channels, self.oh, self.ow].map(|v| v as usize)
    }

    /// The formula.
    pub fn code(&self) -> InterpCode {
        if self.mode == i64::from(InterpCode::Corners.kernel_code()) {
            InterpCode::Corners
        } else {
            InterpCode::Separable
        }
    }
}

fn invalid(msg: String) -> Error {
    Error::InvalidArgument { op: OP, msg }
}

/// PyTorch's `area_pixel_compute_scale` for one axis in the accumulate
/// type of `dtype` (f32 unless f64), as an f64: `(in − 1)/(out − 1)` with
/// `align_corners` (0 for one output), else `1/scale_factor` when one was
/// given, else `in/out`.
fn axis_scale(dtype: DType, len: usize, out: usize, align: bool, factor: Option<f64>) -> f64 {
    let wide = dtype == DType::F64;
    let ratio = |a: usize, b: usize| {
        if wide {
            a as f64 / b as f64
        } else {
            f64::from(a as f32 / b as f32)
        }
    };
    match (align, factor) {
        (true, _) if out > 1 => ratio(len - 1, out - 1),
        (true, _) => 0.0,
        (false, Some(f)) if wide => 1.0 / f,
        (false, Some(f)) => f64::from((1.0 / f) as f32),
        (false, None) => ratio(len, out),
    }
}

/// Whether `shape`/`strides` (rank 4) are channels-last dense as PyTorch's
/// `is_contiguous(memory_format=torch.channels_last)` decides: the dims in
/// the order C, W, H, N, each stride the product of the sizes before it,
/// dims of size 1 ignored.
fn channels_last_dense(shape: &[usize], strides: &[usize]) -> bool {
    let mut expected = 1usize;
    for d in [1, 3, 2, 0] {
        if shape[d] != 1 {
            if strides[d] != expected {
                return false;
            }
            expected = expected.saturating_mul(shape[d]);
        }
    }
    true
}

/// The geometry of interpolating `x` to `size` (checked: a float rank-4
/// input with `C, H, W ≥ 1`, outputs of at least one element per axis,
/// element counts that fit an `i64`), reading `x` in place.
fn geometry(
    x: &Tensor,
    size: [usize; 2],
    factor: Option<[f64; 2]>,
    align_corners: bool,
) -> Result<InterpGeom> {
    expect_float(OP, x)?;
    let shape = x.shape();
    if shape.len() != 4 {
        return Err(invalid(format!(
            "expects a 4-d [N, C, H, W] input, got {shape:?}"
        )));
    }
    let [n, c, h, w] = [shape[0], shape[1], shape[2], shape[3]];
    if c == 0 || h == 0 || w == 0 {
        return Err(invalid(format!(
            "the input's channels, height and width must be positive, got {shape:?}"
        )));
    }
    if size.contains(&0) {
        return Err(invalid(format!(
            "the output size must be positive, got {size:?}"
        )));
    }
    let count = |a: usize, b: usize| {
        [n, c, a, b]
            .into_iter()
            .try_fold(1usize, usize::checked_mul)
            .filter(|&e| i64::try_from(e).is_ok())
    };
    if count(size[0], size[1]).is_none() || count(h, w).is_none() {
        return Err(invalid(format!(
            "an output of {:?} from {shape:?} has more elements than an i64 counts",
            [n, c, size[0], size[1]]
        )));
    }
    let dtype = x.dtype();
    let corners =
        (channels_last_dense(shape, x.layout().strides()) && c > 3) || size[0] + size[1] <= 128;
    let (mode, lanes) = if corners {
        let per_vector = 32 / dtype.size_in_bytes();
        (InterpCode::Corners, c - c % per_vector)
    } else {
        (InterpCode::Separable, 0)
    };
    let i = |v: usize| v as i64;
    Ok(InterpGeom {
        batch: i(n),
        channels: i(c),
        h: i(h),
        w: i(w),
        oh: i(size[0]),
        ow: i(size[1]),
        x: View4::of(x.layout().strides(), x.layout().offset()),
        scale_h: axis_scale(dtype, h, size[0], align_corners, factor.map(|f| f[0])),
        scale_w: axis_scale(dtype, w, size[1], align_corners, factor.map(|f| f[1])),
        align_corners: i64::from(align_corners),
        mode: i64::from(mode.kernel_code()),
        lanes: i(lanes),
    })
}

// The dispatch seam: one function per kernel. The meta device plans the
// output only.

/// The interpolation of `x` (read through `g.x`) into a new contiguous
/// `[N, C, oh, ow]` tensor, on any device.
fn forward(x: &Tensor, g: &InterpGeom) -> Result<Tensor> {
    match backend(OP, &[x])? {
        Backend::Meta => {
            crate::meta::float(OP, x.dtype())?;
            crate::meta::empty(&g.output_shape(), x.dtype())
        }
        Backend::Cpu => cpu::forward(x, g),
        Backend::Cuda(_) => cuda::forward(x, g),
    }
}

/// The input gradient `[N, C, H, W]` from the output's gradient `grad`
/// (read through `g.x`), on any device.
fn backward(grad: &Tensor, g: &InterpGeom) -> Result<Tensor> {
    match backend(OP, &[grad])? {
        Backend::Meta => {
            crate::meta::float(OP, grad.dtype())?;
            crate::meta::empty(&g.input_shape(), grad.dtype())
        }
        Backend::Cpu => cpu::backward(grad, g),
        Backend::Cuda(_) => cuda::backward(grad, g),
    }
}

/// Backward of [`interpolate_bilinear`]: the scatter, from the geometry
/// alone.
struct InterpBackward {
    geom: InterpGeom,
}

impl BackwardOp for InterpBackward {
    fn name(&self) -> &'static str {
        OP
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let want = self.geom.output_shape();
        if g.shape() != want {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: want.to_vec(),
                rhs: g.shape().to_vec(),
            });
        }
        let geom = InterpGeom {
            x: View4::of(g.layout().strides(), g.layout().offset()),
            ..self.geom
        };
        Ok(vec![Some(backward(&g, &geom)?)])
    }
}

/// The interpolation with its node when `x` requires grad.
fn run(x: &Tensor, geom: InterpGeom) -> Result<Tensor> {
    let out = forward(x, &geom)?;
    let [needs] = needs_grad([x]);
    if !needs {
        return Ok(out);
    }
    Ok(attach(out, &[x], InterpBackward { geom }))
}

/// Bilinear interpolation of `x` `[N, C, H, W]` (any float dtype, any
/// layout) to `size` = `[oh, ow]`, as
/// `torch.nn.functional.interpolate(x, size=size, mode="bilinear",
/// align_corners=align_corners)`, into a new contiguous tensor (see the
/// module doc for the source-index rule and PyTorch's roundings). Saves
/// nothing for backward. A rank other than 4, a zero size, an empty
/// channel or spatial dim, or an element count past `i64` is
/// `Error::InvalidArgument`; an integer dtype `Error::UnsupportedDType`.
pub fn interpolate_bilinear(x: &Tensor, size: [usize; 2], align_corners: bool) -> Result<Tensor> {
    let geom = geometry(x, size, None, align_corners)?;
    run(x, geom)
}

/// Bilinear interpolation of `x` `[N, C, H, W]` by `scale_factor` = (rows,
/// columns), as `torch.nn.functional.interpolate(x,
/// scale_factor=scale_factor, mode="bilinear",
/// align_corners=align_corners)` with `recompute_scale_factor` unset: the
/// output is `⌊H·sh⌋ × ⌊W·sw⌋` and, without `align_corners`, the source
/// index uses `1/scale_factor` as its scale (not `H/oh`). Saves nothing for
/// backward. A factor that is not finite and positive, or that gives an
/// empty output, is `Error::InvalidArgument`; otherwise as
/// [`interpolate_bilinear`].
pub fn interpolate_bilinear_scale(
    x: &Tensor,
    scale_factor: [f64; 2],
    align_corners: bool,
) -> Result<Tensor> {
    let shape = x.shape();
    if shape.len() != 4 {
        return Err(invalid(format!(
            "expects a 4-d [N, C, H, W] input, got {shape:?}"
        )));
    }
    let mut size = [0usize; 2];
    for (a, (&f, out)) in scale_factor.iter().zip(size.iter_mut()).enumerate() {
        if !(f.is_finite() && f > 0.0) {
            return Err(invalid(format!(
                "scale factors must be finite and positive, got {scale_factor:?}"
            )));
        }
        let len = (shape[2 + a] as f64 * f).floor();
        if len >= 2f64.powi(53) {
            return Err(invalid(format!(
                "scale factor {f} makes an axis of {len} elements"
            )));
        }
        *out = len as usize;
    }
    let geom = geometry(x, size, Some(scale_factor), align_corners)?;
    run(x, geom)
}
