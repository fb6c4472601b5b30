//! Modules (PTX only), kernels and launches.

use super::consts::*;
use super::errors::{fail, DrvErr};
use super::lock::SimLock;
use super::state::{
    api, handle, id_of, panic_text, FunctionEntry, LaunchJob, ModuleEntry, Op, TAG_FUNCTION,
    TAG_MODULE,
};
use crate::ptx::{LaunchDims, Module};
use std::ffi::{c_char, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What an image is, from its first bytes.
fn is_binary(head: &[u8]) -> bool {
    const FATBIN: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();
    const FATBIN_WRAPPER: [u8; 4] = 0x4662_43B1u32.to_le_bytes();
    head.starts_with(b"\x7fELF") || head.starts_with(&FATBIN) || head.starts_with(&FATBIN_WRAPPER)
}

/// `cuModuleLoadData`: the image must be NUL-terminated PTX text; a CUBIN
/// (ELF) or fatbin is refused with `CUDA_ERROR_NO_BINARY_FOR_GPU`.
///
/// # Safety
/// `image` must be a NUL-terminated string or start with a binary's magic.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    api("cuModuleLoadData", |sim| {
        let d = sim.current_device()?;
        if module.is_null() || image.is_null() {
            return fail(CUDA_ERROR_INVALID_VALUE, "module or image is null");
        }
        // The first 4 bytes: a magic number is checked before reading on to
        // a NUL that a binary need not have.
        let p = image.cast::<u8>();
        let mut head = [0u8; 4];
        for (i, h) in head.iter_mut().enumerate() {
            *h = *p.add(i);
            if *h == 0 {
                break;
            }
        }
        if is_binary(&head) {
            return fail(
                CUDA_ERROR_NO_BINARY_FOR_GPU,
                "gpusim runs PTX only; load the PTX",
            );
        }
        let text = CStr::from_ptr(image.cast::<c_char>())
            .to_str()
            .map_err(|e| {
                DrvErr::new(
                    CUDA_ERROR_INVALID_PTX,
                    format!("the image is not PTX text (not UTF-8: {e})"),
                )
            })?;
        let mem = &mut sim.devices[d].mem;
        let loaded = catch_unwind(AssertUnwindSafe(|| Module::load(text, mem)))
            .map_err(|p| {
                DrvErr::new(
                    CUDA_ERROR_INVALID_PTX,
                    format!("the PTX loader panicked: {}", panic_text(&*p)),
                )
            })?
            .map_err(|e| DrvErr::new(CUDA_ERROR_INVALID_PTX, e.to_string()))?;
        let h = handle(TAG_MODULE, sim.new_id());
        sim.modules.insert(
            h as u64,
            ModuleEntry {
                device: d,
                module: loaded,
            },
        );
        *module = h;
        Ok(())
    })
}

/// Unloads module `h` (queued work of its device runs first), dropping its
/// function handles.
pub fn unload(sim: &mut SimLock, h: u64) {
    let Some(dev) = sim.modules.get(&h).map(|m| m.device) else {
        return;
    };
    sim.drain(dev, None);
    if let Some(m) = sim.modules.remove(&h) {
        let mem = &mut sim.devices[dev].mem;
        let _ = catch_unwind(AssertUnwindSafe(|| m.module.unload(mem)));
    }
    let gone: Vec<u64> = sim
        .functions
        .iter()
        .filter(|(_, f)| f.module == h)
        .map(|(&f, _)| f)
        .collect();
    for f in gone {
        sim.functions.remove(&f);
    }
    sim.function_ids.retain(|k, _| k.0 != h);
}

/// `cuModuleUnload`.
#[no_mangle]
pub extern "C" fn cuModuleUnload(hmod: CUmodule) -> CUresult {
    api("cuModuleUnload", |sim| {
        if id_of(hmod, TAG_MODULE).is_none() || !sim.modules.contains_key(&(hmod as u64)) {
            return fail(
                CUDA_ERROR_INVALID_HANDLE,
                format!("{hmod:p} is not a loaded module"),
            );
        }
        unload(sim, hmod as u64);
        Ok(())
    })
}

