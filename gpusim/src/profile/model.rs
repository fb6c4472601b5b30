//! A performance model: a [`Profile`] turned into predicted time on a
//! named GPU.
//!
//! Per kernel launch, the largest of: DRAM bytes (the launch's distinct
//! 32-byte sectors) over the bandwidth the launch's SMs can draw; FLOPs
//! over the peak of the unit that runs them; SASS instructions (each PTX
//! class weighted by the instructions it expands to) over the issue rate
//! of the SMs the grid occupies, derated when too few warps are resident
//! to hide latency; shared-memory wavefronts over one per SM per cycle;
//! plus a fixed cost per launch. Per cuBLAS GEMM, the larger of the compute
//! time of the best tiling (128×128 down to 32×32 output tiles, each with
//! its efficiency) and split-K a library could pick, counted in whole
//! waves over the SMs, and the operand bytes over the bandwidth, plus a
//! fixed cost. The host and the device are two clocks:
//! each API call advances the host by its cost; device work starts when
//! both the host has issued it and the device is free; a synchronisation
//! or device-to-host copy makes the host wait for the device. The step's
//! time is when both are done.
//!
//! Every constant is in [`Gpu`] (the hardware, from the vendors' data
//! sheets) and [`Costs`] (fitted to the real-GPU measurements in
//! `benches/results/`, see `gpusim/tests/profile_model.rs`).

use super::{Event, GemmCompute, GemmRecord, GemmType, InstClass, LaunchRecord, Profile, CLASSES};

/// The hardware a prediction is for (dense peaks, from data sheets).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gpu {
    /// Name as `GPUSIM_PROFILE_GPU` and the tables give it.
    pub name: &'static str,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// SM clock under load, GHz.
    pub clock_ghz: f64,
    /// DRAM bandwidth, GB/s.
    pub dram_gbps: f64,
    /// f32 on the CUDA cores, TFLOP/s.
    pub f32_tflops: f64,
    /// f64 (CUDA cores), TFLOP/s.
    pub f64_tflops: f64,
    /// f16/bf16 on the CUDA cores, TFLOP/s.
    pub f16_tflops: f64,
    /// TF32 tensor cores (dense), TFLOP/s.
    pub tf32_tflops: f64,
    /// f16/bf16 tensor cores (dense), TFLOP/s.
    pub f16_tensor_tflops: f64,
    /// f64 tensor cores, TFLOP/s.
    pub f64_tensor_tflops: f64,
    /// Threads resident per SM at most.
    pub max_threads_per_sm: u32,
    /// Blocks resident per SM at most.
    pub max_blocks_per_sm: u32,
    /// Shared memory per SM, bytes.
    pub shared_per_sm: u32,
    /// NVLink bandwidth per direction between two GPUs, GB/s (what a NCCL
    /// operation's bytes cross).
    pub nvlink_gbps: f64,
}

/// NVIDIA H100 SXM5 (80 GB HBM3).
pub const H100_SXM: Gpu = Gpu {
    name: "h100",
    sms: 132,
    clock_ghz: 1.755,
    dram_gbps: 3350.0,
    f32_tflops: 67.0,
    f64_tflops: 34.0,
    f16_tflops: 134.0,
    tf32_tflops: 495.0,
    f16_tensor_tflops: 990.0,
    f64_tensor_tflops: 67.0,
    max_threads_per_sm: 2048,
    max_blocks_per_sm: 32,
    shared_per_sm: 228 * 1024,
    nvlink_gbps: 450.0,
};

/// NVIDIA H200 (141 GB HBM3e): the H100's SMs with faster memory.
pub const H200: Gpu = Gpu {
    name: "h200",
    dram_gbps: 4800.0,
    ..H100_SXM
};

impl Gpu {
    /// The GPU named `name` (`h100`, `h200`; case-insensitive).
    pub fn named(name: &str) -> Option<&'static Gpu> {
        match name.to_ascii_lowercase().as_str() {
            "h100" | "h100_sxm" | "h100-sxm" => Some(&H100_SXM),
            "h200" => Some(&H200),
            _ => None,
        }
    }
}

