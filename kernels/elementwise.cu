// Elementwise float kernels: unary maps (with up to two scalar parameters,
// which also cover tensor-scalar arithmetic and clamp) and binary maps with
// broadcasting through strides (with one scalar parameter: the gradient
// kernels of the unary ops are binary maps `(g, saved) -> dx`). Outputs are
// contiguous. The op codes are `UnaryOp` / `BinaryOp`, declared from
// src/op_code.rs in front of this file, and each formula the CPU kernel of the same op
// (src/ops/unary.rs, scalar.rs, loss.rs), operation for operation. The CPU
// computes half types one operation at a time, each rounded to the element
// type, so every intermediate here goes through `lg_rt` (the identity for
// float and double): a formula of several operations rounded only once
// differs from the CPU's by ulps, and by far more where it cancels
// (tanh's 1 - y² for y near ±1).

// `v` rounded to the element type T and back to its arithmetic type.
template <typename T>
__device__ __forceinline__ typename Acc<T>::type lg_rt(typename Acc<T>::type v) {
    return lg_load(lg_store<T>(v));
}

// 1 / (1 + e^-x), each operation rounded to T (the CPU's `sigmoid`).
template <typename T>
__device__ __forceinline__ typename Acc<T>::type lg_sigmoid(typename Acc<T>::type x) {
    typedef typename Acc<T>::type A;
    return lg_rt<T>((A)1 / lg_rt<T>((A)1 + lg_rt<T>(exp(-x))));
}

// GELU and its derivative in double whatever the element type, as
// `gelu_f64` (src/ops/unary.rs) computes them on the CPU for every dtype:
// the exact (erf) form or the tanh approximation.
__device__ __forceinline__ double lg_gelu(double x, bool approximate) {
    if (approximate) {
        double t = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
        return 0.5 * x * (1.0 + t);
    }
    return x * (0.5 * (1.0 + erf(x / 1.4142135623730951)));
}

__device__ __forceinline__ double lg_gelu_grad(double x, bool approximate) {
    if (approximate) {
        const double k = 0.7978845608028654, a = 0.044715;
        double t = tanh(k * (x + a * x * x * x));
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * a * x * x);
    }
    double cdf = 0.5 * (1.0 + erf(x / 1.4142135623730951));
    double pdf = exp(-0.5 * x * x) / sqrt(2.0 * 3.141592653589793);
    return cdf + x * pdf;
}

// tanh(log1p(e^x)) (mish's factor, PyTorch's form: no threshold), each
// operation rounded to T as the CPU's.
template <typename T>
__device__ __forceinline__ typename Acc<T>::type lg_tanh_softplus(typename Acc<T>::type x) {
    return lg_rt<T>(tanh(lg_rt<T>(log1p(lg_rt<T>(exp(x))))));
}

// min(max(x + 3, 0), 6) with x + 3 rounded to T; NaN passes through.
template <typename T>
__device__ __forceinline__ typename Acc<T>::type lg_relu6_shift(typename Acc<T>::type x) {
    typedef typename Acc<T>::type A;
    A r = lg_rt<T>(x + (A)3);
    r = r < (A)0 ? (A)0 : r;
    return (A)6 < r ? (A)6 : r;
}

