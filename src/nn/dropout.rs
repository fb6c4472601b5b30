//! Dropout whose mask is replayed, not stored: forward draws element `i`'s
//! keep-bit as `rng::dropout_keep(seed, offset, i, p)` from a reserved
//! (seed, offset) range, and backward recomputes the same bits from those
//! two numbers. Under the lean policy dropout keeps no bytes at all for
//! backward; under `SaveAll` it keeps PyTorch's one-byte-per-element mask.

use super::Module;
use crate::autograd::{attach, needs_grad, save_policy, BackwardOp, SavePolicy, SavedTensor};
use crate::memory::scope;
use crate::ops::expect_float;
use crate::primitives::{dropout_apply, dropout_apply_mask, dropout_mask, DropoutDraw};
use crate::rng::Generator;
use crate::{Error, Result, Tensor};

/// Checks `0 <= p <= 1`.
fn check_p(p: f64) -> Result<()> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            op: "dropout",
            msg: format!("drop probability {p} is not in [0, 1]"),
        })
    }
}

/// Backward of dropout: saves only (seed, offset, p) and replays the mask;
/// under `SaveAll`, a U8 mask of one byte per element.
struct DropoutBackward {
    draw: DropoutDraw,
    mask: Option<SavedTensor>,
}

impl BackwardOp for DropoutBackward {
    fn name(&self) -> &'static str {
        "dropout"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let gi = match &self.mask {
            None => dropout_apply(&g, self.draw)?,
            Some(mask) => dropout_apply_mask(&g, mask.get()?, self.draw.scale())?,
        };
        Ok(vec![Some(gi)])
    }
}

/// Dropout with an explicit draw: element `i` (row-major) is kept iff
/// `rng::dropout_keep(seed, offset, i, p)`, and kept elements are scaled by
/// `1/(1-p)`; `p = 1` zeroes everything. Always applies (training
/// behaviour); `p = 0` returns `x` itself and records nothing. Saves nothing
/// for backward (the mask is replayed from (seed, offset)); under `SaveAll`
/// the mask as U8, one byte per element, like PyTorch.
pub fn dropout(x: &Tensor, p: f64, seed: u64, offset: u64) -> Result<Tensor> {
    check_p(p)?;
    expect_float("dropout", x)?;
    if p == 0.0 {
        return Ok(x.clone());
    }
    let draw = DropoutDraw { seed, offset, p };
    let out = dropout_apply(x, draw)?;
    let [needs] = needs_grad([x]);
    if !needs {
        return Ok(out);
    }
    let mask = match save_policy() {
        SavePolicy::Lean => None,
        SavePolicy::SaveAll => {
            let t = dropout_mask(x.shape(), draw, x.device())?;
            Some(SavedTensor::new(&t, "dropout"))
        }
    };
    Ok(attach(out, &[x], DropoutBackward { draw, mask }))
}

/// `torch.nn.Dropout(p)`: in training mode each forward reserves a fresh
/// range of its own Philox [`Generator`] and applies [`dropout`] with it;
/// in evaluation mode (or for `p = 0`) it is the identity and records
/// nothing. Saves no bytes for backward (`SaveAll`: one byte per element).
/// No parameters.
pub struct Dropout {
    p: f64,
    training: bool,
    generator: Generator,
    name: String,
}

impl Dropout {
    /// A dropout layer with drop probability `p` (in `[0, 1]`, else an
    /// error) drawing from a generator seeded with `seed`; starts in
    /// training mode.
    pub fn new(name: &str, p: f64, seed: u64) -> Result<Dropout> {
        check_p(p)?;
        Ok(Dropout {
            p,
            training: true,
            generator: Generator::new(seed),
            name: name.to_string(),
        })
    }

    /// The drop probability.
    pub fn p(&self) -> f64 {
        self.p
    }

    /// Whether the layer is in training mode.
    pub fn is_training(&self) -> bool {
        self.training
    }

    /// The generator the masks are drawn from.
    pub fn generator(&self) -> &Generator {
        &self.generator
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.training || self.p == 0.0 {
            expect_float("dropout", x)?;
            return Ok(x.clone());
        }
        let _s = scope(self.name.clone());
        let (seed, offset) = self.generator.reserve(x.numel() as u64);
        dropout(x, self.p, seed, offset)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}
