//! The profile of a simulated run: every kernel launch with what the
//! interpreter counted (instructions by class, FLOPs, global requests and
//! sectors, shared wavefronts), every cuBLAS call with its shape and types,
//! and every synchronisation, copy, allocation and free, in the order the
//! program made them.
//!
//! `GPUSIM_PROFILE=FILE.json` turns it on: at exit the profile is written
//! to `FILE.json` (`%p` in the name becomes the process id) and a summary
//! table, sorted by the time [`model`] predicts on the GPU named by
//! `GPUSIM_PROFILE_GPU` (default `h200`), is printed to stderr.
//! `GPUSIM_PROFILE_RANGE=api` records only between `cuProfilerStart` and
//! `cuProfilerStop` (as Nsight Systems' `--capture-range=cudaProfilerApi`).
//!
//! The file is compact: each distinct launch (kernel, shape, counters) and
//! each distinct GEMM is stored once, and the event list refers to them by
//! index.

pub mod counters;
pub mod ffi;
pub mod model;
mod record;
mod scale;
pub mod table;

pub use counters::{classify, Counting, FlopUnit, InstClass, LaunchCounters, CLASSES};
pub use record::{
    configure, enabled, fill_launch, record, record_gemm, register_exit_writer, reset, set_range,
    snapshot, start_launch,
};
pub use scale::extrapolate;

use serde::{Deserialize, Serialize};

/// The index of `item` in `table`, appending it when new (`index` maps
/// each stored item to its index): how a profile stores each distinct
/// launch, GEMM and kernel name once.
fn intern<T: Clone + Eq + std::hash::Hash>(
    index: &mut std::collections::HashMap<T, u32>,
    table: &mut Vec<T>,
    item: &T,
) -> u32 {
    *index.entry(item.clone()).or_insert_with(|| {
        table.push(item.clone());
        table.len() as u32 - 1
    })
}

/// The `format` field of a profile file.
pub const FORMAT: &str = "gpusim-profile";

/// One distinct launch: the kernel, its shape and what it did.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LaunchRecord {
    /// Index into [`Profile::kernels`].
    pub kernel: u32,
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Static plus dynamic shared memory per block, bytes.
    pub shared_bytes: u32,
    /// What the interpreter counted.
    pub counters: LaunchCounters,
}

impl LaunchRecord {
    /// Blocks in the grid.
    pub fn blocks(&self) -> u64 {
        self.grid.iter().map(|&g| g as u64).product()
    }

    /// Threads per block.
    pub fn threads_per_block(&self) -> u64 {
        self.block.iter().map(|&b| b as u64).product()
    }
}

/// Element types of GEMM operands, as the profile names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GemmType {
    /// f32.
    F32,
    /// f64.
    F64,
    /// f16.
    F16,
    /// bf16.
    Bf16,
}

impl GemmType {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            GemmType::F64 => 8,
            GemmType::F32 => 4,
            GemmType::F16 | GemmType::Bf16 => 2,
        }
    }
}

/// How a GEMM computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GemmCompute {
    /// f32 on the CUDA cores (or f32 accumulation of f16/bf16 inputs on
    /// tensor cores).
    F32,
    /// f32 inputs rounded to TF32 on tensor cores.
    Tf32,
    /// f64.
    F64,
}

/// One distinct cuBLAS GEMM call.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GemmRecord {
    /// The entry point (`cublasGemmEx`, `cublasSgemm_v2`, …).
    pub entry: String,
    /// op(A) = Aᵀ.
    pub transa: bool,
    /// op(B) = Bᵀ.
    pub transb: bool,
    /// Rows of C.
    pub m: u64,
    /// Columns of C.
    pub n: u64,
    /// The contracted size.
    pub k: u64,
    /// Batch count (1 for the unbatched calls).
    pub batch: u64,
    /// A's and B's element type.
    pub ab_type: GemmType,
    /// C's element type.
    pub c_type: GemmType,
    /// The compute mode (TF32 when the call or the math mode asks for it).
    pub compute: GemmCompute,
    /// Leading dimensions of A, B and C.
    pub ld: [u64; 3],
}

impl GemmRecord {
    /// Floating-point operations (2·m·n·k per batch item).
    pub fn flops(&self) -> u64 {
        2 * self.m * self.n * self.k * self.batch
    }
}

/// Which synchronisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncKind {
    /// `cuStreamSynchronize`.
    Stream,
    /// `cuCtxSynchronize`.
    Context,
    /// `cuEventSynchronize`.
    Event,
}

/// Which NCCL operation a [`Event::Collective`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveKind {
    /// `ncclAllReduce`.
    AllReduce,
    /// `ncclBroadcast`.
    Broadcast,
    /// `ncclReduce`.
    Reduce,
    /// `ncclAllGather`.
    AllGather,
    /// `ncclReduceScatter`.
    ReduceScatter,
    /// `ncclSend`.
    Send,
    /// `ncclRecv`.
    Recv,
}

