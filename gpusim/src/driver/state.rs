//! The simulator's global state behind one mutex: devices (memory, pool,
//! work queue, primary context), loaded modules, streams, cuBLAS handles,
//! NCCL communicators, and the faults waiting for the thread that enqueued
//! the faulting work. Running the queues is in `lock.rs`.

use super::config::Config;
use super::consts::*;
use super::errors::{fail, report, DResult, DrvErr};
use super::lock::SimLock;
use super::pool::Pool;
use crate::memory::{self, DeviceMemory};
use crate::ptx::{KernelId, LaunchDims, Module};
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard};
use std::thread::ThreadId;

/// Handles are `TAG | id`: opaque, never null, and never a valid host
/// pointer, so a handle of the wrong kind (or garbage) is recognised.
const TAG_MASK: u64 = 0xffff << 48;
/// Tag of context handles (`id` = device ordinal + 1).
pub const TAG_CTX: u64 = 0xc7c0 << 48;
/// Tag of stream handles.
pub const TAG_STREAM: u64 = 0x57e0 << 48;
/// Tag of module handles.
pub const TAG_MODULE: u64 = 0x30d0 << 48;
/// Tag of function handles.
pub const TAG_FUNCTION: u64 = 0xf0c0 << 48;
/// Tag of memory-pool handles (`id` = device ordinal + 1).
pub const TAG_POOL: u64 = 0x9000 << 48;
/// Tag of cuBLAS handles.
pub const TAG_BLAS: u64 = 0xb1a0 << 48;
/// Tag of event handles.
pub const TAG_EVENT: u64 = 0xe7e0 << 48;

/// The handle `tag | id` as a pointer.
pub fn handle(tag: u64, id: u64) -> *mut c_void {
    (tag | id) as *mut c_void
}

/// The id of handle `h` if it carries `tag`.
pub fn id_of(h: *const c_void, tag: u64) -> Option<u64> {
    let v = h as u64;
    (v & TAG_MASK == tag && v & !TAG_MASK != 0).then_some(v & !TAG_MASK)
}

thread_local! {
    /// The calling thread's current context (0: none).
    static CURRENT: Cell<u64> = const { Cell::new(0) };
}

/// The calling thread's current context handle (0: none).
pub fn current_ctx() -> u64 {
    CURRENT.with(|c| c.get())
}

/// Makes `ctx` (a context handle, or 0) current on the calling thread.
pub fn set_current_ctx(ctx: u64) {
    CURRENT.with(|c| c.set(ctx));
}

/// One device allocation made through the driver.
#[derive(Clone, Copy, Debug)]
pub struct Alloc {
    /// Bytes.
    pub size: u64,
    /// Made by `cuMemAllocAsync` (counted in the pool).
    pub from_pool: bool,
    /// A `cuMemFreeAsync` of it is queued.
    pub free_queued: bool,
}

/// A host closure run in stream order against the device memory
/// (cuBLAS GEMMs). Its error is delivered like a kernel fault.
pub type HostJob = Box<dyn FnOnce(&mut DeviceMemory) -> DResult<()> + Send>;

/// A queued kernel launch (parameters copied at enqueue).
pub struct LaunchJob {
    /// The module handle.
    pub module: u64,
    /// The kernel.
    pub kernel: KernelId,
    /// Its name, for messages.
    pub name: String,
    /// Grid and block.
    pub dims: LaunchDims,
    /// The bytes of each parameter.
    pub params: Vec<Vec<u8>>,
    /// The profile's event for this launch (when profiling).
    pub profile_slot: Option<usize>,
}

