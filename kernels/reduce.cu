// Reductions. The host orders the input's dims so that the kept dims come
// first and the reduced ones last: output element o reduces logical
// elements o*inner .. o*inner+inner of `lx`. One block of LG_RED_THREADS
// threads per output element (grid-stride over outputs); accumulation in
// float (double for f64). The op is a `ReduceCode` (declared from
// src/op_code.rs). As on the CPU, a NaN is the max/min of any
// run that holds one.

#define LG_RED_THREADS 256

template <typename A> __device__ __forceinline__ A lg_red_init(int op) {
    if (op == ReduceCode::Max) return -LG_INF;
    if (op == ReduceCode::Min) return LG_INF;
    return (A)0;
}

template <typename A> __device__ __forceinline__ A lg_red_combine(int op, A a, A b) {
    if (op == ReduceCode::Sum || op == ReduceCode::Mean) return a + b;
    if (a != a) return a;
    if (b != b) return b;
    return op == ReduceCode::Max ? fmax(a, b) : fmin(a, b);
}

// Whether candidate (vb, ib) beats (va, ia) for argmax (want_max) or argmin:
// an index < 0 is "none"; a NaN beats any number; ties go to the lower index.
template <typename A>
__device__ __forceinline__ bool lg_arg_better(int want_max, A va, long long ia, A vb, long long ib) {
    if (ib < 0) return false;
    if (ia < 0) return true;
    bool na = va != va, nb = vb != vb;
    if (na || nb) return nb && (!na || ib < ia);
    if (vb == va) return ib < ia;
    return want_max ? vb > va : vb < va;
}

// Tree reduction of buf[0..LG_RED_THREADS) into buf[0].
template <typename A> __device__ __forceinline__ void lg_block_reduce(int op, A* buf) {
    for (int s = LG_RED_THREADS / 2; s > 0; s >>= 1) {
        __syncthreads();
        if (threadIdx.x < s) buf[threadIdx.x] = lg_red_combine(op, buf[threadIdx.x], buf[threadIdx.x + s]);
    }
    __syncthreads();
}

