//! Elementwise unary float ops and activations. Each saves at most one
//! tensor (its input, its output, or for relu-like ops a 1-bit packed mask).

use super::mask::{MaskRule, SavedMask};
use crate::autograd::{attach, may_reuse, needs_grad, BackwardOp, SavedTensor};
use crate::op_code::{BinaryOp as CudaBinary, UnaryOp as CudaUnary};
use crate::primitives::{
    binary_map, map_and_assign, unary_assign, unary_map, BinaryKernel, PairKernel, UnaryKernel,
};
use crate::{FloatDType, Result, Tensor, WithDType};

mod gelu;
#[cfg(test)]
use gelu::erf;
use gelu::{gelu_grad_f64, gelu_tanh_pair_f64, gelu_value_f64};

/// `v` as a `T`.
#[inline(always)]
fn c<T: FloatDType>(v: f64) -> T {
    <T as WithDType>::from_f64(v)
}

/// `x` as an f64.
#[inline(always)]
fn f64_of<T: FloatDType>(x: T) -> f64 {
    <T as WithDType>::to_f64(x)
}

macro_rules! kernel {
    ($name:ident, $s:literal, $cuda:ident, |$x:ident| $e:expr) => {
        pub(crate) struct $name;
        impl UnaryKernel for $name {
            const NAME: &'static str = $s;
            fn f<T: FloatDType>(&self, $x: T) -> T {
                $e
            }
            fn cuda(&self) -> Option<CudaUnary> {
                Some(CudaUnary::$cuda)
            }
        }
    };
}

/// A gradient kernel `(g, v) -> dx`, `v` being the saved input or output,
/// with the CUDA op computing the same formula (`lg_binary` in
/// kernels/elementwise.cu).
macro_rules! grad_kernel {
    ($name:ident, $s:literal, $cuda:ident, |$g:ident, $v:ident| $e:expr) => {
        pub(crate) struct $name;
        impl BinaryKernel for $name {
            const NAME: &'static str = $s;
            fn f<T: FloatDType>(&self, $g: T, $v: T) -> T {
                $e
            }
            fn cuda(&self) -> Option<CudaBinary> {
                Some(CudaBinary::$cuda)
            }
        }
    };
}

kernel!(NegK, "neg", Neg, |x| -x);
kernel!(ExpK, "exp", Exp, |x| x.exp());
kernel!(LogK, "log", Log, |x| x.ln());
kernel!(SqrtK, "sqrt", Sqrt, |x| x.sqrt());
kernel!(AbsK, "abs", Abs, |x| x.abs());
kernel!(SquareK, "square", Square, |x| x * x);
kernel!(RecipK, "recip", Recip, |x| x.recip());
kernel!(SinK, "sin", Sin, |x| x.sin());
kernel!(CosK, "cos", Cos, |x| x.cos());
kernel!(TanhK, "tanh", Tanh, |x| x.tanh());
kernel!(SigmoidK, "sigmoid", Sigmoid, |x| sigmoid(x));
kernel!(SiluK, "silu", Silu, |x| x * sigmoid(x));
// `x <= 0` is false for NaN, so NaN propagates.
kernel!(ReluK, "relu", Relu, |x| if x <= T::zero() {
    T::zero()
} else {
    x
});
// `(0 < x) − (x < 0)`: ±0 and NaN give 0, as PyTorch's `sign`.
kernel!(SignK, "sign", Sign, |x| {
    let pos = if x > T::zero() { T::one() } else { T::zero() };
    let neg = if x < T::zero() { T::one() } else { T::zero() };
    pos - neg
});

kernel!(HardsigmoidK, "hardsigmoid", Hardsigmoid, |x| relu6_shift(x)
    / c::<T>(6.0));
kernel!(HardswishK, "hardswish", Hardswish, |x| x * relu6_shift(x)
    / c::<T>(6.0));
// PyTorch's mish: `x · tanh(log1p(eˣ))` with no softplus threshold.
kernel!(MishK, "mish", Mish, |x| x * tanh_softplus(x));

