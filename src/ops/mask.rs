//! Masks kept for backward by relu-like ops.

use crate::autograd::{save_policy, SavePolicy, SavedTensor};
use crate::cpu::{mask_scale, mask_where};
use crate::{Result, Tensor};

/// Which elements pass the gradient.
#[derive(Clone, Copy, Debug)]
pub(crate) enum MaskRule {
    /// `x > 0` (relu, leaky_relu).
    Positive,
    /// `lo <= x <= hi` (clamp).
    Within(f64, f64),
}

impl MaskRule {
    fn test(self, v: f64) -> bool {
        match self {
            MaskRule::Positive => v > 0.0,
            MaskRule::Within(lo, hi) => v >= lo && v <= hi,
        }
    }
}

/// A mask kept for backward: 1-bit packed under the lean policy (⌈n/32⌉
/// u32 words); under `SaveAll` the float tensor it is computed from, as
/// PyTorch keeps it. Both give bit-identical gradients.
pub(crate) enum SavedMask {
    Packed(SavedTensor),
    FromFloat(SavedTensor, MaskRule),
}

impl SavedMask {
    /// Keeps the mask of `rule` over `source` for `op`.
    pub(crate) fn new(source: &Tensor, rule: MaskRule, op: &'static str) -> Result<SavedMask> {
        Ok(match save_policy() {
            SavePolicy::Lean => {
                let bits = mask_where(source, op, move |v| rule.test(v))?;
                SavedMask::Packed(SavedTensor::new(&bits, op))
            }
            SavePolicy::SaveAll => SavedMask::FromFloat(SavedTensor::new(source, op), rule),
        })
    }

    /// `g` where the mask is set, `g · slope` elsewhere.
    pub(crate) fn apply(&self, g: &Tensor, slope: f64) -> Result<Tensor> {
        match self {
            SavedMask::Packed(bits) => mask_scale(g, bits.get()?, slope),
            SavedMask::FromFloat(source, rule) => {
                let rule = *rule;
                let bits = mask_where(source.get()?, "mask", move |v| rule.test(v))?;
                mask_scale(g, &bits, slope)
            }
        }
    }
}
