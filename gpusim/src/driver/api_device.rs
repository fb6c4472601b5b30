//! Initialisation, devices, primary contexts and streams.

use super::config::Config;
use super::consts::*;
use super::errors::{fail, report, DrvErr};
use super::lock::SimLock;
use super::state::{self, api, handle, id_of, Device, Sim, TAG_CTX, TAG_STREAM};
use super::stats;
use crate::profile::{Event, SyncKind};
use std::ffi::{c_char, c_int, c_uint};

/// Writes `v` through `p`, or fails on a null output pointer.
macro_rules! out {
    ($p:expr, $v:expr) => {{
        if $p.is_null() {
            return fail(
                CUDA_ERROR_INVALID_VALUE,
                concat!(stringify!($p), " is null"),
            );
        }
        // SAFETY: the caller passed a writable, non-null pointer.
        unsafe { *$p = $v };
    }};
}
pub(crate) use out;

/// `cuInit`: creates the simulated devices (GPUSIM_DEVICE_COUNT,
/// GPUSIM_MEMORY_BYTES, GPUSIM_COMPUTE) on the first call.
#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    if flags != 0 {
        return report(
            "cuInit",
            DrvErr::new(
                CUDA_ERROR_INVALID_VALUE,
                format!("flags must be 0, got {flags}"),
            ),
        );
    }
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => return report("cuInit", DrvErr::new(CUDA_ERROR_INVALID_VALUE, e)),
    };
    state::init(&config);
    stats::register_exit_summary();
    crate::profile::register_exit_writer();
    api("cuInit", |sim| {
        if sim.devices.is_empty() {
            return fail(CUDA_ERROR_NO_DEVICE, "GPUSIM_DEVICE_COUNT=0: no device");
        }
        Ok(())
    })
}

/// `cuDriverGetVersion`: 13000 (CUDA 13.0). Needs no `cuInit`.
///
/// # Safety
/// `version` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    if version.is_null() {
        return report(
            "cuDriverGetVersion",
            DrvErr::new(CUDA_ERROR_INVALID_VALUE, "driverVersion is null"),
        );
    }
    *version = DRIVER_VERSION;
    CUDA_SUCCESS
}

/// `cuDeviceGetCount`.
///
/// # Safety
/// `count` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    api("cuDeviceGetCount", |sim| {
        out!(count, sim.devices.len() as c_int);
        Ok(())
    })
}

/// `cuDeviceGet`: the device handle is its ordinal.
///
/// # Safety
/// `device` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    api("cuDeviceGet", |sim| {
        let d = sim.device(ordinal)?;
        out!(device, d as CUdevice);
        Ok(())
    })
}

/// `cuDeviceGetName`: "leangrad gpusim", truncated to `len - 1` bytes.
///
/// # Safety
/// `name` must be null or hold `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    api("cuDeviceGetName", |sim| {
        let d = sim.device(dev)?;
        if name.is_null() || len <= 0 {
            return fail(CUDA_ERROR_INVALID_VALUE, "name is null or len <= 0");
        }
        let bytes = sim.devices[d].name.as_bytes();
        let n = bytes.len().min(len as usize - 1);
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), name.cast::<u8>(), n);
        *name.add(n) = 0;
        Ok(())
    })
}

