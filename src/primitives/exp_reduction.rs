//! The constants of the vectorised `e^y` kernels (attention's softmax,
//! exact GELU): Cody–Waite reduction `y = n·ln 2 + r` with `|r| ≤ ln 2 / 2`,
//! then a Taylor polynomial in `r`. The kernels differ in their error
//! contracts (one without FMA, so every build gives the same values; one
//! with it), not in these numbers.

/// `1.5·2⁵²`: adding it to a double rounds it to an integer held in the
/// low mantissa bits (`n`, and `2ⁿ` from those bits).
pub(crate) const SHIFT: f64 = 6_755_399_441_055_744.0;

/// ln 2 with its low 32 bits zero, so `n·LN2_HI` is exact for `|n| < 2¹¹`.
pub(crate) const LN2_HI: f64 = 0.693_147_180_369_123_8;

/// `ln 2 − LN2_HI`.
pub(crate) const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;

/// `1/13!`, where Horner's recurrence over [`INV_FACT_12_TO_2`] starts.
pub(crate) const INV_FACT_13: f64 = 1.0 / 6_227_020_800.0;

/// `1/k!` for `k = 12` down to `2`.
pub(crate) const INV_FACT_12_TO_2: [f64; 11] = [
    1.0 / 479_001_600.0,
    1.0 / 39_916_800.0,
    1.0 / 3_628_800.0,
    1.0 / 362_880.0,
    1.0 / 40_320.0,
    1.0 / 5_040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    1.0 / 2.0,
];
