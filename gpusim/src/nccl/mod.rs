//! The stand-in NCCL (`libnccl.so`): communicators over simulated devices
//! — ranks as threads (`ncclCommInitRank` with an id from
//! `ncclGetUniqueId`), one thread driving every device (`ncclCommInitAll`,
//! `ncclGroupStart`/`ncclGroupEnd`), or ranks in several processes on one
//! machine (`ncclCommInitRank` with an id made by another process) — with
//! exactly the C ABI of cudarc 0.19's `nccl::sys` (NCCL 2.30).
//!
//! A collective is queued on its stream like a kernel (`Op::Nccl`) and is
//! matched with the other ranks' parts by its number on the communicator
//! (point-to-point operations by their number per pair of ranks). When a
//! device's queue reaches it, `exec` runs the other devices' queues up to
//! their parts and runs it — or, if a rank has not enqueued its part yet,
//! the synchronising call waits for it with the simulator's mutex released
//! (`driver::lock`), up to `GPUSIM_NCCL_TIMEOUT_MS`. Results are
//! deterministic: reductions go in rank order, rounding each step in the
//! element type (`reduce`, `outcome`). Errors found when a collective runs
//! (a mismatch between ranks, a timeout, an abort, a memory fault) are
//! faults of every rank's enqueuing thread, returned by its next
//! synchronising call, and each rank's asynchronous error
//! (`ncclCommGetAsyncError`).
//!
//! Between processes (`transport`, `wire`, `join`, `net`, `hub`,
//! `netfail`): a unique id also names a TCP listener on 127.0.0.1 that
//! `ncclGetUniqueId` opened in the creating process (port chosen by the
//! system), which is the communicator's hub. A process joining an id made
//! elsewhere connects to it (one connection per id and process) and its
//! ranks join the hub's rendezvous; communicators whose ranks are all in
//! one process never touch a socket. When a process's parts of an
//! operation spanning processes reach the fronts of their queues, their
//! inputs go to the hub, which decides the operation exactly as within one
//! process and sends each process its ranks' outcomes; the hub asks the
//! processes that still owe a part to run their queues up to it (a GPU
//! runs queued work without being waited for). A process that exits or is
//! killed with live ranks, an abort, a timeout anywhere: every process
//! hears of it (`ncclRemoteError`, `ncclSystemError` for a rendezvous that
//! never completes), none hangs. The creating process must outlive the
//! communicator.

pub mod apply;
pub mod coll;
pub mod comm;
pub mod exec;
pub mod group;
pub mod hub;
pub mod join;
pub mod net;
pub mod netfail;
pub mod outcome;
pub mod reduce;
pub mod state;
pub mod transport;
pub mod wire;

pub use state::{Item, Wait};

use crate::driver::errors::intern;
use crate::driver::lock::SimLock;
use crate::driver::state::{lock, panic_text};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// `ncclResult_t`.
pub type NcclResult = u32;
/// `ncclComm_t`: an opaque handle.
pub type NcclComm = *mut c_void;

/// `ncclSuccess`.
pub const NCCL_SUCCESS: NcclResult = 0;
/// `ncclUnhandledCudaError`: a CUDA call failed (no context, a fault).
pub const NCCL_UNHANDLED_CUDA_ERROR: NcclResult = 1;
/// `ncclSystemError`: here, a rank that never joined in time, or the
/// creating process of a unique id that cannot be reached.
pub const NCCL_SYSTEM_ERROR: NcclResult = 2;
/// `ncclInternalError`: a panic of the simulator.
pub const NCCL_INTERNAL_ERROR: NcclResult = 3;
/// `ncclInvalidArgument`.
pub const NCCL_INVALID_ARGUMENT: NcclResult = 4;
/// `ncclInvalidUsage`.
pub const NCCL_INVALID_USAGE: NcclResult = 5;
/// `ncclRemoteError`: another rank aborted, timed out or failed, or its
/// process exited.
pub const NCCL_REMOTE_ERROR: NcclResult = 6;
/// `ncclInProgress`.
pub const NCCL_IN_PROGRESS: NcclResult = 7;
/// `ncclTimeout` (NCCL 2.30).
pub const NCCL_TIMEOUT: NcclResult = 8;

/// `NCCL_VERSION_CODE` reported: 2.30.0, the API cudarc 0.19 binds.
pub const VERSION: c_int = 23000;

/// Tag of communicator handles (see `driver::state::handle`).
pub const TAG_COMM: u64 = 0xcc10 << 48;

/// `ncclUniqueId`: 128 opaque bytes. gpusim's hold a magic, the creating
/// process's id, a serial number and the address of the creating
/// process's listener (layout: `transport`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclUniqueId {
    /// The bytes.
    pub internal: [c_char; 128],
}

