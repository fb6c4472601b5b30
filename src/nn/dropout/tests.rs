//! The dropout launch wrappers against the CPU's keep rule and the CPU
//! layer, bit for bit (were `dropout_masks_replay_the_cpu_rule` in
//! `tests/cuda_layers.rs` and `dropout_replays_the_cpu_mask_bit_for_bit` in
//! `tests/cuda_index_random.rs`). Without a GPU each test prints
//! `skipped: no CUDA device (…)` and passes.

use super::cuda::{dropout, dropout_bits, dropout_mask, dropout_masked};
use crate::cuda::testing::*;
use crate::cuda::CudaBuffer;
use crate::primitives::pack_bits;
use crate::rng::dropout_keep;
use crate::DType;

#[test]
fn dropout_masks_replay_the_cpu_rule() {
    let Some(dev) = device("dropout") else {
        return;
    };
    let (seed, offset, p, n) = (7u64, 1234u64, 0.3, 1000usize);
    let bits = dropout_bits(&dev, seed, offset, p, n).unwrap();
    let want = pack_bits(n, |i| dropout_keep(seed, offset, i as u64, p)).unwrap();
    assert_eq!(bits.to_vec::<u32>().unwrap(), want);
    for dtype in FLOATS {
        let x = cpu_rand(&[10, 100], -1.0, 1.0, dtype, 3);
        let gx = upload(&dev, &x);
        let scale = 1.0 / (1.0 - p);
        let fwd = dropout(&gx, &dense(&[10, 100]), seed, offset, p, scale).unwrap();
        let from_bits = dropout_masked(&gx, &dense(&[10, 100]), &bits, scale).unwrap();
        let cpu = crate::nn::dropout(&x, p, seed, offset).unwrap();
        assert_eq!(download(&fwd), vals(&cpu), "dropout {dtype:?}");
        assert_eq!(
            download(&from_bits),
            vals(&cpu),
            "dropout from bits {dtype:?}"
        );
    }
}

#[test]
fn dropout_replays_the_cpu_mask_bit_for_bit() {
    let Some(dev) = device("dropout replay") else {
        return;
    };
    let (p, seed, offset) = (0.3, 1234u64, 96u64);
    for dtype in FLOATS {
        let x = cpu_rand(&[7, 131], -2.0, 2.0, dtype, 25);
        let want = vals(&crate::nn::dropout(&x, p, seed, offset).unwrap());
        let got = dropout(
            &upload(&dev, &x),
            &dense(&[7, 131]),
            seed,
            offset,
            p,
            1.0 / (1.0 - p),
        )
        .unwrap();
        assert_eq!(download(&got), want, "dropout {dtype:?}");
    }
    let mask = dropout_mask(&dev, seed, offset, p, 1000)
        .unwrap()
        .to_vec::<u8>()
        .unwrap();
    let want: Vec<u8> = (0..1000)
        .map(|i| u8::from(dropout_keep(seed, offset, i, p)))
        .collect();
    assert_eq!(mask, want);
    let empty = CudaBuffer::alloc(&dev, DType::F32, 0).unwrap();
    assert!(dropout(&empty, &dense(&[0]), seed, 0, p, 2.0)
        .unwrap()
        .is_empty());
}
