//! Convolutions as fused ops: `conv1d`, `conv2d` and `conv_transpose2d`,
//! with PyTorch's weight layouts, on the im2col + gemm kernels in
//! `cpu::conv`, and one backward struct that saves only what the needed
//! gradients read.
//!
//! What is saved (for every one of the three):
//! - the input, only if the weight needs grad (its gradient reads it);
//! - the weight, only if the input needs grad;
//! - nothing for the bias (its gradient is a sum of the output gradient).
//!
//! Under [`SavePolicy::SaveAll`](crate::autograd::SavePolicy) input and
//! weight are both saved whenever a node is recorded, as PyTorch does.

use crate::autograd::{attach, keep, needs_grad, BackwardOp, SavedTensor};
use crate::ops::expect_float;
use crate::primitives::check_pair;
use crate::primitives::conv::{
    channel_sum, conv2d_forward, conv2d_input_grad, conv2d_weight_grad, ConvGeom,
};
use crate::tensor::Layout;
use crate::{Error, Result, Tensor};

pub use super::conv_options::{Conv1dOptions, Conv2dOptions, ConvTranspose2dOptions};

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
                Kind::Conv => conv2d_input_grad(&g, w, None, geom)?,
                Kind::Transpose => conv2d_forward(&g, w, None, geom)?,
            };
            Some(reshaped(gx, &self.x_shape))
        } else {
            None
        };
        let gw = if self.needs[1] {
            let x = saved(&self.x, self.name)?;
            let gw = match self.kind {
                Kind::Conv => conv2d_weight_grad(&g, x, geom)?,
                Kind::Transpose => conv2d_weight_grad(x, &g, geom)?,
            };
            Some(reshaped(gw, &self.w_shape))
        } else {
            None
        };
        let mut grads = vec![gx, gw];
        if self.has_bias {
            grads.push(if self.needs[2] {
                Some(channel_sum(&g)?)
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
        Kind::Conv => conv2d_forward(x, w, bias, &geom)?,
        Kind::Transpose => conv2d_input_grad(x, w, bias, &geom)?,
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
