//! Convolutions: `conv1d`, `conv2d` and `conv_transpose2d` as fused ops with
//! PyTorch's weight layouts, and their modules [`Conv1d`], [`Conv2d`] and
//! [`ConvTranspose2d`] (in `layers.rs`).
//!
//! Every convolution runs as a 2-d one over `[n, c, h, w]` described by one
//! [`ConvGeom`] (1-d: a unit height; transposed: the convolution whose input
//! gradient it is): im2col + GEMM for the forward and the weight gradient,
//! GEMM + col2im for the input gradient (which is also the transposed
//! convolution's forward), a per-channel sum for the bias gradient.
//!
//! Files: this one holds the functional API, the options, the geometry, the
//! backward and the dispatch seam (the only place here that picks a
//! backend); `cpu.rs` the CPU (and meta) kernels; `cuda.rs` every line of
//! CUDA code (tensor glue and launch wrappers); `conv.cu` the kernels.
//!
//! Saved for backward (the same for all three ops; `x` the input, `W` the
//! weight, `b` the bias):
//!
//! | op | requires grad | saved for backward | why |
//! | --- | --- | --- | --- |
//! | conv1d / conv2d / conv_transpose2d | none | nothing (no node) | no gradient is computed |
//! | same | `b` only | nothing | `gb` is `gy` summed over the batch and the positions |
//! | same | `x` (± `b`) | `W` | `gx` is the transposed convolution of `gy` by `W` |
//! | same | `W` (± `b`) | `x` | `gW` correlates `gy` with the columns of `x` |
//! | same | `x` and `W` (± `b`) | `x` and `W` | both of the above |
//! | same | any, under [`SavePolicy::SaveAll`](crate::autograd::SavePolicy) | `x` and `W` | what PyTorch keeps |
//!
//! A module's weight is a parameter: keeping it costs no extra bytes. The
//! column buffer (one batch item's columns by default) is Workspace, freed
//! before each call returns, not saved.

mod cpu;
mod cuda;
mod layers;
mod workspace;

use crate::autograd::{attach, keep, needs_grad, BackwardOp, SavedTensor};
use crate::meta::{backend, Backend};
use crate::ops::autocast::lower3;
use crate::ops::expect_float;
use crate::primitives::check_pair;
use crate::tensor::Layout;
use crate::{Error, Result, Tensor};

pub use layers::{
    Conv1d, Conv1dBuilder, Conv2d, Conv2dBuilder, ConvTranspose2d, ConvTranspose2dBuilder, Size2,
};
pub use workspace::{
    conv_workspace_bytes, with_conv_workspace, DEFAULT_CONV_WORKSPACE_BYTES, LARGE_WORKSPACE_BYTES,
};

/// Options of [`conv2d`] (PyTorch's defaults: stride 1, no padding,
/// dilation 1, one group), per axis `[height, width]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dOptions {
    /// Step between output positions.
    pub stride: [usize; 2],
    /// Zeros added on both sides of the input.
    pub padding: [usize; 2],
    /// Spacing between kernel taps.
    pub dilation: [usize; 2],
    /// Channel groups (`groups == in_channels` is a depthwise convolution).
    pub groups: usize,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Conv2dOptions {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

/// Options of [`conv1d`] (PyTorch's defaults: stride 1, no padding,
/// dilation 1, one group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv1dOptions {
    /// Step between output positions.
    pub stride: usize,
    /// Zeros added on both sides of the input.
    pub padding: usize,
    /// Spacing between kernel taps.
    pub dilation: usize,
    /// Channel groups.
    pub groups: usize,
}

impl Default for Conv1dOptions {
    fn default() -> Self {
        Conv1dOptions {
            stride: 1,
            padding: 0,
            dilation: 1,
            groups: 1,
        }
    }
}