grad_kernel!(ExpB, "exp", Mul, |g, y| g * y);
grad_kernel!(LogB, "log", Div, |g, x| g / x);
grad_kernel!(SqrtB, "sqrt", SqrtGrad, |g, y| g / (y + y));
grad_kernel!(AbsB, "abs", AbsGrad, |g, x| if x > T::zero() {
    g
} else if x < T::zero() {
    -g
} else {
    T::zero()
});
grad_kernel!(SquareB, "square", SquareGrad, |g, x| g * (x + x));
grad_kernel!(RecipB, "recip", RecipGrad, |g, y| -(g * y * y));
grad_kernel!(SinB, "sin", SinGrad, |g, x| g * x.cos());
grad_kernel!(CosB, "cos", CosGrad, |g, x| -(g * x.sin()));
grad_kernel!(TanhB, "tanh", TanhGrad, |g, y| g * (T::one() - y * y));
grad_kernel!(SigmoidB, "sigmoid", SigmoidGrad, |g, y| g
    * y
    * (T::one() - y));
grad_kernel!(SiluB, "silu", SiluGrad, |g, x| {
    let s = sigmoid(x);
    g * s * (T::one() + x * (T::one() - s))
});

// PyTorch's backward kernels (its vectorised CPU path, which tensors of
// more than a few elements take): hardsigmoid's is 0 at ±3 and for NaN;
// hardswish's is 0 up to −3 and `g` from 3, NaN for NaN.
grad_kernel!(HardsigmoidB, "hardsigmoid", HardsigmoidGrad, |g, x| {
    if x > c::<T>(-3.0) && x < c::<T>(3.0) {
        // PyTorch's `one_sixth` is the f32 1/6 in every dtype.
        g * c::<T>((1.0f32 / 6.0f32) as f64)
    } else {
        T::zero()
    }
});
grad_kernel!(HardswishB, "hardswish", HardswishGrad, |g, x| {
    if x <= c::<T>(-3.0) {
        T::zero()
    } else if x >= c::<T>(3.0) {
        g
    } else {
        g * (x / c::<T>(3.0) + c::<T>(0.5))
    }
});

// `g · (t + x·s·(1 − t²))`, `s = sigmoid(x)`, `t = tanh(softplus(x))`:
// PyTorch's formula and order of operations.
grad_kernel!(MishB, "mish", MishGrad, |g, x| {
    let (s, t) = (sigmoid(x), tanh_softplus(x));
    g * (t + x * s * (T::one() - t * t))
});

/// `tanh(ln(1 + eˣ))`, mish's factor.
#[inline(always)]
fn tanh_softplus<T: FloatDType>(x: T) -> T {
    x.exp().ln_1p().tanh()
}

/// `min(max(x + 3, 0), 6)` by comparisons as PyTorch's CPU kernels, so NaN
/// passes through (`f32::max` would drop it).
#[inline(always)]
fn relu6_shift<T: FloatDType>(x: T) -> T {
    let r = x + c::<T>(3.0);
    let r = if r < T::zero() { T::zero() } else { r };
    if c::<T>(6.0) < r {
        c(6.0)
    } else {
        r
    }
}

#[inline(always)]
fn sigmoid<T: FloatDType>(x: T) -> T {
    T::one() / (T::one() + (-x).exp())
}

/// `x^p` for a scalar exponent.
struct PowK(f64);
impl UnaryKernel for PowK {
    const NAME: &'static str = "powf";
    fn f<T: FloatDType>(&self, x: T) -> T {
        x.powf(c(self.0))
    }
    fn cuda(&self) -> Option<CudaUnary> {
        Some(CudaUnary::Powf(self.0))
    }
}

/// `g · p · x^(p-1)`, and 0 for `p = 0`.
struct PowB(f64);
impl BinaryKernel for PowB {
    const NAME: &'static str = "powf";
    fn f<T: FloatDType>(&self, g: T, x: T) -> T {
        if self.0 == 0.0 {
            return T::zero();
        }
        g * c::<T>(self.0) * x.powf(c(self.0 - 1.0))
    }
    fn cuda(&self) -> Option<CudaBinary> {
        Some(CudaBinary::PowGrad(self.0))
    }
}

/// `x` for `x > 0`, else `slope · x`.
struct LeakyK(f64);
impl UnaryKernel for LeakyK {
    const NAME: &'static str = "leaky_relu";
    fn f<T: FloatDType>(&self, x: T) -> T {
        if x > T::zero() {
            x
        } else {
            x * c(self.0)
        }
    }
    fn cuda(&self) -> Option<CudaUnary> {
        Some(CudaUnary::LeakyRelu(self.0))
    }
}

