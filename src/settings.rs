//! Per-thread, scoped settings (TF32, the convolution workspace budget,
//! autocast, like the save policy): each is set by a guard for the calling thread
//! only and restored when the guard drops, so no caller changes another's
//! numerics or memory.

use crate::DType;
use std::cell::Cell;
use std::thread::LocalKey;

/// Restores a setting's previous value on this thread when dropped.
#[derive(Debug)]
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

/// The convolution workspace budget by default (4 MiB), as PyTorch bounds
/// cuDNN's: enough for the CPU's products to run whole tiles on every layer
/// of the bundled models, a small part of any step's peak.
pub const DEFAULT_CONV_WORKSPACE_BYTES: usize = 4 << 20;

thread_local! {
    /// TF32 for f32 matrix products (`cuda::with_tf32`).
    pub(crate) static TF32: Cell<bool> = const { Cell::new(false) };
    /// TF32 for f32 convolutions (`cuda::with_conv_tf32`).
    pub(crate) static CONV_TF32: Cell<bool> = const { Cell::new(true) };
    /// The convolution workspace budget (`nn::with_conv_workspace`).
    pub(crate) static CONV_WORKSPACE: Cell<usize> = const { Cell::new(DEFAULT_CONV_WORKSPACE_BYTES) };
    /// The autocast dtype, if an autocast scope is open (`ops::autocast`).
    pub(crate) static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
}

/// Every per-thread setting that decides an op's values or allocations,
/// as it is on the calling thread: what a checkpointed segment's recompute
/// runs under, so that it computes what its forward computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Snapshot {
    tf32: bool,
    conv_tf32: bool,
    conv_workspace: usize,
    autocast: Option<DType>,
}

/// Restores the settings a [`Snapshot::enter`] replaced, when dropped.
pub(crate) struct SnapshotGuard {
    _guards: (
        SettingGuard<bool>,
        SettingGuard<bool>,
        SettingGuard<usize>,
        SettingGuard<Option<DType>>,
    ),
}

impl Snapshot {
    /// The settings on this thread now.
    pub(crate) fn current() -> Snapshot {
        Snapshot {
            tf32: TF32.with(Cell::get),
            conv_tf32: CONV_TF32.with(Cell::get),
            conv_workspace: CONV_WORKSPACE.with(Cell::get),
            autocast: AUTOCAST.with(Cell::get),
        }
    }

    /// Sets this thread's settings to these until the guard drops.
    pub(crate) fn enter(self) -> SnapshotGuard {
        SnapshotGuard {
            _guards: (
                set(&TF32, self.tf32),
                set(&CONV_TF32, self.conv_tf32),
                set(&CONV_WORKSPACE, self.conv_workspace),
                set(&AUTOCAST, self.autocast),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_restores_what_it_took_and_its_guard_undoes_it() {
        let before = Snapshot::current();
        let taken = {
            let _tf32 = set(&TF32, !before.tf32);
            let _ws = set(&CONV_WORKSPACE, 123);
            let _ac = set(&AUTOCAST, Some(DType::BF16));
            Snapshot::current()
        };
        assert_eq!(Snapshot::current(), before);
        {
            let _g = taken.enter();
            assert_eq!(Snapshot::current(), taken);
            assert_eq!(CONV_WORKSPACE.with(Cell::get), 123);
            assert_eq!(AUTOCAST.with(Cell::get), Some(DType::BF16));
        }
        assert_eq!(Snapshot::current(), before);
    }
}
