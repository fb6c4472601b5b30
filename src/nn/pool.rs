//! 2-d pooling layers over `[N, C, H, W]` (or `[C, H, W]`) inputs:
//! max pooling, average pooling and adaptive average pooling, each a fused
//! op with its own backward.
//!
//! Saved for backward (only when the input needs grad):
//! - max pooling: the argmax's position inside its window, one byte per
//!   output element (U8); under `SaveAll`, PyTorch's input and i64 flat
//!   in-plane indices instead.
//! - average pooling (fixed and adaptive): nothing but shapes; under
//!   `SaveAll`, the input, as PyTorch keeps it.

use super::Module;
use crate::autograd::{attach, keep, needs_grad, save_policy, BackwardOp, SavePolicy, SavedTensor};
use crate::memory::scope;
use crate::meta::{backend, Backend};
use crate::ops::expect_float;
use crate::primitives::{
    avg_pool_backward, avg_pool_forward, max_pool_backward, max_pool_backward_cuda,
    max_pool_forward, window_to_flat, ArgSource, AvgMode, PoolGeom,
};
use crate::tensor::Layout;
use crate::{Error, Result, Tensor};

/// Settings of [`max_pool2d`]: `kernel`, `stride` (default: the kernel),
/// zero `padding` (at most half the effective kernel), `dilation` and
/// `ceil_mode` as in `torch.nn.MaxPool2d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxPool2dOptions {
    /// Window size (rows, columns).
    pub kernel: [usize; 2],
    /// Step between windows; `None` means the kernel size.
    pub stride: Option<[usize; 2]>,
    /// Implicit -inf padding on each side.
    pub padding: [usize; 2],
    /// Spacing between window elements.
    pub dilation: [usize; 2],
    /// Rounds the output size up instead of down.
    pub ceil_mode: bool,
}

impl MaxPool2dOptions {
    /// A `kernel` window with stride = kernel, no padding, dilation 1.
    pub fn new(kernel: [usize; 2]) -> Self {
        MaxPool2dOptions {
            kernel,
            stride: None,
            padding: [0, 0],
            dilation: [1, 1],
            ceil_mode: false,
        }
    }
}

/// Settings of [`avg_pool2d`]: `kernel`, `stride` (default: the kernel),
/// zero `padding` (at most half the kernel), and whether padded elements
/// count toward the divisor, as in `torch.nn.AvgPool2d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvgPool2dOptions {
    /// Window size (rows, columns).
    pub kernel: [usize; 2],
    /// Step between windows; `None` means the kernel size.
    pub stride: Option<[usize; 2]>,
    /// Implicit zero padding on each side.
    pub padding: [usize; 2],
    /// Divide by the whole window (padding included) rather than by the
    /// number of input elements in it.
    pub count_include_pad: bool,
}

impl AvgPool2dOptions {
    /// A `kernel` window with stride = kernel, no padding, counting padding.
    pub fn new(kernel: [usize; 2]) -> Self {
        AvgPool2dOptions {
            kernel,
            stride: None,
            padding: [0, 0],
            count_include_pad: true,
        }
    }
}

fn invalid(op: &'static str, msg: String) -> Error {
    Error::InvalidArgument { op, msg }
}

/// Checks the input is a float `[N, C, H, W]` or `[C, H, W]` tensor and
/// returns (planes, H, W).
fn plane_dims(op: &'static str, x: &Tensor) -> Result<(usize, usize, usize)> {
    expect_float(op, x)?;
    if !(3..=4).contains(&x.rank()) {
        return Err(invalid(
            op,
            format!(
                "expected a [N, C, H, W] or [C, H, W] input, got {:?}",
                x.shape()
            ),
        ));
    }
    let s = x.shape();
    let r = s.len();
    Ok((s[..r - 2].iter().product(), s[r - 2], s[r - 1]))
}

/// PyTorch's pooling output length for one axis.
fn out_len(
    op: &'static str,
    len: usize,
    k: usize,
    s: usize,
    p: usize,
    d: usize,
    ceil: bool,
) -> Result<usize> {
    if k == 0 || s == 0 || d == 0 {
        return Err(invalid(
            op,
            "kernel, stride and dilation must be positive".into(),
        ));
    }
    let eff = d * (k - 1) + 1;
    if 2 * p > eff {
        return Err(invalid(
            op,
            format!("padding {p} is more than half the kernel extent {eff}"),
        ));
    }
    let span = (len + 2 * p).checked_sub(eff).ok_or_else(|| {
        invalid(
            op,
            format!(
                "kernel extent {eff} exceeds the padded input {}",
                len + 2 * p
            ),
        )
    })?;
    let mut out = if ceil { span.div_ceil(s) } else { span / s } + 1;
    // The last window must start inside the input or the left padding.
    if ceil && (out - 1) * s >= len + p {
        out -= 1;
    }
    Ok(out)
}

