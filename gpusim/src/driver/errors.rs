//! Error reporting: every failing call prints `gpusim: <function>: <what>`
//! to stderr and remembers the message per (thread, code), so that
//! `cuGetErrorString` — which leangrad uses to format every driver error —
//! returns the standard text followed by the detail.

use super::consts::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::sync::{Mutex, OnceLock};

/// An error of a driver call: its code and what happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrvErr {
    /// The `CUresult`.
    pub code: CUresult,
    /// What was wrong, in words.
    pub msg: String,
    /// Already printed (a fault is printed when it is found, and again
    /// only as the returned error's detail).
    pub printed: bool,
}

impl DrvErr {
    /// A new error.
    pub fn new(code: CUresult, msg: impl Into<String>) -> DrvErr {
        DrvErr {
            code,
            msg: msg.into(),
            printed: false,
        }
    }
}

/// Result of the driver's internal functions.
pub type DResult<T> = Result<T, DrvErr>;

/// Shorthand for `Err(DrvErr::new(code, msg))`.
pub fn fail<T>(code: CUresult, msg: impl Into<String>) -> DResult<T> {
    Err(DrvErr::new(code, msg))
}

thread_local! {
    /// The detail of the most recent error of each code on this thread.
    static DETAILS: RefCell<HashMap<CUresult, String>> = RefCell::new(HashMap::new());
}

/// Prints `e` (unless already printed) as `gpusim: <func>: <msg>`, keeps it
/// as the detail of its code on this thread, and returns its code.
pub fn report(func: &str, e: DrvErr) -> CUresult {
    let text = if e.printed {
        e.msg.clone()
    } else {
        format!("gpusim: {func}: {}", e.msg)
    };
    if !e.printed {
        eprintln!("{text}");
    }
    // try_with: a call from a thread-local destructor must not panic.
    let _ = DETAILS.try_with(|d| d.borrow_mut().insert(e.code, text));
    e.code
}

/// The detail of the most recent error `code` on this thread, if any.
pub fn detail(code: CUresult) -> Option<String> {
    DETAILS
        .try_with(|d| d.borrow().get(&code).cloned())
        .ok()
        .flatten()
}

/// A C string that lives for the rest of the process (each distinct text is
/// allocated once).
pub fn intern(s: &str) -> *const c_char {
    static TABLE: OnceLock<Mutex<HashMap<String, &'static CStr>>> = OnceLock::new();
    let mut t = TABLE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(c) = t.get(s) {
        return c.as_ptr();
    }
    let c: &'static CStr = Box::leak(
        CString::new(s.replace('\0', "\\0"))
            .unwrap_or_default()
            .into_boxed_c_str(),
    );
    t.insert(s.to_string(), c);
    c.as_ptr()
}

/// The name and standard text of `code`.
pub fn lookup(code: CUresult) -> Option<(&'static str, &'static str)> {
    ERRORS
        .iter()
        .find(|e| e.0 == code)
        .map(|&(_, name, text)| (name, text))
}

/// `cuGetErrorString`: the standard text of `error`, followed by the detail
/// of the most recent error with that code on the calling thread.
///
/// # Safety
/// `p_str` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, p_str: *mut *const c_char) -> CUresult {
    if p_str.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match lookup(error) {
        Some((_, text)) => {
            let s = match detail(error) {
                Some(d) if error != CUDA_SUCCESS => format!("{text} — {d}"),
                _ => text.to_string(),
            };
            *p_str = intern(&s);
            CUDA_SUCCESS
        }
        None => {
            *p_str = std::ptr::null();
            CUDA_ERROR_INVALID_VALUE
        }
    }
}

/// `cuGetErrorName`: e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
///
/// # Safety
/// `p_str` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, p_str: *mut *const c_char) -> CUresult {
    if p_str.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match lookup(error) {
        Some((name, _)) => {
            *p_str = intern(name);
            CUDA_SUCCESS
        }
        None => {
            *p_str = std::ptr::null();
            CUDA_ERROR_INVALID_VALUE
        }
    }
}
