// Fused attention softmax (as src/nn/attention/cpu.rs; launched from
// src/nn/attention/cuda.rs): scores S ([rows, lk],
// rows = batch*heads*lq, a fresh GEMM output) to probabilities
//   logit(r, j) = -inf if causal and j > r % lq, else scale*S[r, j] + mask
//   lse(r) = max + log(sum exp(logit - max)) (rounded to the lse type;
//            -inf for a fully masked row, whose probabilities are 0)
//   P[r, j] = exp(logit(r, j) - lse(r))
// in double as the CPU's f64 rows (no FMA contraction of scale*S + mask:
// __dmul_rn and __dadd_rn round each step as Rust does; the CPU works f32
// rows in f32). Masks (`kind`, a `MaskCode`): none, Float (additive, of
// T), Bool (u8, 0 = masked out), F64 (additive double: a float mask of
// another dtype, converted exactly); row r reads mask row r % mask_rows,
// so a [lq, lk] mask serves every batch and head. With use_lse the given
// lse is used instead (recomputing forward's P bit for bit in backward).
// Backward: dS = scale * P * (dP - sum_j P*dP) per row.
// One block of 256 threads per row (LG_ATT_THREADS must equal the block
// size the host launches); sums use a fixed tree order.

#define LG_ATT_THREADS 256

// ScoreGeom is `leangrad::nn::ScoreGeom` (src/nn/attention/mod.rs,
// #[repr(C)]): the same fields in the same order, usize as long long.
struct ScoreGeom {
    long long lq, lk;
    double scale;
    bool causal;
};

// Block-wide max or sum; every thread of the block must call it (the row
// loop is block-uniform, so it is).
__device__ __forceinline__ double lg_att_reduce(double v, double* buf, bool is_max) {
    buf[threadIdx.x] = v;
    for (int s = LG_ATT_THREADS / 2; s > 0; s >>= 1) {
        __syncthreads();
        if (threadIdx.x < s)
            buf[threadIdx.x] = is_max ? fmax(buf[threadIdx.x], buf[threadIdx.x + s])
                                      : buf[threadIdx.x] + buf[threadIdx.x + s];
    }
    __syncthreads();
    double r = buf[0];
    __syncthreads();
    return r;
}

// The logit of score `sv` whose mask element sits at `m` (causal handled by
// the caller).
template <typename T>
__device__ __forceinline__ double lg_att_logit(double scale, double sv, int kind, long long m,
                                               const T* fmask, const unsigned char* bmask,
                                               const double* dmask) {
    double x = __dmul_rn(scale, sv);
    if (kind == MaskCode::Float) x = __dadd_rn(x, lg_to_f64(fmask[m]));
    else if (kind == MaskCode::F64) x = __dadd_rn(x, dmask[m]);
    // Added, not assigned, as the CPU's additive 0/-inf mask: a masked NaN
    // or +inf score stays NaN.
    else if (kind == MaskCode::Bool && !bmask[m]) x = __dadd_rn(x, -(double)LG_INF);
    return x;
}

#define LG_ATTENTION(sfx, T)                                                          \
    extern "C" __global__ void attn_probs_##sfx(ScoreGeom g, long long rows,         \
                                                int mask_kind, long long mask_rows,   \
                                                int use_lse, T* p, Acc<T>::type* lse,  \
                                                const T* s, const T* fmask,           \
                                                const unsigned char* bmask,           \
                                                const double* dmask) {                \
        typedef Acc<T>::type St;                                                      \
        long long lq = g.lq, lk = g.lk;                                               \
        double scale = g.scale;                                                       \
        bool causal = g.causal;                                                       \
        __shared__ double buf[LG_ATT_THREADS];                                        \
        for (long long r = blockIdx.x; r < rows; r += gridDim.x) {                    \
            const T* srow = s + r * lk;                                               \
            long long mrow = mask_rows > 0 ? r % mask_rows * lk : 0;                  \
            long long limit = causal ? r % lq : lk;                                   \
            double value;                                                             \
            if (use_lse) {                                                            \
                value = (double)lse[r];                                               \
            } else {                                                                  \
                double mx = -(double)LG_INF;                                          \
                for (long long j = threadIdx.x; j < lk; j += LG_ATT_THREADS) {        \
                    if (j > limit) continue;                                          \
                    mx = fmax(mx, lg_att_logit<T>(scale, lg_to_f64(srow[j]), mask_kind, \
                                                  mrow + j, fmask, bmask, dmask));    \
                }                                                                     \
                mx = lg_att_reduce(mx, buf, true);                                    \
                double sum = 0;                                                       \
                if (mx != -(double)LG_INF) {                                          \
                    for (long long j = threadIdx.x; j < lk; j += LG_ATT_THREADS) {    \
                        if (j > limit) continue;                                      \
                        double x = lg_att_logit<T>(scale, lg_to_f64(srow[j]), mask_kind, \
                                                   mrow + j, fmask, bmask, dmask);    \
                        sum += exp(x - mx);                                           \
                    }                                                                 \
                }                                                                     \
                sum = lg_att_reduce(sum, buf, false);                                 \
                value = mx == -(double)LG_INF ? mx : (double)(St)(mx + log(sum));     \
                if (threadIdx.x == 0) lse[r] = (St)value;                             \
            }                                                                         \
            for (long long j = threadIdx.x; j < lk; j += LG_ATT_THREADS) {            \
                double x = -(double)LG_INF;                                           \
                if (j <= limit)                                                       \
                    x = lg_att_logit<T>(scale, lg_to_f64(srow[j]), mask_kind, mrow + j, \
                                        fmask, bmask, dmask);                         \
                p[r * lk + j] =                                                       \
                    lg_from_f64<T>(value == -(double)LG_INF ? 0.0 : exp(x - value));  \
            }                                                                         \
        }                                                                             \
    }                                                                                 \
    extern "C" __global__ void attn_softmax_bwd_##sfx(ScoreGeom g, long long rows,   \
                                                      T* ds, const T* p,              \
                                                      const T* dp) {                  \
        long long lk = g.lk;                                                          \
        double scale = g.scale;                                                       \
        __shared__ double buf[LG_ATT_THREADS];                                        \
        for (long long r = blockIdx.x; r < rows; r += gridDim.x) {                    \
            double dot = 0;                                                           \
            for (long long j = threadIdx.x; j < lk; j += LG_ATT_THREADS)              \
                dot += lg_to_f64(p[r * lk + j]) * lg_to_f64(dp[r * lk + j]);          \
            dot = lg_att_reduce(dot, buf, false);                                     \
            for (long long j = threadIdx.x; j < lk; j += LG_ATT_THREADS) {            \
                long long k = r * lk + j;                                             \
                ds[k] = lg_from_f64<T>(scale * lg_to_f64(p[k]) * (lg_to_f64(dp[k]) - dot)); \
            }                                                                         \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_ATTENTION)
