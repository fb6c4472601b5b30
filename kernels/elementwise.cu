// Elementwise float kernels: unary maps (with up to two scalar parameters,
// which also cover tensor-scalar arithmetic and clamp) and binary maps with
// broadcasting through strides (with one scalar parameter: the gradient
// kernels of the unary ops are binary maps `(g, saved) -> dx`). Outputs are
// contiguous. The op codes must match `UnaryOp` / `BinaryOp` in
// src/cuda/elementwise.rs, and each formula the CPU kernel of the same op
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

// `p` and `q` are the parameters in the arithmetic type, `pd` the first in
// double (for the ops that compute in double as the CPU does). The result
// is rounded to T by the caller's store.
template <typename T, typename A = typename Acc<T>::type>
__device__ __forceinline__ A lg_unary(int op, A x, A p, A q, double pd) {
    switch (op) {
    case 0: return -x;
    case 1: return exp(x);
    case 2: return log(x);
    case 3: return sqrt(x);
    case 4: return fabs(x);
    case 5: return x * x;
    case 6: return (A)1 / x;
    case 7: return sin(x);
    case 8: return cos(x);
    case 9: return tanh(x);
    case 10: return lg_sigmoid<T>(x);
    case 11: return (A)lg_gelu((double)x, false);
    case 12: return (A)lg_gelu((double)x, true);
    case 13: return x * lg_sigmoid<T>(x);
    // relu: `x <= 0` is false for NaN, so NaN propagates (as the CPU).
    case 14: return x <= (A)0 ? (A)0 : x;
    case 15: return pow(x, p);
    case 16: return x > (A)0 ? x : x * p;
    case 17: return x + p;
    case 18: return x * p;
    case 19: return p - x;
    case 20: return p / x;
    // One-sided clamps: NaN passes through (a comparison with NaN is false).
    case 21: return x < p ? p : x;
    case 22: return x > p ? p : x;
    case 23: return x;
    case 24: return (A)1 / sqrt(x);
    case 25: return x / p;
    // clamp to [p, q] (bounds already rounded to the element type); NaN
    // passes through, as on the CPU.
    case 26: return x < p ? p : (x > q ? q : x);
    // x · factor with the product in double, as the CPU's `Scale`.
    case 27: return (A)((double)x * pd);
    // sign: (0 < x) - (x < 0), so ±0 and NaN give 0 (as the CPU and PyTorch).
    case 28: return (x > (A)0 ? (A)1 : (A)0) - (x < (A)0 ? (A)1 : (A)0);
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
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    case 3: return a / b;
    // maximum / minimum: NaN propagates (as torch.maximum and the CPU's
    // ExtremumK, which returns a + b then); otherwise the CPU's choice on
    // ties (max keeps a, min keeps b: it matters for -0 vs +0).
    case 4: return (a != a || b != b) ? a + b : (a >= b ? a : b);
    case 5: return (a != a || b != b) ? a + b : (a >= b ? b : a);
    case 6: return pow(a, b);
    case 7: return a / lg_rt<T>(b + b);                             // sqrt: g / 2y
    case 8: return b > (A)0 ? a : (b < (A)0 ? -a : (A)0);            // abs: 0 at 0 and NaN
    case 9: return a * lg_rt<T>(b + b);                             // square: g · 2x
    case 10: return -(lg_rt<T>(a * b) * b);                         // recip: -g y²
    case 11: return a * lg_rt<T>(cos(b));                           // sin
    case 12: return -(a * lg_rt<T>(sin(b)));                        // cos
    case 13: return a * lg_rt<T>((A)1 - lg_rt<T>(b * b));           // tanh: g (1 - y²)
    case 14: return lg_rt<T>(a * b) * lg_rt<T>((A)1 - b);           // sigmoid: g y (1 - y)
    case 15: {                                                      // silu
        A s = lg_sigmoid<T>(b);
        return lg_rt<T>(a * s) * lg_rt<T>((A)1 + lg_rt<T>(b * lg_rt<T>((A)1 - s)));
    }
    // powf: g · p · x^(p-1), and 0 for p = 0 (p and p - 1 each rounded to
    // the element type, as the CPU rounds each to the dtype).
    case 16: return p == 0.0 ? (A)0 : lg_rt<T>(a * pt) * lg_rt<T>(pow(b, pm1t));
    // gelu': computed in double, rounded to T through float (the CPU's
    // `c::<T>(gelu_f64(x).1)`), then the product.
    case 17: return a * lg_rt<T>((A)lg_gelu_grad((double)b, false));
    case 18: return a * lg_rt<T>((A)lg_gelu_grad((double)b, true));
    // The share of maximum's / minimum's gradient that goes to `a`: 1 where
    // a wins, 1/2 on a tie, 0 where b wins or either is NaN.
    case 19: return a == b ? (A)0.5 : (a > b ? (A)1 : (A)0);
    case 20: return a == b ? (A)0.5 : (a < b ? (A)1 : (A)0);
    // a · b · p with the products in double, as the CPU's ScaledMul.
    case 21: return (A)((double)a * (double)b * p);
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
        LG_GRID_LOOP(i, n) { x[start + i] = lg_store<T>(lg_unary<A>(op, lg_load(x[start + i]), p, q, param)); } \
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