/// One thing the program did, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// A kernel launch: index into [`Profile::launches`].
    Launch(u32),
    /// A cuBLAS GEMM: index into [`Profile::gemms`].
    Gemm(u32),
    /// A synchronisation.
    Sync(SyncKind),
    /// A host-to-device copy of this many bytes.
    HtoD(u64),
    /// A device-to-host copy (the host waits for it).
    DtoH(u64),
    /// A device-to-device copy.
    DtoD(u64),
    /// A memset.
    Memset(u64),
    /// An allocation.
    Alloc(u64),
    /// A free.
    Free(u64),
    /// One rank's NCCL operation, when enqueued on its stream (at
    /// `ncclGroupEnd` inside a group), with its bytes (the call's largest
    /// buffer).
    Collective(CollectiveKind, u64),
}

/// A whole profile, as written to `GPUSIM_PROFILE`'s file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// [`FORMAT`].
    pub format: String,
    /// Kernel names, indexed by [`LaunchRecord::kernel`].
    pub kernels: Vec<String>,
    /// Distinct launches.
    pub launches: Vec<LaunchRecord>,
    /// Distinct GEMMs.
    pub gemms: Vec<GemmRecord>,
    /// Everything, in the order the program did it.
    pub events: Vec<Event>,
}

/// How many of each kind of event a profile holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Kernel launches.
    pub launches: u64,
    /// cuBLAS calls.
    pub cublas_calls: u64,
    /// Synchronisations of any kind (stream, context, event).
    pub syncs: u64,
    /// Host-to-device copies.
    pub h2d: u64,
    /// Device-to-host copies.
    pub d2h: u64,
    /// Device-to-device copies.
    pub d2d: u64,
    /// Memsets.
    pub memsets: u64,
    /// Allocations.
    pub allocs: u64,
    /// Frees.
    pub frees: u64,
    /// Bytes copied host to device.
    pub h2d_bytes: u64,
    /// Bytes copied device to host.
    pub d2h_bytes: u64,
    /// NCCL operations (one per rank's call).
    #[serde(default)]
    pub collectives: u64,
    /// Their bytes.
    #[serde(default)]
    pub collective_bytes: u64,
}

impl Profile {
    /// An empty profile.
    pub fn new() -> Profile {
        Profile {
            format: FORMAT.to_string(),
            ..Profile::default()
        }
    }

    /// Counts of every kind of event.
    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for e in &self.events {
            match *e {
                Event::Launch(_) => c.launches += 1,
                Event::Gemm(_) => c.cublas_calls += 1,
                Event::Sync(_) => c.syncs += 1,
                Event::HtoD(b) => {
                    c.h2d += 1;
                    c.h2d_bytes += b;
                }
                Event::DtoH(b) => {
                    c.d2h += 1;
                    c.d2h_bytes += b;
                }
                Event::DtoD(_) => c.d2d += 1,
                Event::Memset(_) => c.memsets += 1,
                Event::Alloc(_) => c.allocs += 1,
                Event::Free(_) => c.frees += 1,
                Event::Collective(_, b) => {
                    c.collectives += 1;
                    c.collective_bytes += b;
                }
            }
        }
        c
    }

    /// How many events use each launch record and each GEMM record
    /// (indexed as [`Profile::launches`] and [`Profile::gemms`]).
    pub fn record_uses(&self) -> (Vec<u64>, Vec<u64>) {
        let mut launches = vec![0u64; self.launches.len()];
        let mut gemms = vec![0u64; self.gemms.len()];
        for e in &self.events {
            match *e {
                Event::Launch(i) => launches[i as usize] += 1,
                Event::Gemm(i) => gemms[i as usize] += 1,
                _ => {}
            }
        }
        (launches, gemms)
    }

    /// Launches per kernel name, most first.
    pub fn launches_by_kernel(&self) -> Vec<(String, u64)> {
        let mut n = vec![0u64; self.kernels.len()];
        for (l, uses) in self.launches.iter().zip(self.record_uses().0) {
            n[l.kernel as usize] += uses;
        }
        let mut v: Vec<(String, u64)> = self.kernels.iter().cloned().zip(n).collect();
        v.retain(|(_, n)| *n > 0);
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }

    /// Reads a profile file's JSON, checking its format.
    pub fn from_json(text: &str) -> Result<Profile, String> {
        let p: Profile = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if p.format != FORMAT {
            return Err(format!("not a {FORMAT} file (format `{}`)", p.format));
        }
        let bad_launch = p
            .launches
            .iter()
            .any(|l| l.kernel as usize >= p.kernels.len());
        let bad_event = p.events.iter().any(|e| match *e {
            Event::Launch(i) => i as usize >= p.launches.len(),
            Event::Gemm(i) => i as usize >= p.gemms.len(),
            _ => false,
        });
        if bad_launch || bad_event {
            return Err("an index past its table".into());
        }
        Ok(p)
    }

    /// The profile as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a profile serialises")
    }
}
