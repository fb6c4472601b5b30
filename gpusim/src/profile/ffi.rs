//! C entry points through which a program running on the simulator reads
//! its own profile (leangrad's `cuda::simulator` finds them with `dlsym`
//! in the loaded `libcuda.so`; a real driver does not have them).

use super::model::{self, Gpu, H100_SXM, H200};
use super::{record, table, Counts, Profile};
use serde::Serialize;

/// One kernel of the summary.
#[derive(Serialize)]
struct KernelSummary {
    name: String,
    launches: u64,
    predicted_us_h200: f64,
    bound: &'static str,
}

/// What [`gpusim_profile_summary_json`] writes.
#[derive(Serialize)]
struct Summary {
    counts: Counts,
    predicted_ms_h100: f64,
    predicted_ms_h200: f64,
    launches_by_kernel: Vec<(String, u64)>,
    top_kernels: Vec<KernelSummary>,
    table_h100: String,
    table_h200: String,
}

fn summary(p: &Profile) -> Summary {
    let ms = |g: &Gpu| model::predict(p, g).total_us / 1e3;
    Summary {
        counts: p.counts(),
        predicted_ms_h100: ms(&H100_SXM),
        predicted_ms_h200: ms(&H200),
        launches_by_kernel: p.launches_by_kernel(),
        top_kernels: table::kernel_rows(p, &H200)
            .into_iter()
            .take(10)
            .map(|r| KernelSummary {
                name: r.name,
                launches: r.launches,
                predicted_us_h200: r.total_us,
                bound: r.bound.map_or("-", |b| b.name()),
            })
            .collect(),
        table_h100: table::summary(p, &H100_SXM),
        table_h200: table::summary(p, &H200),
    }
}

/// Copies `text` and a NUL into `buf` when `len` allows; returns the bytes
/// needed (text + NUL).
///
/// # Safety
/// `buf` must be null or hold `len` writable bytes.
unsafe fn give(text: &str, buf: *mut u8, len: usize) -> usize {
    let need = text.len() + 1;
    if !buf.is_null() && len >= need {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf, text.len());
        *buf.add(text.len()) = 0;
    }
    need
}

/// Starts recording afresh (whatever `GPUSIM_PROFILE` says): the profile
/// so far is dropped.
#[no_mangle]
pub extern "C" fn gpusim_profile_reset() {
    record::configure(false);
    record::reset();
}

/// Waits for the current device's queued work without recording a
/// synchronisation: a profile reader's own wait is not the program's, so
/// the counts it reads are the program's alone. Returns the `CUresult`.
#[no_mangle]
pub extern "C" fn gpusim_profile_wait() -> crate::driver::consts::CUresult {
    crate::driver::state::api("gpusim_profile_wait", |sim| {
        let d = sim.current_device()?;
        sim.sync(d, None)
    })
}

/// The profile so far as JSON (the `GPUSIM_PROFILE` file's contents) into
/// `buf` if `len` is enough; returns the bytes needed, NUL included. Work
/// still queued is left out: synchronise first.
///
/// # Safety
/// `buf` must be null or hold `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn gpusim_profile_json(buf: *mut u8, len: usize) -> usize {
    give(&record::snapshot().to_json(), buf, len)
}

/// A summary of the profile so far as JSON: `counts` (launches,
/// cublas_calls, syncs, h2d, d2h, …), `predicted_ms_h100`,
/// `predicted_ms_h200`, `launches_by_kernel`, `top_kernels` and the
/// summary tables; into `buf` if `len` is enough; returns the bytes
/// needed, NUL included.
///
/// # Safety
/// `buf` must be null or hold `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn gpusim_profile_summary_json(buf: *mut u8, len: usize) -> usize {
    let s = serde_json::to_string(&summary(&record::snapshot())).expect("a summary serialises");
    give(&s, buf, len)
}
