//! The process-wide recorder behind `GPUSIM_PROFILE`: the driver and cuBLAS
//! report each call here, in the order the program makes them; a launch is
//! reported when it is enqueued and filled in when the queue runs it.

use super::{intern, Event, GemmRecord, LaunchRecord, Profile};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;

/// Whether `GPUSIM_PROFILE` is set (read once, at the first `cuInit`).
static CONFIGURED: AtomicBool = AtomicBool::new(false);
/// Whether events are being recorded now (always when configured, unless
/// `GPUSIM_PROFILE_RANGE=api` and outside a profiler range).
static RECORDING: AtomicBool = AtomicBool::new(false);
/// Whether ranges come from `cuProfilerStart`/`cuProfilerStop`.
static RANGE_API: AtomicBool = AtomicBool::new(false);

/// A launch enqueued but not yet run: its event's index.
const PENDING: u32 = u32::MAX;

#[derive(Default)]
struct Recorder {
    profile: Profile,
    kernel_index: HashMap<String, u32>,
    launch_index: HashMap<LaunchRecord, u32>,
    gemm_index: HashMap<GemmRecord, u32>,
}

impl Recorder {
    fn new() -> Recorder {
        Recorder {
            profile: Profile::new(),
            ..Recorder::default()
        }
    }
}

static RECORDER: Mutex<Option<Recorder>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut Recorder) -> R) -> R {
    let mut guard = RECORDER.lock().unwrap_or_else(|p| p.into_inner());
    let rec = guard.get_or_insert_with(Recorder::new);
    f(rec)
}

/// Turns profiling on (recording from now, or from the first
/// `cuProfilerStart` with `range_api`).
pub fn configure(range_api: bool) {
    CONFIGURED.store(true, Relaxed);
    RANGE_API.store(range_api, Relaxed);
    RECORDING.store(!range_api, Relaxed);
}

/// Whether events are recorded now.
pub fn enabled() -> bool {
    RECORDING.load(Relaxed)
}

/// `cuProfilerStart` (`on`) / `cuProfilerStop`: starts or stops recording
/// when ranges come from the profiler API.
pub fn set_range(on: bool) {
    if CONFIGURED.load(Relaxed) && RANGE_API.load(Relaxed) {
        RECORDING.store(on, Relaxed);
    }
}

/// Records `e` (not a launch or GEMM: see [`start_launch`],
/// [`record_gemm`]) if recording.
pub fn record(e: Event) {
    if enabled() {
        with(|r| r.profile.events.push(e));
    }
}

/// Records a GEMM call if recording.
pub fn record_gemm(g: GemmRecord) {
    if !enabled() {
        return;
    }
    with(|r| {
        let i = intern(&mut r.gemm_index, &mut r.profile.gemms, &g);
        r.profile.events.push(Event::Gemm(i));
    });
}

/// Records that a launch was enqueued, if recording: the slot to fill with
/// [`fill_launch`] when it runs.
pub fn start_launch() -> Option<usize> {
    if !enabled() {
        return None;
    }
    Some(with(|r| {
        r.profile.events.push(Event::Launch(PENDING));
        r.profile.events.len() - 1
    }))
}

/// Fills the launch event `slot` with the launch of `kernel` that ran.
pub fn fill_launch(slot: usize, kernel: &str, mut launch: LaunchRecord) {
    with(|r| {
        launch.kernel = intern(
            &mut r.kernel_index,
            &mut r.profile.kernels,
            &kernel.to_string(),
        );
        let i = intern(&mut r.launch_index, &mut r.profile.launches, &launch);
        if let Some(e) = r.profile.events.get_mut(slot) {
            *e = Event::Launch(i);
        }
    });
}

/// The profile so far (launches that have not run yet left out).
pub fn snapshot() -> Profile {
    with(|r| {
        let mut p = r.profile.clone();
        p.events.retain(|e| *e != Event::Launch(PENDING));
        p
    })
}

/// Clears the profile (for tests that profile one piece of work).
pub fn reset() {
    with(|r| *r = Recorder::new());
}

extern "C" {
    fn atexit(cb: extern "C" fn()) -> i32;
}

static PATH: Mutex<Option<String>> = Mutex::new(None);

extern "C" fn write_at_exit() {
    let Some(path) = PATH.lock().ok().and_then(|p| p.clone()) else {
        return;
    };
    let path = path.replace("%p", &std::process::id().to_string());
    let profile = snapshot();
    if let Err(e) = std::fs::write(&path, profile.to_json() + "\n") {
        eprintln!("gpusim: GPUSIM_PROFILE: cannot write {path}: {e}");
        return;
    }
    let gpu = std::env::var("GPUSIM_PROFILE_GPU").unwrap_or_else(|_| "h200".into());
    match super::model::Gpu::named(&gpu) {
        Some(g) => eprint!("{}", super::table::summary(&profile, g)),
        None => eprintln!("gpusim: GPUSIM_PROFILE_GPU={gpu} is not known (h100, h200)"),
    }
    eprintln!("gpusim: profile written to {path}");
}

/// Reads `GPUSIM_PROFILE` (and `GPUSIM_PROFILE_RANGE`) and, when set,
/// starts recording and registers the writer of the file (once).
pub fn register_exit_writer() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let Some(path) = std::env::var("GPUSIM_PROFILE")
        .ok()
        .filter(|p| !p.is_empty())
    else {
        return;
    };
    ONCE.call_once(|| {
        let range_api = std::env::var("GPUSIM_PROFILE_RANGE").is_ok_and(|v| v == "api");
        configure(range_api);
        if let Ok(mut p) = PATH.lock() {
            *p = Some(path);
        }
        // SAFETY: registers a plain function with the C library; it takes
        // locks that no exiting thread holds and writes a file and stderr.
        unsafe {
            atexit(write_at_exit);
        }
    });
}