// `p` and `q` are the parameters in the arithmetic type, `pd` the first in
// double (for the ops that compute in double as the CPU does). The result
// is rounded to T by the caller's store.
template <typename T, typename A = typename Acc<T>::type>
__device__ __forceinline__ A lg_unary(int op, A x, A p, A q, double pd) {
    switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Exp: return exp(x);
    case UnaryOp::Log: return log(x);
    case UnaryOp::Sqrt: return sqrt(x);
    case UnaryOp::Abs: return fabs(x);
    case UnaryOp::Square: return x * x;
    case UnaryOp::Recip: return (A)1 / x;
    case UnaryOp::Sin: return sin(x);
    case UnaryOp::Cos: return cos(x);
    case UnaryOp::Tanh: return tanh(x);
    case UnaryOp::Sigmoid: return lg_sigmoid<T>(x);
    case UnaryOp::Gelu: return (A)lg_gelu((double)x, false);
    case UnaryOp::GeluTanh: return (A)lg_gelu((double)x, true);
    case UnaryOp::Silu: return x * lg_sigmoid<T>(x);
    // relu: `x <= 0` is false for NaN, so NaN propagates (as the CPU).
    case UnaryOp::Relu: return x <= (A)0 ? (A)0 : x;
    case UnaryOp::Powf: return pow(x, p);
    case UnaryOp::LeakyRelu: return x > (A)0 ? x : x * p;
    case UnaryOp::AddScalar: return x + p;
    case UnaryOp::MulScalar: return x * p;
    case UnaryOp::RSubScalar: return p - x;
    case UnaryOp::RDivScalar: return p / x;
    // One-sided clamps: NaN passes through (a comparison with NaN is false).
    case UnaryOp::MaxScalar: return x < p ? p : x;
    case UnaryOp::MinScalar: return x > p ? p : x;
    case UnaryOp::Rsqrt: return (A)1 / sqrt(x);
    case UnaryOp::DivScalar: return x / p;
    // clamp to [p, q] (bounds already rounded to the element type); NaN
    // passes through, as on the CPU.
    case UnaryOp::Clamp: return x < p ? p : (x > q ? q : x);
    // x · factor with the product in double, as the CPU's `Scale`.
    case UnaryOp::Scale: return (A)((double)x * pd);
    // sign: (0 < x) - (x < 0), so ±0 and NaN give 0 (as the CPU and PyTorch).
    case UnaryOp::Sign: return (x > (A)0 ? (A)1 : (A)0) - (x < (A)0 ? (A)1 : (A)0);
    // relu6(x + 3) / 6 and x · relu6(x + 3) / 6, as PyTorch's CPU kernels
    // (comparisons, so NaN passes through), each step rounded to T.
    case UnaryOp::Hardsigmoid: return lg_relu6_shift<T>(x) / (A)6;
    case UnaryOp::Hardswish: return lg_rt<T>(x * lg_relu6_shift<T>(x)) / (A)6;
    case UnaryOp::Mish: return x * lg_tanh_softplus<T>(x);
    default: return x;
    }
}