/// A queued operation.
pub enum Op {
    /// A kernel launch.
    Launch(Box<LaunchJob>),
    /// `cuMemsetD8Async`.
    Memset {
        /// Destination.
        dst: u64,
        /// Bytes.
        len: u64,
        /// The value.
        byte: u8,
    },
    /// `cuMemcpyHtoDAsync`: the host bytes, staged at enqueue.
    HtoD {
        /// Destination.
        dst: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// `cuMemcpyDtoDAsync`.
    DtoD {
        /// Destination.
        dst: u64,
        /// Source.
        src: u64,
        /// Bytes.
        len: u64,
    },
    /// `cuMemFreeAsync`.
    Free {
        /// The allocation.
        ptr: u64,
    },
    /// `cuEventRecord`: completes record number `generation` of `event`.
    Marker {
        /// The event handle.
        event: u64,
        /// Which record of the event this is.
        generation: u64,
    },
    /// Host work (a cuBLAS GEMM); `what` names it in messages.
    Host {
        /// What it is, for messages.
        what: String,
        /// The work.
        job: HostJob,
    },
    /// NCCL operations of one group (or one call) on this device's
    /// stream: run together with the other ranks' parts (`crate::nccl`).
    Nccl(Box<crate::nccl::Item>),
}

/// One queued item: which stream, which host thread enqueued it, what.
pub struct Work {
    /// Sequence number, unique in the simulator, increasing in enqueue
    /// order: names the item while the lock is released (`lock.rs`).
    pub id: u64,
    /// Stream key: 0 for the default stream, else the stream handle.
    pub stream: u64,
    /// The enqueuing thread (its faults are delivered to it).
    pub thread: ThreadId,
    /// The operation.
    pub op: Op,
}

/// One simulated device.
pub struct Device {
    /// The name `cuDeviceGetName` reports.
    pub name: String,
    /// Compute capability.
    pub compute: (i32, i32),
    /// Its memory.
    pub mem: DeviceMemory,
    /// The default memory pool.
    pub pool: Pool,
    /// Allocations made through the driver (module globals are not here).
    pub allocs: BTreeMap<u64, Alloc>,
    /// Work of every stream of the device, in enqueue order.
    pub queue: VecDeque<Work>,
    /// Retains of the primary context; 0 = no context.
    pub primary_refs: u32,
}

/// A loaded module.
pub struct ModuleEntry {
    /// The device it was loaded on.
    pub device: usize,
    /// The decoded module.
    pub module: Module,
}

/// A function handle's target.
#[derive(Clone, Copy, Debug)]
pub struct FunctionEntry {
    /// The module handle.
    pub module: u64,
    /// The kernel.
    pub kernel: KernelId,
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` once set (the
    /// opt-in above 48 KiB).
    pub max_dynamic_shared: Option<u32>,
}

/// A cuBLAS handle's settings.
#[derive(Clone, Copy, Debug)]
pub struct BlasEntry {
    /// Device of the context current at `cublasCreate`.
    pub device: usize,
    /// The stream handle set by `cublasSetStream` (0: default).
    pub stream: u64,
    /// `cublasMath_t`.
    pub math_mode: u32,
}

/// An event: its latest record, and when that record completed.
#[derive(Clone, Copy, Debug)]
pub struct EventEntry {
    /// `cuEventCreate` flags.
    pub flags: u32,
    /// Device of the latest record (`None`: never recorded).
    pub device: Option<usize>,
    /// Number of records so far.
    pub generation: u64,
    /// When the latest record ran (`None`: not yet).
    pub done: Option<std::time::Instant>,
}

/// Faults waiting for the thread that enqueued the faulting work.
#[derive(Default)]
pub struct Pending {
    /// The faults, first first.
    pub errors: Vec<DrvErr>,
    /// Operations of the thread skipped since the first fault.
    pub skipped: u64,
}

/// The whole simulator.
pub struct Sim {
    /// The devices.
    pub devices: Vec<Device>,
    /// Loaded modules by handle.
    pub modules: HashMap<u64, ModuleEntry>,
    /// Function handles.
    pub functions: HashMap<u64, FunctionEntry>,
    /// (module handle, kernel index) → function handle, so that a handle
    /// is made once.
    pub function_ids: HashMap<(u64, usize), u64>,
    /// Created streams → device.
    pub streams: HashMap<u64, usize>,
    /// cuBLAS handles.
    pub blas: HashMap<u64, BlasEntry>,
    /// Events.
    pub events: HashMap<u64, EventEntry>,
    /// Faults by enqueuing thread.
    pub pending: HashMap<ThreadId, Pending>,
    /// NCCL communicators, rendezvous and posted operations.
    pub nccl: crate::nccl::state::NcclState,
    next_id: u64,
    next_work: u64,
}

static SIM: Mutex<Option<Sim>> = Mutex::new(None);

/// The global state (a panic elsewhere does not make it unusable).
pub fn lock() -> MutexGuard<'static, Option<Sim>> {
    SIM.lock().unwrap_or_else(|e| e.into_inner())
}

/// The text of a panic payload.
pub fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

/// Runs the body of driver call `func` on the initialised simulator:
/// `CUDA_ERROR_NOT_INITIALIZED` before `cuInit`; an error is printed and
/// kept for `cuGetErrorString`; a panic becomes `CUDA_ERROR_UNKNOWN`.
pub fn api(func: &str, f: impl FnOnce(&mut SimLock) -> DResult<()>) -> CUresult {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let g = lock();
        if g.is_none() {
            return fail(CUDA_ERROR_NOT_INITIALIZED, "cuInit has not been called");
        }
        f(&mut SimLock::new(g))
    }));
    match r {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(e)) => report(func, e),
        Err(p) => report(
            func,
            DrvErr::new(
                CUDA_ERROR_UNKNOWN,
                format!("internal error (panic): {}", panic_text(&*p)),
            ),
        ),
    }
}

/// Creates the simulator from `config` unless it exists.
pub fn init(config: &Config) {
    let mut g = lock();
    if g.is_none() {
        *g = Some(Sim::new(config));
    }
}

impl Sim {
    /// A simulator with the devices of `config`, no contexts.
    pub fn new(config: &Config) -> Sim {
        Sim {
            devices: (0..config.devices)
                .map(|ordinal| Device {
                    name: "leangrad gpusim".to_string(),
                    compute: config.compute,
                    // A 2^44-byte address range per device, so a pointer
                    // of one device is foreign to every other.
                    mem: DeviceMemory::with_base(
                        memory::DEVICE_BASE + ((ordinal as u64) << 44),
                        config.memory_bytes,
                    ),
                    pool: Pool::new(),
                    allocs: BTreeMap::new(),
                    queue: VecDeque::new(),
                    primary_refs: 0,
                })
                .collect(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            function_ids: HashMap::new(),
            streams: HashMap::new(),
            blas: HashMap::new(),
            events: HashMap::new(),
            pending: HashMap::new(),
            nccl: crate::nccl::state::NcclState::new(config.nccl_timeout_ms),
            next_id: 1,
            next_work: 0,
        }
    }

    /// A fresh id for a handle.
    pub fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Device `ordinal`, or `CUDA_ERROR_INVALID_DEVICE`.
    pub fn device(&self, ordinal: CUdevice) -> DResult<usize> {
        match usize::try_from(ordinal) {
            Ok(d) if d < self.devices.len() => Ok(d),
            _ => fail(
                CUDA_ERROR_INVALID_DEVICE,
                format!(
                    "device {ordinal} does not exist ({} device(s); GPUSIM_DEVICE_COUNT sets the number)",
                    self.devices.len()
                ),
            ),
        }
    }

    /// The device of context handle `ctx` (retained), or why not.
    pub fn ctx_device(&self, ctx: u64) -> DResult<usize> {
        let d = match id_of(ctx as *const c_void, TAG_CTX) {
            Some(id) if (id as usize) <= self.devices.len() => id as usize - 1,
            _ => {
                return fail(
                    CUDA_ERROR_INVALID_CONTEXT,
                    format!("{ctx:#x} is not a context handle"),
                )
            }
        };
        if self.devices[d].primary_refs == 0 {
            return fail(
                CUDA_ERROR_INVALID_CONTEXT,
                format!(
                    "the primary context of device {d} was released (cuDevicePrimaryCtxRelease)"
                ),
            );
        }
        Ok(d)
    }

    /// The device of the calling thread's current context.
    pub fn current_device(&self) -> DResult<usize> {
        match current_ctx() {
            0 => fail(
                CUDA_ERROR_INVALID_CONTEXT,
                "no context is current on this thread (cuDevicePrimaryCtxRetain + cuCtxSetCurrent first)",
            ),
            c => self.ctx_device(c),
        }
    }

    /// The device and queue key of stream handle `h`: null, 1 (legacy) and
    /// 2 (per-thread) are the current context's default stream; a created
    /// stream must belong to the current context.
    pub fn stream(&self, h: *mut c_void) -> DResult<(usize, u64)> {
        let v = h as u64;
        if v <= CU_STREAM_PER_THREAD {
            return Ok((self.current_device()?, 0));
        }
        let Some(&dev) = self.streams.get(&v) else {
            return fail(
                CUDA_ERROR_INVALID_HANDLE,
                format!("{v:#x} is not a live stream handle"),
            );
        };
        let cur = self.current_device()?;
        if cur != dev {
            return fail(
                CUDA_ERROR_INVALID_HANDLE,
                format!("the stream belongs to the context of device {dev}, but the current context is device {cur}'s"),
            );
        }
        Ok((dev, v))
    }

    /// Appends `op` to the queue of `dev`, on stream key `stream`; returns
    /// the item's id.
    pub fn enqueue(&mut self, dev: usize, stream: u64, op: Op) -> u64 {
        self.next_work += 1;
        let id = self.next_work;
        self.devices[dev].queue.push_back(Work {
            id,
            stream,
            thread: std::thread::current().id(),
            op,
        });
        id
    }

    /// Checks that `[addr, addr + len)` lies in one live allocation of `dev`.
    pub fn check_range(&self, dev: usize, addr: u64, len: u64, what: &str) -> DResult<()> {
        if len == 0 {
            return Ok(());
        }
        self.devices[dev]
            .mem
            .find(addr, len)
            .map(|_| ())
            .map_err(|e| DrvErr::new(CUDA_ERROR_INVALID_VALUE, format!("{what}: {e}")))
    }

    /// The calling thread's first undelivered fault (all of them are then
    /// delivered; each was printed when found).
    pub fn deliver(&mut self) -> DResult<()> {
        let Some(p) = self.pending.remove(&std::thread::current().id()) else {
            return Ok(());
        };
        let Some(mut first) = p.errors.first().cloned() else {
            return Ok(());
        };
        let more = p.errors.len() - 1;
        if more > 0 || p.skipped > 0 {
            first.msg += &format!(
                " [{more} later fault(s) of this thread printed above; {} later operation(s) of this thread skipped]",
                p.skipped
            );
        }
        Err(first)
    }

    /// Frees allocation `ptr` of `dev` now.
    pub fn free_now(&mut self, dev: usize, ptr: u64) -> DResult<()> {
        let d = &mut self.devices[dev];
        let size = d
            .mem
            .free(ptr)
            .map_err(|e| DrvErr::new(CUDA_ERROR_INVALID_VALUE, e.to_string()))?;
        if let Some(a) = d.allocs.remove(&ptr) {
            if a.from_pool {
                d.pool.free(size);
            }
        }
        Ok(())
    }

    /// Runs one queued item (not a NCCL one: `lock.rs` hands those to
    /// `crate::nccl::exec`), recording its fault for the enqueuing thread.
    pub(crate) fn execute(&mut self, dev: usize, w: Work) {
        if let Op::Marker { event, generation } = w.op {
            if let Some(e) = self.events.get_mut(&event) {
                if e.generation == generation {
                    e.done = Some(std::time::Instant::now());
                }
            }
            return;
        }
        if let Op::Free { ptr } = w.op {
            // Frees run even after a fault, so that nothing leaks.
            if let Err(e) = self.free_now(dev, ptr) {
                self.fault(w.thread, "cuMemFreeAsync (queued)", e);
            }
            return;
        }
        if let Some(p) = self.pending.get_mut(&w.thread) {
            if !p.errors.is_empty() {
                p.skipped += 1;
                return;
            }
        }
        let mem = &mut self.devices[dev].mem;
        let ill =
            |e: crate::memory::MemError| DrvErr::new(CUDA_ERROR_ILLEGAL_ADDRESS, e.to_string());
        let (what, r) = match w.op {
            Op::Memset { dst, len, byte } => (
                "cuMemsetD8Async (queued)".to_string(),
                mem.fill(dst, len, byte).map_err(ill),
            ),
            Op::HtoD { dst, data } => (
                "cuMemcpyHtoDAsync (queued)".to_string(),
                mem.write(dst, &data).map_err(ill),
            ),
            Op::DtoD { dst, src, len } => (
                "cuMemcpyDtoDAsync (queued)".to_string(),
                mem.copy(dst, src, len).map_err(ill),
            ),
            Op::Host { what, job } => {
                let r = catch_unwind(AssertUnwindSafe(|| job(mem))).unwrap_or_else(|p| {
                    fail(
                        CUDA_ERROR_LAUNCH_FAILED,
                        format!("internal error (panic): {}", panic_text(&*p)),
                    )
                });
                (what, r)
            }
            Op::Launch(job) => {
                let what = format!(
                    "cuLaunchKernel {} grid ({},{},{}) block ({},{},{})",
                    job.name,
                    job.dims.grid[0],
                    job.dims.grid[1],
                    job.dims.grid[2],
                    job.dims.block[0],
                    job.dims.block[1],
                    job.dims.block[2]
                );
                let r = match self.modules.get(&job.module) {
                    Some(m) => super::stats::run_launch(&m.module, &job, mem),
                    None => fail(CUDA_ERROR_INVALID_HANDLE, "the module was unloaded"),
                };
                (what, r)
            }
            Op::Nccl(_) => (
                "NCCL operation".to_string(),
                fail(
                    CUDA_ERROR_UNKNOWN,
                    "internal error: a NCCL item reached the plain executor",
                ),
            ),
            Op::Free { .. } | Op::Marker { .. } => return,
        };
        if let Err(e) = r {
            self.fault(w.thread, &what, e);
        }
    }

    /// Records a fault of work enqueued by `thread`, printing it now.
    pub(crate) fn fault(&mut self, thread: ThreadId, what: &str, mut e: DrvErr) {
        e.msg = format!("gpusim: {what}: {}", e.msg);
        eprintln!("{} (enqueued by thread {thread:?})", e.msg);
        e.printed = true;
        self.pending.entry(thread).or_default().errors.push(e);
    }
}
