//! TF32 for f32 GEMMs on CUDA, an explicit, scoped choice: off unless a
//! [`with_tf32`] guard is alive on the calling thread (like the save policy,
//! it is per thread and restored when the guard drops, so no caller changes
//! another's numerics). TF32 rounds GEMM inputs to a 10-bit mantissa: about
//! 1e-3 relative error instead of f32's 1e-7, for up to several times the
//! throughput on tensor cores. f16/bf16/f64 GEMMs are unaffected.

use std::cell::Cell;

thread_local! {
    static TF32: Cell<bool> = const { Cell::new(false) };
}

/// Restores the previous TF32 choice when dropped.
#[must_use = "TF32 applies only while the guard lives"]
pub struct Tf32Guard {
    previous: bool,
}

impl Drop for Tf32Guard {
    fn drop(&mut self) {
        TF32.with(|t| t.set(self.previous));
    }
}

/// f32 matmuls (and the GEMMs of convolutions) on this thread use TF32
/// tensor cores when `enabled`, until the guard drops.
pub fn with_tf32(enabled: bool) -> Tf32Guard {
    Tf32Guard {
        previous: TF32.with(|t| t.replace(enabled)),
    }
}

/// Whether f32 GEMMs on this thread use TF32 now (false by default).
pub fn tf32_enabled() -> bool {
    TF32.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_by_default_scoped_and_nested() {
        assert!(!tf32_enabled());
        {
            let _on = with_tf32(true);
            assert!(tf32_enabled());
            {
                let _off = with_tf32(false);
                assert!(!tf32_enabled());
            }
            assert!(tf32_enabled());
            // Other threads keep their own (default) choice.
            assert!(!std::thread::spawn(tf32_enabled).join().unwrap());
        }
        assert!(!tf32_enabled());
    }
}
