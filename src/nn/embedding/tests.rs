//! The embedding launch wrappers against the CPU layer, bit for bit, with
//! the indices read on the device (I64 and U32, repeated rows, padding,
//! more positions than the sort's block has threads), and the index check
//! reported by the next read. Without a GPU the tests print
//! `skipped: no CUDA device (…)` and pass.

use super::cuda::{embedding_backward_add, embedding_forward, embedding_sort_keys};
use crate::cuda::testing::*;
use crate::cuda::CudaBuffer;
use crate::{DType, Device, Error, Tensor};

/// `n` indices below `num` with many repeats (a cheap mixing sequence).
fn repeated_indices(n: usize, num: usize) -> Vec<usize> {
    (0..n).map(|k| (k * 7 + k * k % 13) % num).collect()
}

fn check_against_cpu(idx: &[usize], num: usize, dim: usize, padding: Option<usize>) {
    let Some(dev) = device("embedding") else {
        return;
    };
    let it = Tensor::from_vec(
        idx.iter().map(|&i| i as i64).collect(),
        &[idx.len()],
        Device::Cpu,
    )
    .unwrap();
    let i64s: Vec<i64> = idx.iter().map(|&i| i as i64).collect();
    let u32s: Vec<u32> = idx.iter().map(|&i| i as u32).collect();
    let on_device = [
        CudaBuffer::from_slice(&dev, &i64s).unwrap(),
        CudaBuffer::from_slice(&dev, &u32s).unwrap(),
    ];
    for dtype in FLOATS {
        let w = cpu_rand(&[num, dim], -1.0, 1.0, dtype, 22);
        let wl = w.clone().set_requires_grad(true).unwrap();
        let yc = crate::nn::embedding(&wl, &it, padding.map(|p| p as i64)).unwrap();
        let gy = cpu_rand(yc.shape(), -1.0, 1.0, dtype, 23);
        // The CPU's gradient of sum(y · gy).
        yc.mul(&gy).unwrap().sum_all().unwrap().backward().unwrap();
        let grad = wl.grad().unwrap();
        let want = vals(&grad);
        let pending = cpu_rand(&[num, dim], -1.0, 1.0, dtype, 24);
        let want_added = vals(&pending.add(&grad).unwrap());
        for d_idx in &on_device {
            let what = format!("{dtype:?} {:?} {} indices", d_idx.dtype(), idx.len());
            let y = embedding_forward(&upload(&dev, &w), num, dim, d_idx).unwrap();
            assert_eq!(download(&y), vals(&yc), "embedding {what}");
            let keys = embedding_sort_keys(d_idx, num, padding).unwrap();
            let gy_d = upload(&dev, &gy);
            let mut dw = CudaBuffer::zeros(&dev, dtype, num * dim).unwrap();
            embedding_backward_add(&mut dw, &gy_d, &keys, dim).unwrap();
            assert_eq!(download(&dw), want, "embedding bwd {what}");
            // Into a pending gradient (a tied weight's): pending + the sum.
            let mut into = upload(&dev, &pending);
            embedding_backward_add(&mut into, &gy_d, &keys, dim).unwrap();
            assert_eq!(download(&into), want_added, "embedding bwd into {what}");
        }
    }
}

#[test]
fn embedding_matches_the_cpu_bit_for_bit() {
    check_against_cpu(&[3, 1, 3, 0, 5, 3, 1, 2], 6, 5, Some(1));
}

#[test]
fn embedding_sorts_more_positions_than_one_block_has_threads() {
    // 2,500 positions (padded to 4,096 keys) over 37 rows, most repeated
    // many times, and 1,025 positions all of one row.
    check_against_cpu(&repeated_indices(2500, 37), 37, 3, Some(4));
    check_against_cpu(&[2; 1025], 5, 2, None);
    // No index at all, and one only (a single key, no sorting network).
    check_against_cpu(&[], 4, 3, None);
    check_against_cpu(&[3], 4, 3, Some(0));
}

#[test]
fn embedding_index_out_of_range_is_reported_by_the_next_read() {
    let Some(dev) = device("embedding") else {
        return;
    };
    let w = upload(&dev, &cpu_rand(&[6, 5], 0.0, 1.0, DType::F32, 1));
    let bad = CudaBuffer::from_slice(&dev, &[2i64, 6, 1]).unwrap();
    // The launch does not wait; the row of the bad index is zero.
    let y = embedding_forward(&w, 6, 5, &bad).unwrap();
    match y.to_vec::<f32>() {
        Err(Error::IndexOutOfRange { index, size, .. }) => assert_eq!((index, size), (6, 6)),
        other => panic!("expected IndexOutOfRange, got {other:?}"),
    }
    // Reported once: the device is usable again and the good rows hold.
    let y = embedding_forward(&w, 6, 5, &CudaBuffer::from_slice(&dev, &[2i64]).unwrap()).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap().len(), 5);
    let negative = CudaBuffer::from_slice(&dev, &[-1i64]).unwrap();
    let err = embedding_forward(&w, 6, 5, &negative)
        .unwrap()
        .to_vec::<f32>()
        .unwrap_err();
    assert!(
        matches!(err, Error::IndexOutOfRange { index: -1, .. }),
        "{err:?}"
    );
}
