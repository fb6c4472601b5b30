//! The elementwise functions by name: what a backend that runs compiled
//! kernels (CUDA) needs to know which function a [`UnaryKernel`] or
//! [`BinaryKernel`] computes, and which comparison a compare runs. The CPU
//! evaluates the kernels' own Rust code (`UnaryKernel::f`); the codes are
//! the kernels' `int op` arguments, and every kernel's code is checked to
//! be unique by the ops' unit tests.
//!
//! [`UnaryKernel`]: crate::primitives::UnaryKernel
//! [`BinaryKernel`]: crate::primitives::BinaryKernel

use crate::DType;

/// A float map `x ↦ f(x)`; the variants with a value are tensor-scalar ops.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    /// `-x`
    Neg,
    /// `eˣ`
    Exp,
    /// `ln x`
    Log,
    /// `√x`
    Sqrt,
    /// `|x|`
    Abs,
    /// `x²`
    Square,
    /// `1/x`
    Recip,
    /// `sin x`
    Sin,
    /// `cos x`
    Cos,
    /// `tanh x`
    Tanh,
    /// `1/(1+e⁻ˣ)`
    Sigmoid,
    /// `x·Φ(x)` (erf form)
    Gelu,
    /// GELU's tanh approximation
    GeluTanh,
    /// `x·sigmoid(x)`
    Silu,
    /// `max(x, 0)`
    Relu,
    /// `1/√x`
    Rsqrt,
    /// `xᵖ`
    Powf(f64),
    /// `x` if positive, else `slope·x`
    LeakyRelu(f64),
    /// `x + s`
    AddScalar(f64),
    /// `x · s`
    MulScalar(f64),
    /// `x / s`
    DivScalar(f64),
    /// `s − x`
    RSubScalar(f64),
    /// `s / x`
    RDivScalar(f64),
    /// `max(x, s)`, NaN passing through (as `clamp(s, +∞)` on the CPU)
    MaxScalar(f64),
    /// `min(x, s)`, NaN passing through (as `clamp(−∞, s)` on the CPU)
    MinScalar(f64),
    /// `x` limited to `[lo, hi]`, NaN passing through; the bounds are
    /// rounded to the element type first, as the CPU's clamp does
    Clamp(f64, f64),
    /// `x · s` with the product in f64 (the CPU's `Scale`, mean's backward)
    Scale(f64),
    /// `−1`, `0` or `+1` by the sign of `x` (`±0` and NaN give `0`, as
    /// PyTorch's `sign`)
    Sign,
}

impl UnaryOp {
    /// The kernel's op code and scalar parameters (see `lg_unary`) for
    /// elements of `dtype`.
    pub(crate) fn code(self, dtype: DType) -> (i32, f64, f64) {
        use UnaryOp::*;
        let one = |code: i32, p: f64| (code, p, 0.0);
        match self {
            Neg => one(0, 0.0),
            Exp => one(1, 0.0),
            Log => one(2, 0.0),
            Sqrt => one(3, 0.0),
            Abs => one(4, 0.0),
            Square => one(5, 0.0),
            Recip => one(6, 0.0),
            Sin => one(7, 0.0),
            Cos => one(8, 0.0),
            Tanh => one(9, 0.0),
            Sigmoid => one(10, 0.0),
            Gelu => one(11, 0.0),
            GeluTanh => one(12, 0.0),
            Silu => one(13, 0.0),
            Relu => one(14, 0.0),
            Powf(p) => one(15, p),
            LeakyRelu(s) => one(16, s),
            AddScalar(s) => one(17, s),
            MulScalar(s) => one(18, s),
            RSubScalar(s) => one(19, s),
            RDivScalar(s) => one(20, s),
            MaxScalar(s) => one(21, s),
            MinScalar(s) => one(22, s),
            Rsqrt => one(24, 0.0),
            DivScalar(s) => one(25, s),
            Clamp(lo, hi) => (26, round_to(dtype, lo), round_to(dtype, hi)),
            Scale(s) => one(27, s),
            Sign => one(28, 0.0),
        }
    }
}