/// Options of [`conv_transpose2d`], per axis `[height, width]` (PyTorch's
/// defaults: stride 1, no padding or output padding, dilation 1, one group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTranspose2dOptions {
    /// Step between input positions in the output.
    pub stride: [usize; 2],
    /// Removed from both sides of the full output.
    pub padding: [usize; 2],
    /// Added to one side of the output (must be below stride or dilation).
    pub output_padding: [usize; 2],
    /// Spacing between kernel taps.
    pub dilation: [usize; 2],
    /// Channel groups.
    pub groups: usize,
}

impl Default for ConvTranspose2dOptions {
    fn default() -> Self {
        ConvTranspose2dOptions {
            stride: [1, 1],
            padding: [0, 0],
            output_padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

/// The geometry of one 2-d convolution (a 1-d one has `h = kh = 1`): input
/// `[n, cin, h, w]`, weight `[cout, cin/groups, kh, kw]`, output
/// `[n, cout, oh, ow]`. A transposed convolution is described by the
/// convolution whose input gradient it is (its own output is
/// `[n, cin, h, w]`).
///
/// One type for the CPU kernels, the CUDA launch code and the kernels in
/// `conv.cu`, which take it by value as `struct ConvGeom`: hence
/// `#[repr(C)]`, the kernel struct's field order, and `usize` fields laid
/// out as its `long long`s (64-bit targets; checked at compile time in
/// `cuda.rs`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvGeom {
    /// Batch size.
    pub n: usize,
    /// Input channels.
    pub cin: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub cout: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Stride (height, width).
    pub stride: [usize; 2],
    /// Zero padding on both sides (height, width).
    pub pad: [usize; 2],
    /// Dilation (height, width).
    pub dil: [usize; 2],
    /// Channel groups.
    pub groups: usize,
    /// Output height.
    pub oh: usize,
    /// Output width.
    pub ow: usize,
}

impl ConvGeom {
    /// Rows of one group's column block: `cin/groups · kh · kw`.
    fn k(&self) -> usize {
        self.cin / self.groups * self.kh * self.kw
    }
    /// Output positions per channel: `oh · ow`.
    fn l(&self) -> usize {
        self.oh * self.ow
    }
    /// Output channels per group.
    fn cout_g(&self) -> usize {
        self.cout / self.groups
    }
}

// The dispatch seam: each kernel entry picks its backend here, once. The CPU
// kernels serve the meta device too (they dispatch Cpu/Meta again at their
// innermost data access, so a meta step moves the ledger as a CPU step);
// CUDA tensors go to `cuda.rs`.

/// `y = conv(x, w) + b` as a new contiguous `[n, cout, oh, ow]` tensor.
fn forward(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, g: &ConvGeom) -> Result<Tensor> {
    match backend("conv2d", &[x, w])? {
        Backend::Cpu | Backend::Meta => cpu::conv2d_forward(x, w, bias, g),
        Backend::Cuda(_) => cuda::conv2d_forward(x, w, bias, g),
    }
}

/// The input gradient `[n, cin, h, w]` from `gy` (with `bias` `[cin]`: the
/// transposed convolution of `gy` by `w`).
fn input_grad(gy: &Tensor, w: &Tensor, bias: Option<&Tensor>, g: &ConvGeom) -> Result<Tensor> {
    match backend("conv2d_backward", &[gy, w])? {
        Backend::Cpu | Backend::Meta => cpu::conv2d_input_grad(gy, w, bias, g),
        Backend::Cuda(_) => cuda::conv2d_input_grad(gy, w, bias, g),
    }
}

/// The weight gradient `[cout, cin/groups, kh, kw]` from `gy` and `x`.
fn weight_grad(gy: &Tensor, x: &Tensor, g: &ConvGeom) -> Result<Tensor> {
    match backend("conv2d_backward", &[gy, x])? {
        Backend::Cpu | Backend::Meta => cpu::conv2d_weight_grad(gy, x, g),
        Backend::Cuda(_) => cuda::conv2d_weight_grad(gy, x, g),
    }
}

/// The bias gradient `[c]`: `gy` `[n, c, …]` summed over every dim but 1.
fn bias_grad(gy: &Tensor) -> Result<Tensor> {
    match backend("conv_bias_grad", &[gy])? {
        Backend::Cpu | Backend::Meta => cpu::channel_sum(gy),
        Backend::Cuda(_) => cuda::channel_sum(gy),
    }
}

fn invalid(op: &'static str, msg: String) -> Error {
    Error::InvalidArgument { op, msg }
}

/// Checks dtypes, devices and the bias shape shared by every convolution.
fn check_operands(
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    rank: usize,
    bias_len: usize,
) -> Result<()> {
    expect_float(op, x)?;
    check_pair(op, x, w)?;
    if x.rank() != rank || w.rank() != rank {
        return Err(invalid(
            op,
            format!(
                "input and weight must have rank {rank}, got {:?} and {:?}",
                x.shape(),
                w.shape()
            ),
        ));
    }
    if let Some(b) = bias {
        check_pair(op, x, b)?;
        if b.shape() != [bias_len] {
            return Err(Error::ShapeMismatch {
                op,
                lhs: b.shape().to_vec(),
                rhs: vec![bias_len],
            });
        }
    }
    Ok(())
}

/// Checks that strides, dilations and groups are positive and that `groups`
/// divides both channel counts.
fn check_groups(
    op: &'static str,
    groups: usize,
    chans: [usize; 2],
    s: [usize; 2],
    d: [usize; 2],
) -> Result<()> {
    if groups == 0 || s.contains(&0) || d.contains(&0) {
        return Err(invalid(
            op,
            "stride, dilation and groups must be positive".into(),
        ));
    }
    if chans.iter().any(|c| c % groups != 0) {
        return Err(invalid(
            op,
            format!("groups ({groups}) must divide the channel counts {chans:?}"),
        ));
    }
    Ok(())
}

/// The geometry of a convolution of `x` `[n, c, h, w]` by `w`
/// `[o, c/groups, kh, kw]` (4-d shapes; 1-d ones are given a unit height).
fn conv_geom(
    op: &'static str,
    xs: [usize; 4],
    ws: [usize; 4],
    o: &Conv2dOptions,
) -> Result<ConvGeom> {
    let ([n, c, h, w], [cout, cig, kh, kw]) = (xs, ws);
    check_groups(op, o.groups, [c, cout], o.stride, o.dilation)?;
    if cig * o.groups != c {
        return Err(Error::ShapeMismatch {
            op,
            lhs: xs.to_vec(),
            rhs: ws.to_vec(),
        });
    }
    let mut out = [0; 2];
    for (a, (len, k)) in [(h, kh), (w, kw)].into_iter().enumerate() {
        let span = o.dilation[a] * k.saturating_sub(1) + 1;
        let padded = len + 2 * o.padding[a];
        if k == 0 || span > padded {
            return Err(invalid(
                op,
                format!("kernel extent {span} exceeds the padded input size {padded} (or is 0)"),
            ));
        }
        out[a] = (padded - span) / o.stride[a] + 1;
    }
    Ok(ConvGeom {
        n,
        cin: c,
        h,
        w,
        cout,
        kh,
        kw,
        stride: o.stride,
        pad: o.padding,
        dil: o.dilation,
        groups: o.groups,
        oh: out[0],
        ow: out[1],
    })
}

fn shape4(s: &[usize]) -> [usize; 4] {
    [s[0], s[1], s[2], s[3]]
}

/// Whether the op is a convolution or a transposed one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Conv,
    Transpose,
}

/// Backward of every convolution. `geom` is the geometry of the underlying
/// convolution (for a transposed one: its output is our input). Saves the
/// input only if the weight needs grad and the weight only if the input does
/// (both under `SaveAll`); the bias gradient needs nothing saved.
struct ConvBackward {
    name: &'static str,
    kind: Kind,
    geom: ConvGeom,
    x_shape: Vec<usize>,
    w_shape: Vec<usize>,
    has_bias: bool,
    needs: [bool; 3],
    x: Option<SavedTensor>,
    w: Option<SavedTensor>,
}

fn saved<'a>(s: &'a Option<SavedTensor>, name: &str) -> Result<&'a Tensor> {
    s.as_ref()
        .ok_or_else(|| Error::Backward(format!("{name}: a needed tensor was not saved")))?
        .get()
}

