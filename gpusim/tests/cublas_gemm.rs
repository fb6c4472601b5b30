//! cuBLAS GEMMs against a row-major host reference: every transpose
//! combination and data type on odd shapes with padded leading dimensions
//! and batch strides, alpha/beta cases, TF32, argument checks, and the
//! sanitizer's view of the operands.

use half::{bf16, f16};
use leangrad_gpusim::cublas::*;
use leangrad_gpusim::driver::api_device::*;
use leangrad_gpusim::driver::api_memory::*;
use leangrad_gpusim::driver::consts::*;
use leangrad_gpusim::driver::errors::cuGetErrorString;
use std::ffi::{c_void, CStr};
use std::ptr::null_mut;

const R_32F: u32 = 0;
const R_64F: u32 = 1;
const R_16F: u32 = 2;
const R_16BF: u32 = 14;
const COMPUTE_32F: u32 = 68;
const COMPUTE_32F_PEDANTIC: u32 = 69;
const COMPUTE_64F: u32 = 70;
const COMPUTE_TF32: u32 = 77;

fn handle() -> CublasHandle {
    unsafe {
        assert_eq!(cuInit(0), CUDA_SUCCESS);
        let mut ctx = null_mut();
        assert_eq!(cuDevicePrimaryCtxRetain(&mut ctx, 0), CUDA_SUCCESS);
        assert_eq!(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
        let mut h = null_mut();
        assert_eq!(cublasCreate_v2(&mut h), CUBLAS_STATUS_SUCCESS);
        h
    }
}

fn error_string(code: CUresult) -> String {
    let mut p = std::ptr::null();
    assert_eq!(unsafe { cuGetErrorString(code, &mut p) }, CUDA_SUCCESS);
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn size_of(t: u32) -> usize {
    match t {
        R_32F => 4,
        R_64F => 8,
        _ => 2,
    }
}

fn encode(v: &[f64], t: u32) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| match t {
            R_32F => (x as f32).to_le_bytes().to_vec(),
            R_64F => x.to_le_bytes().to_vec(),
            R_16F => f16::from_f64(x).to_le_bytes().to_vec(),
            _ => bf16::from_f64(x).to_le_bytes().to_vec(),
        })
        .collect()
}

fn decode(b: &[u8], t: u32) -> Vec<f64> {
    b.chunks_exact(size_of(t))
        .map(|c| match t {
            R_32F => f32::from_le_bytes(c.try_into().unwrap()) as f64,
            R_64F => f64::from_le_bytes(c.try_into().unwrap()),
            R_16F => f16::from_le_bytes(c.try_into().unwrap()).to_f64(),
            _ => bf16::from_le_bytes(c.try_into().unwrap()).to_f64(),
        })
        .collect()
}

fn upload(bytes: &[u8]) -> u64 {
    let mut p = 0;
    unsafe {
        assert_eq!(
            cuMemAllocAsync(&mut p, bytes.len().max(1), null_mut()),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuMemcpyHtoDAsync_v2(p, bytes.as_ptr().cast(), bytes.len(), null_mut()),
            CUDA_SUCCESS
        );
    }
    p
}

fn download(p: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    let r = unsafe { cuMemcpyDtoHAsync_v2(v.as_mut_ptr().cast(), p, n, null_mut()) };
    assert_eq!(r, CUDA_SUCCESS, "{}", error_string(r));
    v
}

/// A deterministic value exactly representable in f16 and bf16.
fn val(seed: usize) -> f64 {
    ((seed * 7919 + 13) % 17) as f64 / 4.0 - 2.0
}

/// One GEMM case: logical row-major operands stored column-major with
/// padding (NaN in the padding and between batches, so a wrong index shows).
struct Case {
    transa: u32,
    transb: u32,
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    alpha: f64,
    beta: f64,
    ab: u32,
    ct: u32,
    compute: u32,
}

