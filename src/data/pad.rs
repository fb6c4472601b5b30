//! torchvision's `pad` (constant, edge, reflect and symmetric borders) and
//! `make_grid` (a batch of images tiled into one, as `save_image` writes a
//! batch).

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
    let (height, width) = (h + top + bottom, w + left + right);
    let rows: Vec<Option<usize>> = (0..height).map(|o| mode.source(o, top, h)).collect();
    let cols: Vec<Option<usize>> = (0..width).map(|o| mode.source(o, left, w)).collect();
    let planes: usize = shape[..rank - 2].iter().product();
    let src = image.to_dtype(DType::F32)?.to_vec::<f32>()?;
    let mut out = Vec::with_capacity(planes * height * width);
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
    let (cell_h, cell_w) = (h + padding, w + padding);
    let (height, width) = (cell_h * rows + padding, cell_w * columns + padding);
    let src = batch.to_dtype(DType::F32)?.to_vec::<f32>()?;
    let mut out = vec![pad_value; c * height * width];
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
