//! Events. All work of a device runs in one enqueue order, so an event's
//! record precedes everything enqueued after it on any stream: waiting on
//! an event (`cuStreamWaitEvent`) needs no action; `cuEventSynchronize`
//! runs the queue up to the record.

use super::api_device::out;
use super::consts::*;
use super::errors::{fail, DResult};
use super::state::{api, handle, id_of, EventEntry, Op, Sim, TAG_EVENT};
use std::ffi::c_uint;

/// `CUevent`: an opaque handle.
pub type CUevent = *mut std::ffi::c_void;

/// `CU_EVENT_DISABLE_TIMING`.
const DISABLE_TIMING: u32 = 2;

fn event(sim: &Sim, e: CUevent) -> DResult<EventEntry> {
    match sim.events.get(&(e as u64)) {
        Some(&ev) if id_of(e, TAG_EVENT).is_some() => Ok(ev),
        _ => fail(
            CUDA_ERROR_INVALID_HANDLE,
            format!("{e:p} is not a live event"),
        ),
    }
}

/// `cuEventCreate` (flags: default, blocking sync, disable timing).
///
/// # Safety
/// `ph_event` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(ph_event: *mut CUevent, flags: c_uint) -> CUresult {
    api("cuEventCreate", |sim| {
        sim.current_device()?;
        if flags & !3 != 0 {
            return fail(
                CUDA_ERROR_INVALID_VALUE,
                format!("unsupported event flags {flags:#x}"),
            );
        }
        let h = handle(TAG_EVENT, sim.new_id());
        out!(ph_event, h);
        let entry = EventEntry {
            flags,
            device: None,
            generation: 0,
            done: None,
        };
        sim.events.insert(h as u64, entry);
        Ok(())
    })
}

/// `cuEventDestroy_v2`.
#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(e: CUevent) -> CUresult {
    api("cuEventDestroy_v2", |sim| {
        event(sim, e)?;
        sim.events.remove(&(e as u64));
        Ok(())
    })
}

/// `cuEventRecord`: a marker queued on the stream.
#[no_mangle]
pub extern "C" fn cuEventRecord(e: CUevent, stream: CUstream) -> CUresult {
    api("cuEventRecord", |sim| {
        event(sim, e)?;
        let (d, key) = sim.stream(stream)?;
        let generation = match sim.events.get_mut(&(e as u64)) {
            Some(ev) => {
                ev.generation += 1;
                ev.device = Some(d);
                ev.done = None;
                ev.generation
            }
            None => return fail(CUDA_ERROR_INVALID_HANDLE, "event vanished"),
        };
        sim.enqueue(
            d,
            key,
            Op::Marker {
                event: e as u64,
                generation,
            },
        );
        Ok(())
    })
}

/// The device of the event's latest record and that record's queue item,
/// while it is still queued (`None` when done or never recorded).
fn items_before(sim: &Sim, e: CUevent, ev: &EventEntry) -> Option<(usize, u64)> {
    let d = ev.device?;
    let w = sim.devices[d].queue.iter().find(|w| {
        matches!(w.op, Op::Marker { event, generation } if event == e as u64 && generation == ev.generation)
    })?;
    Some((d, w.id))
}

/// `cuEventQuery`: success once the record has run, else
/// `CUDA_ERROR_NOT_READY` (work runs only when something waits for it).
#[no_mangle]
pub extern "C" fn cuEventQuery(e: CUevent) -> CUresult {
    let mut not_ready = false;
    let r = api("cuEventQuery", |sim| {
        let ev = event(sim, e)?;
        not_ready = items_before(sim, e, &ev).is_some();
        Ok(())
    });
    if r == CUDA_SUCCESS && not_ready {
        // Not an error worth printing: the documented answer of a query.
        return CUDA_ERROR_NOT_READY;
    }
    r
}

/// `cuEventSynchronize`: runs the queue up to the record; returns this
/// thread's first undelivered fault.
#[no_mangle]
pub extern "C" fn cuEventSynchronize(e: CUevent) -> CUresult {
    api("cuEventSynchronize", |sim| {
        let ev = event(sim, e)?;
        crate::profile::record(crate::profile::Event::Sync(crate::profile::SyncKind::Event));
        if let Some((d, id)) = items_before(sim, e, &ev) {
            sim.drain_to(d, id);
        }
        sim.deliver()
    })
}

/// `cuStreamWaitEvent`: nothing to do (see the module doc); handles are
/// checked.
#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(stream: CUstream, e: CUevent, flags: c_uint) -> CUresult {
    api("cuStreamWaitEvent", |sim| {
        event(sim, e)?;
        sim.stream(stream)?;
        if flags & !1 != 0 {
            return fail(
                CUDA_ERROR_INVALID_VALUE,
                format!("unsupported flags {flags:#x}"),
            );
        }
        Ok(())
    })
}

/// `cuEventElapsedTime` and `_v2`: host milliseconds between the moments
/// the two records ran (both must have run, with timing enabled).
///
/// # Safety
/// `ms` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    elapsed("cuEventElapsedTime", ms, start, end)
}

/// See [`cuEventElapsedTime`].
///
/// # Safety
/// `ms` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    elapsed("cuEventElapsedTime_v2", ms, start, end)
}

unsafe fn elapsed(func: &str, ms: *mut f32, start: CUevent, end: CUevent) -> CUresult {
    api(func, |sim| {
        let (a, b) = (event(sim, start)?, event(sim, end)?);
        if (a.flags | b.flags) & DISABLE_TIMING != 0 {
            return fail(
                CUDA_ERROR_INVALID_HANDLE,
                "an event was created with CU_EVENT_DISABLE_TIMING",
            );
        }
        let (Some(t0), Some(t1)) = (a.done, b.done) else {
            return fail(
                CUDA_ERROR_NOT_READY,
                "an event's record has not run yet (synchronise first)",
            );
        };
        let d = if t1 >= t0 {
            (t1 - t0).as_secs_f32()
        } else {
            -(t0 - t1).as_secs_f32()
        };
        out!(ms, d * 1000.0);
        Ok(())
    })
}