/// The model's fitted constants: software costs and efficiencies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Costs {
    /// Host time of one kernel launch (the program's own work for the op
    /// that launches it included), µs.
    pub host_launch_us: f64,
    /// Host time of one cuBLAS call, µs.
    pub host_gemm_us: f64,
    /// Host time of an allocation or a free from the pool, µs.
    pub host_alloc_us: f64,
    /// A synchronisation's round trip, µs.
    pub sync_us: f64,
    /// Fixed cost of a copy between host and device, µs.
    pub copy_latency_us: f64,
    /// Host↔device bandwidth of pageable copies, GB/s.
    pub copy_gbps: f64,
    /// Device time every kernel takes at least (launch latency, ramp and
    /// tail), µs.
    pub kernel_fixed_us: f64,
    /// Device time every GEMM takes at least, µs.
    pub gemm_fixed_us: f64,
    /// Fraction of the DRAM peak that streaming kernels reach.
    pub dram_efficiency: f64,
    /// DRAM bandwidth one SM can draw, GB/s.
    pub sm_dram_gbps: f64,
    /// Fraction of the unit's peak a GEMM's full waves reach.
    pub gemm_efficiency: f64,
    /// Warps per SM needed to issue at the full rate.
    pub warps_to_hide_latency: f64,
    /// SASS instructions per PTX warp-instruction of each class.
    pub sass_per_ptx: [f64; CLASSES],
}

/// The costs fitted to the measurements (see the module doc): a
/// coordinate search (`gpusim/tests/profile_model.rs`, `fit_costs`) over
/// the host's per-launch and per-GEMM costs, the synchronisation, the
/// fixed device costs and the GEMM efficiency, from first guesses of 4, 6,
/// 15, 2, 4 µs and 0.75 (which under-predicted every measured step by 7 to
/// 21%). The host's launch cost includes the program's own work per op.
pub const COSTS: Costs = Costs {
    host_launch_us: 12.5,
    host_gemm_us: 4.0,
    host_alloc_us: 1.0,
    sync_us: 6.0,
    copy_latency_us: 10.0,
    copy_gbps: 20.0,
    kernel_fixed_us: 4.25,
    gemm_fixed_us: 4.6,
    dram_efficiency: 0.85,
    sm_dram_gbps: 60.0,
    gemm_efficiency: 0.64,
    warps_to_hide_latency: 16.0,
    // f32 f64 f16 int int_div_rem float_div_sqrt transcendental convert
    // tensor_core shared global control
    sass_per_ptx: [1.0, 2.0, 1.0, 1.5, 40.0, 12.0, 4.0, 1.5, 1.0, 1.0, 1.0, 1.0],
};

/// What limits one piece of device work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bound {
    /// DRAM bandwidth.
    Dram,
    /// Floating-point throughput.
    Flops,
    /// Instruction issue.
    Issue,
    /// Shared-memory wavefronts.
    Shared,
    /// The fixed per-launch cost (the work itself is smaller).
    Latency,
}

impl Bound {
    /// Short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Bound::Dram => "dram",
            Bound::Flops => "flops",
            Bound::Issue => "issue",
            Bound::Shared => "shared",
            Bound::Latency => "latency",
        }
    }
}

/// Predicted device time of one launch, µs, and what bounds it.
pub fn launch_us(l: &LaunchRecord, gpu: &Gpu, costs: &Costs) -> (f64, Bound) {
    let c = &l.counters;
    let threads = l.threads_per_block().max(1);
    let warps_per_block = threads.div_ceil(32) as f64;
    let by_threads = (gpu.max_threads_per_sm as u64 / threads).max(1);
    let by_shared = gpu
        .shared_per_sm
        .checked_div(l.shared_bytes)
        .map_or(u64::MAX, |b| b.max(1) as u64);
    let per_sm_max = by_threads.min(by_shared).min(gpu.max_blocks_per_sm as u64);
    let blocks = l.blocks().max(1);
    let active_sms = blocks.min(gpu.sms as u64) as f64;
    let resident_blocks = (blocks as f64 / active_sms).ceil().min(per_sm_max as f64);
    let warps = resident_blocks * warps_per_block;
    let hide = (warps / costs.warps_to_hide_latency).min(1.0);
    let clock = gpu.clock_ghz * 1e3; // cycles per µs
    let sass: f64 = (0..CLASSES)
        .map(|i| c.warp_instructions[i] as f64 * costs.sass_per_ptx[i])
        .sum();
    let issue = sass / (active_sms * 4.0 * hide * clock);
    let shared = c.shared_wavefronts as f64 / (active_sms * clock);
    let bandwidth = (gpu.dram_gbps * costs.dram_efficiency).min(active_sms * costs.sm_dram_gbps);
    let dram = c.unique_sectors as f64 * 32.0 / (bandwidth * 1e3);
    let share = active_sms / gpu.sms as f64;
    let flops = [
        (InstClass::F32, gpu.f32_tflops),
        (InstClass::FloatDivSqrt, gpu.f32_tflops),
        (InstClass::F64, gpu.f64_tflops),
        (InstClass::F16, gpu.f16_tflops),
        (InstClass::TensorCore, gpu.f16_tensor_tflops),
    ]
    .iter()
    .map(|(class, peak)| c.flops[class.index()] as f64 / (peak * share * 1e6))
    .sum::<f64>();
    let (work, bound) = [
        (dram, Bound::Dram),
        (flops, Bound::Flops),
        (issue, Bound::Issue),
        (shared, Bound::Shared),
    ]
    .into_iter()
    .fold((0.0, Bound::Latency), |a, b| if b.0 > a.0 { b } else { a });
    let bound = if work < costs.kernel_fixed_us {
        Bound::Latency
    } else {
        bound
    };
    (work + costs.kernel_fixed_us, bound)
}

