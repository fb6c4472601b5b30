//! Indexing launch wrappers against the CPU (gather, index_select,
//! scatter-add, out-of-range indices as typed errors) and the Philox4x32-10
//! kernels bit for bit against `crate::rng` (were
//! `tests/cuda_index_random.rs`; dropout's are tested beside their launch
//! code, `src/nn/dropout/tests.rs`). Without a GPU: `skipped: no CUDA
//! device (…)`.

use crate::cuda::testing::{
    assert_close, cpu_rand, cuda_or_skip, dense, download, tol, upload, ALL, FLOATS,
};
use crate::cuda::{index, random, CudaBuffer, Strided};
use crate::{rng, DType, Device, Error, Tensor};

fn index_tensor(values: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(values.to_vec(), shape, Device::Cpu).unwrap()
}

#[test]
fn gather_index_select_scatter_add_match_the_cpu() {
    let dev = cuda_or_skip!("index");
    for dtype in ALL {
        let x = cpu_rand(&[6, 9], 0.0, 50.0, dtype, 21);
        let gx = upload(&dev, &x);
        let ids: Vec<i64> = (0..6 * 4).map(|i| (i * 5 + 3) % 9).collect();
        let idx = index_tensor(&ids, &[6, 4]);
        let got = index::gather(
            &gx,
            &dense(&[6, 9]),
            1,
            &upload(&dev, &idx),
            &dense(&[6, 4]),
        )
        .unwrap();
        assert_eq!(
            download(&got),
            x.gather(1, &idx).unwrap().to_f64_vec().unwrap(),
            "gather {dtype:?}"
        );
        let sel = index_tensor(&[5, 0, 0, 2, 5], &[5]);
        let got = index::index_select(&gx, &dense(&[6, 9]), 0, &upload(&dev, &sel)).unwrap();
        let want = x.index_select(0, &sel).unwrap().to_f64_vec().unwrap();
        assert_eq!(download(&got), want, "index_select {dtype:?}");
        // Through a transposed view: select columns of xᵀ.
        let lt = Strided::new(&[9, 6], &[1, 9], 0).unwrap();
        let got = index::index_select(&gx, &lt, 1, &upload(&dev, &sel)).unwrap();
        let xv = x.to_f64_vec().unwrap();
        let want: Vec<f64> = (0..9 * 5)
            .map(|i| xv[[5, 0, 0, 2, 5][i % 5] * 9 + i / 5])
            .collect();
        assert_eq!(
            download(&got),
            want,
            "index_select of a transpose {dtype:?}"
        );
    }
    for dtype in FLOATS {
        let base = cpu_rand(&[4, 7], -1.0, 1.0, dtype, 22);
        let src = cpu_rand(&[4, 12], -1.0, 1.0, dtype, 23);
        let ids: Vec<i64> = (0..48).map(|i| (i * 3) % 7).collect();
        let idx = index_tensor(&ids, &[4, 12]);
        let want = base
            .scatter_add(1, &idx, &src)
            .unwrap()
            .to_f64_vec()
            .unwrap();
        let mut out = upload(&dev, &base);
        let (l, ls) = (dense(&[4, 7]), dense(&[4, 12]));
        index::scatter_add(
            &mut out,
            &l,
            1,
            &upload(&dev, &idx),
            &ls,
            &upload(&dev, &src),
            &ls,
        )
        .unwrap();
        assert_close(
            &format!("scatter_add {dtype:?}"),
            &download(&out),
            &want,
            tol(dtype) * 4.0,
        );
    }
    let x = upload(&dev, &cpu_rand(&[3, 4], 0.0, 1.0, DType::F32, 24));
    let bad = upload(&dev, &index_tensor(&[1, 4], &[2]));
    // The launch does not wait: the next read from the device reports it.
    let out = index::index_select(&x, &dense(&[3, 4]), 1, &bad).unwrap();
    match out.to_vec::<f32>() {
        Err(Error::IndexOutOfRange { op, index, size }) => {
            assert_eq!((op, index, size), ("index_select", 4, 4))
        }
        other => panic!("expected IndexOutOfRange, got {other:?}"),
    }
    let neg = upload(&dev, &index_tensor(&[-1; 6], &[3, 2]));
    let out = index::gather(&x, &dense(&[3, 4]), 1, &neg, &dense(&[3, 2])).unwrap();
    let r = out.to_vec::<f32>();
    assert!(
        matches!(
            r,
            Err(Error::IndexOutOfRange {
                op: "gather",
                index: -1,
                ..
            })
        ),
        "{r:?}"
    );
    // Reported once: the device reads on.
    assert_eq!(x.to_vec::<f32>().unwrap().len(), 12);
}