struct GeluK(bool);
impl UnaryKernel for GeluK {
    const NAME: &'static str = "gelu";
    const BLOCKWISE: bool = true;
    fn f<T: FloatDType>(&self, x: T) -> T {
        c(gelu_value_f64(f64_of(x), self.0))
    }
    fn f_block<T: FloatDType>(&self, src: &[T], out: &mut [T]) {
        if self.0 {
            out.iter_mut().zip(src).for_each(|(o, &x)| *o = self.f(x));
        } else {
            gelu::fast_block(src, out, false);
        }
    }
    fn cuda(&self) -> Option<CudaUnary> {
        Some(if self.0 {
            CudaUnary::GeluTanh
        } else {
            CudaUnary::Gelu
        })
    }
}

struct GeluB(bool);
impl BinaryKernel for GeluB {
    const NAME: &'static str = "gelu";
    const BLOCKWISE: bool = true;
    fn f<T: FloatDType>(&self, g: T, x: T) -> T {
        g * c(gelu_grad_f64(f64_of(x), self.0))
    }
    fn f_block<T: FloatDType>(&self, g: &[T], x: &[T], out: &mut [T]) {
        if self.0 {
            for ((o, &g), &x) in out.iter_mut().zip(g).zip(x) {
                *o = self.f(g, x);
            }
        } else {
            gelu::fast_grad_block(x, g, out);
        }
    }
    fn cuda(&self) -> Option<CudaBinary> {
        Some(if self.0 {
            CudaBinary::GeluTanhGrad
        } else {
            CudaBinary::GeluGrad
        })
    }
}

/// GELU and its derivative from one evaluation, each rounded once to the
/// element type exactly as [`GeluK`] and [`GeluB`] round them.
struct GeluPairK(bool);
impl PairKernel for GeluPairK {
    const NAME: &'static str = "gelu";
    fn pair_block<T: FloatDType>(&self, x: &[T], value: &mut [T], slope: &mut [T]) {
        if self.0 {
            for ((v, d), &x) in value.iter_mut().zip(slope.iter_mut()).zip(x) {
                let (value, slope) = gelu_tanh_pair_f64(f64_of(x));
                (*v, *d) = (c(value), c(slope));
            }
        } else {
            gelu::fast_pair_block(x, value, slope);
        }
    }
}

// GELU's input gradient from its saved derivative `d` (already rounded to
// the element type): the same product [`GeluB`] makes.
grad_kernel!(GeluSlopeB, "gelu", Mul, |g, d| g * d);

/// Backward of neg: saves nothing.
struct NegBackward;

impl BackwardOp for NegBackward {
    fn name(&self) -> &'static str {
        "neg"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(unary_map(&g, &NegK)?)])
    }
}

/// Backward of sign: the gradient is zero everywhere (as PyTorch's
/// `sign_backward`), so nothing is saved; the zeros are made from the
/// incoming gradient's shape, dtype and device.
struct SignBackward;

impl BackwardOp for SignBackward {
    fn name(&self) -> &'static str {
        "sign"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(Tensor::zeros(g.shape(), g.dtype(), g.device())?)])
    }
}

/// Backward of a unary op whose input gradient is `k(g, saved)`; `saved`
/// is the op's input or its output, as the op's doc comment says.
struct SavedBackward<K> {
    saved: SavedTensor,
    k: K,
}

impl<K: BinaryKernel + Send + 'static> BackwardOp for SavedBackward<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(binary_map(&g, self.saved.get()?, &self.k)?)])
    }
}

/// Backward of relu and leaky_relu: saves only a packed 1-bit mask (U32
/// words, bit set where the input was > 0) and the negative slope; under
/// `SaveAll`, the output (relu) or input (leaky_relu) instead, like PyTorch.
struct MaskBackward {
    name: &'static str,
    mask: SavedMask,
    slope: f64,
}

impl BackwardOp for MaskBackward {
    fn name(&self) -> &'static str {
        self.name
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(self.mask.apply(g, self.slope)?)])
    }
}

/// Which tensor a unary op keeps for backward.
enum Keep {
    Input,
    Output,
}

