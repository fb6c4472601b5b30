//! Process-wide counters of the work the simulator did (for throughput
//! figures), and the one-line summary printed at exit with GPUSIM_STATS=1.

use super::consts::*;
use super::errors::{DResult, DrvErr};
use super::state::{panic_text, LaunchJob};
use crate::memory::DeviceMemory;
use crate::ptx::{self, FaultKind, Module};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

static LAUNCHES: AtomicU64 = AtomicU64::new(0);
static THREAD_INSTRUCTIONS: AtomicU64 = AtomicU64::new(0);
static WARP_INSTRUCTIONS: AtomicU64 = AtomicU64::new(0);
static INTERP_NANOS: AtomicU64 = AtomicU64::new(0);
static GEMMS: AtomicU64 = AtomicU64::new(0);
static GEMM_MACS: AtomicU64 = AtomicU64::new(0);
static GEMM_NANOS: AtomicU64 = AtomicU64::new(0);
static COLLECTIVES: AtomicU64 = AtomicU64::new(0);
static COLLECTIVE_BYTES: AtomicU64 = AtomicU64::new(0);

/// Totals since the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Kernel launches run (faulting ones included).
    pub launches: u64,
    /// Instructions executed, summed over active lanes.
    pub thread_instructions: u64,
    /// Warp-instructions issued.
    pub warp_instructions: u64,
    /// Nanoseconds spent in the interpreter.
    pub interp_nanos: u64,
    /// cuBLAS GEMM calls run (a batched call counts once).
    pub gemms: u64,
    /// Multiply-adds of those GEMMs.
    pub gemm_macs: u64,
    /// Nanoseconds spent in GEMMs.
    pub gemm_nanos: u64,
    /// NCCL operations run, counted per rank (an all-reduce over 4 ranks
    /// counts 4, as 4 kernels would run).
    pub collectives: u64,
    /// Their bytes (each rank's call's largest buffer).
    pub collective_bytes: u64,
}

/// The counters now.
pub fn stats() -> Stats {
    Stats {
        launches: LAUNCHES.load(Relaxed),
        thread_instructions: THREAD_INSTRUCTIONS.load(Relaxed),
        warp_instructions: WARP_INSTRUCTIONS.load(Relaxed),
        interp_nanos: INTERP_NANOS.load(Relaxed),
        gemms: GEMMS.load(Relaxed),
        gemm_macs: GEMM_MACS.load(Relaxed),
        gemm_nanos: GEMM_NANOS.load(Relaxed),
        collectives: COLLECTIVES.load(Relaxed),
        collective_bytes: COLLECTIVE_BYTES.load(Relaxed),
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.interp_nanos as f64 * 1e-9;
        let rate = if secs > 0.0 {
            self.thread_instructions as f64 / secs
        } else {
            0.0
        };
        write!(
            f,
            "gpusim: {} launches, {} thread-instructions ({} warp-instructions) in {:.3} s of interpretation ({:.3e} thread-instructions/s); {} GEMMs, {} multiply-adds in {:.3} s",
            self.launches,
            self.thread_instructions,
            self.warp_instructions,
            secs,
            rate,
            self.gemms,
            self.gemm_macs,
            self.gemm_nanos as f64 * 1e-9
        )?;
        if self.collectives > 0 {
            write!(
                f,
                "; {} NCCL operations (per rank), {} bytes",
                self.collectives, self.collective_bytes
            )?;
        }
        Ok(())
    }
}

/// Counts one GEMM call of `macs` multiply-adds that took `nanos`.
pub fn count_gemm(macs: u64, nanos: u64) {
    GEMMS.fetch_add(1, Relaxed);
    GEMM_MACS.fetch_add(macs, Relaxed);
    GEMM_NANOS.fetch_add(nanos, Relaxed);
}

/// Counts one rank's NCCL operation of `bytes` that ran.
pub fn count_collective(bytes: u64) {
    COLLECTIVES.fetch_add(1, Relaxed);
    COLLECTIVE_BYTES.fetch_add(bytes, Relaxed);
}

/// The driver error of a kernel fault (see gpusim/README.md).
pub fn fault_code(kind: FaultKind) -> CUresult {
    match kind {
        FaultKind::OutOfBounds | FaultKind::Uninitialized => CUDA_ERROR_ILLEGAL_ADDRESS,
        FaultKind::Misaligned => CUDA_ERROR_MISALIGNED_ADDRESS,
        FaultKind::Unsupported => CUDA_ERROR_ILLEGAL_INSTRUCTION,
        FaultKind::Assert => CUDA_ERROR_ASSERT,
        FaultKind::SharedRace | FaultKind::DivergentBarrier | FaultKind::Trap => {
            CUDA_ERROR_LAUNCH_FAILED
        }
    }
}

/// Runs one queued launch on the interpreter, counting it.
pub fn run_launch(module: &Module, job: &LaunchJob, mem: &mut DeviceMemory) -> DResult<()> {
    let params: Vec<&[u8]> = job.params.iter().map(|p| p.as_slice()).collect();
    let t0 = Instant::now();
    let r = catch_unwind(AssertUnwindSafe(|| match job.profile_slot {
        None => ptx::launch(module, job.kernel, &job.dims, &params, mem).map(|s| (s, None)),
        Some(_) => ptx::launch_profiled(module, job.kernel, &job.dims, &params, mem)
            .map(|(s, c)| (s, Some(c))),
    }));
    INTERP_NANOS.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
    LAUNCHES.fetch_add(1, Relaxed);
    match r {
        Ok(Ok((s, counters))) => {
            THREAD_INSTRUCTIONS.fetch_add(s.thread_instructions, Relaxed);
            WARP_INSTRUCTIONS.fetch_add(s.warp_instructions, Relaxed);
            if let (Some(slot), Some(counters)) = (job.profile_slot, counters) {
                let shared_bytes =
                    module.static_shared_bytes(job.kernel) as u32 + job.dims.dynamic_shared_bytes;
                let record = crate::profile::LaunchRecord {
                    kernel: 0,
                    grid: job.dims.grid,
                    block: job.dims.block,
                    shared_bytes,
                    counters,
                };
                crate::profile::fill_launch(slot, &job.name, record);
            }
            Ok(())
        }
        Ok(Err(fault)) => Err(DrvErr::new(fault_code(fault.kind), fault.to_string())),
        Err(p) => Err(DrvErr::new(
            CUDA_ERROR_LAUNCH_FAILED,
            format!("the interpreter panicked: {}", panic_text(&*p)),
        )),
    }
}

extern "C" {
    fn atexit(cb: extern "C" fn()) -> i32;
}

extern "C" fn print_at_exit() {
    eprintln!("{}", stats());
}

/// With GPUSIM_STATS=1, prints the summary when the process exits
/// (registered once).
pub fn register_exit_summary() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    if std::env::var("GPUSIM_STATS").is_ok_and(|v| v == "1") {
        ONCE.call_once(|| {
            // SAFETY: registers a plain function with the C library; it
            // only reads atomics and writes to stderr.
            unsafe {
                atexit(print_at_exit);
            }
        });
    }
}
