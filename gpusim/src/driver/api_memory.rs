//! Device memory: allocation (plain and from the stream-ordered pool),
//! memsets and copies, synchronous and queued.

use super::api_device::out;
use super::consts::*;
use super::errors::{fail, DResult, DrvErr};
use super::lock::SimLock;
use super::state::{api, handle, id_of, Alloc, Op, Sim, TAG_POOL};
use crate::memory::DEVICE_BASE;
use crate::profile::{record, Event};
use std::ffi::{c_uchar, c_void};

/// Checks a host pointer: not null, and not a device address (device
/// memory lives above every host user-space address).
fn host_ptr(p: *const c_void, what: &str) -> DResult<()> {
    if p.is_null() {
        return fail(CUDA_ERROR_INVALID_VALUE, format!("{what} is null"));
    }
    if p as u64 >= DEVICE_BASE {
        return fail(
            CUDA_ERROR_INVALID_VALUE,
            format!(
                "{what} {:#x} is a device address, not host memory",
                p as u64
            ),
        );
    }
    Ok(())
}

/// Allocates `size` bytes on `dev`, from the pool or not. Cached pool
/// bytes are released, then queued work (pending frees) is run, before an
/// allocation is refused.
fn alloc(sim: &mut SimLock, dev: usize, size: u64, from_pool: bool) -> DResult<u64> {
    if size == 0 {
        return fail(CUDA_ERROR_INVALID_VALUE, "bytesize is 0");
    }
    let fits = |sim: &Sim| {
        let d = &sim.devices[dev];
        let cached = d.pool.cached();
        let new = if from_pool {
            size.saturating_sub(cached)
        } else {
            size
        };
        new <= d.mem.capacity().saturating_sub(d.mem.used() + cached)
    };
    if !fits(sim) {
        sim.devices[dev].pool.release_cache();
    }
    let mut r = sim.devices[dev].mem.alloc(size);
    if r.is_err() && !sim.devices[dev].queue.is_empty() {
        sim.drain(dev, None);
        sim.devices[dev].pool.release_cache();
        r = sim.devices[dev].mem.alloc(size);
    }
    let d = &mut sim.devices[dev];
    match r {
        Ok(p) => {
            d.allocs.insert(
                p,
                Alloc {
                    size,
                    from_pool,
                    free_queued: false,
                },
            );
            if from_pool {
                d.pool.alloc(size);
            }
            Ok(p)
        }
        Err(e) => fail(CUDA_ERROR_OUT_OF_MEMORY, format!("device {dev}: {e}")),
    }
}

/// `cuMemAlloc_v2`: a plain allocation in the current context.
///
/// # Safety
/// `dptr` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    api("cuMemAlloc_v2", |sim| {
        let d = sim.current_device()?;
        if dptr.is_null() {
            return fail(CUDA_ERROR_INVALID_VALUE, "dptr is null");
        }
        *dptr = alloc(sim, d, bytesize as u64, false)?;
        record(Event::Alloc(bytesize as u64));
        Ok(())
    })
}

/// `cuMemAllocAsync`: a pool allocation, usable at once (in stream order
/// it is available immediately).
///
/// # Safety
/// `dptr` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    api("cuMemAllocAsync", |sim| {
        let (d, _) = sim.stream(stream)?;
        if dptr.is_null() {
            return fail(CUDA_ERROR_INVALID_VALUE, "dptr is null");
        }
        *dptr = alloc(sim, d, bytesize as u64, true)?;
        record(Event::Alloc(bytesize as u64));
        Ok(())
    })
}

/// `cuMemFreeAsync`: queued; the bytes return to the pool's cache when the
/// stream reaches the free.
#[no_mangle]
pub extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    api("cuMemFreeAsync", |sim| {
        let (d, key) = sim.stream(stream)?;
        let dv = &mut sim.devices[d];
        match dv.allocs.get_mut(&dptr) {
            Some(a) if a.free_queued => fail(
                CUDA_ERROR_INVALID_VALUE,
                format!("{dptr:#x}: a free of this allocation is already queued (double free)"),
            ),
            Some(a) => {
                a.free_queued = true;
                record(Event::Free(a.size));
                sim.enqueue(d, key, Op::Free { ptr: dptr });
                Ok(())
            }
            None => fail(
                CUDA_ERROR_INVALID_VALUE,
                format!(
                    "free of {dptr:#x}, not the start of a live allocation: {}",
                    dv.mem.describe(dptr)
                ),
            ),
        }
    })
}

