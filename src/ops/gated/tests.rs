//! `silu_mul` against PyTorch's composition (`silu(gate)·up`) bit for bit
//! in every float dtype with its saved bytes under both policies, its
//! errors, and, with a GPU (or the simulated one), CUDA against the CPU.

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
