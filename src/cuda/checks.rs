//! Input checks that kernels record on the device and the host reads later.
//!
//! A kernel that meets input it cannot compute with (a class index out of
//! range) records it in a check record on its device instead of making the
//! host wait for a status after the launch. The next copy from the device
//! to the host on the thread that launched it (every read of a value:
//! [`CudaBuffer::to_vec`], a loss read with `to_scalar`) copies the record
//! along with its own data, under the same synchronisation, and returns the
//! first recorded problem as a typed error ([`Error::IndexOutOfRange`]
//! naming the op). A training step with such checks synchronises once,
//! where its loss is read — as PyTorch's device-side asserts, but with a
//! typed error and the device still usable (the record is cleared once
//! reported).
//!
//! Each host thread has its own record on each device, so a problem is
//! reported to the thread whose work met it, never to another thread that
//! happens to read first (all threads share the device's one stream: a
//! read synchronises it, so the reading thread's launches have all run).
//!
//! The record is four i64 words, written by `lg_check_fail` in
//! `kernels/common.cuh`: `[recorded, index, size, op]`, where `op` is the
//! position of the launching op in the thread's armed list.

use super::CudaDevice;
use crate::{Error, Result};
use cudarc::driver::{CudaSlice, DevicePtr};
use std::collections::HashMap;
use std::sync::Mutex;
use std::thread::ThreadId;

/// Words of the check record (`lg_check_fail`'s layout).
pub(crate) const CHECK_WORDS: usize = 4;

/// One thread's check record on a device and the ops that may have written
/// it since the thread last read from the device.
struct ThreadRecord {
    record: CudaSlice<i64>,
    armed: Vec<&'static str>,
}

/// A device's check records, one per host thread that launched a checking
/// kernel (32 bytes of device memory each, outside the ledger, kept for
/// the device's lifetime).
#[derive(Default)]
pub(crate) struct DeviceChecks {
    threads: Mutex<HashMap<ThreadId, ThreadRecord>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl CudaDevice {
    /// The device address of this thread's check record for a launch of
    /// `op` (made zeroed on first use) and `op`'s id to pass to
    /// `lg_check_fail`. This thread's next read from the device reads the
    /// record.
    pub(crate) fn check_record(&self, op: &'static str) -> Result<(u64, i64)> {
        let mut threads = lock(&self.checks.threads);
        let entry = match threads.entry(std::thread::current().id()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let record = self
                    .stream()
                    .alloc_zeros::<i64>(CHECK_WORDS)
                    .map_err(|e| self.error("cuMemAllocAsync (check record)", e))?;
                v.insert(ThreadRecord {
                    record,
                    armed: Vec::new(),
                })
            }
        };
        let (address, _record) = entry.record.device_ptr(self.stream());
        let id = match entry.armed.iter().position(|o| *o == op) {
            Some(i) => i,
            None => {
                entry.armed.push(op);
                entry.armed.len() - 1
            }
        };
        Ok((address, id as i64))
    }

    /// Queues the copy of this thread's check record to `host` when some
    /// op armed it since the thread's last read; returns the ops armed then
    /// (empty: nothing queued). The caller synchronises, then calls
    /// [`CudaDevice::report`].
    pub(crate) fn queue_check_read(
        &self,
        host: &mut [i64; CHECK_WORDS],
    ) -> Result<Vec<&'static str>> {
        let mut threads = lock(&self.checks.threads);
        let Some(entry) = threads.get_mut(&std::thread::current().id()) else {
            return Ok(Vec::new());
        };
        let armed = std::mem::take(&mut entry.armed);
        if !armed.is_empty() {
            self.stream()
                .memcpy_dtoh(&entry.record, host.as_mut_slice())
                .map_err(|e| self.error("cuMemcpyDtoHAsync (check record)", e))?;
        }
        Ok(armed)
    }

    /// After the synchronisation that follows [`CudaDevice::queue_check_read`]:
    /// the recorded problem as an error (the record then cleared), or Ok.
    pub(crate) fn report(&self, host: &[i64; CHECK_WORDS], armed: &[&'static str]) -> Result<()> {
        if armed.is_empty() || host[0] == 0 {
            return Ok(());
        }
        if let Some(entry) = lock(&self.checks.threads).get_mut(&std::thread::current().id()) {
            self.stream()
                .memset_zeros(&mut entry.record)
                .map_err(|e| self.error("cuMemsetD8Async (check record)", e))?;
        }
        let op = usize::try_from(host[3])
            .ok()
            .and_then(|i| armed.get(i))
            .copied()
            .unwrap_or("cuda kernel");
        Err(Error::IndexOutOfRange {
            op,
            index: host[1],
            size: usize::try_from(host[2]).unwrap_or(0),
        })
    }
}