/// The output tiles a GEMM library chooses among (rows, columns) and the
/// fraction of an SM's peak each reaches on a full wave (smaller tiles
/// reuse less of what they load).
const GEMM_TILES: [(u64, u64, f64); 4] = [
    (128, 128, 1.0),
    (128, 64, 0.85),
    (64, 64, 0.6),
    (32, 32, 0.3),
];

/// Splits of the contracted dimension a GEMM library may use when the
/// output has too few tiles to fill the GPU (split-K).
const GEMM_SPLITS: [u64; 6] = [1, 2, 4, 8, 16, 32];

/// The fastest of the tilings and split-K choices a GEMM library picks
/// from: each wave of tiles takes one tile's work at one SM's share of
/// `peak` (TFLOP/s), a split's partial sums cost one more pass over C.
fn gemm_compute_us(g: &GemmRecord, gpu: &Gpu, costs: &Costs, peak: f64) -> f64 {
    let per_sm = peak * 1e6 / gpu.sms as f64 * costs.gemm_efficiency; // FLOP per µs
    let mut best = f64::INFINITY;
    for (tm, tn, eff) in GEMM_TILES {
        for split in GEMM_SPLITS {
            let k = g.k.div_ceil(split);
            if split > 1 && k < 128 {
                break;
            }
            let tiles = g.m.div_ceil(tm) * g.n.div_ceil(tn) * g.batch * split;
            let waves = tiles.div_ceil(gpu.sms as u64).max(1);
            let tile_us = 2.0 * (tm * tn * k) as f64 / (per_sm * eff);
            let reduce_us = if split > 1 {
                (g.m * g.n * g.batch * 4 * split) as f64
                    / (gpu.dram_gbps * costs.dram_efficiency * 1e3)
            } else {
                0.0
            };
            best = best.min(waves as f64 * tile_us + reduce_us);
        }
    }
    best
}

/// Predicted device time of one GEMM, µs, and what bounds it: the best
/// tiling and split-K (`gemm_compute_us`) or the operands' DRAM bytes.
pub fn gemm_us(g: &GemmRecord, gpu: &Gpu, costs: &Costs) -> (f64, Bound) {
    let peak = match (g.compute, g.ab_type) {
        (GemmCompute::F64, _) => gpu.f64_tensor_tflops,
        (GemmCompute::Tf32, GemmType::F32) => gpu.tf32_tflops,
        (_, GemmType::F16 | GemmType::Bf16) => gpu.f16_tensor_tflops,
        _ => gpu.f32_tflops,
    };
    let compute = gemm_compute_us(g, gpu, costs, peak);
    let bytes =
        ((g.m * g.k + g.k * g.n) * g.ab_type.bytes() + g.m * g.n * g.c_type.bytes()) * g.batch;
    let dram = bytes as f64 / (gpu.dram_gbps * costs.dram_efficiency * 1e3);
    let (work, bound) = if compute >= dram {
        (compute, Bound::Flops)
    } else {
        (dram, Bound::Dram)
    };
    let bound = if work < costs.gemm_fixed_us {
        Bound::Latency
    } else {
        bound
    };
    (work + costs.gemm_fixed_us, bound)
}