/// `cuModuleGetFunction`.
///
/// # Safety
/// `name` must be a NUL-terminated string; `hfunc` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    hfunc: *mut CUfunction,
    hmod: CUmodule,
    name: *const c_char,
) -> CUresult {
    api("cuModuleGetFunction", |sim| {
        let m = match sim.modules.get(&(hmod as u64)) {
            Some(m) if id_of(hmod, TAG_MODULE).is_some() => m,
            _ => {
                return fail(
                    CUDA_ERROR_INVALID_HANDLE,
                    format!("{hmod:p} is not a loaded module"),
                )
            }
        };
        if hfunc.is_null() || name.is_null() {
            return fail(CUDA_ERROR_INVALID_VALUE, "hfunc or name is null");
        }
        let name = CStr::from_ptr(name).to_string_lossy();
        let Some(k) = m.module.kernel(&name) else {
            return fail(
                CUDA_ERROR_NOT_FOUND,
                format!("no kernel named {name} in the module"),
            );
        };
        let key = (hmod as u64, k.0);
        let h = match sim.function_ids.get(&key) {
            Some(&h) => h,
            None => {
                let h = handle(TAG_FUNCTION, sim.new_id()) as u64;
                sim.function_ids.insert(key, h);
                sim.functions.insert(
                    h,
                    FunctionEntry {
                        module: hmod as u64,
                        kernel: k,
                        max_dynamic_shared: None,
                    },
                );
                h
            }
        };
        *hfunc = h as CUfunction;
        Ok(())
    })
}

/// Checks a launch shape: at most 1024 threads per block (x, y ≤ 1024,
/// z ≤ 64), grid x < 2^31, y and z < 65536, no zero dimension, and at
/// most 48 KiB of static plus dynamic shared memory — or, once the kernel
/// opted in (`max_dynamic`, set by `cuFuncSetAttribute`), at most that
/// much dynamic shared memory.
pub fn validate_dims(
    grid: [u32; 3],
    block: [u32; 3],
    static_shared: usize,
    dynamic_shared: u32,
    max_dynamic: Option<u32>,
) -> Result<(), String> {
    if grid.contains(&0) || block.contains(&0) {
        return Err(format!("a zero dimension: grid {grid:?}, block {block:?}"));
    }
    let threads = block.iter().map(|&b| b as u64).product::<u64>();
    if threads > MAX_THREADS_PER_BLOCK as u64 || block[0] > 1024 || block[1] > 1024 || block[2] > 64
    {
        return Err(format!(
            "block {block:?} has {threads} threads (at most 1024; x, y ≤ 1024, z ≤ 64)"
        ));
    }
    if grid[0] > i32::MAX as u32 || grid[1] > 65535 || grid[2] > 65535 {
        return Err(format!(
            "grid {grid:?} too large (x < 2^31, y and z < 65536)"
        ));
    }
    let shared = static_shared as u64 + dynamic_shared as u64;
    match max_dynamic {
        None if shared > MAX_SHARED_PER_BLOCK as u64 => {
            return Err(format!(
                "{static_shared} bytes of static plus {dynamic_shared} of dynamic shared memory \
                 exceed {MAX_SHARED_PER_BLOCK} (more needs \
                 cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES))"
            ));
        }
        Some(max) if dynamic_shared > max => {
            return Err(format!(
                "{dynamic_shared} bytes of dynamic shared memory exceed the kernel's \
                 CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES of {max}"
            ));
        }
        _ => {}
    }
    Ok(())
}

