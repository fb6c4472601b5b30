//! CUDA throughput: `Tensor::matmul` on `Device::Cuda(0)` (our cuBLAS
//! wrapper and its checks) vs cuBLAS called directly on the same device
//! buffers at 4096³ (f32, TF32, bf16), and elementwise bandwidth
//! (`mul_scalar`) vs a device-to-device copy. Prints JSON lines. Run:
//! `cargo bench --bench cuda_gemm`; without a GPU it prints that it was
//! skipped.
use cudarc::cublas::sys::{
    cublasComputeType_t as Compute, cublasGemmAlgo_t, cublasOperation_t, cudaDataType,
};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{DevicePtr, DevicePtrMut};
use leangrad::cuda::{with_tf32, CudaBuffer, CudaDevice};
use leangrad::{DType, Device, Tensor};
use std::ffi::c_void;
use std::time::Instant;

/// Best-of-`reps` seconds for `f`, each run waited for on the device.
fn best(dev: &CudaDevice, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    dev.synchronize().unwrap();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            dev.synchronize().unwrap();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// cuBLAS `gemm_ex` on raw buffers, square n³, no checks: the baseline.
/// `blas` runs on the device's stream, whose context is current.
#[allow(clippy::too_many_arguments)]
fn direct(
    dev: &CudaDevice,
    blas: &CudaBlas,
    a: &CudaBuffer,
    b: &CudaBuffer,
    c: &mut CudaBuffer,
    n: i32,
    ty: cudaDataType,
    compute: Compute,
) {
    let stream = dev.stream().clone();
    let (alpha, beta) = (1.0f32, 0.0f32);
    {
        let (pa, _ra) = a.slice().device_ptr(&stream);
        let (pb, _rb) = b.slice().device_ptr(&stream);
        let (pc, _rc) = c.slice_mut().device_ptr_mut(&stream);
        let op = cublasOperation_t::CUBLAS_OP_N;
        // SAFETY: three live n×n buffers of `ty`; f32 scalars for a 32F compute type.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                op,
                op,
                n,
                n,
                n,
                (&alpha as *const f32).cast(),
                pb as *const c_void,
                ty,
                n,
                pa as *const c_void,
                ty,
                n,
                (&beta as *const f32).cast(),
                pc as *mut c_void,
                ty,
                n,
                compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .unwrap_or_else(|e| panic!("gemm_ex: {e:?}"));
    }
}

fn main() {
    let dev = match CudaDevice::get(0) {
        Ok(d) => d,
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            return;
        }
    };
    println!(
        "{{\"device\": \"{}\", \"capability\": \"{:?}\"}}",
        dev.name().unwrap_or_default(),
        dev.compute_capability()
    );
    let n = 4096usize;
    let flops = 2.0 * (n as f64).powi(3);
    let cases = [
        (
            "f32",
            DType::F32,
            false,
            cudaDataType::CUDA_R_32F,
            Compute::CUBLAS_COMPUTE_32F,
        ),
        (
            "tf32",
            DType::F32,
            true,
            cudaDataType::CUDA_R_32F,
            Compute::CUBLAS_COMPUTE_32F_FAST_TF32,
        ),
        (
            "bf16",
            DType::BF16,
            false,
            cudaDataType::CUDA_R_16BF,
            Compute::CUBLAS_COMPUTE_32F,
        ),
    ];
    // The baseline's own handle on the device's stream (the context made
    // current first: raw cuBLAS calls do not do it).
    dev.stream().context().bind_to_thread().unwrap();
    let blas = CudaBlas::new(dev.stream().clone()).unwrap();
    let cuda = Device::Cuda(dev.ordinal());
    for (name, dtype, tf32, ty, compute) in cases {
        let a = Tensor::randn(&[n, n], dtype, cuda, 1).unwrap();
        let b = Tensor::randn(&[n, n], dtype, cuda, 2).unwrap();
        let c = Tensor::zeros(&[n, n], dtype, cuda).unwrap();
        let _tf32 = with_tf32(tf32);
        let ours = best(&dev, 10, || drop(a.matmul(&b).unwrap()));
        let theirs = {
            let (a, b) = (a.storage().cuda().unwrap(), b.storage().cuda().unwrap());
            let mut c = c.storage().cuda_mut().unwrap();
            best(&dev, 10, || {
                direct(&dev, &blas, &a, &b, &mut c, n as i32, ty, compute)
            })
        };
        println!(
            "{{\"bench\": \"gemm\", \"dtype\": \"{name}\", \"n\": {n}, \"ours_tflops\": {:.1}, \"cublas_tflops\": {:.1}}}",
            flops / ours / 1e12,
            flops / theirs / 1e12
        );
    }
    // Elementwise bandwidth: read + write of 1 GiB of f32.
    let len = 256 << 20;
    let x = Tensor::zeros(&[len], DType::F32, cuda).unwrap();
    let map = best(&dev, 10, || drop(x.mul_scalar(2.0).unwrap()));
    let y = Tensor::zeros(&[len], DType::F32, cuda).unwrap();
    let stream = dev.stream().clone();
    let copy = {
        let (x, mut y) = (x.storage().cuda().unwrap(), y.storage().cuda_mut().unwrap());
        best(&dev, 10, || {
            stream.memcpy_dtod(x.slice(), y.slice_mut()).unwrap()
        })
    };
    let bytes = 2.0 * (len * 4) as f64;
    println!(
        "{{\"bench\": \"elementwise\", \"bytes\": {bytes}, \"mul_scalar_gbs\": {:.0}, \"dtod_copy_gbs\": {:.0}}}",
        bytes / map / 1e9,
        bytes / copy / 1e9
    );
}