impl Case {
    fn run(&self, h: CublasHandle) {
        let Case { m, n, k, batch, .. } = *self;
        let (ta, tb) = (self.transa != 0, self.transb != 0);
        // Stored shapes (rows × cols) and padded leading dimensions.
        let (ar, ac) = if ta { (k, m) } else { (m, k) };
        let (br, bc) = if tb { (n, k) } else { (k, n) };
        let (lda, ldb, ldc) = (ar + 2, br + 1, m + 3);
        let (sa, sb, sc) = (lda * ac + 5, ldb * bc + 3, ldc * n + 1);
        let mut a = vec![f64::NAN; sa * batch];
        let mut b = vec![f64::NAN; sb * batch];
        let mut c = vec![f64::NAN; sc * batch];
        // Logical op(A)[i][p], op(B)[p][j], C[i][j] per batch.
        let opa = |bt: usize, i: usize, p: usize| val(bt * 1000 + i * 31 + p);
        let opb = |bt: usize, p: usize, j: usize| val(bt * 2000 + p * 17 + j + 500);
        let c0 = |bt: usize, i: usize, j: usize| val(bt * 3000 + i * 5 + j * 11 + 900);
        for bt in 0..batch {
            for i in 0..m {
                for p in 0..k {
                    let at = if ta { p + i * lda } else { i + p * lda };
                    a[bt * sa + at] = opa(bt, i, p);
                }
            }
            for p in 0..k {
                for j in 0..n {
                    let at = if tb { j + p * ldb } else { p + j * ldb };
                    b[bt * sb + at] = opb(bt, p, j);
                }
            }
            for i in 0..m {
                for j in 0..n {
                    c[bt * sc + i + j * ldc] = c0(bt, i, j);
                }
            }
        }
        let (pa, pb) = (upload(&encode(&a, self.ab)), upload(&encode(&b, self.ab)));
        let pc = upload(&encode(&c, self.ct));
        let (alpha32, beta32) = (self.alpha as f32, self.beta as f32);
        let wide = self.compute == COMPUTE_64F;
        let (alpha, beta): (*const c_void, *const c_void) = if wide {
            (
                (&self.alpha as *const f64).cast(),
                (&self.beta as *const f64).cast(),
            )
        } else {
            (
                (&alpha32 as *const f32).cast(),
                (&beta32 as *const f32).cast(),
            )
        };
        let st = unsafe {
            cublasGemmStridedBatchedEx(
                h,
                self.transa,
                self.transb,
                m as i32,
                n as i32,
                k as i32,
                alpha,
                pa as *const c_void,
                self.ab,
                lda as i32,
                sa as i64,
                pb as *const c_void,
                self.ab,
                ldb as i32,
                sb as i64,
                beta,
                pc as *mut c_void,
                self.ct,
                ldc as i32,
                sc as i64,
                batch as i32,
                self.compute,
                -1,
            )
        };
        assert_eq!(st, CUBLAS_STATUS_SUCCESS);
        let got = decode(&download(pc, sc * batch * size_of(self.ct)), self.ct);
        for bt in 0..batch {
            for j in 0..n {
                for i in 0..m {
                    let want = self
                        .reference((0..k).map(|p| (opa(bt, i, p), opb(bt, p, j))), c0(bt, i, j));
                    let g = got[bt * sc + i + j * ldc];
                    assert!(
                        g.to_bits() == want.to_bits(),
                        "{:?}: batch {bt} C[{i}][{j}] = {g}, want {want}",
                        (self.transa, self.transb, self.ab, self.ct, self.compute)
                    );
                }
            }
            // Padding rows of C untouched (still NaN).
            assert!(got[bt * sc + m].is_nan() && got[bt * sc + ldc - 1].is_nan());
        }
        for p in [pa, pb, pc] {
            assert_eq!(cuMemFreeAsync(p, null_mut()), CUDA_SUCCESS);
        }
    }