fn reshaped(t: Tensor, shape: &[usize]) -> Tensor {
    t.view_with_layout(Layout::contiguous(shape))
}

impl BackwardOp for ConvBackward {
    fn name(&self) -> &'static str {
        self.name
    }

    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let geom = &self.geom;
        let gx = if self.needs[0] {
            let w = saved(&self.w, self.name)?;
            let gx = match self.kind {
                Kind::Conv => input_grad(&g, w, None, geom)?,
                Kind::Transpose => forward(&g, w, None, geom)?,
            };
            Some(reshaped(gx, &self.x_shape))
        } else {
            None
        };
        let gw = if self.needs[1] {
            let x = saved(&self.x, self.name)?;
            let gw = match self.kind {
                Kind::Conv => weight_grad(&g, x, geom)?,
                Kind::Transpose => weight_grad(x, &g, geom)?,
            };
            Some(reshaped(gw, &self.w_shape))
        } else {
            None
        };
        let mut grads = vec![gx, gw];
        if self.has_bias {
            grads.push(if self.needs[2] {
                Some(bias_grad(&g)?)
            } else {
                None
            });
        }
        Ok(grads)
    }
}

/// Runs a convolution (`Kind::Conv`: `geom`'s forward; `Kind::Transpose`:
/// its input gradient), shapes the output, and records the backward.
fn record(
    name: &'static str,
    kind: Kind,
    geom: ConvGeom,
    (x, w, bias): (&Tensor, &Tensor, Option<&Tensor>),
    out_shape: &[usize],
) -> Result<Tensor> {
    let out = match kind {
        Kind::Conv => forward(x, w, bias, &geom)?,
        Kind::Transpose => input_grad(x, w, bias, &geom)?,
    };
    let out = reshaped(out, out_shape);
    let [nx, nw] = needs_grad([x, w]);
    let nb = bias.is_some_and(|b| needs_grad([b])[0]);
    if !(nx || nw || nb) {
        return Ok(out);
    }
    let op = ConvBackward {
        name,
        kind,
        geom,
        x_shape: x.shape().to_vec(),
        w_shape: w.shape().to_vec(),
        has_bias: bias.is_some(),
        needs: [nx, nw, nb],
        x: keep(nw).then(|| SavedTensor::new(x, name)),
        w: keep(nx).then(|| SavedTensor::new(w, name)),
    };
    let mut inputs = vec![x, w];
    inputs.extend(bias);
    Ok(attach(out, &inputs, op))
}

