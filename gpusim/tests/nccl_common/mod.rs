//! Shared helpers of the NCCL tests: the machine's shape, binding a
//! thread to a device, device buffers, element encodings, ranks as
//! threads.
#![allow(dead_code)]

use leangrad_gpusim::driver::api_device::*;
use leangrad_gpusim::driver::api_memory::*;
use leangrad_gpusim::driver::consts::*;
use leangrad_gpusim::driver::errors::cuGetErrorString;
pub use leangrad_gpusim::nccl::coll::*;
pub use leangrad_gpusim::nccl::comm::*;
pub use leangrad_gpusim::nccl::group::*;
pub use leangrad_gpusim::nccl::*;
use std::ffi::CStr;
use std::ptr::null_mut;
use std::sync::{Mutex, MutexGuard, Once};

/// `ncclInt64`, `ncclFloat16`, `ncclFloat32`, `ncclBfloat16`.
pub const I64: u32 = 4;
pub const F16: u32 = 6;
pub const F32: u32 = 7;
pub const BF16: u32 = 9;
/// `ncclSum`, `ncclProd`, `ncclMax`, `ncclMin`, `ncclAvg`.
pub const SUM: u32 = 0;
pub const PROD: u32 = 1;
pub const MAX: u32 = 2;
pub const MIN: u32 = 3;
pub const AVG: u32 = 4;

/// Sets the machine's shape (read once, at the first `cuInit` of the
/// process) and initialises the driver.
pub fn init(devices: usize, timeout_ms: Option<u64>) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: set before any thread of this process reads the
        // environment (every test calls this first).
        unsafe {
            std::env::set_var("GPUSIM_DEVICE_COUNT", devices.to_string());
            std::env::set_var("GPUSIM_MEMORY_BYTES", "64M");
            if let Some(ms) = timeout_ms {
                std::env::set_var("GPUSIM_NCCL_TIMEOUT_MS", ms.to_string());
            }
        }
    });
    assert_eq!(cuInit(0), CUDA_SUCCESS);
}

/// The tests of a file share the devices, and collectives of different
/// communicators interleaved on one device's queue could deadlock (as
/// they could on a GPU): they run one at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Retains device `dev`'s primary context and makes it current on the
/// calling thread.
pub fn bind(dev: usize) {
    unsafe {
        let mut ctx = null_mut();
        assert_eq!(
            cuDevicePrimaryCtxRetain(&mut ctx, dev as CUdevice),
            CUDA_SUCCESS
        );
        assert_eq!(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    }
}

/// This thread's description of the last error `code`.
pub fn error_string(code: CUresult) -> String {
    let mut p = std::ptr::null();
    assert_eq!(unsafe { cuGetErrorString(code, &mut p) }, CUDA_SUCCESS);
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// `ncclGetErrorString(code)` (with this thread's detail).
pub fn nccl_error(code: NcclResult) -> String {
    unsafe { CStr::from_ptr(ncclGetErrorString(code)) }
        .to_string_lossy()
        .into_owned()
}

/// `n` unwritten bytes on the current device.
pub fn alloc(n: usize) -> u64 {
    let mut p = 0;
    assert_eq!(
        unsafe { cuMemAllocAsync(&mut p, n, null_mut()) },
        CUDA_SUCCESS
    );
    p
}

/// `bytes` copied to a new buffer of the current device.
pub fn upload(bytes: &[u8]) -> u64 {
    let p = alloc(bytes.len());
    let r = unsafe { cuMemcpyHtoDAsync_v2(p, bytes.as_ptr().cast(), bytes.len(), null_mut()) };
    assert_eq!(r, CUDA_SUCCESS);
    p
}

/// The `n` bytes at `p` of the current device, or the error the copy
/// returned (it synchronises the default stream).
pub fn try_read(p: u64, n: usize) -> Result<Vec<u8>, CUresult> {
    let mut v = vec![0u8; n];
    match unsafe { cuMemcpyDtoHAsync_v2(v.as_mut_ptr().cast(), p, n, null_mut()) } {
        CUDA_SUCCESS => Ok(v),
        r => Err(r),
    }
}

/// The `n` bytes at `p` of the current device.
pub fn read(p: u64, n: usize) -> Vec<u8> {
    try_read(p, n).unwrap_or_else(|r| panic!("read failed: {}", error_string(r)))
}

/// A fresh unique id.
pub fn unique_id() -> NcclUniqueId {
    let mut id = NcclUniqueId { internal: [0; 128] };
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, NCCL_SUCCESS);
    id
}

/// Joins rank `rank` of `n` under `id` on the current device.
pub fn init_rank(n: usize, id: NcclUniqueId, rank: usize) -> NcclComm {
    let mut comm = null_mut();
    let r = unsafe { ncclCommInitRank(&mut comm, n as i32, id, rank as i32) };
    assert_eq!(r, NCCL_SUCCESS, "{}", nccl_error(r));
    comm
}

/// Communicator handles may cross threads (the test joins them back).
#[derive(Clone, Copy)]
pub struct Comm(pub NcclComm);
unsafe impl Send for Comm {}

/// Runs `f(rank, comm)` on `n` threads, rank r bound to device r and
/// joined to one communicator; destroys the communicators; returns the
/// results by rank.
pub fn ranks_as_threads<T: Send>(n: usize, f: impl Fn(usize, NcclComm) -> T + Sync) -> Vec<T> {
    let id = unique_id();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let f = &f;
                s.spawn(move || {
                    bind(rank);
                    let comm = init_rank(n, id, rank);
                    let out = f(rank, comm);
                    assert_eq!(ncclCommDestroy(comm), NCCL_SUCCESS);
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Values as little-endian bytes.
pub trait Le: Copy {
    fn le(self) -> Vec<u8>;
}
macro_rules! le {
    ($($t:ty),*) => {$(
        impl Le for $t {
            fn le(self) -> Vec<u8> {
                self.to_le_bytes().to_vec()
            }
        }
    )*};
}
le!(f32, f64, i64, i32, u8, half::f16, half::bf16);

/// The bytes of `v`.
pub fn bytes<T: Le>(v: &[T]) -> Vec<u8> {
    v.iter().flat_map(|x| x.le()).collect()
}

/// Communicators over devices 0..n made at once by this thread.
pub fn init_all(n: usize) -> Vec<NcclComm> {
    let mut comms = vec![null_mut(); n];
    let devs: Vec<i32> = (0..n as i32).collect();
    let r = unsafe { ncclCommInitAll(comms.as_mut_ptr(), n as i32, devs.as_ptr()) };
    assert_eq!(r, NCCL_SUCCESS, "{}", nccl_error(r));
    comms
}

/// Runs `f(rank)` for every rank inside one group, bound to its device.
pub fn group(n: usize, mut f: impl FnMut(usize)) {
    assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
    for rank in 0..n {
        bind(rank);
        f(rank);
    }
    assert_eq!(ncclGroupEnd(), NCCL_SUCCESS);
}

/// Little-endian f32s.
pub fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Little-endian i64s.
pub fn i64s(b: &[u8]) -> Vec<i64> {
    b.chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
