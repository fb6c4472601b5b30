//! torchvision's `pad` (constant, edge, reflect and symmetric borders) and
//! `make_grid` (a batch of images tiled into one, as `save_image` writes a
//! batch).

use super::plan::{f32_bytes, StepPlan};
use crate::memory::host::{checked_count, try_collect, try_filled, try_vec};
use crate::{DType, Error, Result, Tensor};

/// How [`pad`] fills the border (torchvision's `padding_mode`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PaddingMode {
    /// A constant value (torchvision's `fill`).
    Constant(f32),
    /// The edge pixel repeated.
    Edge,
    /// Mirrored without repeating the edge pixel (`[1 2 3] → 3 2 | 1 2 3 | 2 1`).
    Reflect,
    /// Mirrored with the edge pixel repeated (`[1 2 3] → 2 1 | 1 2 3 | 3 2`).
    Symmetric,
}

impl Default for PaddingMode {
    /// Zeros, as torchvision's default `fill=0, padding_mode="constant"`.
    fn default() -> Self {
        PaddingMode::Constant(0.0)
    }
}

impl PaddingMode {
    /// The source index for output index `o` of a padded axis of length `n`
    /// with `lo` added before it, or `None` for a constant fill.
    fn source(self, o: usize, lo: usize, n: usize) -> Option<usize> {
        let i = o as isize - lo as isize;
        let n = n as isize;
        let j = match self {
            PaddingMode::Constant(_) => return (0..n).contains(&i).then_some(i as usize),
            PaddingMode::Edge => i.clamp(0, n - 1),
            PaddingMode::Reflect if i < 0 => -i,
            PaddingMode::Reflect if i >= n => 2 * (n - 1) - i,
            PaddingMode::Symmetric if i < 0 => -i - 1,
            PaddingMode::Symmetric if i >= n => 2 * n - 1 - i,
            _ => i,
        };
        Some(j as usize)
    }

    /// The widest border this mode can add to an axis of length `n`.
    fn max_border(self, n: usize) -> usize {
        match self {
            PaddingMode::Constant(_) => usize::MAX,
            // An empty side has no pixel to repeat or mirror.
            PaddingMode::Edge if n == 0 => 0,
            PaddingMode::Edge => usize::MAX,
            PaddingMode::Reflect => n.saturating_sub(1),
            PaddingMode::Symmetric => n,
        }
    }

    fn fill(self) -> f32 {
        match self {
            PaddingMode::Constant(v) => v,
            _ => 0.0,
        }
    }
}

/// `image` (`[C, H, W]` or `[N, C, H, W]`) with `[left, top, right,
/// bottom]` pixels added around it (torchvision's `pad` with a four-element
/// padding). Reflect borders must be narrower than the image, symmetric ones
/// at most as wide, as in PyTorch; wider is [`Error::InvalidArgument`].
pub fn pad(
    image: &Tensor,
    [left, top, right, bottom]: [usize; 4],
    mode: PaddingMode,
) -> Result<Tensor> {
    let shape = image.shape().to_vec();
    let rank = shape.len();
    if !(3..=4).contains(&rank) {
        return Err(Error::InvalidArgument {
            op: "pad",
            msg: format!("expected a [C, H, W] or [N, C, H, W] image, got shape {shape:?}"),
        });
    }
    let (h, w) = (shape[rank - 2], shape[rank - 1]);
    for (border, n, axis) in [
        (top, h, "top"),
        (bottom, h, "bottom"),
        (left, w, "left"),
        (right, w, "right"),
    ] {
        if border > mode.max_border(n) {
            return Err(Error::InvalidArgument {
                op: "pad",
                msg: format!("a {axis} border of {border} is too wide for {mode:?} padding of a side of {n} pixels"),
            });
        }
    }
    let too_large = || Error::InvalidArgument {
        op: "pad",
        msg: format!("borders [{left}, {top}, {right}, {bottom}] around a {h}×{w} image overflow"),
    };
    let height = [top, bottom]
        .iter()
        .try_fold(h, |n, &b| n.checked_add(b))
        .ok_or_else(too_large)?;
    let width = [left, right]
        .iter()
        .try_fold(w, |n, &b| n.checked_add(b))
        .ok_or_else(too_large)?;
    let planes = checked_count(&shape[..rank - 2])?;
    let mut out = try_vec(checked_count(&[planes, height, width])?)?;
    let rows: Vec<Option<usize>> =
        try_collect(height, (0..height).map(|o| mode.source(o, top, h)))?;
    let cols: Vec<Option<usize>> = try_collect(width, (0..width).map(|o| mode.source(o, left, w)))?;
    let src = image.to_dtype(DType::F32)?.to_vec::<f32>()?;
    for p in 0..planes {
        let plane = &src[p * h * w..][..h * w];
        for row in &rows {
            out.extend(cols.iter().map(|col| match (row, col) {
                (Some(y), Some(x)) => plane[y * w + x],
                _ => mode.fill(),
            }));
        }
    }
    let mut padded = shape;
    padded[rank - 2] = height;
    padded[rank - 1] = width;
    Tensor::from_vec(out, &padded, image.device())?.to_dtype(image.dtype())
}

