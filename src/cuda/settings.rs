//! Per-thread, scoped CUDA settings (like the save policy): each is set by
//! a guard for the calling thread only and restored when the guard drops,
//! so no caller changes another's numerics or memory.
//!
//! TF32 as PyTorch sets it (`torch.backends.cuda.matmul.allow_tf32` off,
//! `torch.backends.cudnn.allow_tf32` on): TF32 rounds the inputs of a
//! product to a 10-bit mantissa, about 1e-3 relative error instead of
//! f32's 1e-7, for several times the throughput on tensor cores; f16, bf16
//! and f64 are unaffected.
//!
//! - TF32 for f32 matrix products ([`with_tf32`], off by default): cuBLAS
//!   GEMMs (matmul, linear layers, attention's products).
//! - TF32 for f32 convolutions ([`with_conv_tf32`], on by default): their
//!   tiles of 16 rows or more run on TF32 tensor cores (`mma.sync`,
//!   operands rounded to nearest); the 8-row tiles of layers with at most
//!   8 output (or, for the input gradient, input) channels stay in f32.
//!   Off: every f32 convolution in strict f32, as on the CPU.
//!
//! The convolution workspace budget, which applies on every device, is
//! `crate::nn::with_conv_workspace`.

use crate::settings::{set, SettingGuard, CONV_TF32, TF32};
use std::cell::Cell;

/// f32 matrix products (cuBLAS GEMMs) on this thread use TF32 tensor
/// cores when `enabled`, until the guard drops (off by default, as
/// PyTorch's `torch.backends.cuda.matmul.allow_tf32`).
pub fn with_tf32(enabled: bool) -> SettingGuard<bool> {
    set(&TF32, enabled)
}

/// Whether f32 matrix products on this thread use TF32 now (false by
/// default).
pub fn tf32_enabled() -> bool {
    TF32.with(Cell::get)
}

/// f32 convolutions on this thread use TF32 tensor cores when `enabled`,
/// strict f32 otherwise, until the guard drops (on by default, as
/// PyTorch's `torch.backends.cudnn.allow_tf32`).
pub fn with_conv_tf32(enabled: bool) -> SettingGuard<bool> {
    set(&CONV_TF32, enabled)
}

/// Whether f32 convolutions on this thread use TF32 now (true by default).
pub fn conv_tf32_enabled() -> bool {
    CONV_TF32.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_scoped_nested_and_per_thread() {
        assert!(!tf32_enabled());
        assert!(conv_tf32_enabled());
        {
            let _strict = with_conv_tf32(false);
            assert!(!conv_tf32_enabled());
            let _on = with_tf32(true);
            assert!(tf32_enabled());
            {
                let _off = with_tf32(false);
                assert!(!tf32_enabled());
            }
            assert!(tf32_enabled());
            // Other threads keep their own (default) settings.
            let other = std::thread::spawn(|| (tf32_enabled(), conv_tf32_enabled()));
            assert_eq!(other.join().unwrap(), (false, true));
        }
        assert!(!tf32_enabled());
        assert!(conv_tf32_enabled());
    }
}
