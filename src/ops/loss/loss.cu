// Cross-entropy on logits of a contiguous tensor viewed as
// [outer, classes, inner] (element (o, c, j) at (o*classes + c)*inner + j),
// one i64 target per sample (o, j), label smoothing eps, ignore_index.
// Mirrors the CPU kernels (src/ops/loss/cpu.rs):
//   loss = lse - (1-eps)*x_t - eps/C * sum_c x_c      (0 where ignored)
//   dx   = w * (p - eps/C - (1-eps)*[c == t])         (0 where ignored)
//
// count (1 x i64, zeroed by the host) += samples not ignored; an
// out-of-range target goes to the device's check record (lg_check_fail,
// op id `check_op`), which the host reads with its next read.

// LaneGeom is `leangrad::ops::LaneGeom` (src/ops/softmax/mod.rs, #[repr(C)]):
// the same fields in the same order, its usize fields laid out as these
// long longs.
struct LaneGeom {
    long long outer, classes, inner;
};

#define LG_CE_THREADS 256

template <typename A> __device__ __forceinline__ A lg_ce_reduce(A v, A* buf, int is_max) {
    buf[threadIdx.x] = v;
    for (int s = LG_CE_THREADS / 2; s > 0; s >>= 1) {
        __syncthreads();
        if (threadIdx.x < s)
            buf[threadIdx.x] = is_max ? fmax(buf[threadIdx.x], buf[threadIdx.x + s])
                                      : buf[threadIdx.x] + buf[threadIdx.x + s];
    }
    __syncthreads();
    A r = buf[0];
    __syncthreads();
    return r;
}

// losses: one double per sample. probs: softmax output (logits' dtype), or
// null when not wanted.
#define LG_CE_FWD(sfx, T)                                                             \
    extern "C" __global__ void cross_entropy_fwd_##sfx(                              \
        LaneGeom g, long long ignore_index, double eps, const T* x,                  \
        const long long* targets, double* losses, T* probs, long long* count,         \
        long long* check, long long check_op) {                                       \
        long long outer = g.outer, classes = g.classes, inner = g.inner;              \
        typedef Acc<T>::type A;                                                       \
        __shared__ A buf[LG_CE_THREADS];                                              \
        for (long long lane = blockIdx.x; lane < outer * inner; lane += gridDim.x) {  \
            long long base = (lane / inner) * classes * inner + lane % inner;         \
            long long t = targets[lane];                                              \
            A m = -LG_INF, xs = 0;                                                  \
            for (long long c = threadIdx.x; c < classes; c += LG_CE_THREADS) {        \
                A v = lg_load(x[base + c * inner]);                                   \
                m = fmax(m, v);                                                       \
                xs += v;                                                              \
            }                                                                         \
            m = lg_ce_reduce(m, buf, 1);                                              \
            xs = lg_ce_reduce(xs, buf, 0);                                            \
            A s = 0;                                                                  \
            for (long long c = threadIdx.x; c < classes; c += LG_CE_THREADS)          \
                s += exp(lg_load(x[base + c * inner]) - m);                           \
            s = lg_ce_reduce(s, buf, 0);                                              \
            A lse = m + log(s);                                                       \
            if (probs)                                                                \
                for (long long c = threadIdx.x; c < classes; c += LG_CE_THREADS)      \
                    probs[base + c * inner] = lg_store<T>(exp(lg_load(x[base + c * inner]) - lse)); \
            if (threadIdx.x == 0) {                                                   \
                double loss = 0.0;                                                    \
                if (t != ignore_index) {                                              \
                    if (t < 0 || t >= classes) {                                      \
                        lg_check_fail(check, check_op, t, classes);                   \
                    } else {                                                          \
                        atomicAdd((unsigned long long*)count, 1ULL);                  \
                        double xt = (double)lg_load(x[base + t * inner]);             \
                        /* as the CPU: no smoothing term (and no inf*0) for eps = 0 */ \
                        double smooth = eps != 0.0 ? eps / (double)classes * (double)xs : 0.0; \
                        loss = (double)lse - (1.0 - eps) * xt - smooth;                      \
                    }                                                                 \
                }                                                                     \
                losses[lane] = loss;                                                  \
            }                                                                         \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_CE_FWD)

// out[0] = counts[0] + ... + counts[n-1]: the samples not ignored over the
// chunks of one op (linear_cross_entropy), on the device.
extern "C" __global__ void cross_entropy_count_total(long long n, const long long* counts,
                                                     long long* out) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    long long total = 0;
    for (long long i = 0; i < n; ++i) total += counts[i];
    out[0] = total;
}