/// What [`pad`] makes of an f32 image of `shape` (rank 3 or 4) and the
/// most host bytes it holds at once: the input, its copy, the row and
/// column maps and the padded image (saturating).
pub(crate) fn pad_plan(shape: &[usize], [left, top, right, bottom]: [usize; 4]) -> StepPlan {
    let rank = shape.len();
    let height = shape[rank - 2].saturating_add(top).saturating_add(bottom);
    let width = shape[rank - 1].saturating_add(left).saturating_add(right);
    let mut padded = shape.to_vec();
    padded[rank - 2] = height;
    padded[rank - 1] = width;
    let maps = height.saturating_add(width).saturating_mul(16);
    let bytes = f32_bytes(shape)
        .saturating_mul(2)
        .saturating_add(maps)
        .saturating_add(f32_bytes(&padded));
    StepPlan {
        shape: padded,
        bytes,
    }
}

/// The images of `batch` (`[N, C, H, W]`) tiled `nrow` to a row with
/// `padding` pixels of `pad_value` between and around them, as
/// torchvision's `make_grid`: a `[3, …]` (or `[C, …]` for C ≠ 1) image;
/// one-channel images are repeated to three channels; a batch of one is
/// returned as that image, without padding.
pub fn make_grid(batch: &Tensor, nrow: usize, padding: usize, pad_value: f32) -> Result<Tensor> {
    let bad = |msg: String| {
        Err(Error::InvalidArgument {
            op: "make_grid",
            msg,
        })
    };
    let &[n, c, h, w] = batch.shape() else {
        return bad(format!(
            "expected a batch [N, C, H, W], got shape {:?}",
            batch.shape()
        ));
    };
    if nrow == 0 || n == 0 {
        return bad(format!(
            "needs at least one image and nrow ≥ 1, got {n} images and nrow {nrow}"
        ));
    }
    let batch = if c == 1 {
        Tensor::cat(&[batch, batch, batch], 1)?
    } else {
        batch.clone()
    };
    let c = batch.shape()[1];
    if n == 1 {
        return batch.squeeze(0);
    }
    let (columns, rows) = (nrow.min(n), n.div_ceil(nrow.min(n)));
    // cell · count + padding, checked: `padding` is an argument.
    let side = |size: usize, count: usize| {
        size.checked_add(padding)
            .and_then(|cell| cell.checked_mul(count))
            .and_then(|s| s.checked_add(padding))
            .map(|s| (size + padding, s))
    };
    let (Some((cell_h, height)), Some((cell_w, width))) = (side(h, rows), side(w, columns)) else {
        return bad(format!(
            "a grid of {rows}×{columns} images of {h}×{w} with padding {padding} overflows"
        ));
    };
    let mut out = try_filled(checked_count(&[c, height, width])?, pad_value)?;
    let src = batch.to_dtype(DType::F32)?.to_vec::<f32>()?;
    for k in 0..n {
        let (top, left) = (
            (k / columns) * cell_h + padding,
            (k % columns) * cell_w + padding,
        );
        for ch in 0..c {
            for y in 0..h {
                let from = &src[((k * c + ch) * h + y) * w..][..w];
                out[(ch * height + top + y) * width + left..][..w].copy_from_slice(from);
            }
        }
    }
    Tensor::from_vec(out, &[c, height, width], batch.device())?.to_dtype(batch.dtype())
}
