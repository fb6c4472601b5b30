//! The CPU products split across threads (a block of rows or columns per
//! thread, each block one gemm call) add the same terms in the same order
//! as one call, so a matmul or a convolution gives the same bits for any
//! thread count. Each computation runs in pools of 1, 2 and 3 threads and
//! is compared bit for bit.

use leangrad::autograd::{backward_with, CollectGrads};
use leangrad::nn::{conv2d, Conv2dOptions};
use leangrad::{DType, Device, Result, Tensor};

const CPU: Device = Device::Cpu;
const F32: DType = DType::F32;

/// The values' bit patterns (through f64, exact for every float dtype).
fn bits(t: &Tensor) -> Result<Vec<u64>> {
    let v = t.to_dtype(DType::F64)?.to_vec::<f64>()?;
    Ok(v.iter().map(|v| v.to_bits()).collect())
}

/// `f`'s results in pools of 1, 2 and 3 threads, which must be equal.
fn same_for_every_thread_count(what: &str, f: impl Fn() -> Result<Vec<Vec<u64>>> + Sync) {
    let run = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a rayon pool")
            .install(&f)
            .expect("the computation runs")
    };
    let one = run(1);
    assert!(one.iter().all(|v| !v.is_empty()), "{what}: no values");
    for threads in [2, 3] {
        let many = run(threads);
        assert_eq!(one.len(), many.len(), "{what}");
        for (i, (a, b)) in one.iter().zip(&many).enumerate() {
            let differ = a.iter().zip(b).filter(|(x, y)| x != y).count();
            assert_eq!(
                differ, 0,
                "{what}, result {i}: {differ} elements differ at {threads} threads"
            );
        }
    }
}

#[test]
fn matmuls_give_the_same_bits_for_any_thread_count() {
    // Row splits (m ≥ n), column splits (m < n), transposed operands (the
    // strides a Linear layer's products read), sizes whose halves fall
    // under gemm's small-matrix branches (must not be split), a batch that
    // folds into one product, and batches of distinct products: one whole
    // product per thread (6 entries at 2 and 3 threads), or each split (4
    // entries at 3 threads).
    let shapes: &[(&[usize], &[usize], bool)] = &[
        (&[64, 576], &[576, 784], false),
        (&[640, 512], &[512, 64], false),
        (&[512, 4608], &[4608, 128], false),
        (&[200, 300], &[300, 130], true),
        (&[37, 1500], &[1500, 101], false),
        (&[130, 700], &[700, 9], false),
        (&[3, 100, 257], &[257, 150], false),
        (&[6, 128, 64], &[6, 64, 128], false),
        (&[4, 100, 257], &[4, 257, 150], false),
    ];
    // f64 and f16 run gemm's other kernels (other tile sizes).
    let cases = shapes
        .iter()
        .map(|&s| (s, F32))
        .chain([(shapes[0], DType::F64), (shapes[1], DType::F16)]);
    for (i, ((a, b, transposed), dtype)) in cases.enumerate() {
        same_for_every_thread_count(&format!("matmul {a:?}·{b:?} {dtype:?}"), || {
            let x = Tensor::randn(a, F32, CPU, 10 + i as u64)?.to_dtype(dtype)?;
            let y = if transposed {
                // [k, n] read through the strides of a transposed [n, k].
                Tensor::randn(&[b[1], b[0]], F32, CPU, 20 + i as u64)?.t()?
            } else {
                Tensor::randn(b, F32, CPU, 20 + i as u64)?
            };
            Ok(vec![bits(&x.matmul(&y.to_dtype(dtype)?)?)?])
        });
    }
}

#[test]
fn convolutions_give_the_same_bits_for_any_thread_count() {
    // ResNet-18's 3×3 layers: one item per product (28²), and several
    // items side by side in the column buffer (14², 7², 4²).
    for (cin, hw) in [(64, 28), (128, 14), (256, 7), (512, 4)] {
        same_for_every_thread_count(&format!("conv {cin}ch {hw}²"), || {
            let opts = Conv2dOptions {
                padding: [1, 1],
                ..Default::default()
            };
            let x = Tensor::randn(&[4, cin, hw, hw], F32, CPU, 1)?.set_requires_grad(true)?;
            let w = Tensor::randn(&[cin, cin, 3, 3], F32, CPU, 2)?
                .mul_scalar(0.05)?
                .set_requires_grad(true)?;
            let y = conv2d(&x, &w, None, &opts)?;
            let g = Tensor::randn(y.shape(), F32, CPU, 3)?;
            backward_with(&y, Some(g), &mut CollectGrads)?;
            let (gx, gw) = (x.grad(), w.grad());
            let (Some(gx), Some(gw)) = (gx, gw) else {
                panic!("both gradients are computed");
            };
            Ok(vec![bits(&y)?, bits(&gx)?, bits(&gw)?])
        });
    }
}
