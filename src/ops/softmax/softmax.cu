// Softmax and log-softmax over the class dim of a contiguous tensor viewed
// as [outer, classes, inner] (element (o, c, j) at (o*classes + c)*inner + j),
// forward and backward. One block of LG_SM_THREADS per lane (o, j); math in
// float (double for f64) with the lane maximum subtracted.
//
// backward, from the forward output y and the incoming gradient g:
//   softmax:      dx = y * (g - sum_c g*y)
//   log-softmax:  dx = g - exp(y) * sum_c g

// LaneGeom is `leangrad::ops::LaneGeom` (src/ops/softmax/mod.rs, #[repr(C)]):
// the same fields in the same order, its usize fields laid out as these
// long longs.
struct LaneGeom {
    long long outer, classes, inner;
};

#define LG_SM_THREADS 256

template <typename A> __device__ __forceinline__ A lg_sm_sum(A v, A* buf) {
    buf[threadIdx.x] = v;
    for (int s = LG_SM_THREADS / 2; s > 0; s >>= 1) {
        __syncthreads();
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    }
    __syncthreads();
    A r = buf[0];
    __syncthreads();
    return r;
}

template <typename A> __device__ __forceinline__ A lg_sm_max(A v, A* buf) {
    buf[threadIdx.x] = v;
    for (int s = LG_SM_THREADS / 2; s > 0; s >>= 1) {
        __syncthreads();
        if (threadIdx.x < s) buf[threadIdx.x] = fmax(buf[threadIdx.x], buf[threadIdx.x + s]);
    }
    __syncthreads();
    A r = buf[0];
    __syncthreads();
    return r;
}

#define LG_SOFTMAX(sfx, T)                                                            \
    extern "C" __global__ void softmax_fwd_##sfx(int log_mode, LaneGeom g, T* y,     \
                                                 const T* x) {                        \
        long long outer = g.outer, classes = g.classes, inner = g.inner;              \
        typedef Acc<T>::type A;                                                       \
        __shared__ A buf[LG_SM_THREADS];                                              \
        for (long long lane = blockIdx.x; lane < outer * inner; lane += gridDim.x) {  \
            long long base = (lane / inner) * classes * inner + lane % inner;         \
            A m = -LG_INF;                                                          \
            for (long long c = threadIdx.x; c < classes; c += LG_SM_THREADS)          \
                m = fmax(m, lg_load(x[base + c * inner]));                            \
            m = lg_sm_max(m, buf);                                                    \
            A s = 0;                                                                  \
            for (long long c = threadIdx.x; c < classes; c += LG_SM_THREADS)          \
                s += exp(lg_load(x[base + c * inner]) - m);                           \
            s = lg_sm_sum(s, buf);                                                    \
            A log_s = log(s);                                                         \
            for (long long c = threadIdx.x; c < classes; c += LG_SM_THREADS) {        \
                A v = lg_load(x[base + c * inner]) - m;                               \
                y[base + c * inner] = lg_store<T>(log_mode ? v - log_s : exp(v - log_s)); \
            }                                                                         \
        }                                                                             \
    }                                                                                 \
    extern "C" __global__ void softmax_bwd_##sfx(int log_mode, LaneGeom geo, T* dx,  \
                                                 const T* y, const T* g) {            \
        long long outer = geo.outer, classes = geo.classes, inner = geo.inner;        \
        typedef Acc<T>::type A;                                                       \
        __shared__ A buf[LG_SM_THREADS];                                              \
        for (long long lane = blockIdx.x; lane < outer * inner; lane += gridDim.x) {  \
            long long base = (lane / inner) * classes * inner + lane % inner;         \
            A s = 0;                                                                  \
            for (long long c = threadIdx.x; c < classes; c += LG_SM_THREADS) {        \
                long long k = base + c * inner;                                       \
                s += log_mode ? lg_load(g[k]) : lg_load(g[k]) * lg_load(y[k]);        \
            }                                                                         \
            s = lg_sm_sum(s, buf);                                                    \
            for (long long c = threadIdx.x; c < classes; c += LG_SM_THREADS) {        \
                long long k = base + c * inner;                                       \
                A yv = lg_load(y[k]);                                                 \
                A gv = lg_load(g[k]);                                                 \
                dx[k] = lg_store<T>(log_mode ? gv - exp(yv) * s : yv * (gv - s));     \
            }                                                                         \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_SOFTMAX)
