//! Throughput of the simulated GPU's PTX interpreter on leangrad's own
//! kernels (compiled by the real NVRTC): thread-instructions per second on
//! one core, for an elementwise add, a strided unary map and a block
//! reduction with barriers. Needs libnvrtc and CUDA's headers (as
//! `tests/kernels_nvrtc.rs`); run with `cargo bench --bench gpusim_interp`.

use leangrad::cuda::nvrtc;
use leangrad_gpusim::memory::DeviceMemory;
use leangrad_gpusim::ptx::{self, LaunchDims, Module};
use std::time::Instant;

/// The kernels' `Strided` struct (kernels/common.cuh): rank, offset, 8
/// shape and 8 stride entries, all i64.
fn strided(shape: &[i64], strides: &[i64]) -> Vec<u8> {
    let mut words = [0i64; 18];
    words[0] = shape.len() as i64;
    words[2..2 + shape.len()].copy_from_slice(shape);
    words[10..10 + strides.len()].copy_from_slice(strides);
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn upload(mem: &mut DeviceMemory, values: &[f32]) -> u64 {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let p = mem.alloc(bytes.len() as u64).expect("alloc");
    mem.write(p, &bytes).expect("write");
    p
}

struct Workload {
    name: &'static str,
    file: &'static str,
    kernel: &'static str,
    grid: u32,
    params: Vec<Vec<u8>>,
}

fn main() {
    let mut mem = DeviceMemory::new(1 << 32);
    let n: i64 = 1 << 20;
    let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 1e-3).collect();
    let (a, b) = (upload(&mut mem, &x), upload(&mut mem, &x));
    let out = mem.alloc(4 * n as u64).expect("alloc");
    let le = |v: u64| v.to_le_bytes().to_vec();
    let contiguous = strided(&[n], &[1]);
    // A transposed 3-d view: every element's offset takes the division loop.
    let permuted = strided(&[64, 128, 128], &[1, 64 * 128, 64]);
    let (outer, inner) = (512i64, 2048i64);
    let workloads = [
        Workload {
            name: "binary add f32, 2^20 elements",
            file: "elementwise.cu",
            kernel: "binary_f32",
            grid: 4096,
            params: vec![
                0i32.to_le_bytes().to_vec(),
                0f64.to_le_bytes().to_vec(),
                n.to_le_bytes().to_vec(),
                le(out),
                le(a),
                contiguous.clone(),
                le(b),
                contiguous.clone(),
            ],
        },
        Workload {
            name: "unary exp f32, 2^20 elements, permuted rank-3 view",
            file: "elementwise.cu",
            kernel: "unary_f32",
            grid: 4096,
            params: vec![
                1i32.to_le_bytes().to_vec(),
                0f64.to_le_bytes().to_vec(),
                0f64.to_le_bytes().to_vec(),
                n.to_le_bytes().to_vec(),
                le(out),
                le(a),
                permuted,
            ],
        },
        Workload {
            name: "reduce sum f32, 512 rows of 2048 (bar.sync)",
            file: "reduce.cu",
            kernel: "reduce_f32",
            grid: outer as u32,
            params: vec![
                0i32.to_le_bytes().to_vec(),
                outer.to_le_bytes().to_vec(),
                inner.to_le_bytes().to_vec(),
                le(out),
                le(a),
                contiguous,
            ],
        },
    ];
    let mut rows = Vec::new();
    for w in &workloads {
        let text = match nvrtc::compile(w.file, "compute_80") {
            Ok(t) => t,
            Err(e) => {
                eprintln!(
                    "gpusim_interp: cannot compile {} ({e}); nothing measured",
                    w.file
                );
                return;
            }
        };
        let module = Module::load(&text, &mut mem).expect("PTX loads");
        let k = module.kernel(w.kernel).expect("kernel exists");
        let dims = LaunchDims {
            grid: [w.grid, 1, 1],
            block: [256, 1, 1],
            dynamic_shared_bytes: 0,
        };
        let params: Vec<&[u8]> = w.params.iter().map(|p| p.as_slice()).collect();
        ptx::launch(&module, k, &dims, &params, &mut mem).expect("warm-up launch");
        let mut times = Vec::new();
        let mut instr = 0;
        for _ in 0..5 {
            let t = Instant::now();
            let stats = ptx::launch(&module, k, &dims, &params, &mut mem).expect("launch");
            times.push(t.elapsed().as_secs_f64());
            instr = stats.thread_instructions;
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let rate = instr as f64 / median;
        println!(
            "{:<55} {:>12} thread-instr  {:>8.1} ms  {:>6.2}e8 thread-instr/s",
            w.name,
            instr,
            median * 1e3,
            rate / 1e8
        );
        rows.push(format!(
            "{{\"workload\":\"{}\",\"thread_instructions\":{instr},\"seconds\":{median},\"per_second\":{rate}}}",
            w.name
        ));
        module.unload(&mut mem);
    }
    println!("[{}]", rows.join(","));
}
