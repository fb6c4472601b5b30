//! Rounding to f16/bf16 at near-tie values, on every device: f64 and f32
//! sources round through f32 exactly as PyTorch does (values checked with
//! PyTorch 2.x: `torch.tensor([v], dtype=float32).to(bfloat16)` etc.).

mod cuda_common;

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
