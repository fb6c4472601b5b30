// Reductions. The host orders the input's dims so that the kept dims come
// first and the reduced ones last: output element o reduces logical
// elements o*inner .. o*inner+inner of `lx`. One block of LG_RED_THREADS
// threads per output element (grid-stride over outputs); accumulation in
// float (double for f64). Op codes match `ReduceOp` in src/cuda/reduce.rs:
// 0 sum, 1 mean, 2 max, 3 min. max/min skip NaNs (fmax/fmin).

#define LG_RED_THREADS 256

template <typename A> __device__ __forceinline__ A lg_red_init(int op) {
    if (op == 2) return -LG_INF;
    if (op == 3) return LG_INF;
    return (A)0;
}

template <typename A> __device__ __forceinline__ A lg_red_combine(int op, A a, A b) {
    if (op == 2) return fmax(a, b);
    if (op == 3) return fmin(a, b);
    return a + b;
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
                if (op == 1) r = r / (A)inner;                                        \
                out[o] = lg_store<T>(r);                                              \
            }                                                                         \
            __syncthreads();                                                          \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_REDUCE)

// Index (0..inner) of the largest (want_max = 1) or smallest value of each
// output's run; the first one on ties; NaNs are skipped (index 0 if all are).
#define LG_ARG(sfx, T)                                                                \
    extern "C" __global__ void argreduce_##sfx(int want_max, long long outer,        \
                                               long long inner, long long* out,       \
                                               const T* x, Strided lx) {              \
        typedef Acc<T>::type A;                                                       \
        __shared__ A vals[LG_RED_THREADS];                                            \
        __shared__ long long idxs[LG_RED_THREADS];                                    \
        for (long long o = blockIdx.x; o < outer; o += gridDim.x) {                   \
            A best = want_max ? -LG_INF : LG_INF;                                 \
            long long bi = -1;                                                        \
            for (long long j = threadIdx.x; j < inner; j += LG_RED_THREADS) {         \
                A v = lg_load(x[lg_offset(lx, o * inner + j)]);                       \
                bool better = want_max ? v > best : v < best;                         \
                if (v == v && (bi < 0 || better)) { best = v; bi = j; }               \
            }                                                                         \
            vals[threadIdx.x] = best;                                                 \
            idxs[threadIdx.x] = bi;                                                   \
            for (int s = LG_RED_THREADS / 2; s > 0; s >>= 1) {                        \
                __syncthreads();                                                      \
                if (threadIdx.x < s) {                                                \
                    long long ib = idxs[threadIdx.x + s];                             \
                    A vb = vals[threadIdx.x + s];                                     \
                    long long ia = idxs[threadIdx.x];                                 \
                    A va = vals[threadIdx.x];                                         \
                    bool take = ib >= 0 && (ia < 0 || (want_max ? vb > va : vb < va)  \
                                            || (vb == va && ib < ia));                \
                    if (take) { vals[threadIdx.x] = vb; idxs[threadIdx.x] = ib; }     \
                }                                                                     \
            }                                                                         \
            __syncthreads();                                                          \
            if (threadIdx.x == 0) out[o] = idxs[0] < 0 ? 0 : idxs[0];                 \
            __syncthreads();                                                          \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_ARG)