/// The output shape: the input's with the last two dims replaced.
fn out_shape(x: &Tensor, g: &PoolGeom) -> Vec<usize> {
    let mut shape = x.shape().to_vec();
    let r = shape.len();
    shape[r - 2] = g.oh;
    shape[r - 1] = g.ow;
    shape
}

/// What max pooling keeps for backward.
enum MaxSaved {
    /// Lean: the argmax's position inside its window (U8).
    Window(SavedTensor),
    /// SaveAll: the input and i64 flat in-plane indices, as PyTorch.
    Flat {
        input: SavedTensor,
        indices: SavedTensor,
    },
}

/// Backward of max pooling.
struct MaxPoolBackward {
    geom: PoolGeom,
    input_shape: Vec<usize>,
    saved: MaxSaved,
}

impl BackwardOp for MaxPoolBackward {
    fn name(&self) -> &'static str {
        "max_pool2d"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let (t, flat) = match &self.saved {
            MaxSaved::Window(t) => (t.get()?, false),
            MaxSaved::Flat { input, indices } => {
                // Kept like PyTorch; checked for modification, not read.
                input.get()?;
                (indices.get()?, true)
            }
        };
        match backend("max_pool2d", &[&g, t])? {
            // Meta: no positions to read; the kernel gives the shape.
            Backend::Meta => {
                let gi = max_pool_backward(&g, ArgSource::Window(&[]), &self.geom)?;
                return Ok(vec![Some(
                    gi.view_with_layout(Layout::contiguous(&self.input_shape)),
                )]);
            }
            // The U8 positions (lean) or the I64 flat indices (SaveAll)
            // are read on the device.
            Backend::Cuda(_) => {
                let gi = max_pool_backward_cuda(&g, t, &self.geom)?;
                return Ok(vec![Some(
                    gi.view_with_layout(Layout::contiguous(&self.input_shape)),
                )]);
            }
            Backend::Cpu => {}
        }
        let data = t.storage().cpu()?;
        let n_out = self.geom.planes * self.geom.oh * self.geom.ow;
        let arg = match (flat, data.as_slice::<i64>(), data.as_slice::<u8>()) {
            (true, Some(idx), _) if idx.len() >= n_out => ArgSource::Flat(idx),
            (false, _, Some(pos)) if pos.len() >= n_out => ArgSource::Window(pos),
            _ => {
                return Err(Error::Backward(
                    "max_pool2d: saved indices do not match".into(),
                ))
            }
        };
        let gi = max_pool_backward(&g, arg, &self.geom)?;
        drop(data);
        Ok(vec![Some(
            gi.view_with_layout(Layout::contiguous(&self.input_shape)),
        )])
    }
}

/// 2-d max pooling (see [`MaxPool2dOptions`]); a NaN counts as the maximum
/// and the gradient goes to the first maximum of each window. Windows are
/// limited to 256 positions. Saves, when the input needs grad, one byte per
/// output element (the argmax's position inside its window); under
/// `SaveAll` the input and i64 flat indices, as PyTorch.
pub fn max_pool2d(x: &Tensor, o: &MaxPool2dOptions) -> Result<Tensor> {
    const OP: &str = "max_pool2d";
    let (planes, h, w) = plane_dims(OP, x)?;
    if o.kernel[0] * o.kernel[1] > 256 {
        return Err(invalid(
            OP,
            format!("a {:?} window has more than 256 positions", o.kernel),
        ));
    }
    let s = o.stride.unwrap_or(o.kernel);
    let geom = PoolGeom {
        planes,
        h,
        w,
        oh: out_len(
            OP,
            h,
            o.kernel[0],
            s[0],
            o.padding[0],
            o.dilation[0],
            o.ceil_mode,
        )?,
        ow: out_len(
            OP,
            w,
            o.kernel[1],
            s[1],
            o.padding[1],
            o.dilation[1],
            o.ceil_mode,
        )?,
        k: o.kernel,
        s,
        p: o.padding,
        d: o.dilation,
    };
    let (out, pos) = max_pool_forward(x, &geom)?;
    let shape = out_shape(x, &geom);
    let out = out.view_with_layout(Layout::contiguous(&shape));
    let [needs] = needs_grad([x]);
    if !needs {
        return Ok(out);
    }
    let saved = match save_policy() {
        SavePolicy::Lean => {
            MaxSaved::Window(SavedTensor::new(&pos.into_tensor(&shape, x.device())?, OP))
        }
        SavePolicy::SaveAll => {
            let flat = window_to_flat(&pos.into_host()?, &geom);
            MaxSaved::Flat {
                input: SavedTensor::new(x, OP),
                indices: SavedTensor::new(&Tensor::from_host_vec(flat, &shape, x.device())?, OP),
            }
        }
    };
    let op = MaxPoolBackward {
        geom,
        input_shape: x.shape().to_vec(),
        saved,
    };
    Ok(attach(out, &[x], op))
}