/// `v` rounded to the nearest value of the float `dtype` (what the CPU's
/// kernels do to a scalar before comparing with elements), as an f64.
fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F32 => v as f32 as f64,
        // Through f32, as `WithDType::from_f64` and PyTorch round.
        DType::F16 => half::f16::from_f32(v as f32).to_f64(),
        DType::BF16 => half::bf16::from_f32(v as f32).to_f64(),
        _ => v,
    }
}

/// A float map of two tensors; the `…Grad` variants are the gradient
/// kernels of the unary ops, `(g, saved) ↦ dx` with `saved` the op's input
/// `x` or output `y` as its CPU kernel keeps it (src/ops/unary.rs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a − b`
    Sub,
    /// `a · b`
    Mul,
    /// `a / b`
    Div,
    /// `max(a, b)`, NaN propagating (torch.maximum)
    Max,
    /// `min(a, b)`, NaN propagating (torch.minimum)
    Min,
    /// `aᵇ`
    Pow,
    /// sqrt's: `g / 2y`
    SqrtGrad,
    /// abs's: `±g` by the sign of `x`, 0 at 0
    AbsGrad,
    /// square's: `g · 2x`
    SquareGrad,
    /// recip's: `−g·y²`
    RecipGrad,
    /// sin's: `g · cos x`
    SinGrad,
    /// cos's: `−g · sin x`
    CosGrad,
    /// tanh's: `g · (1 − y²)`
    TanhGrad,
    /// sigmoid's: `g · y(1 − y)`
    SigmoidGrad,
    /// silu's: `g · s(1 + x(1 − s))`, `s = sigmoid(x)`
    SiluGrad,
    /// powf's with exponent `p`: `g · p · x^(p−1)`, 0 for `p = 0`
    PowGrad(f64),
    /// GELU's (erf form), the derivative in f64 as on the CPU
    GeluGrad,
    /// GELU's tanh approximation's, the derivative in f64
    GeluTanhGrad,
    /// maximum's share for `a`: 1 where `a > b`, ½ on a tie, else 0
    MaxShare,
    /// minimum's share for `a`: 1 where `a < b`, ½ on a tie, else 0
    MinShare,
    /// `a · b · factor` with the products in f64 (mse_loss's backward)
    ScaledMul(f64),
}

impl BinaryOp {
    /// The kernel's op code and scalar parameter (see `lg_binary`).
    pub(crate) fn code(self) -> (i32, f64) {
        use BinaryOp::*;
        match self {
            Add => (0, 0.0),
            Sub => (1, 0.0),
            Mul => (2, 0.0),
            Div => (3, 0.0),
            Max => (4, 0.0),
            Min => (5, 0.0),
            Pow => (6, 0.0),
            SqrtGrad => (7, 0.0),
            AbsGrad => (8, 0.0),
            SquareGrad => (9, 0.0),
            RecipGrad => (10, 0.0),
            SinGrad => (11, 0.0),
            CosGrad => (12, 0.0),
            TanhGrad => (13, 0.0),
            SigmoidGrad => (14, 0.0),
            SiluGrad => (15, 0.0),
            PowGrad(p) => (16, p),
            GeluGrad => (17, 0.0),
            GeluTanhGrad => (18, 0.0),
            MaxShare => (19, 0.0),
            MinShare => (20, 0.0),
            ScaledMul(f) => (21, f),
        }
    }
}

/// A comparison; results are u8 (1 = true).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    /// `a == b`
    Eq = 0,
    /// `a != b`
    Ne = 1,
    /// `a < b`
    Lt = 2,
    /// `a <= b`
    Le = 3,
    /// `a > b`
    Gt = 4,
    /// `a >= b`
    Ge = 5,
}