/// The value of device attribute `attrib`, if the simulator knows it.
pub fn attribute(sim: &Sim, dev: &Device, attrib: u32) -> Option<i32> {
    Some(match attrib {
        1..=3 => MAX_THREADS_PER_BLOCK as i32, // threads per block, block x, y
        4 => 64,                               // block z
        5 => i32::MAX,                         // grid x
        6 | 7 => 65535,                        // grid y, z
        8 => MAX_SHARED_PER_BLOCK as i32,      // shared per block without opt-in
        97 => super::api_func::optin_shared_per_block(dev.compute) as i32, // opt-in maximum
        9 => 65536,                            // constant memory
        10 => 32,                              // warp size
        11 => i32::MAX,                        // max pitch
        12 | 82 => 65536,                      // registers per block / per SM
        13 => 1_410_000,                       // clock (kHz)
        14 => 512,                             // texture alignment
        15 => 0,                               // copy/kernel overlap: none, all in order
        16 => 108,                             // multiprocessors
        17..=20 => 0, // exec timeout, integrated, host mapping, compute mode default
        31 => 0,      // concurrent kernels: no, they run one at a time
        32 | 35 => 0, // ECC, TCC
        33 => dev_index(sim, dev) + 1, // PCI bus id
        34 => 0,      // PCI device id
        36 => 1_215_000, // memory clock (kHz)
        37 => 5120,   // memory bus width
        38 => 40 << 20, // L2 bytes
        39 => 2048,   // threads per SM
        40 => 0,      // async copy engines
        41 => i32::from(sim.devices.len() == 1), // unified addressing (see README)
        75 => dev.compute.0,
        76 => dev.compute.1,
        78 => 0, // stream priorities
        81 => super::api_func::shared_per_sm(dev.compute) as i32,
        83 | 88 | 89 => 0, // managed / pageable memory access
        84 => 0,           // multi-GPU board
        95 | 96 => 0,      // cooperative launch
        106 => 32,         // blocks per SM
        115 => 1,          // memory pools
        _ => return None,
    })
}

fn dev_index(sim: &Sim, dev: &Device) -> i32 {
    sim.devices
        .iter()
        .position(|d| std::ptr::eq(d, dev))
        .unwrap_or(0) as i32
}

/// `cuDeviceGetAttribute`: the attributes of [`attribute`]; any other is
/// `CUDA_ERROR_INVALID_VALUE` with a message.
///
/// # Safety
/// `pi` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: u32,
    dev: CUdevice,
) -> CUresult {
    api("cuDeviceGetAttribute", |sim| {
        let d = sim.device(dev)?;
        match attribute(sim, &sim.devices[d], attrib) {
            Some(v) => {
                out!(pi, v);
                Ok(())
            }
            None => fail(
                CUDA_ERROR_INVALID_VALUE,
                format!("device attribute {attrib} is not simulated"),
            ),
        }
    })
}

/// `cuDeviceTotalMem_v2`.
///
/// # Safety
/// `bytes` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    api("cuDeviceTotalMem_v2", |sim| {
        let d = sim.device(dev)?;
        out!(bytes, sim.devices[d].mem.capacity() as usize);
        Ok(())
    })
}

/// `cuDevicePrimaryCtxRetain`: the device's one context, reference counted.
///
/// # Safety
/// `pctx` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    api("cuDevicePrimaryCtxRetain", |sim| {
        let d = sim.device(dev)?;
        out!(pctx, handle(TAG_CTX, d as u64 + 1));
        sim.devices[d].primary_refs += 1;
        Ok(())
    })
}

/// `cuDevicePrimaryCtxRelease_v2`: the last release destroys the context's
/// resources, as the driver does: queued work runs, allocations are freed,
/// modules unloaded, streams destroyed.
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    api("cuDevicePrimaryCtxRelease_v2", |sim| {
        let d = sim.device(dev)?;
        if sim.devices[d].primary_refs == 0 {
            return fail(
                CUDA_ERROR_INVALID_CONTEXT,
                format!("device {d}'s primary context is not retained"),
            );
        }
        sim.devices[d].primary_refs -= 1;
        if sim.devices[d].primary_refs == 0 {
            reset_device(sim, d);
        }
        Ok(())
    })
}

/// Destroys everything the context of `d` owned.
fn reset_device(sim: &mut SimLock, d: usize) {
    sim.drain(d, None);
    let ptrs: Vec<u64> = sim.devices[d].allocs.keys().copied().collect();
    for p in ptrs {
        let _ = sim.free_now(d, p);
    }
    let mods: Vec<u64> = sim
        .modules
        .iter()
        .filter(|(_, m)| m.device == d)
        .map(|(&h, _)| h)
        .collect();
    for h in mods {
        super::api_module::unload(sim, h);
    }
    sim.streams.retain(|_, dev| *dev != d);
    sim.devices[d].pool.release_cache();
}

/// `cuCtxGetCurrent`: null when none.
///
/// # Safety
/// `pctx` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    api("cuCtxGetCurrent", |_| {
        out!(pctx, state::current_ctx() as CUcontext);
        Ok(())
    })
}