/// `cuMemFree_v2`: synchronous (runs queued work first).
#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    api("cuMemFree_v2", |sim| {
        let d = sim.current_device()?;
        sim.drain(d, None);
        if sim.devices[d]
            .allocs
            .get(&dptr)
            .is_some_and(|a| a.free_queued)
        {
            return fail(
                CUDA_ERROR_INVALID_VALUE,
                format!("{dptr:#x}: a free of this allocation is already queued (double free)"),
            );
        }
        if !sim.devices[d].allocs.contains_key(&dptr) {
            let place = sim.devices[d].mem.describe(dptr);
            return fail(
                CUDA_ERROR_INVALID_VALUE,
                format!("free of {dptr:#x}, not the start of a live allocation: {place}"),
            );
        }
        record(Event::Free(sim.devices[d].allocs[&dptr].size));
        sim.free_now(d, dptr)?;
        sim.deliver()
    })
}

/// `cuMemGetInfo_v2`: free = capacity − live allocations − the pool's
/// cached bytes.
///
/// # Safety
/// `free` and `total` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    api("cuMemGetInfo_v2", |sim| {
        let d = &sim.devices[sim.current_device()?];
        let cap = d.mem.capacity();
        out!(
            free,
            cap.saturating_sub(d.mem.used() + d.pool.cached()) as usize
        );
        out!(total, cap as usize);
        Ok(())
    })
}

/// `cuDeviceGetMemPool`: the device's default pool.
///
/// # Safety
/// `pool` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    api("cuDeviceGetMemPool", |sim| {
        let d = sim.device(dev)?;
        out!(pool, handle(TAG_POOL, d as u64 + 1));
        Ok(())
    })
}

fn pool_device(sim: &Sim, pool: CUmemoryPool) -> DResult<usize> {
    match id_of(pool, TAG_POOL) {
        Some(id) if (id as usize) <= sim.devices.len() => Ok(id as usize - 1),
        _ => fail(
            CUDA_ERROR_INVALID_VALUE,
            format!("{pool:p} is not a memory pool handle"),
        ),
    }
}

/// `cuMemPoolGetAttribute`: the counters of the pool model (README), the
/// release threshold and the reuse flags.
///
/// # Safety
/// `value` must point to an `int` (attributes 1–3) or a `cuuint64_t`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    attr: u32,
    value: *mut c_void,
) -> CUresult {
    api("cuMemPoolGetAttribute", |sim| {
        let p = &sim.devices[pool_device(sim, pool)?].pool;
        if value.is_null() {
            return fail(CUDA_ERROR_INVALID_VALUE, "value is null");
        }
        let v = match attr {
            1..=3 => {
                *value.cast::<i32>() = p.reuse[attr as usize - 1];
                return Ok(());
            }
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => p.release_threshold,
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => p.reserved,
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => p.reserved_high,
            CU_MEMPOOL_ATTR_USED_MEM_CURRENT => p.used,
            CU_MEMPOOL_ATTR_USED_MEM_HIGH => p.used_high,
            _ => {
                return fail(
                    CUDA_ERROR_INVALID_VALUE,
                    format!("pool attribute {attr} is not simulated"),
                )
            }
        };
        *value.cast::<u64>() = v;
        Ok(())
    })
}