#define LG_REDUCE(sfx, T)                                                             \
    extern "C" __global__ void reduce_##sfx(int op, long long outer, long long inner,\
                                            T* out, const T* x, Strided lx) {         \
        typedef Acc<T>::type A;                                                       \
        __shared__ A buf[LG_RED_THREADS];                                             \
        for (long long o = blockIdx.x; o < outer; o += gridDim.x) {                   \
            A acc = lg_red_init<A>(op);                                               \
            for (long long j = threadIdx.x; j < inner; j += LG_RED_THREADS)           \
                acc = lg_red_combine(op, acc, lg_load(x[lg_offset(lx, o * inner + j)])); \
            buf[threadIdx.x] = acc;                                                   \
            lg_block_reduce(op, buf);                                                 \
            if (threadIdx.x == 0) {                                                   \
                A r = buf[0];                                                         \
                if (op == ReduceCode::Mean) r = r / (A)inner;                                        \
                out[o] = lg_store<T>(r);                                              \
            }                                                                         \
            __syncthreads();                                                          \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_REDUCE)

// The same reductions where the kept elements are adjacent in memory (a
// bias gradient: the sum over the rows of a row-major [inner, outer]):
// output o reduces x[offset + o + j*stride] for j < inner. A block of
// LG_RED_THREADS threads takes LG_RED_COLS adjacent outputs, its threads
// as LG_RED_COLS columns by LG_RED_SLICES row slices (a warp reads whole
// 32-byte sectors of each row); thread (c, s) reduces rows j = s, s +
// LG_RED_SLICES, ... in order, then the slices join in a fixed tree.
#define LG_RED_COLS 8
#define LG_RED_SLICES (LG_RED_THREADS / LG_RED_COLS)

#define LG_REDUCE_COLS(sfx, T)                                                        \
    extern "C" __global__ void reduce_cols_##sfx(int op, long long outer,             \
                                                 long long inner, long long stride,   \
                                                 T* out, const T* x, long long offset) { \
        typedef Acc<T>::type A;                                                       \
        __shared__ A buf[LG_RED_SLICES][LG_RED_COLS];                                 \
        int c = threadIdx.x % LG_RED_COLS, sl = threadIdx.x / LG_RED_COLS;            \
        long long groups = (outer + LG_RED_COLS - 1) / LG_RED_COLS;                   \
        for (long long grp = blockIdx.x; grp < groups; grp += gridDim.x) {            \
            long long o = grp * LG_RED_COLS + c;                                      \
            A acc = lg_red_init<A>(op);                                               \
            if (o < outer) {                                                          \
                const T* col = x + offset + o;                                        \
                for (long long j = sl; j < inner; j += LG_RED_SLICES)                 \
                    acc = lg_red_combine(op, acc, lg_load(col[j * stride]));          \
            }                                                                         \
            buf[sl][c] = acc;                                                         \
            for (int h = LG_RED_SLICES / 2; h > 0; h >>= 1) {                         \
                __syncthreads();                                                      \
                if (sl < h) buf[sl][c] = lg_red_combine(op, buf[sl][c], buf[sl + h][c]); \
            }                                                                         \
            __syncthreads();                                                          \
            if (sl == 0 && o < outer) {                                               \
                A r = buf[0][c];                                                      \
                if (op == ReduceCode::Mean) r = r / (A)inner;                                        \
                out[o] = lg_store<T>(r);                                              \
            }                                                                         \
            __syncthreads();                                                          \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_REDUCE_COLS)

// The type argreduce compares in: the arithmetic type for floats, the
// element type itself for integers (exact: u32 and i64 do not fit a float).
template <typename T> struct LgArg {
    typedef typename Acc<T>::type A;
    static __device__ __forceinline__ A load(T v) { return lg_load(v); }
};
#define LG_ARG_EXACT(T)                                                               \
    template <> struct LgArg<T> {                                                     \
        typedef T A;                                                                  \
        static __device__ __forceinline__ A load(T v) { return v; }                   \
    };
LG_ARG_EXACT(unsigned char)
LG_ARG_EXACT(unsigned int)
LG_ARG_EXACT(long long)

// Index (0..inner) of the largest (want_max = 1) or smallest value of each
// output's run: the first one on ties, the first NaN if there is one (as
// src/cpu/reduce.rs). Every dtype, as on the CPU.
#define LG_ARG(sfx, T)                                                                \
    extern "C" __global__ void argreduce_##sfx(int want_max, long long outer,        \
                                               long long inner, long long* out,       \
                                               const T* x, Strided lx) {              \
        typedef LgArg<T>::A A;                                                        \
        __shared__ A vals[LG_RED_THREADS];                                            \
        __shared__ long long idxs[LG_RED_THREADS];                                    \
        for (long long o = blockIdx.x; o < outer; o += gridDim.x) {                   \
            A best = 0;                                                               \
            long long bi = -1;                                                        \
            for (long long j = threadIdx.x; j < inner; j += LG_RED_THREADS) {         \
                A v = LgArg<T>::load(x[lg_offset(lx, o * inner + j)]);                \
                if (lg_arg_better(want_max, best, bi, v, j)) { best = v; bi = j; }    \
            }                                                                         \
            vals[threadIdx.x] = best;                                                 \
            idxs[threadIdx.x] = bi;                                                   \
            for (int s = LG_RED_THREADS / 2; s > 0; s >>= 1) {                        \
                __syncthreads();                                                      \
                if (threadIdx.x < s) {                                                \
                    A vb = vals[threadIdx.x + s];                                     \
                    long long ib = idxs[threadIdx.x + s];                             \
                    if (lg_arg_better(want_max, vals[threadIdx.x], idxs[threadIdx.x], vb, ib)) { \
                        vals[threadIdx.x] = vb;                                       \
                        idxs[threadIdx.x] = ib;                                       \
                    }                                                                 \
                }                                                                     \
            }                                                                         \
            __syncthreads();                                                          \
            if (threadIdx.x == 0) out[o] = idxs[0] < 0 ? 0 : idxs[0];                 \
            __syncthreads();                                                          \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_ARG)
LG_ARG(u8, unsigned char)
LG_ARG(u32, unsigned int)
LG_ARG(i64, long long)
