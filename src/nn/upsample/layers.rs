//! The `Upsample` module: `torch.nn.Upsample(size | scale_factor,
//! mode="bilinear", align_corners)`. No parameters.

use super::{interpolate_bilinear, interpolate_bilinear_scale};
use crate::memory::scope;
use crate::nn::Module;
use crate::{Result, Tensor};

/// What an [`Upsample`] resizes to: a fixed output size or a scale factor
/// per axis (`torch.nn.Upsample`'s `size` or `scale_factor`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UpsampleSize {
    /// The output's `[height, width]`.
    Size([usize; 2]),
    /// The factors (rows, columns): the output is `⌊H·sh⌋ × ⌊W·sw⌋`, and the
    /// source index uses `1/factor` as PyTorch does.
    ScaleFactor([f64; 2]),
}

/// `torch.nn.Upsample(..., mode="bilinear", align_corners=...)`: see
/// [`interpolate_bilinear`] and [`interpolate_bilinear_scale`]. Saves
/// nothing for backward. No parameters.
#[derive(Clone, Debug)]
pub struct Upsample {
    /// The output size or scale factor.
    pub size: UpsampleSize,
    /// PyTorch's `align_corners` (its `Upsample` default, `None`, is
    /// `false` for bilinear).
    pub align_corners: bool,
    name: String,
}

impl Upsample {
    /// The layer named `name` (its scope in memory reports).
    pub fn new(name: &str, size: UpsampleSize, align_corners: bool) -> Self {
        Upsample {
            size,
            align_corners,
            name: name.to_string(),
        }
    }
}

impl Module for Upsample {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        match self.size {
            UpsampleSize::Size(s) => interpolate_bilinear(x, s, self.align_corners),
            UpsampleSize::ScaleFactor(f) => interpolate_bilinear_scale(x, f, self.align_corners),
        }
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}
