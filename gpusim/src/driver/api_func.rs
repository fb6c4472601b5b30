//! Function attributes: `cuFuncSetAttribute` (the dynamic shared memory
//! opt-in above 48 KiB) and `cuFuncGetAttribute`, and the shared memory
//! limits of each compute capability.

use super::consts::*;
use super::errors::fail;
use super::state::{api, FunctionEntry, Sim};
use std::ffi::c_int;

/// `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`.
const ATTR_MAX_THREADS: u32 = 0;
/// `CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES` (static shared memory).
const ATTR_SHARED_SIZE: u32 = 1;
/// `CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES`.
const ATTR_CONST_SIZE: u32 = 2;
/// `CU_FUNC_ATTRIBUTE_BINARY_VERSION`.
const ATTR_BINARY_VERSION: u32 = 6;
/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
pub const ATTR_MAX_DYNAMIC_SHARED: u32 = 8;
/// `CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`.
const ATTR_CARVEOUT: u32 = 9;

/// Most shared memory one block may use after opting in
/// (`CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`), by compute
/// capability, as NVIDIA's tuning guides give it.
pub fn optin_shared_per_block(compute: (i32, i32)) -> u32 {
    match compute {
        (9, _) | (10, _) | (12, _) => 227 * 1024,
        (8, 0) | (8, 7) => 163 * 1024,
        (8, _) => 99 * 1024,
        (7, 0) | (7, 2) => 96 * 1024,
        (7, 5) => 64 * 1024,
        _ => MAX_SHARED_PER_BLOCK,
    }
}

/// Shared memory of one multiprocessor
/// (`CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR`).
pub fn shared_per_sm(compute: (i32, i32)) -> u32 {
    match compute {
        (9, _) | (10, _) | (12, _) => 228 * 1024,
        (8, 0) | (8, 7) => 164 * 1024,
        (8, _) => 100 * 1024,
        (7, 0) | (7, 2) => 96 * 1024,
        (7, 5) => 64 * 1024,
        _ => 64 * 1024,
    }
}

/// The function entry of handle `f`, and its device's compute capability.
fn function(sim: &Sim, f: *mut std::ffi::c_void) -> Result<(FunctionEntry, (i32, i32)), String> {
    let e = sim
        .functions
        .get(&(f as u64))
        .copied()
        .ok_or_else(|| format!("{f:p} is not a function of a loaded module"))?;
    let dev = sim.modules[&e.module].device;
    Ok((e, sim.devices[dev].compute))
}

/// `cuFuncSetAttribute`: `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`
/// (0 up to the device's opt-in maximum less the kernel's static shared
/// memory) and the carveout hint (-1..=100, no effect here); any other
/// attribute is `CUDA_ERROR_INVALID_VALUE` with a message.
#[no_mangle]
pub extern "C" fn cuFuncSetAttribute(hfunc: CUfunction, attrib: u32, value: c_int) -> CUresult {
    api("cuFuncSetAttribute", |sim| {
        let (e, compute) = function(sim, hfunc)
            .map_err(|m| super::errors::DrvErr::new(CUDA_ERROR_INVALID_HANDLE, m))?;
        match attrib {
            ATTR_MAX_DYNAMIC_SHARED => {
                let m = &sim.modules[&e.module].module;
                let stat = m.static_shared_bytes(e.kernel) as i64;
                let max = optin_shared_per_block(compute) as i64 - stat;
                if value < 0 || value as i64 > max {
                    return fail(
                        CUDA_ERROR_INVALID_VALUE,
                        format!(
                            "max dynamic shared size {value} outside 0..={max} (the device's \
                             opt-in maximum {} less {stat} bytes of static shared memory)",
                            optin_shared_per_block(compute)
                        ),
                    );
                }
                if let Some(f) = sim.functions.get_mut(&(hfunc as u64)) {
                    f.max_dynamic_shared = Some(value as u32);
                }
                Ok(())
            }
            ATTR_CARVEOUT if (-1..=100).contains(&value) => Ok(()),
            _ => fail(
                CUDA_ERROR_INVALID_VALUE,
                format!("setting function attribute {attrib} (value {value}) is not supported"),
            ),
        }
    })
}

/// `cuFuncGetAttribute`: max threads per block, static shared bytes,
/// constant bytes (0), binary version, max dynamic shared bytes.
///
/// # Safety
/// `pi` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(
    pi: *mut c_int,
    attrib: u32,
    hfunc: CUfunction,
) -> CUresult {
    api("cuFuncGetAttribute", |sim| {
        let (e, compute) = function(sim, hfunc)
            .map_err(|m| super::errors::DrvErr::new(CUDA_ERROR_INVALID_HANDLE, m))?;
        let stat = sim.modules[&e.module].module.static_shared_bytes(e.kernel) as i32;
        let v = match attrib {
            ATTR_MAX_THREADS => MAX_THREADS_PER_BLOCK as i32,
            ATTR_SHARED_SIZE => stat,
            ATTR_CONST_SIZE => 0,
            ATTR_BINARY_VERSION => compute.0 * 10 + compute.1,
            ATTR_MAX_DYNAMIC_SHARED => e
                .max_dynamic_shared
                .map_or(MAX_SHARED_PER_BLOCK as i32 - stat, |x| x as i32),
            _ => {
                return fail(
                    CUDA_ERROR_INVALID_VALUE,
                    format!("function attribute {attrib} is not simulated"),
                )
            }
        };
        if pi.is_null() {
            return fail(CUDA_ERROR_INVALID_VALUE, "pi is null");
        }
        // SAFETY: the caller passed a writable, non-null pointer.
        *pi = v;
        Ok(())
    })
}
