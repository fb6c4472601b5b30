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

#[test]
fn position_ids_count_the_tokens_that_are_not_padding() {
    let ids = Tensor::from_vec(vec![5i64, 7, 1, 1, 1, 1, 9, 4], &[2, 4], Device::Cpu).unwrap();
    let pos = super::position_ids_from_input_ids(&ids, 1).unwrap();
    assert_eq!(pos.shape(), &[2, 4]);
    assert_eq!(pos.to_vec::<i64>().unwrap(), [2, 3, 1, 1, 1, 1, 2, 3]);
    let u = Tensor::from_vec(vec![0u32, 3, 0], &[1, 3], Device::Cpu).unwrap();
    let pos = super::position_ids_from_input_ids(&u, 0).unwrap();
    assert_eq!(pos.to_vec::<i64>().unwrap(), [0, 1, 0]);
    // A transposed view is read in its logical order.
    let t = ids.reshape(&[4, 2]).unwrap().transpose(0, 1).unwrap();
    let pos = super::position_ids_from_input_ids(&t, 1).unwrap();
    assert_eq!(pos.to_vec::<i64>().unwrap(), [2, 1, 1, 3, 2, 1, 1, 3]);
    let f = Tensor::zeros(&[1, 2], DType::F32, Device::Cpu).unwrap();
    assert!(super::position_ids_from_input_ids(&f, 1).is_err());
    let flat = Tensor::zeros(&[3], DType::I64, Device::Cpu).unwrap();
    assert!(super::position_ids_from_input_ids(&flat, 1).is_err());
    assert!(super::position_ids_from_input_ids(&ids, -1).is_err());
}

#[test]
fn position_ids_on_the_device_are_the_cpus() {
    let Some(_dev) = device("position_ids") else {
        return;
    };
    let cuda = Device::Cuda(0);
    // Rows with padding on either side, in the middle, none and all; more
    // rows than one block has threads.
    let (rows, len) = (300, 7);
    let ids: Vec<i64> = (0..rows * len)
        .map(|k| [1, 1, 4, 9, 1, 3, 2][(k * 5 + k / 11) % 7])
        .collect();
    let cpu = Tensor::from_vec(ids.clone(), &[rows, len], Device::Cpu).unwrap();
    let want = super::position_ids_from_input_ids(&cpu, 1).unwrap();
    let on = cpu.to_device(cuda).unwrap();
    let got = super::position_ids_from_input_ids(&on, 1).unwrap();
    assert_eq!(got.device(), cuda);
    assert_eq!(got.to_vec::<i64>().unwrap(), want.to_vec::<i64>().unwrap());
    let u: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
    let u = Tensor::from_vec(u, &[len, rows], Device::Cpu).unwrap();
    let ut = u.transpose(0, 1).unwrap();
    let want = super::position_ids_from_input_ids(&ut, 1).unwrap();
    let got = super::position_ids_from_input_ids(&ut.to_device(cuda).unwrap(), 1).unwrap();
    assert_eq!(got.to_vec::<i64>().unwrap(), want.to_vec::<i64>().unwrap());
}
