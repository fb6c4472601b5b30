//! Every integer Rust hands a kernel to choose what it computes, from one
//! source. Each table is an enum declared with `kernel_codes!` (a variant's
//! code is its position; its fields are scalars passed beside it): the
//! CUDA side's kernels name the same variants (`case
//! UnaryOp::Silu:`, `mode == NormGradCode::Affine`) from the C++
//! enumerations [`kernel_code_header`] writes in front of every kernel file,
//! so a code is written once, here, and never as a number in a `.cu` file
//! (`tests/kernel_codes.rs` checks both sides use every variant and that no
//! kernel compares a code with a literal).
//!
//! [`UnaryOp`], [`BinaryOp`] and [`CompareOp`] name the elementwise
//! functions a [`UnaryKernel`] or [`BinaryKernel`] computes on a backend
//! that runs compiled kernels (CUDA); the CPU evaluates the kernels' own
//! Rust code (`UnaryKernel::f`).
//!
//! [`UnaryKernel`]: crate::primitives::UnaryKernel
//! [`BinaryKernel`]: crate::primitives::BinaryKernel

use crate::DType;

/// One table of kernel codes: its enum's name (the C++ enumeration's
/// namespace) and each variant's name and value.
#[derive(Clone, Copy, Debug)]
pub struct CodeTable {
    /// The enum's name, on both sides.
    pub name: &'static str,
    /// `(variant, value)` in declaration order.
    pub codes: &'static [(&'static str, i32)],
}