// `p` is the op's scalar parameter (a double, so that ops computing in
// double as the CPU does keep it exact). For the gradient kernels `a` is the
// incoming gradient g and `b` the saved input x or output y.
// `pt` and `pm1t` are p and p - 1 rounded to the element type (the CPU
// rounds a scalar to T before using it: powf's gradient). Intermediates are
// rounded to T as the CPU's (`lg_rt`); the result by the caller's store.
template <typename T, typename A = typename Acc<T>::type>
__device__ __forceinline__ A lg_binary(int op, A a, A b, double p, A pt, A pm1t) {
    switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
    // maximum / minimum: NaN propagates (as torch.maximum and the CPU's
    // ExtremumK, which returns a + b then); otherwise the CPU's choice on
    // ties (max keeps a, min keeps b: it matters for -0 vs +0).
    case BinaryOp::Max: return (a != a || b != b) ? a + b : (a >= b ? a : b);
    case BinaryOp::Min: return (a != a || b != b) ? a + b : (a >= b ? b : a);
    case BinaryOp::Pow: return pow(a, b);
    case BinaryOp::SqrtGrad: return a / lg_rt<T>(b + b);                             // sqrt: g / 2y
    case BinaryOp::AbsGrad: return b > (A)0 ? a : (b < (A)0 ? -a : (A)0);            // abs: 0 at 0 and NaN
    case BinaryOp::SquareGrad: return a * lg_rt<T>(b + b);                             // square: g · 2x
    case BinaryOp::RecipGrad: return -(lg_rt<T>(a * b) * b);                         // recip: -g y²
    case BinaryOp::SinGrad: return a * lg_rt<T>(cos(b));                           // sin
    case BinaryOp::CosGrad: return -(a * lg_rt<T>(sin(b)));                        // cos
    case BinaryOp::TanhGrad: return a * lg_rt<T>((A)1 - lg_rt<T>(b * b));           // tanh: g (1 - y²)
    case BinaryOp::SigmoidGrad: return lg_rt<T>(a * b) * lg_rt<T>((A)1 - b);           // sigmoid: g y (1 - y)
    case BinaryOp::SiluGrad: {                                                      // silu
        A s = lg_sigmoid<T>(b);
        return lg_rt<T>(a * s) * lg_rt<T>((A)1 + lg_rt<T>(b * lg_rt<T>((A)1 - s)));
    }
    // powf: g · p · x^(p-1), and 0 for p = 0 (p and p - 1 each rounded to
    // the element type, as the CPU rounds each to the dtype).
    case BinaryOp::PowGrad: return p == 0.0 ? (A)0 : lg_rt<T>(a * pt) * lg_rt<T>(pow(b, pm1t));
    // gelu': computed in double, rounded to T through float (the CPU's
    // `c::<T>(gelu_f64(x).1)`), then the product.
    case BinaryOp::GeluGrad: return a * lg_rt<T>((A)lg_gelu_grad((double)b, false));
    case BinaryOp::GeluTanhGrad: return a * lg_rt<T>((A)lg_gelu_grad((double)b, true));
    // The share of maximum's / minimum's gradient that goes to `a`: 1 where
    // a wins, 1/2 on a tie, 0 where b wins or either is NaN.
    case BinaryOp::MaxShare: return a == b ? (A)0.5 : (a > b ? (A)1 : (A)0);
    case BinaryOp::MinShare: return a == b ? (A)0.5 : (a < b ? (A)1 : (A)0);
    // a · b · p with the products in double, as the CPU's ScaledMul.
    case BinaryOp::ScaledMul: return (A)((double)a * (double)b * p);
    // hardsigmoid: g · (the f32 1/6, rounded to T) strictly inside (-3, 3), else 0
    // (NaN gives 0); hardswish: 0 up to -3, g from 3, else g · (x/3 + 1/2)
    // (NaN gives NaN), as PyTorch's vectorised backward kernels.
    case BinaryOp::HardsigmoidGrad: return (b > (A)-3 && b < (A)3) ? a * lg_rt<T>((A)(1.0f / 6.0f)) : (A)0;
    case BinaryOp::MishGrad: {                                      // mish, as PyTorch's order
        A s = lg_sigmoid<T>(b), t = lg_tanh_softplus<T>(b);
        return a * lg_rt<T>(t + lg_rt<T>(lg_rt<T>(b * s) * lg_rt<T>((A)1 - lg_rt<T>(t * t))));
    }
    case BinaryOp::HardswishGrad:
        return b <= (A)-3 ? (A)0 : (b >= (A)3 ? a : a * lg_rt<T>(lg_rt<T>(b / (A)3) + (A)0.5));
    default: return a;
    }
}

// out[i] = op(x[i], param, param2) for the n logical elements of x.
#define LG_UNARY(sfx, T)                                                              \
    extern "C" __global__ void unary_##sfx(int op, double param, double param2,      \
                                           long long n, T* out, const T* x,           \
                                           Strided lx) {                              \
        typedef Acc<T>::type A;                                                       \
        /* the scalars rounded to T first, as the CPU's `c::<T>(p)` */                \
        A p = lg_load(lg_from_f64<T>(param)), q = lg_load(lg_from_f64<T>(param2));    \
        LG_GRID_LOOP(i, n) { out[i] = lg_store<T>(lg_unary<T>(op, lg_load(x[lg_offset(lx, i)]), p, q, param)); } \
    }
LG_FOR_FLOATS(LG_UNARY)

// x[start + i] = op(x[start + i], param, param2) for i < n, in place (an
// in-place op such as relu_ on a contiguous tensor): each element is read
// and written by the same thread, so no temporary buffer is needed, as on
// the CPU.
#define LG_UNARY_INPLACE(sfx, T)                                                      \
    extern "C" __global__ void unary_inplace_##sfx(int op, double param, double param2, \
                                                   long long start, long long n, T* x) { \
        typedef Acc<T>::type A;                                                       \
        A p = lg_load(lg_from_f64<T>(param)), q = lg_load(lg_from_f64<T>(param2));    \
        LG_GRID_LOOP(i, n) { x[start + i] = lg_store<T>(lg_unary<T>(op, lg_load(x[start + i]), p, q, param)); } \
    }
LG_FOR_FLOATS(LG_UNARY_INPLACE)