    /// Sequential fused multiply-adds in the compute type, then the
    /// epilogue, rounded to C's type.
    fn reference(&self, terms: impl Iterator<Item = (f64, f64)>, c: f64) -> f64 {
        let r = if self.compute == COMPUTE_64F {
            let acc = terms.fold(0.0f64, |acc, (x, y)| x.mul_add(y, acc));
            if self.beta == 0.0 {
                self.alpha * acc
            } else {
                self.alpha.mul_add(acc, self.beta * c)
            }
        } else {
            let acc = terms.fold(0.0f32, |acc, (x, y)| (x as f32).mul_add(y as f32, acc));
            let (al, be) = (self.alpha as f32, self.beta as f32);
            let r = if be == 0.0 {
                al * acc
            } else {
                al.mul_add(acc, be * c as f32)
            };
            // Rounded once from the f32 (half's `from_f64` is not: see
            // `half_results_round_the_accumulator_once`).
            return match self.ct {
                R_16F => f16::from_f32(r).to_f64(),
                R_16BF => bf16::from_f32(r).to_f64(),
                _ => r as f64,
            };
        };
        decode(&encode(&[r], self.ct), self.ct)[0]
    }
}

#[test]
fn every_transpose_and_type_matches_the_reference() {
    let h = handle();
    let types = [
        (R_32F, R_32F, COMPUTE_32F),
        (R_32F, R_32F, COMPUTE_32F_PEDANTIC),
        (R_64F, R_64F, COMPUTE_64F),
        (R_16F, R_16F, COMPUTE_32F),
        (R_16F, R_32F, COMPUTE_32F),
        (R_16BF, R_16BF, COMPUTE_32F),
        (R_16BF, R_32F, COMPUTE_32F),
    ];
    for (ab, ct, compute) in types {
        for (transa, transb) in [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (0, 2)] {
            for (alpha, beta) in [(1.0, 0.0), (0.5, 1.0), (-1.25, 0.75)] {
                let (m, n, k) = (3, 5, 7);
                Case {
                    transa,
                    transb,
                    m,
                    n,
                    k,
                    batch: 2,
                    alpha,
                    beta,
                    ab,
                    ct,
                    compute,
                }
                .run(h);
            }
        }
    }
    // Shapes with 1s and a longer k.
    for (m, n, k) in [(1, 1, 1), (1, 4, 9), (6, 1, 2), (4, 3, 33)] {
        Case {
            transa: 1,
            transb: 0,
            m,
            n,
            k,
            batch: 3,
            alpha: 1.0,
            beta: 1.0,
            ab: R_32F,
            ct: R_32F,
            compute: COMPUTE_32F,
        }
        .run(h);
    }
    assert_eq!(cublasDestroy_v2(h), CUBLAS_STATUS_SUCCESS);
}

