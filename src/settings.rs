//! Per-thread, scoped settings (TF32, the convolution workspace budget,
//! like the save policy): each is set by a guard for the calling thread
//! only and restored when the guard drops, so no caller changes another's
//! numerics or memory.

use std::cell::Cell;
use std::thread::LocalKey;

/// Restores a setting's previous value on this thread when dropped.
#[must_use = "the setting applies only while the guard lives"]
pub struct SettingGuard<T: Copy + 'static> {
    key: &'static LocalKey<Cell<T>>,
    previous: T,
}

impl<T: Copy + 'static> Drop for SettingGuard<T> {
    fn drop(&mut self) {
        self.key.with(|c| c.set(self.previous));
    }
}

/// Sets `key` to `value` on this thread until the returned guard drops.
pub(crate) fn set<T: Copy + 'static>(key: &'static LocalKey<Cell<T>>, value: T) -> SettingGuard<T> {
    SettingGuard {
        key,
        previous: key.with(|c| c.replace(value)),
    }
}