/// A profile's predicted time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Prediction {
    /// Wall time from the first event to the last, host and device both
    /// done, µs.
    pub total_us: f64,
    /// Device time in kernels, µs.
    pub kernels_us: f64,
    /// Device time in GEMMs, µs.
    pub gemms_us: f64,
    /// Device time in copies and memsets, µs.
    pub copies_us: f64,
    /// Device time in NCCL operations, µs (not fitted: a kernel's fixed
    /// cost plus twice the bytes over NVLink, a ring all-reduce's traffic).
    pub collectives_us: f64,
    /// Time the device sat idle waiting for the host, µs.
    pub device_idle_us: f64,
    /// Device time per launch record (index as [`Profile::launches`]),
    /// summed over its launches, µs.
    pub per_launch_us: Vec<f64>,
    /// Device time per GEMM record, summed over its calls, µs.
    pub per_gemm_us: Vec<f64>,
}

/// The host and device clocks of [`predict`].
struct Clocks {
    host: f64,
    device: f64,
    idle: f64,
}

impl Clocks {
    /// The host spends `host_us` issuing device work of `device_us`.
    fn issue(&mut self, host_us: f64, device_us: f64) {
        self.host += host_us;
        if self.host > self.device {
            self.idle += self.host - self.device;
            self.device = self.host;
        }
        self.device += device_us;
    }

    /// The host waits for the device, then spends `after_us`.
    fn wait(&mut self, after_us: f64) {
        self.host = self.host.max(self.device) + after_us;
        self.device = self.device.max(self.host);
    }
}

/// Predicts `p` on `gpu` with the fitted [`COSTS`].
pub fn predict(p: &Profile, gpu: &Gpu) -> Prediction {
    predict_with(p, gpu, &COSTS)
}

/// Predicts `p` on `gpu` with `costs`.
pub fn predict_with(p: &Profile, gpu: &Gpu, costs: &Costs) -> Prediction {
    let launch: Vec<f64> = p
        .launches
        .iter()
        .map(|l| launch_us(l, gpu, costs).0)
        .collect();
    let gemm: Vec<f64> = p.gemms.iter().map(|g| gemm_us(g, gpu, costs).0).collect();
    let mut out = Prediction {
        per_launch_us: vec![0.0; p.launches.len()],
        per_gemm_us: vec![0.0; p.gemms.len()],
        ..Prediction::default()
    };
    let mut t = Clocks {
        host: 0.0,
        device: 0.0,
        idle: 0.0,
    };
    let copy = |bytes: u64| costs.copy_latency_us + bytes as f64 / (costs.copy_gbps * 1e3);
    let on_device = |bytes: u64| {
        costs.kernel_fixed_us + bytes as f64 / (gpu.dram_gbps * costs.dram_efficiency * 1e3)
    };
    for e in &p.events {
        match *e {
            Event::Launch(i) => {
                let us = launch[i as usize];
                out.per_launch_us[i as usize] += us;
                out.kernels_us += us;
                t.issue(costs.host_launch_us, us);
            }
            Event::Gemm(i) => {
                let us = gemm[i as usize];
                out.per_gemm_us[i as usize] += us;
                out.gemms_us += us;
                t.issue(costs.host_gemm_us, us);
            }
            Event::Sync(_) => t.wait(costs.sync_us),
            Event::DtoH(bytes) => {
                t.wait(copy(bytes));
                out.copies_us += copy(bytes);
            }
            Event::HtoD(bytes) => {
                // A pageable copy: the host stages it, the device takes it.
                t.issue(copy(bytes), 0.0);
                out.copies_us += copy(bytes);
            }
            Event::DtoD(bytes) | Event::Memset(bytes) => {
                let us = on_device(2 * bytes);
                out.copies_us += us;
                t.issue(costs.host_launch_us, us);
            }
            Event::Alloc(_) | Event::Free(_) => t.host += costs.host_alloc_us,
            Event::Collective(_, bytes) => {
                let us = costs.kernel_fixed_us + 2.0 * bytes as f64 / (gpu.nvlink_gbps * 1e3);
                out.collectives_us += us;
                t.issue(costs.host_launch_us, us);
            }
        }
    }
    out.total_us = t.host.max(t.device);
    out.device_idle_us = t.idle;
    out
}