/// Runs `f` on `x` and, when `x` needs grad, records a [`SavedBackward`]
/// with gradient kernel `b` keeping the input or the output.
fn unary_op<F: UnaryKernel, B: BinaryKernel + Send + 'static>(
    x: &Tensor,
    f: F,
    keep: Keep,
    b: B,
) -> Result<Tensor> {
    let out = unary_map(x, &f)?;
    let [needs] = needs_grad([x]);
    if !needs {
        return Ok(out);
    }
    let saved = match keep {
        Keep::Input => SavedTensor::new(x, F::NAME),
        Keep::Output => SavedTensor::new(&out, F::NAME),
    };
    Ok(attach(out, &[x], SavedBackward { saved, k: b }))
}

/// [`unary_op`] over an input the caller hands over: the output is written
/// over `x`'s buffer when buffer reuse may take it ([`may_reuse`]) and
/// backward will not read `x` (no gradient flows through it, or the op
/// keeps its output). Same values, same saved tensor, one buffer fewer.
fn unary_op_owned<F: UnaryKernel, B: BinaryKernel + Send + 'static>(
    x: Tensor,
    f: F,
    keep: Keep,
    b: B,
) -> Result<Tensor> {
    let [needs] = needs_grad([&x]);
    if !may_reuse(&x) || (needs && matches!(keep, Keep::Input)) {
        return unary_op(&x, f, keep, b);
    }
    unary_assign(&x, &f)?;
    let out = x.detach();
    if !needs {
        return Ok(out);
    }
    let saved = SavedTensor::new(&out, F::NAME);
    Ok(attach(out, &[&x], SavedBackward { saved, k: b }))
}

/// Runs a relu-like kernel; when `x` needs grad saves only the packed mask
/// of `mask_of > 0` (`mask_of` being the input or the output).
fn masked_op(
    x: &Tensor,
    out: Tensor,
    name: &'static str,
    slope: f64,
    mask_of_input: bool,
) -> Result<Tensor> {
    let [needs] = needs_grad([x]);
    if !needs {
        return Ok(out);
    }
    let source = if mask_of_input { x } else { &out };
    let op = MaskBackward {
        name,
        mask: SavedMask::new(source, MaskRule::Positive, name)?,
        slope,
    };
    Ok(attach(out, &[x], op))
}

/// ReLU whose output and mask one kernel makes (where the device has one:
/// CUDA under the lean policy) when the input needs grad; the same output,
/// saved mask and node as [`masked_op`] after the plain kernel. `None`:
/// take the plain path.
fn relu_fused(x: &Tensor, in_place: bool) -> Result<Option<Tensor>> {
    let [needs] = needs_grad([x]);
    if !needs {
        return Ok(None);
    }
    let Some((out, bits)) = crate::ops::mask::relu_with_mask(x, in_place)? else {
        return Ok(None);
    };
    let op = MaskBackward {
        name: "relu",
        mask: SavedMask::from_bits(&out, &bits, MaskRule::Positive, "relu"),
        slope: 0.0,
    };
    Ok(Some(attach(out, &[x], op)))
}

/// The ReLU of `relu_inplace` over `x` whose values a fused kernel (a
/// norm's apply with ReLU) already replaced by `max(x, 0)` in place: the
/// output and node `x.relu_inplace()` would give on the values before, with
/// the mask `bits()` makes (the packed bits of the output's positives,
/// taken only when `x` needs grad, so it is counted where the unfused op
/// counts its own).
pub(crate) fn relu_applied_in_place(
    x: Tensor,
    bits: impl FnOnce() -> Result<Tensor>,
) -> Result<Tensor> {
    let [needs] = needs_grad([&x]);
    let out = x.detach();
    if !needs {
        return Ok(out);
    }
    let op = MaskBackward {
        name: "relu",
        mask: SavedMask::from_bits(&out, &bits()?, MaskRule::Positive, "relu"),
        slope: 0.0,
    };
    Ok(attach(out, &[&x], op))
}

impl Tensor {
    /// `-self`. Saves nothing for backward.
    pub fn neg(&self) -> Result<Tensor> {
        Ok(attach(unary_map(self, &NegK)?, &[self], NegBackward))
    }

    /// `−1`, `0` or `+1` by the sign of each element, as `torch.sign`:
    /// `±0` and NaN give `0` (PyTorch computes `(0 < x) − (x < 0)`). The
    /// gradient is zero everywhere; nothing is saved for backward.
    pub fn sign(&self) -> Result<Tensor> {
        Ok(attach(unary_map(self, &SignK)?, &[self], SignBackward))
    }