/// 2-d convolution (cross-correlation, as `torch.nn.functional.conv2d`):
/// `x` `[n, in, h, w]`, `weight` `[out, in/groups, kh, kw]`, `bias` `[out]`;
/// the result is `[n, out, oh, ow]` with
/// `oh = (h + 2·pad − dil·(kh − 1) − 1) / stride + 1`.
///
/// Saves `x` only if `weight` needs grad and `weight` only if `x` does
/// (both under `SaveAll`); nothing for the bias.
pub fn conv2d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    opts: &Conv2dOptions,
) -> Result<Tensor> {
    let (x, weight, bias) = lower3(x, weight, bias)?;
    let (x, weight, bias) = (&x, &weight, bias.as_ref());
    const OP: &str = "conv2d";
    let cout = weight.shape().first().copied().unwrap_or(0);
    check_operands(OP, x, weight, bias, 4, cout)?;
    let g = conv_geom(OP, shape4(x.shape()), shape4(weight.shape()), opts)?;
    let shape = [g.n, g.cout, g.oh, g.ow];
    record(OP, Kind::Conv, g, (x, weight, bias), &shape)
}

/// 1-d convolution (as `torch.nn.functional.conv1d`): `x` `[n, in, l]`,
/// `weight` `[out, in/groups, k]`, `bias` `[out]`; the result is
/// `[n, out, ol]`. Runs the 2-d kernel with a unit height.
///
/// Saves `x` only if `weight` needs grad and `weight` only if `x` does
/// (both under `SaveAll`); nothing for the bias.
pub fn conv1d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    opts: &Conv1dOptions,
) -> Result<Tensor> {
    let (x, weight, bias) = lower3(x, weight, bias)?;
    let (x, weight, bias) = (&x, &weight, bias.as_ref());
    const OP: &str = "conv1d";
    let cout = weight.shape().first().copied().unwrap_or(0);
    check_operands(OP, x, weight, bias, 3, cout)?;
    let (xs, ws) = (x.shape(), weight.shape());
    let o2 = Conv2dOptions {
        stride: [1, opts.stride],
        padding: [0, opts.padding],
        dilation: [1, opts.dilation],
        groups: opts.groups,
    };
    let g = conv_geom(OP, [xs[0], xs[1], 1, xs[2]], [ws[0], ws[1], 1, ws[2]], &o2).map_err(
        |e| match e {
            Error::ShapeMismatch { op, .. } => Error::ShapeMismatch {
                op,
                lhs: xs.to_vec(),
                rhs: ws.to_vec(),
            },
            e => e,
        },
    )?;
    let shape = [g.n, g.cout, g.ow];
    record(OP, Kind::Conv, g, (x, weight, bias), &shape)
}