/// `cuLaunchKernel`: validated and queued; the parameter bytes (sizes from
/// the module's `.param` list) are copied now, as the driver does.
/// `extra` is not supported.
///
/// # Safety
/// `kernel_params` must hold one valid pointer per kernel parameter.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem_bytes: c_uint,
    stream: CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    api("cuLaunchKernel", |sim| {
        let Some(&FunctionEntry {
            module,
            kernel,
            max_dynamic_shared,
        }) = sim.functions.get(&(f as u64))
        else {
            return fail(
                CUDA_ERROR_INVALID_HANDLE,
                format!("{f:p} is not a function of a loaded module"),
            );
        };
        if !extra.is_null() {
            return fail(
                CUDA_ERROR_NOT_SUPPORTED,
                "the `extra` parameter form is not supported; pass kernelParams",
            );
        }
        let (d, key) = sim.stream(stream)?;
        let m = &sim.modules[&module];
        if m.device != d {
            return fail(
                CUDA_ERROR_INVALID_HANDLE,
                format!(
                    "the kernel's module was loaded on device {}, the stream is device {d}'s",
                    m.device
                ),
            );
        }
        let (grid, block) = ([grid_x, grid_y, grid_z], [block_x, block_y, block_z]);
        let name = m.module.kernel_name(kernel).to_string();
        validate_dims(
            grid,
            block,
            m.module.static_shared_bytes(kernel),
            shared_mem_bytes,
            max_dynamic_shared,
        )
        .map_err(|e| DrvErr::new(CUDA_ERROR_INVALID_VALUE, format!("kernel {name}: {e}")))?;
        let specs = m.module.params(kernel);
        if !specs.is_empty() && kernel_params.is_null() {
            return fail(
                CUDA_ERROR_INVALID_VALUE,
                format!(
                    "kernel {name} takes {} parameters but kernelParams is null",
                    specs.len()
                ),
            );
        }
        let mut params = Vec::with_capacity(specs.len());
        for (i, s) in specs.iter().enumerate() {
            let p = *kernel_params.add(i);
            if p.is_null() {
                return fail(
                    CUDA_ERROR_INVALID_VALUE,
                    format!("kernel {name}: kernelParams[{i}] is null"),
                );
            }
            params.push(std::slice::from_raw_parts(p.cast::<u8>(), s.size).to_vec());
        }
        let job = LaunchJob {
            module,
            kernel,
            name,
            dims: LaunchDims {
                grid,
                block,
                dynamic_shared_bytes: shared_mem_bytes,
            },
            params,
            profile_slot: crate::profile::start_launch(),
        };
        sim.enqueue(d, key, Op::Launch(Box::new(job)));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_shapes_are_checked() {
        assert!(validate_dims([555, 1, 1], [256, 1, 1], 2048, 0, None).is_ok());
        assert!(validate_dims([1, 1, 1], [1024, 1, 1], 0, 0, None).is_ok());
        assert!(validate_dims([1, 1, 1], [1025, 1, 1], 0, 0, None)
            .unwrap_err()
            .contains("1025 threads"));
        assert!(validate_dims([1, 1, 1], [32, 32, 2], 0, 0, None).is_err());
        assert!(validate_dims([1, 1, 1], [1, 1, 65], 0, 0, None).is_err());
        assert!(validate_dims([0, 1, 1], [32, 1, 1], 0, 0, None).is_err());
        assert!(validate_dims([1 << 31, 1, 1], [32, 1, 1], 0, 0, None).is_err());
        assert!(validate_dims([(1 << 31) - 1, 65535, 65535], [32, 1, 1], 0, 0, None).is_ok());
        assert!(validate_dims([1, 65536, 1], [32, 1, 1], 0, 0, None).is_err());
        assert!(validate_dims([1, 1, 1], [32, 1, 1], 40 << 10, 8 << 10, None).is_ok());
        assert!(
            validate_dims([1, 1, 1], [32, 1, 1], 40 << 10, (8 << 10) + 1, None)
                .unwrap_err()
                .contains("shared")
        );
        // Opted in: the attribute bounds the dynamic part only.
        assert!(validate_dims([1, 1, 1], [32, 1, 1], 1024, 100 << 10, Some(100 << 10)).is_ok());
        assert!(
            validate_dims([1, 1, 1], [32, 1, 1], 0, (100 << 10) + 1, Some(100 << 10))
                .unwrap_err()
                .contains("MAX_DYNAMIC_SHARED_SIZE_BYTES")
        );
        assert!(is_binary(b"\x7fELF"));
        assert!(is_binary(&[0x50, 0xED, 0x55, 0xBA]));
        assert!(!is_binary(b"//\n/"));
    }
}
