//! Per-thread, scoped CUDA settings (like the save policy): each is set by
//! a guard for the calling thread only and restored when the guard drops,
//! so no caller changes another's numerics or memory.
//!
//! - TF32 for f32 matrix products ([`with_tf32`], off by default): TF32
//!   rounds GEMM inputs to a 10-bit mantissa, about 1e-3 relative error
//!   instead of f32's 1e-7, for up to several times the throughput on
//!   tensor cores; f16/bf16/f64 GEMMs are unaffected. Convolutions run on
//!   leangrad's own kernels, in strict f32.
//! - The convolution workspace budget ([`with_conv_workspace`], 0 by
//!   default): every CUDA convolution holds one batch item's im2col
//!   columns of Workspace, exactly the buffer the CPU kernels use, so a
//!   CUDA step's ledger equals the CPU's (and the meta prediction) byte for
//!   byte; a weight gradient keeps the partial sums of its split reduction
//!   there. A larger budget lets it split further (more parallel work for
//!   layers with few output tiles), and the ledger shows that extra
//!   Workspace.

use std::cell::Cell;
use std::thread::LocalKey;

thread_local! {
    static TF32: Cell<bool> = const { Cell::new(false) };
    static CONV_WORKSPACE: Cell<usize> = const { Cell::new(0) };
}

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

fn set<T: Copy + 'static>(key: &'static LocalKey<Cell<T>>, value: T) -> SettingGuard<T> {
    SettingGuard {
        key,
        previous: key.with(|c| c.replace(value)),
    }
}

/// f32 matmuls (and the GEMMs of convolutions) on this thread use TF32
/// tensor cores when `enabled`, until the guard drops.
pub fn with_tf32(enabled: bool) -> SettingGuard<bool> {
    set(&TF32, enabled)
}

/// Whether f32 GEMMs on this thread use TF32 now (false by default).
pub fn tf32_enabled() -> bool {
    TF32.with(Cell::get)
}

/// CUDA convolutions on this thread may hold up to `bytes` of Workspace
/// (at least one item's im2col columns, whatever `bytes` says), until the
/// guard drops.
pub fn with_conv_workspace(bytes: usize) -> SettingGuard<usize> {
    set(&CONV_WORKSPACE, bytes)
}

/// A workspace budget for speed over memory parity (256 MiB): pass it to
/// [`with_conv_workspace`] (the default budget is one item's columns, as on
/// the CPU).
pub const LARGE_WORKSPACE_BYTES: usize = 256 << 20;

/// The convolution workspace budget on this thread now (0: one item's
/// columns, as the CPU).
pub fn conv_workspace_bytes() -> usize {
    CONV_WORKSPACE.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_scoped_nested_and_per_thread() {
        assert!(!tf32_enabled());
        assert_eq!(conv_workspace_bytes(), 0);
        {
            let _on = with_tf32(true);
            let _big = with_conv_workspace(256 << 20);
            assert!(tf32_enabled());
            assert_eq!(conv_workspace_bytes(), 256 << 20);
            {
                let _off = with_tf32(false);
                assert!(!tf32_enabled());
            }
            assert!(tf32_enabled());
            // Other threads keep their own (default) settings.
            let other = std::thread::spawn(|| (tf32_enabled(), conv_workspace_bytes()));
            assert_eq!(other.join().unwrap(), (false, 0));
        }
        assert!(!tf32_enabled());
        assert_eq!(conv_workspace_bytes(), 0);
    }
}