/// `cuMemPoolSetAttribute`: reuse flags, the release threshold, and the
/// high-water marks (only 0, which resets them to the current value).
///
/// # Safety
/// `value` must point to an `int` (attributes 1–3) or a `cuuint64_t`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: u32,
    value: *mut c_void,
) -> CUresult {
    api("cuMemPoolSetAttribute", |sim| {
        let d = pool_device(sim, pool)?;
        if value.is_null() {
            return fail(CUDA_ERROR_INVALID_VALUE, "value is null");
        }
        let p = &mut sim.devices[d].pool;
        if (1..=3).contains(&attr) {
            p.reuse[attr as usize - 1] = *value.cast::<i32>();
            return Ok(());
        }
        let v = *value.cast::<u64>();
        match attr {
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => p.release_threshold = v,
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH | CU_MEMPOOL_ATTR_USED_MEM_HIGH if v != 0 => {
                return fail(
                    CUDA_ERROR_INVALID_VALUE,
                    format!("high-water attribute {attr} can only be reset (value 0), got {v}"),
                )
            }
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => p.reserved_high = p.reserved,
            CU_MEMPOOL_ATTR_USED_MEM_HIGH => p.used_high = p.used,
            _ => {
                return fail(
                    CUDA_ERROR_INVALID_VALUE,
                    format!("pool attribute {attr} cannot be set (or is not simulated)"),
                )
            }
        }
        Ok(())
    })
}

/// `cuMemsetD8Async`: queued.
#[no_mangle]
pub extern "C" fn cuMemsetD8Async(
    dst: CUdeviceptr,
    uc: c_uchar,
    n: usize,
    stream: CUstream,
) -> CUresult {
    api("cuMemsetD8Async", |sim| {
        let (d, key) = sim.stream(stream)?;
        sim.check_range(d, dst, n as u64, "destination")?;
        if n > 0 {
            record(Event::Memset(n as u64));
            sim.enqueue(
                d,
                key,
                Op::Memset {
                    dst,
                    len: n as u64,
                    byte: uc,
                },
            );
        }
        Ok(())
    })
}

/// `cuMemsetD8_v2`: synchronous.
#[no_mangle]
pub extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, uc: c_uchar, n: usize) -> CUresult {
    api("cuMemsetD8_v2", |sim| {
        let d = sim.current_device()?;
        sim.sync(d, None)?;
        sim.check_range(d, dst, n as u64, "destination")?;
        if n > 0 {
            record(Event::Memset(n as u64));
            sim.devices[d]
                .mem
                .fill(dst, n as u64, uc)
                .map_err(|e| DrvErr::new(CUDA_ERROR_INVALID_VALUE, e.to_string()))?;
        }
        Ok(())
    })
}

/// `cuMemcpyHtoDAsync_v2`: the host bytes are copied at the call (host
/// memory here is pageable), the device write is queued.
///
/// # Safety
/// `src` must hold `n` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    stream: CUstream,
) -> CUresult {
    api("cuMemcpyHtoDAsync_v2", |sim| {
        let (d, key) = sim.stream(stream)?;
        if n == 0 {
            return Ok(());
        }
        host_ptr(src, "srcHost")?;
        sim.check_range(d, dst, n as u64, "destination")?;
        let data = std::slice::from_raw_parts(src.cast::<u8>(), n).to_vec();
        record(Event::HtoD(n as u64));
        sim.enqueue(d, key, Op::HtoD { dst, data });
        Ok(())
    })
}

/// `cuMemcpyHtoD_v2`: synchronous.
///
/// # Safety
/// `src` must hold `n` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    api("cuMemcpyHtoD_v2", |sim| {
        let d = sim.current_device()?;
        sim.sync(d, None)?;
        if n == 0 {
            return Ok(());
        }
        host_ptr(src, "srcHost")?;
        sim.check_range(d, dst, n as u64, "destination")?;
        let data = std::slice::from_raw_parts(src.cast::<u8>(), n);
        record(Event::HtoD(n as u64));
        sim.devices[d]
            .mem
            .write(dst, data)
            .map_err(|e| DrvErr::new(CUDA_ERROR_INVALID_VALUE, e.to_string()))
    })
}

/// The first byte of `[off, off + n)` of `a` never written, checked one
/// shadow word (64 bytes) at a time.
fn first_unwritten(a: &crate::memory::Allocation, off: usize, n: usize) -> Option<usize> {
    let (mut start, end) = (off, off + n);
    while start < end {
        let stop = end.min((start / 64 + 1) * 64);
        if !a.is_written(start, stop - start) {
            return a.first_unwritten(start, stop - start);
        }
        start = stop;
    }
    None
}