#[test]
fn philox_streams_are_bit_identical_to_the_cpu() {
    let dev = cuda_or_skip!("philox");
    for (seed, offset, n) in [
        (0u64, 0u64, 1usize),
        (42, 4, 1001),
        (u64::MAX, 1 << 40, 4099),
        (7, 3, 17),
    ] {
        let words = random::philox_words(&dev, seed, offset, n)
            .unwrap()
            .to_vec::<u32>()
            .unwrap();
        let want: Vec<u32> = (0..n as u64)
            .map(|i| rng::random_u32(seed, offset + i))
            .collect();
        assert_eq!(words, want, "words seed {seed} offset {offset}");
        for dtype in FLOATS {
            let got = download(&random::uniform(&dev, dtype, seed, offset, n).unwrap());
            let want =
                Tensor::from_f64_slice(&rng::uniform(seed, offset, n), &[n], dtype, Device::Cpu)
                    .unwrap()
                    .to_f64_vec()
                    .unwrap();
            assert_eq!(got, want, "uniform {dtype:?}");
            // Normals go through the device's double log/cos: equal after
            // rounding to the dtype except, rarely, in the last bit.
            let got = download(&random::normal(&dev, dtype, seed, offset, n).unwrap());
            let want =
                Tensor::from_f64_slice(&rng::normal(seed, offset, n), &[n], dtype, Device::Cpu)
                    .unwrap()
                    .to_f64_vec()
                    .unwrap();
            assert_close(&format!("normal {dtype:?}"), &got, &want, tol(dtype) / 4.0);
        }
    }
}

#[test]
fn scatter_along_and_place_write_their_lanes() {
    let dev = cuda_or_skip!("scatter_along");
    // g of the keepdim shape [2, 1, 3] into zeros of [2, 4, 3] along dim 1.
    let ids = [3.0, 0.0, 2.0, 1.0, 1.0, 3.0];
    for dtype in ALL {
        let g = cpu_rand(&[2, 1, 3], 1.0, 9.0, dtype, 31);
        let gv = g.to_f64_vec().unwrap();
        let want: Vec<f64> = (0..24)
            .map(|o| {
                let p = (o / 12) * 3 + o % 3;
                if ids[p] == (o / 3 % 4) as f64 {
                    gv[p]
                } else {
                    0.0
                }
            })
            .collect();
        for idx_dtype in [DType::U8, DType::U32, DType::I64] {
            let idx = Tensor::from_f64_slice(&ids, &[2, 3], idx_dtype, Device::Cpu).unwrap();
            let got = index::scatter_along(
                &upload(&dev, &g),
                &dense(&[2, 1, 3]),
                &upload(&dev, &idx),
                &dense(&[2, 3]),
                &[2, 4, 3],
                1,
            )
            .unwrap();
            assert_eq!(download(&got), want, "{dtype:?} with {idx_dtype:?} indices");
        }
    }
    // As on the CPU, a negative I64 index reads as 0; one past the axis is
    // reported by the next read (the CPU's InvalidArgument at the call);
    // the indices may be a strided view (a transpose).
    let g = upload(&dev, &cpu_rand(&[1, 1, 3], 1.0, 2.0, DType::F32, 32));
    let gv = download(&g);
    let neg = upload(&dev, &index_tensor(&[-5, 1, 0], &[3, 1]));
    let lt = Strided::new(&[1, 3], &[1, 1], 0).unwrap();
    let got = index::scatter_along(&g, &dense(&[1, 1, 3]), &neg, &lt, &[1, 2, 3], 1).unwrap();
    assert_eq!(download(&got), [gv[0], 0.0, gv[2], 0.0, gv[1], 0.0]);
    let bad = upload(&dev, &index_tensor(&[0, 2, 0], &[1, 3]));
    let out =
        index::scatter_along(&g, &dense(&[1, 1, 3]), &bad, &dense(&[1, 3]), &[1, 2, 3], 1).unwrap();
    let r = out.to_vec::<f32>();
    assert!(
        matches!(
            r,
            Err(Error::IndexOutOfRange {
                op: "scatter_along",
                index: 2,
                size: 2
            })
        ),
        "{r:?}"
    );
    // place: [[1, 2], [3, 4]] into the top-left corner of zeros of [3, 4].
    let x = CudaBuffer::from_slice(&dev, &[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let mut out = CudaBuffer::zeros(&dev, DType::F32, 12).unwrap();
    let corner = Strided::new(&[2, 2], &[4, 1], 0).unwrap();
    index::place(&mut out, &corner, &x).unwrap();
    let mut want = [0.0; 12];
    want[..2].copy_from_slice(&[1.0, 2.0]);
    want[4..6].copy_from_slice(&[3.0, 4.0]);
    assert_eq!(download(&out), want);
}
