//! The gated linear unit of Llama/Mistral MLPs, `silu(gate) · up`
//! (SwiGLU), as one op. PyTorch's composition keeps three tensors of the
//! MLP's width for backward (`gate` for SiLU, `silu(gate)` and `up` for the
//! product); this op keeps `gate` and, when the gate needs a gradient,
//! `up`, and recomputes `silu(gate)` in backward, where `up`'s gradient
//! needs it: one tensor of the MLP's width fewer per layer, with the same
//! values and gradients as the composition, bit for bit.

use super::binary::MulK;
use super::unary::{SiluB, SiluK};
use crate::autograd::{attach, needs_grad, save_policy, BackwardOp, SavePolicy, SavedTensor};
use crate::primitives::{binary_assign, binary_map, unary_map};
use crate::{Error, Result, Tensor};

const OP: &str = "silu_mul";

/// Backward of [`Tensor::silu_mul`]: `dgate = silu'(gate)·(g·up)`, `dup =
/// g·silu(gate)`.
struct SiluMulBackward {
    gate: SavedTensor,
    /// Kept only when the gate needs a gradient.
    up: Option<SavedTensor>,
    needs: [bool; 2],
    /// `SaveAll` only: `silu(gate)`, held as PyTorch's product keeps it.
    _held: Option<SavedTensor>,
}

impl BackwardOp for SiluMulBackward {
    fn name(&self) -> &'static str {
        OP
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let gate = self.gate.get()?;
        let [ng, nu] = self.needs;
        let dgate = match &self.up {
            Some(up) if ng => {
                // As PyTorch's: the product's gradient `g·up`, then SiLU's
                // backward of it (written over it).
                let t = binary_map(&g, up.get()?, &MulK)?;
                binary_assign(&t, gate, &SiluB)?;
                Some(t)
            }
            _ => None,
        };
        let dup = if nu {
            let s = unary_map(gate, &SiluK)?;
            binary_assign(&s, &g, &MulK)?;
            Some(s)
        } else {
            None
        };
        Ok(vec![dgate, dup])
    }
}

impl Tensor {
    /// `silu(self) · up` for a gate and an up projection of one shape,
    /// dtype and device (the MLP of Llama and Mistral: `down_proj(silu(
    /// gate_proj(x)) · up_proj(x))`), in one pass over a new buffer. Saves
    /// `self` (the gate) when either input needs grad and `up` when the
    /// gate does; never `silu(self)` (under `SavePolicy::SaveAll` also
    /// `silu(self)`, as PyTorch's composition keeps it).
    pub fn silu_mul(&self, up: &Tensor) -> Result<Tensor> {
        if self.shape() != up.shape() {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: self.shape().to_vec(),
                rhs: up.shape().to_vec(),
            });
        }
        if self.dtype() != up.dtype() {
            return Err(Error::DTypeMismatch {
                op: OP,
                expected: self.dtype(),
                got: up.dtype(),
            });
        }
        let needs = needs_grad([self, up]);
        let save_all = save_policy() == SavePolicy::SaveAll && needs.contains(&true);
        let out = unary_map(self, &SiluK)?;
        if save_all {
            let product = binary_map(&out, up, &MulK)?;
            let held = SavedTensor::new(&out, OP);
            return Ok(finish(product, (self, up), needs, Some(held)));
        }
        binary_assign(&out, up, &MulK)?;
        Ok(finish(out, (self, up), needs, None))
    }
}

/// Attaches [`SiluMulBackward`] to `out` where an input needs grad.
fn finish(
    out: Tensor,
    (gate, up): (&Tensor, &Tensor),
    needs: [bool; 2],
    held: Option<SavedTensor>,
) -> Tensor {
    if !needs.contains(&true) {
        return out;
    }
    let op = SiluMulBackward {
        gate: SavedTensor::new(gate, OP),
        up: needs[0].then(|| SavedTensor::new(up, OP)),
        needs,
        _held: held,
    };
    attach(out, &[gate, up], op)
}

#[cfg(test)]
mod tests;