/// Uploads f32s.
fn f32s(v: &[f32]) -> u64 {
    upload(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}

fn read_f32s(p: u64, n: usize) -> Vec<f32> {
    download(p, 4 * n)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// C (m×n, ld m) = op(A)·op(B) with f32 data, via cublasGemmEx.
#[allow(clippy::too_many_arguments)]
fn gemm_ex(
    h: CublasHandle,
    m: i32,
    n: i32,
    k: i32,
    a: u64,
    lda: i32,
    b: u64,
    ldb: i32,
    c: u64,
    ldc: i32,
    alpha: f32,
    beta: f32,
    compute: u32,
) -> CublasStatus {
    unsafe {
        cublasGemmEx(
            h,
            0,
            0,
            m,
            n,
            k,
            (&alpha as *const f32).cast(),
            a as *const c_void,
            R_32F,
            lda,
            b as *const c_void,
            R_32F,
            ldb,
            (&beta as *const f32).cast(),
            c as *mut c_void,
            R_32F,
            ldc,
            compute,
            -1,
        )
    }
}

/// `C = A·B` for a 1×k row `a` and a k×1 column of ones in type `t`
/// (f32 compute); C's bits.
fn half_dot(h: CublasHandle, a: &[f64], t: u32) -> u16 {
    let (pa, pb) = (
        upload(&encode(a, t)),
        upload(&encode(&vec![1.0; a.len()], t)),
    );
    let pc = upload(&encode(&[0.0], t));
    let (one, zero) = (1.0f32, 0.0f32);
    let k = a.len() as i32;
    let st = unsafe {
        cublasGemmEx(
            h,
            0,
            0,
            1,
            1,
            k,
            (&one as *const f32).cast(),
            pa as *const c_void,
            t,
            1,
            pb as *const c_void,
            t,
            k,
            (&zero as *const f32).cast(),
            pc as *mut c_void,
            t,
            1,
            COMPUTE_32F,
            -1,
        )
    };
    assert_eq!(st, CUBLAS_STATUS_SUCCESS);
    let c = download(pc, 2);
    for p in [pa, pb, pc] {
        assert_eq!(cuMemFreeAsync(p, null_mut()), CUDA_SUCCESS);
    }
    u16::from_le_bytes([c[0], c[1]])
}

#[test]
fn half_results_round_the_accumulator_once() {
    let h = handle();
    let p2 = |e: i32| f64::powi(2.0, e);
    // bf16: 0x3dca (0.0986328125) + 2^-12 is the tie between bf16 0x3dca
    // and 0x3dcb; + 2^-25 puts the f32 accumulator 4 f32 ulps above it
    // (0x3dca8004), in bits an f64's upper word does not hold: it rounds
    // up (the leangrad bf16 convolution that differed from the CPU's).
    let base = bf16::from_bits(0x3dca).to_f64();
    assert_eq!(half_dot(h, &[base, p2(-12), p2(-25)], R_16BF), 0x3dcb);
    assert_eq!(
        half_dot(h, &[base, p2(-12)], R_16BF),
        0x3dca,
        "a tie: to even"
    );
    assert_eq!(half_dot(h, &[-base, -p2(-12), -p2(-25)], R_16BF), 0xbdcb);
    // f16: 1 + 2^-11 is the tie between 1 and 1 + 2^-10; 2^-23 is the f32
    // accumulator's last bit.
    assert_eq!(half_dot(h, &[1.0, p2(-11), p2(-23)], R_16F), 0x3c01);
    assert_eq!(
        half_dot(h, &[1.0, p2(-11)], R_16F),
        0x3c00,
        "a tie: to even"
    );
    assert_eq!(
        half_dot(h, &[1.0, p2(-10), p2(-11)], R_16F),
        0x3c02,
        "a tie: to even"
    );
    assert_eq!(cublasDestroy_v2(h), CUBLAS_STATUS_SUCCESS);
}

#[test]
fn tf32_rounds_the_inputs() {
    let h = handle();
    // 1 + 2^-12 is below half a TF32 ulp (2^-11) above 1: it rounds to 1.
    let x = 1.0 + f32::powi(2.0, -12);
    let a = f32s(&[x, x]);
    let b = f32s(&[x, x]);
    let c = f32s(&[0.0]);
    let run = |compute| {
        assert_eq!(
            gemm_ex(h, 1, 1, 2, a, 1, b, 2, c, 1, 1.0, 0.0, compute),
            CUBLAS_STATUS_SUCCESS
        );
        read_f32s(c, 1)[0]
    };
    assert_eq!(run(COMPUTE_32F), x.mul_add(x, x * x));
    assert_eq!(run(COMPUTE_TF32), 2.0);
    // The TF32 math mode makes plain 32F compute TF32, but not the pedantic one.
    assert_eq!(cublasSetMathMode(h, 3), CUBLAS_STATUS_SUCCESS);
    let mut mode = 0;
    assert_eq!(
        unsafe { cublasGetMathMode(h, &mut mode) },
        CUBLAS_STATUS_SUCCESS
    );
    assert_eq!(mode, 3);
    assert_eq!(run(COMPUTE_32F), 2.0);
    assert_eq!(run(COMPUTE_32F_PEDANTIC), x.mul_add(x, x * x));
    // Sgemm follows the math mode too.
    assert_eq!(cublasSetMathMode(h, 0), CUBLAS_STATUS_SUCCESS);
    let (one, zero) = (1.0f32, 0.0f32);
    let sgemm = |h| unsafe {
        cublasSgemm_v2(
            h,
            0,
            0,
            1,
            1,
            2,
            &one,
            a as *const f32,
            1,
            b as *const f32,
            2,
            &zero,
            c as *mut f32,
            1,
        )
    };
    assert_eq!(sgemm(h), CUBLAS_STATUS_SUCCESS);
    assert_eq!(read_f32s(c, 1)[0], x.mul_add(x, x * x));
    assert_eq!(cublasSetMathMode(h, 3 | 16), CUBLAS_STATUS_SUCCESS);
    assert_eq!(sgemm(h), CUBLAS_STATUS_SUCCESS);
    assert_eq!(read_f32s(c, 1)[0], 2.0);
    assert_eq!(cublasSetMathMode(h, 4), CUBLAS_STATUS_NOT_SUPPORTED);
    assert_eq!(cublasSetMathMode(h, 7), CUBLAS_STATUS_INVALID_VALUE);
    assert_eq!(cublasDestroy_v2(h), CUBLAS_STATUS_SUCCESS);
}

#[test]
fn beta_zero_never_reads_c_and_k_zero_scales_c() {
    let h = handle();
    let a = f32s(&[1.0, 2.0]); // 2×1
    let b = f32s(&[3.0, 4.0]); // 1×2
    let c = f32s(&[f32::NAN; 4]);
    assert_eq!(
        gemm_ex(h, 2, 2, 1, a, 2, b, 1, c, 2, 1.0, 0.0, COMPUTE_32F),
        CUBLAS_STATUS_SUCCESS
    );
    assert_eq!(read_f32s(c, 4), [3.0, 6.0, 4.0, 8.0]);
    // C never written at all: beta = 0 needs none of it.
    let mut fresh = 0;
    unsafe { assert_eq!(cuMemAllocAsync(&mut fresh, 16, null_mut()), CUDA_SUCCESS) };
    assert_eq!(
        gemm_ex(h, 2, 2, 1, a, 2, b, 1, fresh, 2, 2.0, 0.0, COMPUTE_32F),
        CUBLAS_STATUS_SUCCESS
    );
    assert_eq!(read_f32s(fresh, 4), [6.0, 12.0, 8.0, 16.0]);
    // k = 0: C = beta·C, A and B not read (null is fine).
    assert_eq!(
        gemm_ex(h, 2, 2, 0, 0, 2, 0, 1, c, 2, 1.0, 0.5, COMPUTE_32F),
        CUBLAS_STATUS_SUCCESS
    );
    assert_eq!(read_f32s(c, 4), [1.5, 3.0, 2.0, 4.0]);
    assert_eq!(
        gemm_ex(h, 2, 2, 0, 0, 2, 0, 1, c, 2, 1.0, 0.0, COMPUTE_32F),
        CUBLAS_STATUS_SUCCESS
    );
    assert_eq!(read_f32s(c, 4), [0.0; 4]);
    // alpha = 0 reads neither A nor B either.
    let nan_a = f32s(&[f32::NAN, f32::NAN]);
    let c2 = f32s(&[1.0, 2.0, 3.0, 4.0]);
    assert_eq!(
        gemm_ex(h, 2, 2, 1, nan_a, 2, b, 1, c2, 2, 0.0, 2.0, COMPUTE_32F),
        CUBLAS_STATUS_SUCCESS
    );
    assert_eq!(read_f32s(c2, 4), [2.0, 4.0, 6.0, 8.0]);
    // m = 0 or batchCount = 0: nothing to do, nothing checked past sizes.
    assert_eq!(
        gemm_ex(h, 0, 2, 1, 0, 1, 0, 1, 0, 1, 1.0, 0.0, COMPUTE_32F),
        CUBLAS_STATUS_SUCCESS
    );
    assert_eq!(cuStreamSynchronize(null_mut()), CUDA_SUCCESS);
}

#[test]
fn arguments_are_checked_as_cublas_does() {
    let h = handle();
    let a = f32s(&[1.0; 16]);
    let ok = |s| assert_eq!(s, CUBLAS_STATUS_SUCCESS);
    ok(gemm_ex(h, 2, 2, 2, a, 2, a, 2, a, 2, 1.0, 0.0, COMPUTE_32F));
    // Leading dimensions below the minimum.
    assert_eq!(
        gemm_ex(h, 3, 2, 2, a, 2, a, 2, a, 3, 1.0, 0.0, COMPUTE_32F),
        CUBLAS_STATUS_INVALID_VALUE
    );
    assert_eq!(
        gemm_ex(h, 2, 2, 3, a, 2, a, 2, a, 2, 1.0, 0.0, COMPUTE_32F),
        CUBLAS_STATUS_INVALID_VALUE
    );
    assert_eq!(
        gemm_ex(h, 2, 2, 2, a, 2, a, 2, a, 1, 1.0, 0.0, COMPUTE_32F),
        CUBLAS_STATUS_INVALID_VALUE
    );
    assert_eq!(
        gemm_ex(h, 0, 0, 0, a, 0, a, 1, a, 1, 1.0, 0.0, COMPUTE_32F),
        CUBLAS_STATUS_INVALID_VALUE
    );
    assert_eq!(
        gemm_ex(h, -1, 2, 2, a, 2, a, 2, a, 2, 1.0, 0.0, COMPUTE_32F),
        CUBLAS_STATUS_INVALID_VALUE
    );
    let (one, zero) = (1.0f32, 0.0f32);
    let batched = |count, ta: u32, lda| unsafe {
        cublasSgemmStridedBatched(
            h,
            ta,
            0,
            2,
            2,
            2,
            &one,
            a as *const f32,
            lda,
            4,
            a as *const f32,
            2,
            4,
            &zero,
            a as *mut f32,
            2,
            4,
            count,
        )
    };
    assert_eq!(batched(-1, 0, 2), CUBLAS_STATUS_INVALID_VALUE);
    assert_eq!(batched(2, 5, 2), CUBLAS_STATUS_INVALID_VALUE);
    ok(batched(4, 0, 2));
    // 5 batches of stride 4 run past the 16 elements.
    assert_eq!(batched(5, 0, 2), CUBLAS_STATUS_EXECUTION_FAILED);
    // Unsupported combinations.
    let mixed = unsafe {
        cublasGemmEx(
            h,
            0,
            0,
            2,
            2,
            2,
            (&one as *const f32).cast(),
            a as *const c_void,
            R_32F,
            2,
            a as *const c_void,
            R_32F,
            2,
            (&zero as *const f32).cast(),
            a as *mut c_void,
            R_16F,
            2,
            COMPUTE_32F,
            -1,
        )
    };
    assert_eq!(mixed, CUBLAS_STATUS_NOT_SUPPORTED);
    assert_eq!(
        gemm_ex(h, 2, 2, 2, a, 2, a, 2, a, 2, 1.0, 0.0, 64),
        CUBLAS_STATUS_NOT_SUPPORTED
    );
    // A host pointer as an operand.
    let host = [1.0f32; 4];
    let hp = host.as_ptr() as u64;
    assert_eq!(
        gemm_ex(h, 2, 2, 2, hp, 2, a, 2, a, 2, 1.0, 0.0, COMPUTE_32F),
        CUBLAS_STATUS_EXECUTION_FAILED
    );
    // Destroyed and bogus handles.
    assert_eq!(cublasDestroy_v2(h), CUBLAS_STATUS_SUCCESS);
    assert_eq!(
        gemm_ex(h, 2, 2, 2, a, 2, a, 2, a, 2, 1.0, 0.0, COMPUTE_32F),
        CUBLAS_STATUS_NOT_INITIALIZED
    );
    assert_eq!(cublasDestroy_v2(h), CUBLAS_STATUS_NOT_INITIALIZED);
    assert_eq!(
        cublasSetStream_v2(0x99 as CublasHandle, null_mut()),
        CUBLAS_STATUS_NOT_INITIALIZED
    );
    // No context on this thread: no handle.
    std::thread::spawn(|| unsafe {
        let mut h2 = null_mut();
        assert_eq!(cublasCreate_v2(&mut h2), CUBLAS_STATUS_NOT_INITIALIZED);
    })
    .join()
    .unwrap();
}

#[test]
fn streams_and_the_sanitizer_see_gemms() {
    let h = handle();
    unsafe {
        let mut s = null_mut();
        assert_eq!(cuStreamCreate(&mut s, 0), CUDA_SUCCESS);
        assert_eq!(cublasSetStream_v2(h, s), CUBLAS_STATUS_SUCCESS);
        let mut got = null_mut();
        assert_eq!(cublasGetStream_v2(h, &mut got), CUBLAS_STATUS_SUCCESS);
        assert_eq!(got, s);
        assert_eq!(
            cublasSetStream_v2(h, 0x5555 as CUstream),
            CUBLAS_STATUS_INVALID_VALUE
        );
        // A never written: initcheck, delivered at this thread's sync.
        let mut a = 0;
        assert_eq!(cuMemAllocAsync(&mut a, 16, s), CUDA_SUCCESS);
        assert_eq!(cuMemsetD8Async(a, 0, 12, s), CUDA_SUCCESS);
        let c = f32s(&[0.0; 4]);
        assert_eq!(
            gemm_ex(h, 2, 2, 2, a, 2, a, 2, c, 2, 1.0, 0.0, COMPUTE_32F),
            CUBLAS_STATUS_SUCCESS
        );
        let r = cuStreamSynchronize(s);
        assert_eq!(r, CUDA_ERROR_ILLEGAL_ADDRESS);
        let e = error_string(r);
        assert!(
            e.contains("cublasGemmEx") && e.contains("never written"),
            "{e}"
        );
        // An operand freed in stream order before the GEMM runs.
        let b = f32s(&[1.0; 4]);
        assert_eq!(cuMemFreeAsync(b, s), CUDA_SUCCESS);
        assert_eq!(
            gemm_ex(h, 2, 2, 2, b, 2, b, 2, c, 2, 1.0, 0.0, COMPUTE_32F),
            CUBLAS_STATUS_SUCCESS
        );
        assert_eq!(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
        assert!(error_string(CUDA_ERROR_ILLEGAL_ADDRESS).contains("use after free"));
        // The same with the free already run when the GEMM is enqueued (as
        // when another thread's sync runs it first): the same fault, at the
        // same place, whatever the timing.
        let b = f32s(&[1.0; 4]);
        assert_eq!(cuMemFree_v2(b), CUDA_SUCCESS);
        assert_eq!(
            gemm_ex(h, 2, 2, 2, b, 2, b, 2, c, 2, 1.0, 0.0, COMPUTE_32F),
            CUBLAS_STATUS_SUCCESS
        );
        assert_eq!(cuStreamSynchronize(s), CUDA_ERROR_ILLEGAL_ADDRESS);
        assert!(error_string(CUDA_ERROR_ILLEGAL_ADDRESS).contains("use after free"));
        assert_eq!(cublasDestroy_v2(h), CUBLAS_STATUS_SUCCESS);
        assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
    }
}

#[test]
fn double_precision_entry_points() {
    let h = handle();
    let up = |v: &[f64]| upload(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    // A = [[1,2],[3,4]] (column-major [1,3,2,4]), B = I, two batches: C = A, then 2A.
    let a = up(&[1.0, 3.0, 2.0, 4.0, 2.0, 6.0, 4.0, 8.0]);
    let b = up(&[1.0, 0.0, 0.0, 1.0]);
    let c = up(&[0.0; 8]);
    let (one, zero) = (1.0f64, 0.0f64);
    unsafe {
        let st = cublasDgemmStridedBatched(
            h,
            1,
            0,
            2,
            2,
            2,
            &one,
            a as *const f64,
            2,
            4,
            b as *const f64,
            2,
            0,
            &zero,
            c as *mut f64,
            2,
            4,
            2,
        );
        assert_eq!(st, CUBLAS_STATUS_SUCCESS);
        let got: Vec<f64> = download(c, 64)
            .chunks_exact(8)
            .map(|x| f64::from_le_bytes(x.try_into().unwrap()))
            .collect();
        // op(A) = Aᵀ.
        assert_eq!(got, [1.0, 2.0, 3.0, 4.0, 2.0, 4.0, 6.0, 8.0]);
        let st = cublasDgemm_v2(
            h,
            0,
            0,
            2,
            2,
            2,
            &one,
            a as *const f64,
            2,
            b as *const f64,
            2,
            &one,
            c as *mut f64,
            2,
        );
        assert_eq!(st, CUBLAS_STATUS_SUCCESS);
        let got: Vec<f64> = download(c, 32)
            .chunks_exact(8)
            .map(|x| f64::from_le_bytes(x.try_into().unwrap()))
            .collect();
        assert_eq!(got, [2.0, 5.0, 5.0, 8.0]);
    }
    assert_eq!(cublasDestroy_v2(h), CUBLAS_STATUS_SUCCESS);
}