    /// `e^x`. Saves its output for backward.
    pub fn exp(&self) -> Result<Tensor> {
        unary_op(self, ExpK, Keep::Output, ExpB)
    }

    /// Natural logarithm. Saves its input for backward.
    pub fn log(&self) -> Result<Tensor> {
        unary_op(self, LogK, Keep::Input, LogB)
    }

    /// Square root. Saves its output for backward.
    pub fn sqrt(&self) -> Result<Tensor> {
        unary_op(self, SqrtK, Keep::Output, SqrtB)
    }

    /// `|x|` (gradient 0 at 0). Saves its input for backward.
    pub fn abs(&self) -> Result<Tensor> {
        unary_op(self, AbsK, Keep::Input, AbsB)
    }

    /// `x²`. Saves its input for backward.
    pub fn square(&self) -> Result<Tensor> {
        unary_op(self, SquareK, Keep::Input, SquareB)
    }

    /// `1/x`. Saves its output for backward.
    pub fn recip(&self) -> Result<Tensor> {
        unary_op(self, RecipK, Keep::Output, RecipB)
    }

    /// Sine. Saves its input for backward.
    pub fn sin(&self) -> Result<Tensor> {
        unary_op(self, SinK, Keep::Input, SinB)
    }

    /// Cosine. Saves its input for backward.
    pub fn cos(&self) -> Result<Tensor> {
        unary_op(self, CosK, Keep::Input, CosB)
    }

    /// Hyperbolic tangent. Saves its output for backward.
    pub fn tanh(&self) -> Result<Tensor> {
        unary_op(self, TanhK, Keep::Output, TanhB)
    }

    /// `1 / (1 + e^-x)`. Saves its output for backward.
    pub fn sigmoid(&self) -> Result<Tensor> {
        unary_op(self, SigmoidK, Keep::Output, SigmoidB)
    }

    /// `x · Φ(x)`: exact with erf, or the tanh approximation
    /// `0.5x(1 + tanh(√(2/π)(x + 0.044715x³)))` when `approximate`.
    /// Computed in f64 whatever the dtype and rounded once (f32/f16/bf16
    /// blocks of the exact form through a vectorised path that returns the
    /// same bits). Saves its input for backward.
    pub fn gelu(&self, approximate: bool) -> Result<Tensor> {
        unary_op(self, GeluK(approximate), Keep::Input, GeluB(approximate))
    }

    /// `x · sigmoid(x)` (swish). Saves its input for backward.
    pub fn silu(&self) -> Result<Tensor> {
        unary_op(self, SiluK, Keep::Input, SiluB)
    }

    /// `relu6(x + 3) / 6` (`torch.nn.functional.hardsigmoid`; MobileNetV3's
    /// squeeze-and-excitation gate). Saves its input for backward.
    pub fn hardsigmoid(&self) -> Result<Tensor> {
        unary_op(self, HardsigmoidK, Keep::Input, HardsigmoidB)
    }

    /// `x · relu6(x + 3) / 6` (`torch.nn.functional.hardswish`). Saves its
    /// input for backward.
    pub fn hardswish(&self) -> Result<Tensor> {
        unary_op(self, HardswishK, Keep::Input, HardswishB)
    }

    /// `x · tanh(ln(1 + eˣ))` (`torch.nn.functional.mish`). Saves its input
    /// for backward.
    pub fn mish(&self) -> Result<Tensor> {
        unary_op(self, MishK, Keep::Input, MishB)
    }

    /// [`Tensor::mish`] of a tensor handed over (see
    /// [`Tensor::hardswish_owned`]).
    pub fn mish_owned(self) -> Result<Tensor> {
        unary_op_owned(self, MishK, Keep::Input, MishB)
    }

    /// [`Tensor::hardswish`] of a tensor handed over: written over its
    /// buffer when nothing else holds it and no gradient flows through it.
    /// Saves its input for backward, as `hardswish`.
    pub fn hardswish_owned(self) -> Result<Tensor> {
        unary_op_owned(self, HardswishK, Keep::Input, HardswishB)
    }

