//! GEMM throughput on the shapes of a ResNet-18 training step, in G
//! multiply-adds per second: `cargo run --release -p leangrad-gpusim
//! --example gemm_speed [reps]`.

use leangrad_gpusim::cublas::gemm::{Compute, Elem, Gemm};
use leangrad_gpusim::memory::DeviceMemory;
use std::time::Instant;

/// (m, n, k) of the step's largest GEMMs.
const SHAPES: &[(usize, usize, usize)] = &[
    (576, 64, 3136),
    (196, 256, 2304),
    (49, 512, 4608),
    (3136, 64, 576),
    (784, 1152, 128),
];

/// Type cases: name, A/B type, C type, compute.
const TYPES: &[(&str, Elem, Elem, Compute)] = &[
    ("f32", Elem::F32, Elem::F32, Compute::F32),
    ("tf32", Elem::F32, Elem::F32, Compute::Tf32),
    ("bf16>f32", Elem::Bf16, Elem::F32, Compute::F32),
    ("f64", Elem::F64, Elem::F64, Compute::F64),
];

/// `len` elements of type `t` with values in [-1, 1), deterministic.
fn bytes(len: usize, t: Elem, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len * t.size());
    for _ in 0..len {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let v = (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
        match t {
            Elem::F32 => out.extend((v as f32).to_le_bytes()),
            Elem::F64 => out.extend(v.to_le_bytes()),
            Elem::F16 => out.extend(half::f16::from_f64(v).to_le_bytes()),
            Elem::Bf16 => out.extend(half::bf16::from_f64(v).to_le_bytes()),
        }
    }
    out
}

fn main() {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let mut mem = DeviceMemory::new(1 << 32);
    for &(m, n, k) in SHAPES {
        for &(name, ab, ct, compute) in TYPES {
            let upload = |mem: &mut DeviceMemory, len: usize, t: Elem, seed: u64| {
                let p = mem.alloc((len * t.size()) as u64).unwrap();
                mem.write(p, &bytes(len, t, seed)).unwrap();
                p
            };
            let a = upload(&mut mem, m * k, ab, 1);
            let b = upload(&mut mem, k * n, ab, 2);
            let c = upload(&mut mem, m * n, ct, 3);
            let g = Gemm {
                transa: false,
                transb: false,
                m,
                n,
                k,
                alpha: 1.0,
                beta: 0.0,
                a,
                lda: m,
                stride_a: 0,
                b,
                ldb: k,
                stride_b: 0,
                c,
                ldc: m,
                stride_c: 0,
                batch: 1,
                ab,
                ct,
                compute,
            };
            let t0 = Instant::now();
            for _ in 0..reps {
                g.run(&mut mem).unwrap();
            }
            let s = t0.elapsed().as_secs_f64() / reps as f64;
            let gmacs = (m * n * k) as f64 / s / 1e9;
            println!(
                "{m:5} {n:5} {k:5} {name:9} {:8.1} ms {gmacs:7.2} GMAC/s",
                s * 1e3
            );
            for p in [a, b, c] {
                mem.free(p).unwrap();
            }
        }
    }
}
