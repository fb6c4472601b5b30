//! One cast of a tensor handed over (`to_dtype_owned`) or borrowed
//! (`to_dtype`) on any device, measured: the values, the gradient, and
//! what the ledger saw. Shared by `tests/buffer_reuse.rs` (CPU and meta)
//! and `tests/device_casts.rs` (CUDA).
#![allow(dead_code)]

use leangrad::autograd::with_buffer_reuse;
use leangrad::memory::{Category, Ledger};
use leangrad::{DType, Device, Result, Tensor};

/// The pairs of dtypes of one element size, both ways.
pub const SAME_SIZE_PAIRS: [(DType, DType); 6] = [
    (DType::F16, DType::BF16),
    (DType::BF16, DType::F16),
    (DType::F32, DType::U32),
    (DType::U32, DType::F32),
    (DType::F64, DType::I64),
    (DType::I64, DType::F64),
];

/// How the cast is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `to_dtype(&h)`: the reference.
    Borrowed,
    /// `h.to_dtype_owned(..)`, nothing else holding `h`.
    Owned,
    /// `h.to_dtype_owned(..)` while a clone of `h` is held.
    OwnedCloneHeld,
    /// `h.to_dtype_owned(..)` with buffer reuse off.
    OwnedReuseOff,
}

/// Every way of calling the cast, the reference first.
pub const MODES: [Mode; 4] = [
    Mode::Borrowed,
    Mode::Owned,
    Mode::OwnedCloneHeld,
    Mode::OwnedReuseOff,
];

/// What one cast did.
#[derive(Debug)]
pub struct CastRun {
    /// The output's elements as f64 bit patterns (`None` on meta).
    pub values: Option<Vec<u64>>,
    /// The input leaf's gradient as f64 bit patterns (`None` on meta or
    /// without a gradient).
    pub grad: Option<Vec<u64>>,
    /// Whether the output requires grad.
    pub requires_grad: bool,
    /// Whether the output lives in the input's storage, one version later.
    pub same_storage: bool,
    /// The ledger on the run's device: allocations made by the cast, bytes
    /// live after it, bytes saved for backward, the peak from the cast to
    /// the end of backward, bytes live at the end.
    pub ledger: [u64; 5],
}

/// Values that exercise every conversion of `from`: rounding near ties,
/// overflow, underflow, saturation, NaN and infinities, signed zeros,
/// then `n` seeded values spread over the dtype's range.
pub fn values(from: DType, n: usize) -> Vec<f64> {
    let mut v: Vec<f64> = match from {
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => vec![
            0.0,
            -0.0,
            1.0,
            -1.5,
            0.7,
            3.99,
            1.0 + 1.0 / 256.0 + 1.0 / 8_388_608.0,
            1.0 + 1.0 / 512.0,
            1.0 + 1.0 / 2048.0,
            65504.0,
            -65504.0,
            6.1e-5,
            5.96e-8,
            1e-30,
            3.0e38,
            4.0e9,
            5.0e9,
            -3.0e9,
            1.0e19,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ],
        _ => vec![
            0.0,
            1.0,
            255.0,
            16_777_217.0,
            123_456_789.0,
            4_294_967_295.0,
            9_007_199_254_740_993.0,
            -9_007_199_254_740_993.0,
        ],
    };
    let spread = Tensor::randn(&[n], DType::F64, Device::Cpu, 17)
        .and_then(|t| t.to_f64_vec())
        .expect("randn");
    let scale = if from.is_float() { 1e3 } else { 1e8 };
    v.extend(spread.iter().map(|x| (x * scale).abs()));
    v
}

/// `f64` bit patterns of a tensor's elements.
pub fn bits_of(t: &Tensor) -> Result<Vec<u64>> {
    Ok(t.to_f64_vec()?.iter().map(|v| v.to_bits()).collect())
}

/// `bits` with every NaN as the one f64 NaN: the CPU and CUDA agree that
/// an element is NaN, not always on its sign and payload bits.
pub fn nan_as_one(bits: &Option<Vec<u64>>) -> Option<Vec<u64>> {
    bits.as_ref().map(|b| {
        b.iter()
            .map(|&x| {
                if f64::from_bits(x).is_nan() {
                    f64::NAN.to_bits()
                } else {
                    x
                }
            })
            .collect()
    })
}

/// Casts `values` (made in `from` on `device`, as the output of an op on a
/// leaf requiring grad when `grad`) to `to` in `mode`, then runs backward
/// through `square` when the output requires grad.
pub fn cast_run(
    from: DType,
    to: DType,
    values: &[f64],
    device: Device,
    grad: bool,
    mode: Mode,
) -> Result<CastRun> {
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let _r = with_buffer_reuse(mode != Mode::OwnedReuseOff);
    // One expression: on the CPU `to_device` is a clone, and the first
    // handle must be gone for the tensor to be exclusive.
    let src =
        Tensor::from_f64_slice(values, &[values.len()], from, Device::Cpu)?.to_device(device)?;
    let (leaf, h) = if grad {
        let a = src.set_requires_grad(true)?;
        let h = a.mul_scalar(1.0)?;
        (Some(a), h)
    } else {
        (None, src)
    };
    let held = (mode == Mode::OwnedCloneHeld).then(|| h.clone());
    let held_values = match (&held, device) {
        (Some(t), d) if !d.is_meta() => Some(bits_of(t)?),
        _ => None,
    };
    let storage = std::sync::Arc::as_ptr(h.storage());
    let version = h.version();
    ledger.reset_peak();
    let before = ledger.allocation_count(device);
    let saved_before = ledger.live_in(device, Category::Saved);
    let y = match mode {
        Mode::Borrowed => h.to_dtype(to)?,
        _ => h.to_dtype_owned(to)?,
    };
    let made = ledger.allocation_count(device) - before;
    let live_after = ledger.live(device);
    let saved = ledger.live_in(device, Category::Saved) - saved_before;
    assert_eq!(y.dtype(), to, "{from:?} → {to:?} on {device}, {mode:?}");
    assert_eq!(y.shape(), [values.len()]);
    let same_storage = std::sync::Arc::as_ptr(y.storage()) == storage && y.version() == version + 1;
    if let Some(held) = &held {
        assert_eq!(held.dtype(), from, "the held clone changed dtype");
        if let Some(before) = held_values {
            assert_eq!(bits_of(held)?, before, "the held clone changed values");
        }
        assert!(!held.shares_storage_with(&y));
    }
    let output = if device.is_meta() {
        None
    } else {
        Some(bits_of(&y)?)
    };
    let requires_grad = y.requires_grad();
    if requires_grad {
        y.square()?.sum_all()?.backward()?;
    }
    drop(y);
    drop(held);
    let grad = match (&leaf, device.is_meta()) {
        (Some(a), false) => a.grad().map(|g| bits_of(&g)).transpose()?,
        _ => None,
    };
    if let Some(a) = &leaf {
        assert_eq!(
            a.grad().is_some(),
            requires_grad,
            "a gradient reached the leaf"
        );
    }
    let peak = ledger.peak(device);
    drop(leaf);
    Ok(CastRun {
        values: output,
        grad,
        requires_grad,
        same_storage,
        ledger: [
            made,
            live_after as u64,
            saved as u64,
            peak as u64,
            ledger.live(device) as u64,
        ],
    })
}
