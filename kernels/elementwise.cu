// Elementwise float kernels: unary maps (with an optional scalar parameter,
// which also covers tensor-scalar arithmetic) and binary maps with
// broadcasting through strides. Outputs are contiguous. The op codes must
// match `UnaryOp` / `BinaryOp` in src/cuda/elementwise.rs.

template <typename A> __device__ __forceinline__ A lg_sigmoid(A x) {
    return (A)1 / ((A)1 + exp(-x));
}

template <typename A> __device__ __forceinline__ A lg_unary(int op, A x, A p) {
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
    case 10: return lg_sigmoid(x);
    case 11: return (A)0.5 * x * ((A)1 + erf(x * (A)0.70710678118654752440));
    case 12: {
        A inner = (A)0.79788456080286535588 * (x + (A)0.044715 * x * x * x);
        return (A)0.5 * x * ((A)1 + tanh(inner));
    }
    case 13: return x * lg_sigmoid(x);
    case 14: return x > (A)0 ? x : (A)0;
    case 15: return pow(x, p);
    case 16: return x > (A)0 ? x : x * p;
    case 17: return x + p;
    case 18: return x * p;
    case 19: return p - x;
    case 20: return p / x;
    case 21: return fmax(x, p);
    case 22: return fmin(x, p);
    case 23: return x;
    case 24: return (A)1 / sqrt(x);
    case 25: return x / p;
    default: return x;
    }
}

template <typename A> __device__ __forceinline__ A lg_binary(int op, A a, A b) {
    switch (op) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    case 3: return a / b;
    case 4: return fmax(a, b);
    case 5: return fmin(a, b);
    case 6: return pow(a, b);
    default: return a;
    }
}

// out[i] = op(x[i], param) for the n logical elements of x.
#define LG_UNARY(sfx, T)                                                              \
    extern "C" __global__ void unary_##sfx(int op, double param, long long n,        \
                                           T* out, const T* x, Strided lx) {          \
        typedef Acc<T>::type A;                                                       \
        A p = (A)param;                                                               \
        LG_GRID_LOOP(i, n) { out[i] = lg_store<T>(lg_unary<A>(op, lg_load(x[lg_offset(lx, i)]), p)); } \
    }
LG_FOR_FLOATS(LG_UNARY)

// out[i] = op(a[i], b[i]); la and lb carry the output shape (stride 0 where
// an input is broadcast).
#define LG_BINARY(sfx, T)                                                             \
    extern "C" __global__ void binary_##sfx(int op, long long n, T* out,             \
                                            const T* a, Strided la,                   \
                                            const T* b, Strided lb) {                 \
        typedef Acc<T>::type A;                                                       \
        LG_GRID_LOOP(i, n) {                                                          \
            A va = lg_load(a[lg_offset(la, i)]);                                      \
            A vb = lg_load(b[lg_offset(lb, i)]);                                      \
            out[i] = lg_store<T>(lg_binary<A>(op, va, vb));                           \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_BINARY)

// In-place accumulation (the autograd engine's gradient sums):
// acc[i] += alpha * x[i] with acc contiguous and x of any layout.
#define LG_AXPY(sfx, T)                                                               \
    extern "C" __global__ void axpy_##sfx(long long n, double alpha, T* acc,         \
                                          const T* x, Strided lx) {                   \
        typedef Acc<T>::type A;                                                       \
        A al = (A)alpha;                                                              \
        LG_GRID_LOOP(i, n) { acc[i] = lg_store<T>(lg_load(acc[i]) + al * lg_load(x[lg_offset(lx, i)])); } \
    }
LG_FOR_FLOATS(LG_AXPY)
