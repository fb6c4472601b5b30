//! Profiler ranges and, on the simulated GPU, the simulator's own profile
//! of the work this process did (see `gpusim/README.md`: the counts of
//! launches, cuBLAS calls, synchronisations and copies, and the time a
//! performance model predicts for an H100 and an H200).
//!
//! [`range_start`]/[`range_stop`] are `cuProfilerStart`/`cuProfilerStop`:
//! on a GPU they delimit what Nsight Systems captures with
//! `--capture-range=cudaProfilerApi`; on the simulator, what
//! `GPUSIM_PROFILE_RANGE=api` records.

use super::CudaDevice;
use crate::{Error, Result};

/// `cuProfilerStart` on `dev`'s context.
pub fn range_start(dev: &CudaDevice) -> Result<()> {
    dev.bind()?;
    // SAFETY: a plain driver call on the current context.
    unsafe { cudarc::driver::sys::cuProfilerStart() }
        .result()
        .map_err(|e| dev.error("cuProfilerStart", e))
}

/// `cuProfilerStop` on `dev`'s context.
pub fn range_stop(dev: &CudaDevice) -> Result<()> {
    dev.bind()?;
    // SAFETY: a plain driver call on the current context.
    unsafe { cudarc::driver::sys::cuProfilerStop() }
        .result()
        .map_err(|e| dev.error("cuProfilerStop", e))
}

/// A C entry point of the simulator's driver library, if this process runs
/// on it (a real driver has none of them).
fn simulator_symbol<F: Copy>(dev: &CudaDevice, name: &[u8]) -> Result<F> {
    if !dev.is_simulated() {
        return Err(Error::DeviceUnavailable {
            device: dev.device(),
            reason: "the simulator's profile exists only on the simulated GPU".into(),
        });
    }
    // SAFETY: the driver library is loaded (the device is open); the symbol
    // is one of the simulator's C functions, whose type the caller names
    // as gpusim declares it.
    unsafe {
        cudarc::driver::sys::culib()
            .get::<F>(name)
            .map(|s| *s)
            .map_err(|e| Error::DeviceUnavailable {
                device: dev.device(),
                reason: format!("the simulated GPU has no profile entry point: {e}"),
            })
    }
}

/// On the simulated GPU: drops the simulator's profile so far and records
/// from now (work already queued is counted when it runs). An error on a
/// real GPU.
pub fn simulator_profile_reset(dev: &CudaDevice) -> Result<()> {
    let reset: unsafe extern "C" fn() = simulator_symbol(dev, b"gpusim_profile_reset")?;
    // SAFETY: gpusim's `gpusim_profile_reset` takes no arguments.
    unsafe { reset() };
    Ok(())
}

/// Reads a JSON document from a simulator entry point `f(buf, len) ->
/// needed` (the text and a NUL).
fn read_json(dev: &CudaDevice, f: unsafe extern "C" fn(*mut u8, usize) -> usize) -> Result<String> {
    // Wait for queued work without recording a synchronisation: the
    // reader's own wait is not the program's.
    let wait: unsafe extern "C" fn() -> u32 = simulator_symbol(dev, b"gpusim_profile_wait")?;
    // SAFETY: gpusim's `gpusim_profile_wait` takes no arguments and returns
    // a `CUresult`.
    let status = unsafe { wait() };
    if status != 0 {
        return Err(dev.error("gpusim_profile_wait", format!("CUresult {status}")));
    }
    let mut buf = vec![0u8; 1 << 16];
    loop {
        // SAFETY: `buf` holds `buf.len()` writable bytes.
        let need = unsafe { f(buf.as_mut_ptr(), buf.len()) };
        if need <= buf.len() {
            buf.truncate(need.saturating_sub(1));
            return String::from_utf8(buf).map_err(|e| dev.error("simulator profile", e));
        }
        buf = vec![0u8; need];
    }
}

/// On the simulated GPU, once queued work is done: the simulator's summary of
/// the profile since [`simulator_profile_reset`] as JSON: `counts`
/// (`launches`, `cublas_calls`, `syncs`, `h2d`, `d2h`, `d2d`, `memsets`,
/// `allocs`, `frees`, byte totals), `predicted_ms_h100`,
/// `predicted_ms_h200`, `launches_by_kernel`, `top_kernels` and the
/// summary tables `table_h100`, `table_h200`. An error on a real GPU.
pub fn simulator_profile_summary(dev: &CudaDevice) -> Result<serde_json::Value> {
    let f = simulator_symbol(dev, b"gpusim_profile_summary_json")?;
    let text = read_json(dev, f)?;
    serde_json::from_str(&text).map_err(|e| dev.error("simulator profile", e))
}

/// On the simulated GPU, once queued work is done: the whole profile since
/// [`simulator_profile_reset`] (the `GPUSIM_PROFILE` file's JSON).
pub fn simulator_profile_json(dev: &CudaDevice) -> Result<String> {
    let f = simulator_symbol(dev, b"gpusim_profile_json")?;
    read_json(dev, f)
}