// The loss as the reduction asks, from the per-sample f64 losses, on the
// device: reduction 0 (none) rounds each to T; 1 (sum) and 2 (mean, over
// the count of samples not ignored) add them in sample order in one thread,
// the CPU's order, so the value is the CPU's bit for bit.
#define LG_CE_REDUCE(sfx, T)                                                          \
    extern "C" __global__ void cross_entropy_reduce_##sfx(                           \
        long long samples, int reduction, const double* losses,                      \
        const long long* count, T* out) {                                            \
        if (reduction == 0) {                                                        \
            LG_GRID_LOOP(i, samples) out[i] = lg_from_f64<T>(losses[i]);             \
            return;                                                                  \
        }                                                                            \
        if (blockIdx.x != 0 || threadIdx.x != 0) return;                             \
        double total = -0.0; /* Rust's f64 sum starts from -0.0 */              \
        for (long long i = 0; i < samples; ++i) total += losses[i];                  \
        if (reduction == 2) total = total / (double)count[0];                        \
        out[0] = lg_from_f64<T>(total);                                              \
    }
LG_FOR_FLOATS(LG_CE_REDUCE)

// The per-sample weights of the gradient from the incoming gradient g (n
// values: one per sample, or one for all), as f64, divided by the count of
// samples not ignored when `mean` (read from the device's `count`, or
// `count_host` when that is null): the CPU's `sample_weights`.
#define LG_CE_WEIGHTS(sfx, T)                                                         \
    extern "C" __global__ void cross_entropy_weights_##sfx(                          \
        long long n, const T* g, int mean, const long long* count,                   \
        long long count_host, double* w) {                                           \
        double cnt = (double)(count ? count[0] : count_host);                        \
        LG_GRID_LOOP(i, n) {                                                         \
            double v = lg_to_f64(g[i]);                                              \
            w[i] = mean ? v / cnt : v;                                               \
        }                                                                            \
    }
LG_FOR_FLOATS(LG_CE_WEIGHTS)

// weights: n_weights doubles, one per sample or a single one for all.
#define LG_CE_BWD(sfx, T)                                                             \
    extern "C" __global__ void cross_entropy_bwd_##sfx(                              \
        LaneGeom g, long long ignore_index, double eps, const T* probs,              \
        const long long* targets, const double* weights, long long n_weights, T* dx) { \
        long long outer = g.outer, classes = g.classes, inner = g.inner;              \
        long long n = outer * classes * inner;                                        \
        double smooth = eps / (double)classes;                                        \
        LG_GRID_LOOP(i, n) {                                                          \
            long long j = i % inner;                                                  \
            long long c = (i / inner) % classes;                                      \
            long long sample = (i / (inner * classes)) * inner + j;                   \
            long long t = targets[sample];                                            \
            double r = 0.0;                                                           \
            if (t != ignore_index) {                                                  \
                double w = n_weights == 1 ? weights[0] : weights[sample];             \
                double hit = t == c ? 1.0 - eps : 0.0;                                \
                r = w * (lg_to_f64(probs[i]) - smooth - hit);                         \
            }                                                                         \
            dx[i] = lg_from_f64<T>(r);                                                \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_CE_BWD)
