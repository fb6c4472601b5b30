//! CPU throughput of the core kernels: GEMM (GFLOP/s) and elementwise
//! bandwidth (GB/s), printed as JSON lines. Run: `cargo bench --bench cpu_ops`.
use leangrad::autograd::no_grad;
use leangrad::{DType, Device, Tensor};
use std::time::Instant;

/// Best-of-`reps` seconds for `f`.
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let _ng = no_grad();
    let threads = rayon::current_num_threads();
    for (n, dtype) in [
        (512, DType::F32),
        (1024, DType::F32),
        (1024, DType::BF16),
        (512, DType::F64),
    ] {
        let a = Tensor::randn(&[n, n], dtype, Device::Cpu, 1).unwrap();
        let b = Tensor::randn(&[n, n], dtype, Device::Cpu, 2).unwrap();
        let s = best(5, || drop(a.matmul(&b).unwrap()));
        let gflops = 2.0 * (n * n * n) as f64 / s / 1e9;
        println!("{{\"bench\":\"matmul\",\"n\":{n},\"dtype\":\"{dtype:?}\",\"seconds\":{s:.6},\"gflops\":{gflops:.1},\"threads\":{threads}}}");
        let bt = b.t().unwrap();
        let s = best(5, || drop(a.matmul(&bt).unwrap()));
        let gflops = 2.0 * (n * n * n) as f64 / s / 1e9;
        println!("{{\"bench\":\"matmul_transposed_rhs\",\"n\":{n},\"dtype\":\"{dtype:?}\",\"seconds\":{s:.6},\"gflops\":{gflops:.1},\"threads\":{threads}}}");
    }
    let n = 1 << 24;
    let x = Tensor::randn(&[n], DType::F32, Device::Cpu, 3).unwrap();
    let y = Tensor::randn(&[n], DType::F32, Device::Cpu, 4).unwrap();
    let s = best(5, || drop(x.add(&y).unwrap()));
    println!(
        "{{\"bench\":\"add_f32\",\"elements\":{n},\"seconds\":{s:.6},\"gbps\":{:.2}}}",
        12.0 * n as f64 / s / 1e9
    );
    let s = best(5, || drop(x.relu().unwrap()));
    println!(
        "{{\"bench\":\"relu_f32\",\"elements\":{n},\"seconds\":{s:.6},\"gbps\":{:.2}}}",
        8.0 * n as f64 / s / 1e9
    );
    let s = best(5, || drop(x.contiguous().unwrap().reshape(&[n]).unwrap()));
    let copy = best(5, || {
        let v: Vec<f32> = x.to_vec().unwrap();
        drop(v)
    });
    println!("{{\"bench\":\"copy_f32\",\"elements\":{n},\"seconds\":{copy:.6},\"gbps\":{:.2},\"noop_contiguous_seconds\":{s:.6}}}", 8.0 * n as f64 / copy / 1e9);
}