/// `cuCtxSetCurrent`: null unbinds.
#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    api("cuCtxSetCurrent", |sim| {
        if !ctx.is_null() {
            sim.ctx_device(ctx as u64)?;
        }
        state::set_current_ctx(ctx as u64);
        Ok(())
    })
}

/// `cuCtxGetDevice`.
///
/// # Safety
/// `device` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    api("cuCtxGetDevice", |sim| {
        let d = sim.current_device()?;
        out!(device, d as CUdevice);
        Ok(())
    })
}

/// `cuCtxSynchronize`: runs all queued work of the current context;
/// returns this thread's first undelivered fault.
#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    api("cuCtxSynchronize", |sim| {
        let d = sim.current_device()?;
        crate::profile::record(Event::Sync(SyncKind::Context));
        sim.sync(d, None)
    })
}

/// `cuStreamCreate` (flags 0 or CU_STREAM_NON_BLOCKING).
///
/// # Safety
/// `ph_stream` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(ph_stream: *mut CUstream, flags: c_uint) -> CUresult {
    api("cuStreamCreate", |sim| {
        if flags & !CU_STREAM_NON_BLOCKING != 0 {
            return fail(
                CUDA_ERROR_INVALID_VALUE,
                format!("unsupported flags {flags:#x}"),
            );
        }
        let d = sim.current_device()?;
        if ph_stream.is_null() {
            return fail(CUDA_ERROR_INVALID_VALUE, "phStream is null");
        }
        let h = handle(TAG_STREAM, sim.new_id());
        sim.streams.insert(h as u64, d);
        *ph_stream = h;
        Ok(())
    })
}

/// `cuStreamDestroy_v2`: its queued work still runs (now), as on the
/// driver where destroying does not cancel work.
#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> CUresult {
    api("cuStreamDestroy_v2", |sim| {
        if id_of(stream, TAG_STREAM).is_none() {
            return fail(
                CUDA_ERROR_INVALID_HANDLE,
                format!("{stream:p} is not a created stream"),
            );
        }
        let (d, key) = sim.stream(stream)?;
        sim.drain(d, Some(key));
        sim.streams.remove(&key);
        Ok(())
    })
}

/// `cuStreamSynchronize`: runs the device's queue up to the stream's last
/// item; returns this thread's first undelivered fault.
#[no_mangle]
pub extern "C" fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    api("cuStreamSynchronize", |sim| {
        let (d, key) = sim.stream(stream)?;
        crate::profile::record(Event::Sync(SyncKind::Stream));
        sim.sync(d, Some(key))
    })
}

/// `cuGetExportTable`: the driver's private tables of undocumented entry
/// points, which the simulator does not have. NVRTC asks for one when it
/// finds a libcuda (and compiles as usual after this error: without the
/// symbol at all it crashes). Returns `CUDA_ERROR_NOT_SUPPORTED` and a null
/// table; the detail is printed once per process, not at every compile.
///
/// # Safety
/// `table` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const std::ffi::c_void,
    _id: *const std::ffi::c_void,
) -> CUresult {
    static PRINTED: std::sync::Once = std::sync::Once::new();
    if !table.is_null() {
        // SAFETY: the caller passed a writable pointer.
        unsafe { *table = std::ptr::null() };
    }
    let e = DrvErr::new(
        CUDA_ERROR_NOT_SUPPORTED,
        "the driver's private export tables are not simulated",
    );
    let mut first = false;
    PRINTED.call_once(|| first = true);
    if first {
        report("cuGetExportTable", e)
    } else {
        CUDA_ERROR_NOT_SUPPORTED
    }
}

/// `cuProfilerStart`: with `GPUSIM_PROFILE_RANGE=api`, the profile records
/// from here (as Nsight Systems' `--capture-range=cudaProfilerApi`);
/// otherwise nothing.
#[no_mangle]
pub extern "C" fn cuProfilerStart() -> CUresult {
    crate::profile::set_range(true);
    CUDA_SUCCESS
}

/// `cuProfilerStop`: ends a range begun by [`cuProfilerStart`].
#[no_mangle]
pub extern "C" fn cuProfilerStop() -> CUresult {
    crate::profile::set_range(false);
    CUDA_SUCCESS
}
