//! Rounding to f16/bf16 at near-tie values, on every device: f64 and f32
//! sources round through f32 exactly as PyTorch does (values checked with
//! PyTorch 2.x: `torch.tensor([v], dtype=float32).to(bfloat16)` etc.).

mod cast_runs;
mod cuda_common;

use cast_runs::{cast_run, nan_as_one, values, Mode, MODES, SAME_SIZE_PAIRS};
use leangrad::{DType, Device, Tensor};

/// `(source dtype, value, target dtype, PyTorch's result)`.
const CASES: [(DType, f64, DType, f64); 4] = [
    // An f32 just above the bf16 tie: rounds up (a truncating f64 path
    // would lose the sticky bit and round to even, 1.0).
    (
        DType::F32,
        1.0 + 1.0 / 256.0 + 1.0 / 8_388_608.0,
        DType::BF16,
        1.0078125,
    ),
    // An f64 just above a bf16 tie, below f32's precision: through f32 it
    // is the tie itself, which rounds to even.
    (
        DType::F64,
        1.0 + 1.0 / 256.0 + 1.0 / 1_099_511_627_776.0,
        DType::BF16,
        1.0,
    ),
    // The same for f16 (tie at 2^-11).
    (
        DType::F64,
        1.0 + 1.0 / 2048.0 + 1.0 / 1_099_511_627_776.0,
        DType::F16,
        1.0,
    ),
    // Plain round-to-nearest-even below a tie.
    (DType::F32, 1.0 + 1.0 / 512.0, DType::BF16, 1.0),
];

#[test]
fn half_casts_round_through_f32_like_pytorch() {
    for dev in cuda_common::devices("half casts") {
        for (from, v, to, want) in CASES {
            let x = Tensor::from_f64_slice(&[v, -v], &[2], from, Device::Cpu)
                .unwrap()
                .to_device(dev)
                .unwrap();
            let got = x.to_dtype(to).unwrap().to_f64_vec().unwrap();
            assert_eq!(got, [want, -want], "{from:?} {v} → {to:?} on {dev}");
        }
    }
}

#[test]
fn scalar_constructors_round_the_same_way() {
    for (_, v, to, want) in CASES.iter().filter(|c| c.0 == DType::F64) {
        let t = Tensor::full(&[3], *v, *to, Device::Cpu).unwrap();
        assert_eq!(t.to_f64_vec().unwrap(), [*want; 3], "full({v}) in {to:?}");
    }
}

/// A cast between dtypes of one element size handed its input converts it
/// in place on every device (on CUDA by the in-place cast kernel): the
/// device's `to_dtype` values and gradient bit for bit, and the CPU's (a
/// NaN is a NaN on both, its payload bits may differ), no allocation (one
/// while a clone is held, which keeps its values and dtype), and the
/// device's ledger moves exactly as the CPU's.
#[test]
fn same_size_casts_convert_an_owned_input_in_place_on_every_device() {
    let modes = MODES;
    for (from, to) in SAME_SIZE_PAIRS {
        let v = values(from, 2000);
        let grads: &[bool] = if from.is_float() {
            &[false, true]
        } else {
            &[false]
        };
        for &grad in grads {
            let reference = cast_run(from, to, &v, Device::Cpu, grad, Mode::Borrowed).unwrap();
            for dev in cuda_common::devices("same-size casts in place") {
                let borrowed = cast_run(from, to, &v, dev, grad, Mode::Borrowed).unwrap();
                for mode in modes {
                    let case = format!("{from:?} → {to:?} on {dev}, grad {grad}, {mode:?}");
                    let cpu = cast_run(from, to, &v, Device::Cpu, grad, mode).unwrap();
                    let run = cast_run(from, to, &v, dev, grad, mode).unwrap();
                    assert!(run.values == borrowed.values, "{case}: values");
                    assert!(run.grad == borrowed.grad, "{case}: gradient");
                    let same_as_cpu = |a: &Option<Vec<u64>>, b: &Option<Vec<u64>>| {
                        a.is_some() == b.is_some() && nan_as_one(a) == nan_as_one(b)
                    };
                    assert!(
                        same_as_cpu(&run.values, &reference.values),
                        "{case}: CPU values"
                    );
                    assert!(
                        same_as_cpu(&run.grad, &reference.grad),
                        "{case}: CPU gradient"
                    );
                    assert_eq!(run.requires_grad, reference.requires_grad, "{case}");
                    let in_place = mode == Mode::Owned;
                    assert_eq!(run.ledger[0], u64::from(!in_place), "{case}: allocations");
                    assert_eq!(run.same_storage, in_place, "{case}: storage");
                    assert_eq!(run.ledger, cpu.ledger, "{case}: ledger");
                }
            }
        }
    }
}