/// Backward of average pooling: saves only shapes (under `SaveAll`, the
/// input, unused, as PyTorch keeps it).
struct AvgPoolBackward {
    name: &'static str,
    geom: PoolGeom,
    mode: AvgMode,
    input_shape: Vec<usize>,
    input: Option<SavedTensor>,
}

impl BackwardOp for AvgPoolBackward {
    fn name(&self) -> &'static str {
        self.name
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        if let Some(x) = &self.input {
            x.get()?;
        }
        let gi = avg_pool_backward(&g, &self.geom, self.mode)?;
        Ok(vec![Some(
            gi.view_with_layout(Layout::contiguous(&self.input_shape)),
        )])
    }
}

fn avg_common(op: &'static str, x: &Tensor, geom: PoolGeom, mode: AvgMode) -> Result<Tensor> {
    let out = avg_pool_forward(x, &geom, mode)?;
    let out = out.view_with_layout(Layout::contiguous(&out_shape(x, &geom)));
    let [needs] = needs_grad([x]);
    if !needs {
        return Ok(out);
    }
    let op = AvgPoolBackward {
        name: op,
        geom,
        mode,
        input_shape: x.shape().to_vec(),
        input: keep(false).then(|| SavedTensor::new(x, op)),
    };
    Ok(attach(out, &[x], op))
}

/// 2-d average pooling (see [`AvgPool2dOptions`]). Sums in f64. Saves
/// nothing but shapes for backward (the input under `SaveAll`).
pub fn avg_pool2d(x: &Tensor, o: &AvgPool2dOptions) -> Result<Tensor> {
    const OP: &str = "avg_pool2d";
    let (planes, h, w) = plane_dims(OP, x)?;
    let s = o.stride.unwrap_or(o.kernel);
    let geom = PoolGeom {
        planes,
        h,
        w,
        oh: out_len(OP, h, o.kernel[0], s[0], o.padding[0], 1, false)?,
        ow: out_len(OP, w, o.kernel[1], s[1], o.padding[1], 1, false)?,
        k: o.kernel,
        s,
        p: o.padding,
        d: [1, 1],
    };
    let mode = AvgMode::Fixed {
        count_include_pad: o.count_include_pad,
    };
    avg_common(OP, x, geom, mode)
}

/// Adaptive 2-d average pooling to `output` = (rows, columns): output
/// `(i, j)` averages input rows `floor(i·H/oh)..ceil((i+1)·H/oh)` and the
/// same for columns. Saves nothing but shapes (the input under `SaveAll`).
pub fn adaptive_avg_pool2d(x: &Tensor, output: [usize; 2]) -> Result<Tensor> {
    const OP: &str = "adaptive_avg_pool2d";
    let (planes, h, w) = plane_dims(OP, x)?;
    if output.contains(&0) || h == 0 || w == 0 {
        return Err(invalid(
            OP,
            format!("output {output:?} from input {:?}", x.shape()),
        ));
    }
    let geom = PoolGeom {
        planes,
        h,
        w,
        oh: output[0],
        ow: output[1],
        k: [1, 1],
        s: [1, 1],
        p: [0, 0],
        d: [1, 1],
    };
    avg_common(OP, x, geom, AvgMode::Adaptive)
}

macro_rules! pool_module {
    ($(#[$m:meta])* $name:ident, $opts:ty, |$x:ident, $o:ident| $call:expr) => {
        $(#[$m])*
        pub struct $name {
            /// The pooling settings.
            pub options: $opts,
            name: String,
        }

        impl $name {
            /// The layer named `name` (its scope in memory reports).
            pub fn new(name: &str, options: $opts) -> Self {
                $name {
                    options,
                    name: name.to_string(),
                }
            }
        }

        impl Module for $name {
            fn forward(&self, $x: &Tensor) -> Result<Tensor> {
                let _s = scope(self.name.clone());
                let $o = &self.options;
                $call
            }

            fn named_parameters(&self) -> Vec<(String, Tensor)> {
                Vec::new()
            }
        }
    };
}

pool_module!(
    /// `torch.nn.MaxPool2d`: see [`max_pool2d`]; saves one byte per output
    /// element when the input needs grad. No parameters.
    MaxPool2d, MaxPool2dOptions, |x, o| max_pool2d(x, o)
);
pool_module!(
    /// `torch.nn.AvgPool2d`: see [`avg_pool2d`]; saves nothing. No parameters.
    AvgPool2d, AvgPool2dOptions, |x, o| avg_pool2d(x, o)
);
pool_module!(
    /// `torch.nn.AdaptiveAvgPool2d` with output size `options` (rows,
    /// columns): see [`adaptive_avg_pool2d`]; saves nothing. No parameters.
    AdaptiveAvgPool2d, [usize; 2], |x, o| adaptive_avg_pool2d(x, *o)
);