/// The codes: value, name, standard text.
const RESULTS: &[(NcclResult, &str, &str)] = &[
    (0, "ncclSuccess", "no error"),
    (1, "ncclUnhandledCudaError", "unhandled CUDA error"),
    (2, "ncclSystemError", "unhandled system error"),
    (3, "ncclInternalError", "internal error"),
    (4, "ncclInvalidArgument", "invalid argument"),
    (5, "ncclInvalidUsage", "invalid usage"),
    (
        6,
        "ncclRemoteError",
        "remote process exited or there was a network error",
    ),
    (7, "ncclInProgress", "NCCL operation in progress"),
    (8, "ncclTimeout", "operation timed out"),
];

/// The name of `code` (`ncclInvalidUsage`).
pub fn name(code: NcclResult) -> &'static str {
    RESULTS
        .iter()
        .find(|r| r.0 == code)
        .map_or("ncclUnknownResult", |r| r.1)
}

/// An error of a NCCL call: its code and what was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NErr {
    /// The `ncclResult_t`.
    pub code: NcclResult,
    /// What was wrong.
    pub msg: String,
}

/// Result of the NCCL stand-in's internal functions.
pub type NResult<T> = Result<T, NErr>;

/// Shorthand for `Err(NErr { code, msg })`.
pub fn nfail<T>(code: NcclResult, msg: impl Into<String>) -> NResult<T> {
    Err(NErr {
        code,
        msg: msg.into(),
    })
}

impl From<state::Failure> for NErr {
    fn from(f: state::Failure) -> NErr {
        NErr {
            code: f.code,
            msg: f.msg,
        }
    }
}

thread_local! {
    /// The most recent error message of each code on this thread, and the
    /// most recent of all (`ncclGetLastError`).
    static DETAILS: RefCell<(HashMap<NcclResult, String>, String)> =
        RefCell::new((HashMap::new(), String::new()));
}

/// Remembers `text` as this thread's detail of `code` and its last error.
pub fn remember(code: NcclResult, text: &str) {
    let _ = DETAILS.try_with(|d| {
        let mut d = d.borrow_mut();
        d.0.insert(code, text.to_string());
        d.1 = text.to_string();
    });
}

/// Prints `e` as `gpusim: <func>: <code name>: <msg>`, remembers it and
/// returns its code.
pub fn report(func: &str, e: NErr) -> NcclResult {
    let text = format!("gpusim: {func}: {}: {}", name(e.code), e.msg);
    eprintln!("{text}");
    remember(e.code, &text);
    e.code
}

/// Runs the body of NCCL call `func` on the initialised simulator (the
/// CUDA driver must have been initialised: `cuInit`); an error is printed
/// and remembered, a panic becomes `ncclInternalError`.
pub fn nccl_api(func: &str, f: impl FnOnce(&mut SimLock) -> NResult<()>) -> NcclResult {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let g = lock();
        if g.is_none() {
            return nfail(
                NCCL_UNHANDLED_CUDA_ERROR,
                "the CUDA driver is not initialised (cuInit first)",
            );
        }
        f(&mut SimLock::new(g))
    }));
    match r {
        Ok(Ok(())) => NCCL_SUCCESS,
        Ok(Err(e)) => report(func, e),
        Err(p) => report(
            func,
            NErr {
                code: NCCL_INTERNAL_ERROR,
                msg: format!("internal error (panic): {}", panic_text(&*p)),
            },
        ),
    }
}

/// Writes `v` through `p`, or fails with `ncclInvalidArgument` on null.
///
/// # Safety
/// `p` must be null or writable.
pub unsafe fn put<T>(p: *mut T, v: T, what: &str) -> NResult<()> {
    if p.is_null() {
        return nfail(NCCL_INVALID_ARGUMENT, format!("{what} is null"));
    }
    *p = v;
    Ok(())
}

/// `ncclGetVersion`: [`VERSION`]. Needs no `cuInit`.
///
/// # Safety
/// `version` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> NcclResult {
    match put(version, VERSION, "version") {
        Ok(()) => NCCL_SUCCESS,
        Err(e) => report("ncclGetVersion", e),
    }
}

/// `ncclGetErrorString`: the standard text of `result`, followed by the
/// detail of the most recent error with that code on the calling thread
/// (as `cuGetErrorString` does).
#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: NcclResult) -> *const c_char {
    let Some(&(_, _, text)) = RESULTS.iter().find(|r| r.0 == result) else {
        return intern("unknown result code");
    };
    let detail = DETAILS
        .try_with(|d| d.borrow().0.get(&result).cloned())
        .ok()
        .flatten();
    match detail {
        Some(d) if result != NCCL_SUCCESS => intern(&format!("{text} — {d}")),
        _ => intern(text),
    }
}

/// `ncclGetLastError`: the calling thread's most recent NCCL error message
/// (empty when none); the communicator is not needed.
#[no_mangle]
pub extern "C" fn ncclGetLastError(_comm: NcclComm) -> *const c_char {
    let last = DETAILS
        .try_with(|d| d.borrow().1.clone())
        .unwrap_or_default();
    intern(&last)
}