    /// [`Tensor::hardsigmoid`] of a tensor handed over (see
    /// [`Tensor::hardswish_owned`]).
    pub fn hardsigmoid_owned(self) -> Result<Tensor> {
        unary_op_owned(self, HardsigmoidK, Keep::Input, HardsigmoidB)
    }

    /// [`Tensor::tanh`] of a tensor handed over: written over its buffer
    /// when nothing else holds it ([`crate::autograd::may_reuse`]). Saves
    /// its output for backward, as `tanh`.
    pub fn tanh_owned(self) -> Result<Tensor> {
        unary_op_owned(self, TanhK, Keep::Output, TanhB)
    }

    /// [`Tensor::sigmoid`] of a tensor handed over: written over its
    /// buffer when nothing else holds it. Saves its output for backward.
    pub fn sigmoid_owned(self) -> Result<Tensor> {
        unary_op_owned(self, SigmoidK, Keep::Output, SigmoidB)
    }

    /// [`Tensor::gelu`] of a tensor handed over, with the same values and
    /// gradients. When nothing else holds it: with no gradient flowing
    /// through it (a frozen prefix), written over its buffer; with one, on
    /// the CPU, the output is a new tensor and the input's buffer is
    /// rewritten with gelu'(x) (rounded to the dtype), which is what it
    /// saves for backward, so backward is one product instead of a second
    /// evaluation (the same bytes as saving the input). Otherwise out of
    /// place, saving its input.
    pub fn gelu_owned(self, approximate: bool) -> Result<Tensor> {
        let [needs] = needs_grad([&self]);
        let host = self.device().is_cpu() || self.device().is_meta();
        let dense = self.layout().contiguous_range().is_some();
        if needs && host && dense && may_reuse(&self) {
            let out = map_and_assign(&self, &GeluPairK(approximate))?;
            let saved = SavedTensor::new(&self, "gelu");
            return Ok(attach(
                out,
                &[&self],
                SavedBackward {
                    saved,
                    k: GeluSlopeB,
                },
            ));
        }
        let (f, b) = (GeluK(approximate), GeluB(approximate));
        unary_op_owned(self, f, Keep::Input, b)
    }

    /// [`Tensor::silu`] of a tensor handed over: written over its buffer
    /// when nothing else holds it and no gradient flows through it;
    /// otherwise out of place, saving its input.
    pub fn silu_owned(self) -> Result<Tensor> {
        unary_op_owned(self, SiluK, Keep::Input, SiluB)
    }

    /// `x^exponent` for a scalar exponent. Saves its input for backward.
    pub fn powf(&self, exponent: f64) -> Result<Tensor> {
        unary_op(self, PowK(exponent), Keep::Input, PowB(exponent))
    }

    /// `max(x, 0)` (NaN propagates). Saves for backward only a packed 1-bit
    /// mask of `output > 0`: a U32 tensor of `ceil(n/32)` words.
    pub fn relu(&self) -> Result<Tensor> {
        if let Some(out) = relu_fused(self, false)? {
            return Ok(out);
        }
        let out = unary_map(self, &ReluK)?;
        masked_op(self, out, "relu", 0.0, false)
    }

    /// `max(x, 0)` written over the input's own storage when nothing else
    /// can see it: this tensor and its storage each held once (no other
    /// view, clone or saved tensor), contiguous over the whole storage, and
    /// not a leaf requiring grad. Then no new buffer is allocated and the
    /// storage's version is bumped; otherwise it falls back to
    /// [`Tensor::relu`]. Either way saves only the packed 1-bit mask of
    /// `output > 0` when the input needs grad (the output under `SaveAll`).
    pub fn relu_inplace(self) -> Result<Tensor> {
        if !self.is_exclusive() {
            return self.relu();
        }
        if let Some(out) = relu_fused(&self, true)? {
            return Ok(out);
        }
        unary_assign(&self, &ReluK)?;
        let out = self.detach();
        masked_op(&self, out, "relu", 0.0, false)
    }

    /// `x` for `x > 0`, else `slope · x`. Saves for backward only a packed
    /// 1-bit mask of `input > 0` (U32, `ceil(n/32)` words).
    pub fn leaky_relu(&self, slope: f64) -> Result<Tensor> {
        let out = unary_map(self, &LeakyK(slope))?;
        masked_op(self, out, "leaky_relu", slope, true)
    }
}

#[cfg(test)]
mod tests;
