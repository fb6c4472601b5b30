//! Input checks that kernels record on the device and the host reads later.
//!
//! A kernel that meets input it cannot compute with (a class index out of
//! range) records it in its device's check record instead of making the
//! host wait for a status after the launch. The next copy from the device
//! to the host (every read of a value: [`CudaBuffer::to_vec`], a loss read
//! with `to_scalar`) copies the record along with its own data, under the
//! same synchronisation, and returns the first recorded problem as a typed
//! error ([`Error::IndexOutOfRange`] naming the op). A training step with
//! such checks synchronises once, where its loss is read — as PyTorch's
//! device-side asserts, but with a typed error and the device still usable
//! (the record is cleared once reported).
//!
//! The record is four i64 words, written by `lg_check_fail` in
//! `kernels/common.cuh`: `[recorded, index, size, op]`, where `op` is the
//! position of the launching op in the armed list below.

use super::CudaDevice;
use crate::{Error, Result};
use cudarc::driver::{CudaSlice, DevicePtr};
use std::sync::Mutex;

/// Words of the check record (`lg_check_fail`'s layout).
pub(crate) const CHECK_WORDS: usize = 4;

/// A device's check record and the ops that may have written it since it
/// was last read.
#[derive(Default)]
pub(crate) struct DeviceChecks {
    record: Mutex<Option<CudaSlice<i64>>>,
    armed: Mutex<Vec<&'static str>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl CudaDevice {
    /// The device address of the check record for a launch of `op` (made
    /// zeroed on first use, outside the ledger: 32 bytes per device for its
    /// lifetime) and `op`'s id to pass to `lg_check_fail`. The next read
    /// from the device reads the record.
    pub(crate) fn check_record(&self, op: &'static str) -> Result<(u64, i64)> {
        let mut record = lock(&self.checks.record);
        if record.is_none() {
            let zeroed = self
                .stream()
                .alloc_zeros::<i64>(CHECK_WORDS)
                .map_err(|e| self.error("cuMemAllocAsync (check record)", e))?;
            *record = Some(zeroed);
        }
        let slice = record
            .as_ref()
            .ok_or_else(|| self.error("check record", "missing"))?;
        let (address, _record) = slice.device_ptr(self.stream());
        let mut armed = lock(&self.checks.armed);
        let id = match armed.iter().position(|o| *o == op) {
            Some(i) => i,
            None => {
                armed.push(op);
                armed.len() - 1
            }
        };
        Ok((address, id as i64))
    }

    /// Queues the copy of the check record to `host` when some op armed it
    /// since the last read; returns the ops armed then (empty: nothing
    /// queued). The caller synchronises, then calls [`CudaDevice::report`].
    pub(crate) fn queue_check_read(
        &self,
        host: &mut [i64; CHECK_WORDS],
    ) -> Result<Vec<&'static str>> {
        let armed = std::mem::take(&mut *lock(&self.checks.armed));
        if armed.is_empty() {
            return Ok(armed);
        }
        let record = lock(&self.checks.record);
        if let Some(r) = record.as_ref() {
            self.stream()
                .memcpy_dtoh(r, host.as_mut_slice())
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
        if let Some(r) = lock(&self.checks.record).as_mut() {
            self.stream()
                .memset_zeros(r)
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