/// 2-d transposed convolution (as `torch.nn.functional.conv_transpose2d`,
/// the gradient of `conv2d` with respect to its input): `x` `[n, in, h, w]`,
/// `weight` `[in, out/groups, kh, kw]`, `bias` `[out]`; the result is
/// `[n, out, oh, ow]` with
/// `oh = (h − 1)·stride − 2·pad + dil·(kh − 1) + output_pad + 1`.
///
/// Saves `x` only if `weight` needs grad and `weight` only if `x` does
/// (both under `SaveAll`); nothing for the bias. The input gradient is a
/// convolution of the output gradient, the weight gradient a correlation of
/// the output gradient with `x`.
pub fn conv_transpose2d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    opts: &ConvTranspose2dOptions,
) -> Result<Tensor> {
    let (x, weight, bias) = lower3(x, weight, bias)?;
    let (x, weight, bias) = (&x, &weight, bias.as_ref());
    const OP: &str = "conv_transpose2d";
    let ws = weight.shape();
    let cout = if ws.len() == 4 {
        ws[1].saturating_mul(opts.groups)
    } else {
        0
    };
    check_operands(OP, x, weight, bias, 4, cout)?;
    let ([n, cin, h, w], [cw, _, kh, kw]) = (shape4(x.shape()), shape4(ws));
    check_groups(OP, opts.groups, [cin, cout], opts.stride, opts.dilation)?;
    if cin != cw {
        return Err(Error::ShapeMismatch {
            op: OP,
            lhs: x.shape().to_vec(),
            rhs: ws.to_vec(),
        });
    }
    let mut out = [0; 2];
    for (a, (len, k)) in [(h, kh), (w, kw)].into_iter().enumerate() {
        let (s, p, d, op) = (
            opts.stride[a],
            opts.padding[a],
            opts.dilation[a],
            opts.output_padding[a],
        );
        if op >= s.max(d) {
            return Err(invalid(
                OP,
                format!("output padding {op} must be below the stride or the dilation"),
            ));
        }
        let full = (len.saturating_sub(1) * s + d * k.saturating_sub(1) + op + 1) as isize;
        let size = full - 2 * p as isize;
        if len == 0 || k == 0 || size <= 0 {
            return Err(invalid(OP, format!("output size {size} is not positive")));
        }
        out[a] = size as usize;
    }
    let geom = ConvGeom {
        n,
        cin: cout,
        h: out[0],
        w: out[1],
        cout: cin,
        kh,
        kw,
        stride: opts.stride,
        pad: opts.padding,
        dil: opts.dilation,
        groups: opts.groups,
        oh: h,
        ow: w,
    };
    let shape = [n, cout, out[0], out[1]];
    record(OP, Kind::Transpose, geom, (x, weight, bias), &shape)
}
