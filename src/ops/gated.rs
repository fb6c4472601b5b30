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
mod tests {
    use crate::autograd::{backward_with, with_save_policy, CollectGrads, SavePolicy};
    use crate::cuda::testing::{assert_close, cpu_rand, device, tol, vals, FLOATS};
    use crate::memory::{Category, Ledger};
    use crate::{Device, Error, Tensor};

    /// Values and both gradients of `f(gate, up)` against `g`.
    fn run(
        f: impl Fn(&Tensor, &Tensor) -> Tensor,
        (gate, up, g): (&Tensor, &Tensor, &Tensor),
        needs: [bool; 2],
    ) -> (Vec<f64>, Vec<Option<Vec<f64>>>) {
        let a = gate.detach().set_requires_grad(needs[0]).unwrap();
        let b = up.detach().set_requires_grad(needs[1]).unwrap();
        let y = f(&a, &b);
        let out = vals(&y);
        backward_with(&y, Some(g.clone()), &mut CollectGrads).unwrap();
        let grads = [a, b].iter().map(|t| t.grad().map(|g| vals(&g))).collect();
        (out, grads)
    }

    #[test]
    fn equals_the_composition_bit_for_bit_and_saves_two_tensors_at_most() {
        for dtype in FLOATS {
            let gate = cpu_rand(&[3, 70], -6.0, 6.0, dtype, 1);
            let up = cpu_rand(&[3, 70], -2.0, 2.0, dtype, 2);
            let g = cpu_rand(&[3, 70], -1.0, 1.0, dtype, 3);
            for needs in [[true, true], [true, false], [false, true]] {
                let fused = run(|a, b| a.silu_mul(b).unwrap(), (&gate, &up, &g), needs);
                let composed = run(
                    |a, b| a.silu().unwrap().mul(b).unwrap(),
                    (&gate, &up, &g),
                    needs,
                );
                assert_eq!(fused, composed, "{dtype:?} {needs:?}");
            }
        }
        // Saved bytes: gate and up (lean), gate alone when only up learns,
        // and what PyTorch keeps under SaveAll.
        let n = 3 * 70 * 4;
        for (policy, needs, want) in [
            (SavePolicy::Lean, [true, true], 2 * n),
            (SavePolicy::Lean, [false, true], n),
            (SavePolicy::SaveAll, [true, true], 3 * n),
        ] {
            let ledger = Ledger::new();
            let _l = ledger.enter();
            let _p = with_save_policy(policy);
            let gate = cpu_rand(&[3, 70], -6.0, 6.0, crate::DType::F32, 1)
                .set_requires_grad(needs[0])
                .unwrap();
            let up = cpu_rand(&[3, 70], -2.0, 2.0, crate::DType::F32, 2)
                .set_requires_grad(needs[1])
                .unwrap();
            let before = ledger.live_in(Device::Cpu, Category::Saved);
            let _y = gate.silu_mul(&up).unwrap();
            let saved = ledger.live_in(Device::Cpu, Category::Saved) - before;
            assert_eq!(saved, want, "{policy:?} {needs:?}");
        }
    }

    #[test]
    fn mismatched_operands_are_refused() {
        let a = Tensor::zeros(&[2, 3], crate::DType::F32, Device::Cpu).unwrap();
        let b = Tensor::zeros(&[3, 2], crate::DType::F32, Device::Cpu).unwrap();
        let c = Tensor::zeros(&[2, 3], crate::DType::F64, Device::Cpu).unwrap();
        assert!(matches!(a.silu_mul(&b), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(a.silu_mul(&c), Err(Error::DTypeMismatch { .. })));
    }

    #[test]
    fn cuda_gives_the_cpus_values() {
        let Some(_dev) = device("silu_mul") else {
            return;
        };
        let cuda = Device::Cuda(0);
        for dtype in FLOATS {
            let gate = cpu_rand(&[5, 33], -6.0, 6.0, dtype, 4);
            let up = cpu_rand(&[5, 33], -2.0, 2.0, dtype, 5);
            let g = cpu_rand(&[5, 33], -1.0, 1.0, dtype, 6);
            let f = |a: &Tensor, b: &Tensor| a.silu_mul(b).unwrap();
            let want = run(f, (&gate, &up, &g), [true, true]);
            let on = |t: &Tensor| t.to_device(cuda).unwrap();
            let a = on(&gate).set_requires_grad(true).unwrap();
            let b = on(&up).set_requires_grad(true).unwrap();
            let y = a.silu_mul(&b).unwrap();
            backward_with(&y, Some(on(&g)), &mut CollectGrads).unwrap();
            // SiLU's exponential is the device's own (as the unary op's
            // device tests): the same values within its rounding.
            let back = |t: &Tensor| vals(&t.to_device(Device::Cpu).unwrap());
            let t = tol(dtype);
            assert_close(&format!("{dtype:?} out"), &back(&y), &want.0, t);
            for (i, x) in [a, b].iter().enumerate() {
                let w = want.1[i].as_ref().unwrap();
                assert_close(
                    &format!("{dtype:?} grad {i}"),
                    &back(&x.grad().unwrap()),
                    w,
                    t,
                );
            }
        }
    }
}