/// Declares an enum whose variants a kernel tells apart by an `int` code
/// (0, 1, … in declaration order; a variant's fields are scalars passed
/// beside it), with its [`CodeTable`] as the associated const `TABLE` and
/// `kernel_code()`. `in <module>` names a private module for the fieldless
/// twin the codes are counted in. List the table in [`TABLES`] so the
/// kernels see it.
macro_rules! kernel_codes {
    ($(#[$meta:meta])* $vis:vis enum $name:ident in $codes:ident {
        $($(#[$vmeta:meta])* $variant:ident $(($($field:ty),+))?,)+
    }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq)]
        $vis enum $name {
            $($(#[$vmeta])* $variant $(($($field),+))?,)+
        }
        mod $codes {
            /// The variants without their fields, numbered as the kernels see them.
            #[repr(i32)]
            #[allow(dead_code)]
            pub(super) enum Code {
                $($variant,)+
            }
        }
        impl $name {
            /// This enum's codes as the kernels see them.
            pub const TABLE: CodeTable = CodeTable {
                name: stringify!($name),
                codes: &[$((stringify!($variant), $codes::Code::$variant as i32),)+],
            };
            /// The `int` a kernel receives for this variant (its fields, if
            /// any, travel as separate arguments).
            pub fn kernel_code(self) -> i32 {
                match self {
                    $($name::$variant { .. } => $codes::Code::$variant as i32,)+
                }
            }
        }
    };
}

/// Every table of kernel codes (what [`kernel_code_header`] declares).
pub const TABLES: &[CodeTable] = &[
    UnaryOp::TABLE,
    BinaryOp::TABLE,
    CompareOp::TABLE,
    ReduceCode::TABLE,
    GradMapCode::TABLE,
    NormGradCode::TABLE,
    AvgPoolCode::TABLE,
    MaskCode::TABLE,
    InterpCode::TABLE,
];

/// The C++ text that declares every table for the kernels, one
/// `namespace Name { enum : int { Variant = value, … }; }` per table (an
/// unscoped enumeration in a namespace: `case Name::Variant:` compares with
/// a kernel's `int` argument directly).
pub fn kernel_code_header() -> String {
    let mut out = String::from("// Generated from src/op_code.rs (kernel_code_header).\n");
    for t in TABLES {
        let body: Vec<String> = t.codes.iter().map(|(v, c)| format!("{v} = {c}")).collect();
        out.push_str(&format!(
            "namespace {} {{ enum : int {{ {} }}; }}\n",
            t.name,
            body.join(", ")
        ));
    }
    out
}

kernel_codes! {
    /// What `reduce.cu`'s kernels compute over each output's elements.
    pub enum ReduceCode in reduce_codes {
        /// Their sum.
        Sum,
        /// Their mean.
        Mean,
        /// Their maximum (NaN if one of them is, as on the CPU).
        Max,
        /// Their minimum (NaN if one of them is, as on the CPU).
        Min,
    }
}

kernel_codes! {
    /// How `optim.cu`'s updates map a gradient before using it (the
    /// optimizers' `GradTransform`; the value is the kernel's `gparam`).
    pub enum GradMapCode in grad_map_codes {
        /// The gradient as it is.
        Identity,
        /// The gradient times `gparam`.
        Scale,
        /// The gradient limited to `[-gparam, gparam]`.
        ClampAbs,
    }
}

kernel_codes! {
    /// Which input gradient `norm.cu`'s `norm_bwd_saved` computes (the
    /// norms' `GradMode`).
    pub enum NormGradCode in norm_grad_codes {
        /// `scale·(g − mean(g) − x̂·mean(g·x̂))` (batch and layer norm).
        Centered,
        /// `scale·(g − x̂·mean(g·x̂))` (RMS norm).
        Uncentered,
        /// `scale·g` (eval-mode batch norm).
        Affine,
    }
}

kernel_codes! {
    /// `pool.cu`'s average-pooling windows.
    pub enum AvgPoolCode in avg_pool_codes {
        /// Fixed windows, padding not counted.
        Fixed,
        /// Fixed windows, padding counted.
        FixedCountPad,
        /// Adaptive windows.
        Adaptive,
    }
}

kernel_codes! {
    /// `upsample.cu`'s bilinear formula: which of PyTorch's two CPU kernels
    /// (and so which order of products and sums) an interpolation follows.
    pub enum InterpCode in interp_codes {
        /// PyTorch's generic (channels-first) kernel: each row interpolated
        /// along the width, then the two rows along the height.
        Separable,
        /// PyTorch's channels-last kernel: four corner weights, one sum of
        /// four products.
        Corners,
    }
}

kernel_codes! {
    /// The attention kernels' mask (`attention.cu`, `flash.cu`).
    pub enum MaskCode in mask_codes {
        /// No mask.
        None,
        /// Additive, in the scores' dtype.
        Float,
        /// Boolean (u8, 0 = masked out).
        Bool,
        /// Additive, in f64.
        F64,
    }
}

kernel_codes! {
    /// A float map `x ↦ f(x)` (`elementwise.cu`'s `lg_unary`); the variants
    /// with a value are tensor-scalar ops.
    pub enum UnaryOp in unary_codes {
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
        /// `relu6(x + 3) / 6`
        Hardsigmoid,
        /// `x · relu6(x + 3) / 6`
        Hardswish,
        /// `x · tanh(ln(1 + eˣ))`
        Mish,
    }
}

impl UnaryOp {
    /// The kernel's op code and scalar parameters (see `lg_unary`) for
    /// elements of `dtype`.
    pub(crate) fn code(self, dtype: DType) -> (i32, f64, f64) {
        use UnaryOp::*;
        let (p, q) = match self {
            Powf(p) | LeakyRelu(p) | AddScalar(p) | MulScalar(p) | DivScalar(p) => (p, 0.0),
            RSubScalar(p) | RDivScalar(p) | MaxScalar(p) | MinScalar(p) | Scale(p) => (p, 0.0),
            Clamp(lo, hi) => (round_to(dtype, lo), round_to(dtype, hi)),
            Neg | Exp | Log | Sqrt | Abs | Square | Recip | Sin | Cos | Tanh | Sigmoid | Gelu
            | GeluTanh | Silu | Relu | Rsqrt | Sign | Hardsigmoid | Hardswish | Mish => (0.0, 0.0),
        };
        (self.kernel_code(), p, q)
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

kernel_codes! {
    /// A float map of two tensors (`elementwise.cu`'s `lg_binary`); the
    /// `…Grad` variants are the gradient kernels of the unary ops,
    /// `(g, saved) ↦ dx` with `saved` the op's input `x` or output `y` as its
    /// CPU kernel keeps it (src/ops/unary.rs).
    pub enum BinaryOp in binary_codes {
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
        /// hardsigmoid's: `g/6` inside `(-3, 3)`, else 0
        HardsigmoidGrad,
        /// hardswish's: 0 up to −3, `g` from 3, else `g·(x/3 + ½)`
        HardswishGrad,
        /// mish's: `g·(t + x·sigmoid(x)·(1 − t²))`, `t = tanh(ln(1 + eˣ))`
        MishGrad,
    }
}

impl BinaryOp {
    /// The kernel's op code and scalar parameter (see `lg_binary`).
    pub(crate) fn code(self) -> (i32, f64) {
        use BinaryOp::*;
        let p = match self {
            PowGrad(p) | ScaledMul(p) => p,
            Add | Sub | Mul | Div | Max | Min | Pow | SqrtGrad | AbsGrad | SquareGrad
            | RecipGrad | SinGrad | CosGrad | TanhGrad | SigmoidGrad | SiluGrad | GeluGrad
            | GeluTanhGrad | MaxShare | MinShare | HardsigmoidGrad | HardswishGrad | MishGrad => {
                0.0
            }
        };
        (self.kernel_code(), p)
    }
}

kernel_codes! {
    /// A comparison; results are u8 (1 = true) (`compare.cu`'s `lg_cmp`).
    pub enum CompareOp in compare_codes {
        /// `a == b`
        Eq,
        /// `a != b`
        Ne,
        /// `a < b`
        Lt,
        /// `a <= b`
        Le,
        /// `a > b`
        Gt,
        /// `a >= b`
        Ge,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Every variant of `UnaryOp` (parameters arbitrary).
    const UNARY: [UnaryOp; 31] = {
        use UnaryOp::*;
        [
            Neg,
            Exp,
            Log,
            Sqrt,
            Abs,
            Square,
            Recip,
            Sin,
            Cos,
            Tanh,
            Sigmoid,
            Gelu,
            GeluTanh,
            Silu,
            Relu,
            Rsqrt,
            Powf(2.0),
            LeakyRelu(0.1),
            AddScalar(1.0),
            MulScalar(2.0),
            DivScalar(2.0),
            RSubScalar(1.0),
            RDivScalar(1.0),
            MaxScalar(0.0),
            MinScalar(0.0),
            Clamp(-1.0, 1.0),
            Scale(0.5),
            Sign,
            Hardsigmoid,
            Hardswish,
            Mish,
        ]
    };

    /// Every variant of `BinaryOp`.
    const BINARY: [BinaryOp; 25] = {
        use BinaryOp::*;
        [
            Add,
            Sub,
            Mul,
            Div,
            Max,
            Min,
            Pow,
            SqrtGrad,
            AbsGrad,
            SquareGrad,
            RecipGrad,
            SinGrad,
            CosGrad,
            TanhGrad,
            SigmoidGrad,
            SiluGrad,
            PowGrad(2.0),
            GeluGrad,
            GeluTanhGrad,
            MaxShare,
            MinShare,
            ScaledMul(0.5),
            HardsigmoidGrad,
            HardswishGrad,
            MishGrad,
        ]
    };

    /// Each op has its own code and every code is some op's: a code with no
    /// op, or two ops on one formula, fails here.
    #[test]
    fn ops_and_codes_correspond_one_to_one() {
        let unary: BTreeSet<i32> = UNARY.iter().map(|op| op.code(DType::F32).0).collect();
        assert_eq!(unary.len(), UNARY.len());
        let table: BTreeSet<i32> = UnaryOp::TABLE.codes.iter().map(|c| c.1).collect();
        assert_eq!(unary, table);
        let binary: BTreeSet<i32> = BINARY.iter().map(|op| op.code().0).collect();
        assert_eq!(binary.len(), BINARY.len());
        let table: BTreeSet<i32> = BinaryOp::TABLE.codes.iter().map(|c| c.1).collect();
        assert_eq!(binary, table);
    }

    /// The scalars travel with the code (clamp's bounds rounded to the
    /// element type first).
    #[test]
    fn codes_carry_their_scalars() {
        assert_eq!(
            UnaryOp::LeakyRelu(0.25).code(DType::F32),
            (UnaryOp::LeakyRelu(0.0).kernel_code(), 0.25, 0.0)
        );
        let (code, lo, hi) = UnaryOp::Clamp(0.1, 2.0).code(DType::F16);
        assert_eq!(code, UnaryOp::Clamp(0.0, 0.0).kernel_code());
        assert_eq!((lo, hi), (half::f16::from_f32(0.1).to_f64(), 2.0));
        assert_eq!(
            BinaryOp::ScaledMul(3.0).code(),
            (BinaryOp::ScaledMul(0.0).kernel_code(), 3.0)
        );
    }

    #[test]
    fn every_table_is_listed_once() {
        let names: BTreeSet<&str> = TABLES.iter().map(|t| t.name).collect();
        assert_eq!(names.len(), TABLES.len());
    }
}