#[cfg(test)]
mod tests {
    use super::super::{LaunchCounters, SyncKind};
    use super::*;

    fn streaming_launch(bytes: u64) -> LaunchRecord {
        let mut counters = LaunchCounters {
            unique_sectors: bytes / 32,
            ..LaunchCounters::default()
        };
        counters.warp_instructions[InstClass::Int.index()] = bytes / 128;
        LaunchRecord {
            kernel: 0,
            grid: [65535, 1, 1],
            block: [256, 1, 1],
            shared_bytes: 0,
            counters,
        }
    }

    #[test]
    fn a_large_copy_kernel_runs_at_the_bandwidth() {
        let l = streaming_launch(1 << 30);
        let (us, bound) = launch_us(&l, &H200, &COSTS);
        let gbps = (1u64 << 30) as f64 / ((us - COSTS.kernel_fixed_us) * 1e3);
        assert_eq!(bound, Bound::Dram);
        assert!(
            (gbps / (4800.0 * COSTS.dram_efficiency) - 1.0).abs() < 0.01,
            "{gbps}"
        );
        // The H100's slower memory takes longer.
        assert!(launch_us(&l, &H100_SXM, &COSTS).0 > us * 1.3);
    }

    #[test]
    fn tiny_work_costs_the_fixed_latency() {
        let l = streaming_launch(4096);
        let (us, bound) = launch_us(&l, &H200, &COSTS);
        assert_eq!(bound, Bound::Latency);
        assert!((us - COSTS.kernel_fixed_us).abs() < 0.1);
    }

    #[test]
    fn a_big_gemm_runs_near_the_peak_and_small_ones_waste_waves() {
        let g = |m, n, k, compute| GemmRecord {
            entry: "cublasGemmEx".into(),
            transa: false,
            transb: false,
            m,
            n,
            k,
            batch: 1,
            ab_type: GemmType::F32,
            c_type: GemmType::F32,
            compute,
            ld: [m, k, m],
        };
        let big = g(4096, 4096, 4096, GemmCompute::F32);
        let (us, bound) = gemm_us(&big, &H200, &COSTS);
        let tflops = big.flops() as f64 / us / 1e6;
        assert_eq!(bound, Bound::Flops);
        assert!(tflops > 40.0 && tflops < 67.0, "{tflops}");
        let tf32 = gemm_us(&g(4096, 4096, 4096, GemmCompute::Tf32), &H200, &COSTS).0;
        assert!(us / tf32 > 5.0);
        // 133 tiles of 128×128: a second, nearly empty wave (or smaller
        // tiles, or split-K) costs far more than the one tile (0.8%) more
        // of work.
        let (a, _) = gemm_us(&g(128 * 133, 128, 4096, GemmCompute::F32), &H200, &COSTS);
        let (b, _) = gemm_us(&g(128 * 132, 128, 4096, GemmCompute::F32), &H200, &COSTS);
        assert!(a > 1.1 * b, "{a} vs {b}");
        // A tall contraction with few output tiles splits K.
        let thin = g(576, 64, 3136, GemmCompute::F32);
        let (t, _) = gemm_us(&thin, &H200, &COSTS);
        let no_split = 2.0 * (128.0 * 128.0 * 3136.0) / (67e6 / 132.0 * COSTS.gemm_efficiency);
        assert!(t < no_split / 2.0, "{t} vs {no_split}");
    }

    #[test]
    fn the_host_and_device_clocks_overlap_until_a_sync() {
        let mut p = Profile::new();
        p.kernels.push("k".into());
        p.launches.push(streaming_launch(1 << 30));
        let device = launch_us(&p.launches[0], &H200, &COSTS).0;
        // Ten long kernels: the device is the bottleneck.
        p.events = vec![Event::Launch(0); 10];
        p.events.push(Event::Sync(SyncKind::Stream));
        let long = predict(&p, &H200);
        let expected = COSTS.host_launch_us + 10.0 * device + COSTS.sync_us;
        assert!((long.total_us - expected).abs() < 1e-6);
        // A thousand tiny ones: the host's issue rate is.
        p.launches[0] = streaming_launch(4096);
        p.events = vec![Event::Launch(0); 1000];
        let short = predict(&p, &H200);
        assert!(short.total_us >= 1000.0 * COSTS.host_launch_us);
        assert!(short.device_idle_us > 0.0);
    }
}