// out[i] = op(a[i], b[i], param); la and lb carry the output shape (stride 0
// where an input is broadcast).
#define LG_BINARY(sfx, T)                                                             \
    extern "C" __global__ void binary_##sfx(int op, double param, long long n, T* out, \
                                            const T* a, Strided la,                   \
                                            const T* b, Strided lb) {                 \
        typedef Acc<T>::type A;                                                       \
        A pt = lg_load(lg_from_f64<T>(param));                                        \
        A pm1t = lg_load(lg_from_f64<T>(param - 1.0));                                \
        LG_GRID_LOOP(i, n) {                                                          \
            A va = lg_load(a[lg_offset(la, i)]);                                      \
            A vb = lg_load(b[lg_offset(lb, i)]);                                      \
            out[i] = lg_store<T>(lg_binary<T>(op, va, vb, param, pt, pm1t));          \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_BINARY)

// x[start + i] = op(x[start + i], b[i], param) in place: the CPU's in-place
// binary kernels allocate nothing, so neither does this. b is read through
// lb, which has the range's shape (stride 0 where broadcast).
#define LG_BINARY_INPLACE(sfx, T)                                                     \
    extern "C" __global__ void binary_inplace_##sfx(int op, double param, long long start, \
                                                    long long n, T* x, const T* b,    \
                                                    Strided lb) {                     \
        typedef Acc<T>::type A;                                                       \
        A pt = lg_load(lg_from_f64<T>(param));                                        \
        A pm1t = lg_load(lg_from_f64<T>(param - 1.0));                                \
        LG_GRID_LOOP(i, n) {                                                          \
            A va = lg_load(x[start + i]);                                             \
            A vb = lg_load(b[lg_offset(lb, i)]);                                      \
            x[start + i] = lg_store<T>(lg_binary<T>(op, va, vb, param, pt, pm1t));    \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_BINARY_INPLACE)

// In-place accumulation (the autograd engine's gradient sums):
// acc[i] += alpha * x[i] with acc contiguous and x of any layout.
template <typename T>
static __device__ __forceinline__ T lg_axpy_one(T acc, typename Acc<T>::type al, T x) {
    return lg_store<T>(lg_load(acc) + al * lg_load(x));
}
#define LG_AXPY(sfx, T)                                                               \
    /* In runs of LG_RUN per thread: x's offsets by one index chain per run */      \
    /* (LgRunOffsets), acc as one vector where 16-byte aligned (vec). */              \
    extern "C" __global__ void axpy_##sfx(long long n, double alpha, int vec, T* acc, \
                                          const T* x, Strided lx) {                   \
        typedef Acc<T>::type A;                                                       \
        A al = (A)alpha;                                                              \
        LG_RUN_LOOP(e0, n) {                                                          \
            int cnt = lg_run_count(n, e0);                                            \
            LgRunOffsets<LG_RUN> at(lx, e0, cnt);                                     \
            LgRun<T, LG_RUN> a;                                                       \
            a.load(acc + e0, cnt, vec);                                               \
            LG_RUN_EACH(k, cnt) a.v[k] = lg_axpy_one<T>(a.v[k], al, x[at.off[k]]);    \
            a.store(acc + e0, cnt, vec);                                              \
        }                                                                             \
    }                                                                                 \
    /* The same with x contiguous too, in runs of LG_RUN per thread (one */     \
    /* vector each where both buffers are 16-byte aligned: vec). */                   \
    extern "C" __global__ void axpy_dense_##sfx(long long n, double alpha, int vec,  \
                                                T* acc, const T* x) {                 \
        typedef Acc<T>::type A;                                                       \
        A al = (A)alpha;                                                              \
        LG_RUN_LOOP(e0, n) {                                                          \
            int cnt = lg_run_count(n, e0);                                            \
            LgRun<T, LG_RUN> a, b;                                               \
            a.load(acc + e0, cnt, vec);                                               \
            b.load(x + e0, cnt, vec);                                                 \
            LG_RUN_EACH(i, cnt) a.v[i] = lg_axpy_one<T>(a.v[i], al, b.v[i]);          \
            a.store(acc + e0, cnt, vec);                                              \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_AXPY)