/// Reads `n` bytes at `src` of `dev` into `dst` (host). Bytes never
/// written are copied (as zeros) with a warning on stderr: the sanitizer's
/// initcheck covers device reads, and a copy to the host is where a
/// never-written buffer becomes visible.
unsafe fn read_to_host(
    sim: &Sim,
    dev: usize,
    func: &str,
    dst: *mut c_void,
    src: u64,
    n: usize,
) -> DResult<()> {
    let mem = &sim.devices[dev].mem;
    let out = std::slice::from_raw_parts_mut(dst.cast::<u8>(), n);
    mem.read(src, out, false).map_err(|e| {
        DrvErr::new(
            CUDA_ERROR_ILLEGAL_ADDRESS,
            format!("source freed before the copy ran: {e}"),
        )
    })?;
    if let Ok(a) = mem.find(src, n as u64) {
        let off = (src - a.base) as usize;
        if let Some(i) = first_unwritten(a, off, n) {
            eprintln!(
                "gpusim: {func}: warning: copying {n} bytes at {src:#x} to the host, byte {i} of which ({:#x}) was never written: {}",
                src + (i - off) as u64,
                mem.describe(src + (i - off) as u64)
            );
        }
    }
    Ok(())
}

/// `cuMemcpyDtoHAsync_v2`: host memory is pageable, so (as the driver)
/// the copy is complete on return: the stream is drained first, and this
/// thread's undelivered fault, if any, is returned instead.
///
/// # Safety
/// `dst` must hold `n` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
) -> CUresult {
    api("cuMemcpyDtoHAsync_v2", |sim| {
        let (d, key) = sim.stream(stream)?;
        if n == 0 {
            return sim.sync(d, Some(key));
        }
        host_ptr(dst, "dstHost")?;
        sim.check_range(d, src, n as u64, "source")?;
        record(Event::DtoH(n as u64));
        sim.sync(d, Some(key))?;
        read_to_host(sim, d, "cuMemcpyDtoHAsync_v2", dst, src, n)
    })
}

/// `cuMemcpyDtoH_v2`: synchronous.
///
/// # Safety
/// `dst` must hold `n` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    api("cuMemcpyDtoH_v2", |sim| {
        let d = sim.current_device()?;
        sim.sync(d, None)?;
        if n == 0 {
            return Ok(());
        }
        host_ptr(dst, "dstHost")?;
        sim.check_range(d, src, n as u64, "source")?;
        record(Event::DtoH(n as u64));
        read_to_host(sim, d, "cuMemcpyDtoH_v2", dst, src, n)
    })
}

/// `cuMemcpyDtoDAsync_v2`: queued; the written-shadow travels with the
/// bytes.
#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
) -> CUresult {
    api("cuMemcpyDtoDAsync_v2", |sim| {
        let (d, key) = sim.stream(stream)?;
        sim.check_range(d, src, n as u64, "source")?;
        sim.check_range(d, dst, n as u64, "destination")?;
        if n > 0 {
            record(Event::DtoD(n as u64));
            sim.enqueue(
                d,
                key,
                Op::DtoD {
                    dst,
                    src,
                    len: n as u64,
                },
            );
        }
        Ok(())
    })
}

/// `cuMemcpyDtoD_v2`: synchronous.
#[no_mangle]
pub extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    api("cuMemcpyDtoD_v2", |sim| {
        let d = sim.current_device()?;
        sim.sync(d, None)?;
        sim.check_range(d, src, n as u64, "source")?;
        sim.check_range(d, dst, n as u64, "destination")?;
        if n > 0 {
            record(Event::DtoD(n as u64));
            sim.devices[d]
                .mem
                .copy(dst, src, n as u64)
                .map_err(|e| DrvErr::new(CUDA_ERROR_INVALID_VALUE, e.to_string()))?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::DeviceMemory;

    #[test]
    fn first_unwritten_byte_is_found_word_by_word() {
        let mut m = DeviceMemory::new(1 << 20);
        let p = m.alloc(300).unwrap();
        m.write(p, &[1; 70]).unwrap();
        m.write(p + 72, &[1; 228]).unwrap();
        let a = m.find(p, 300).unwrap();
        assert_eq!(first_unwritten(a, 0, 300), Some(70));
        assert_eq!(first_unwritten(a, 71, 229), Some(71));
        assert_eq!(first_unwritten(a, 72, 228), None);
        assert_eq!(first_unwritten(a, 3, 60), None);
    }
}
