// Normalization layers over a contiguous input, as cpu.rs beside this file;
// launched from cuda.rs beside it.
//
// Geometry: `struct NormGeom` is the Rust `leangrad::nn::NormGeom`
// (src/nn/norm/mod.rs, #[repr(C)]): same fields in the same order, its usize
// fields laid out as these long longs. Statistics: the input is viewed as
// [a, s, b]; statistic i covers the elements (k*s + i)*b + j for all k < a,
// j < b:
//   batch norm  [outer, C, inner]   -> a = outer, s = C, b = inner
//   group norm  [N, C, spatial]     -> a = 1, s = N*groups, b = C/groups*spatial
//   layer / RMS [rows, len]         -> a = 1, s = rows, b = len
// Affine parameters: element e uses parameter (e / lp) % p (batch and group
// norm: p = C, lp = inner/spatial; layer/RMS norm: p = len, lp = 1). `seg`
// is the CPU's unit of work and is not used here.
// Reductions and the normalization run in double (as the CPU, which uses
// f64; the affine map with uncontracted __dmul_rn/__dadd_rn as Rust's); statistics are stored in the statistics type (double for f64,
// float otherwise: `Acc<T>`). One block of LG_NORM_THREADS per statistic or
// per parameter; sums use a fixed tree order, so results are deterministic.

struct NormGeom {
    long long a, s, b, p, lp, seg;
};

#define LG_NORM_THREADS 256

__device__ __forceinline__ double lg_norm_sum(double v, double* buf) {
    buf[threadIdx.x] = v;
    for (int s = LG_NORM_THREADS / 2; s > 0; s >>= 1) {
        __syncthreads();
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    }
    __syncthreads();
    double r = buf[0];
    __syncthreads();
    return r;
}

// Element k (< A*B) of statistic s is (k / B * S + s) * B + k % B. A thread
// visits k = threadIdx.x, threadIdx.x + LG_NORM_THREADS, … in that order
// without a 64-bit division per element: k = a*B + b advances by the
// block's stride as (a, b) += (stride / B, stride % B) with one carry
// (B = 0 means no elements: the walk is never advanced then).
struct LgNormWalk {
    long long a, b, da, db;
    __device__ __forceinline__ LgNormWalk(long long k0, long long B)
        : a(B > 0 ? k0 / B : 0), b(B > 0 ? k0 % B : 0), da(B > 0 ? LG_NORM_THREADS / B : 0),
          db(B > 0 ? LG_NORM_THREADS % B : 0) {}
    __device__ __forceinline__ long long elem(long long s, long long S, long long B) const {
        return (a * S + s) * B + b;
    }
    __device__ __forceinline__ void next(long long B) {
        a += da;
        b += db;
        if (b >= B) {
            b -= B;
            ++a;
        }
    }
};

// A thread of norm_fwd_* normalizes a run of LG_RUN consecutive elements:
// the statistic and parameter indices are divided out once per run and
// then stepped, and the run moves as one vector when `vec` (every buffer
// 16-byte aligned, checked by the host).

// Multiply-high dividers (LgDiv) by b, s, lp and p, made by a block's first
// thread, where every index of the input fits 31 bits (`narrow`).
struct LgNormDivs {
    LgDiv b, s, lp, p;
    bool narrow;
};

// The block's dividers for `g` (every thread of the block calls this once,
// before its loop: it synchronises the block).
__device__ __forceinline__ LgNormDivs lg_norm_divs(const NormGeom& g) {
    __shared__ LgNormDivs d;
    if (threadIdx.x == 0) {
        const long long most = 1LL << 31;
        d.narrow = g.a * g.s * g.b < most && g.b >= 1 && g.s >= 1 && g.lp >= 1 && g.p >= 1 &&
                   g.b < most && g.s < most && g.lp < most && g.p < most;
        if (d.narrow) {
            d.b = lg_div_make((unsigned int)g.b);
            d.s = lg_div_make((unsigned int)g.s);
            d.lp = lg_div_make((unsigned int)g.lp);
            d.p = lg_div_make((unsigned int)g.p);
        }
    }
    __syncthreads();
    return d;
}

// The statistic s = (e / B) % S and parameter p = (e / Lp) % P of element
// e (found by multiply-highs where the dividers are narrow), stepped one
// element at a time without a division.
struct LgNormAt {
    long long rb, s, rl, p;
    __device__ __forceinline__ LgNormAt(long long e, const NormGeom& g, const LgNormDivs& d) {
        if (d.narrow) {
            unsigned int u = (unsigned int)e, qb = lg_div(d.b, u), ql = lg_div(d.lp, u);
            rb = u - qb * (unsigned int)g.b;
            s = qb - lg_div(d.s, qb) * (unsigned int)g.s;
            rl = u - ql * (unsigned int)g.lp;
            p = ql - lg_div(d.p, ql) * (unsigned int)g.p;
        } else {
            rb = e % g.b;
            s = e / g.b % g.s;
            rl = e % g.lp;
            p = e / g.lp % g.p;
        }
    }
    __device__ __forceinline__ void next(const NormGeom& g) {
        if (++rb == g.b) {
            rb = 0;
            if (++s == g.s) s = 0;
        }
        if (++rl == g.lp) {
            rl = 0;
            if (++p == g.p) p = 0;
        }
    }
};

// One element of the norms' forward: x_hat = (x - mean[s]) * rstd[s] in
// double, written rounded to T where `hat` is given, and y = x_hat * w[p] +
// b[p] (w, b optional: null) with uncontracted products, rounded to T.
template <typename T>
__device__ __forceinline__ T lg_norm_elem(T x, const LgNormAt& at,
                                          const typename Acc<T>::type* mean,
                                          const typename Acc<T>::type* rstd, const T* w,
                                          const T* b, T* hat) {
    double h = (lg_to_f64(x) - (double)mean[at.s]) * (double)rstd[at.s];
    if (hat) *hat = lg_from_f64<T>(h);
    double wv = w ? lg_to_f64(w[at.p]) : 1.0;
    double bv = b ? lg_to_f64(b[at.p]) : 0.0;
    return lg_from_f64<T>(__dadd_rn(__dmul_rn(h, wv), bv));
}

#define LG_NORM(sfx, T)                                                               \
    /* y = x_hat * w + b (w, b optional) and/or x_hat = (x - mean) * rstd, both */   \
    /* rounded to T; the statistic of element e is (e / B) % S. */                    \
    /* y may be x itself: each run is read whole before it is written, by the */     \
    /* one thread that owns it. */                                                    \
    static __device__ void norm_fwd_body_##sfx(NormGeom g, int want_y, int want_xhat, \
                                               int has_w, int has_b, int vec,         \
                                               const T* x, const Acc<T>::type* mean,  \
                                               const Acc<T>::type* rstd, const T* w,  \
                                               const T* b, T* y, T* xhat) {           \
        const LgNormDivs divs = lg_norm_divs(g);                                      \
        long long n = g.a * g.s * g.b;                                                \
        long long runs = (n + LG_RUN - 1) / LG_RUN;                                   \
        LG_GRID_LOOP(t, runs) {                                                       \
            long long e0 = t * LG_RUN;                                           \
            int cnt = n - e0 < LG_RUN ? (int)(n - e0) : LG_RUN;             \
            LgRun<T, LG_RUN> in, hat, out;                                       \
            in.load(x + e0, cnt, vec);                                                \
            LgNormAt at(e0, g, divs);                                                 \
            for (int i = 0; i < cnt; ++i, at.next(g)) {                               \
                T yv = lg_norm_elem<T>(in.v[i], at, mean, rstd, has_w ? w : 0,        \
                                       has_b ? b : 0, want_xhat ? &hat.v[i] : 0);     \
                if (want_y) out.v[i] = yv;                                            \
            }                                                                         \
            if (want_xhat) hat.store(xhat + e0, cnt, vec);                            \
            if (want_y) out.store(y + e0, cnt, vec);                                  \
        }                                                                             \
    }                                                                                 \
    extern "C" __global__ void norm_fwd_##sfx(NormGeom g, int want_y, int want_xhat,  \
                                              int has_w, int has_b, int vec,          \
                                              const T* x, const Acc<T>::type* mean,   \
                                              const Acc<T>::type* rstd, const T* w,   \
                                              const T* b, T* y, T* xhat) {            \
        norm_fwd_body_##sfx(g, want_y, want_xhat, has_w, has_b, vec, x, mean, rstd,   \
                            w, b, y, xhat);                                           \
    }                                                                                 \
    /* y written over x (buffer reuse: nothing else holds x). */                      \
    extern "C" __global__ void norm_fwd_inplace_##sfx(NormGeom g, int want_xhat,      \
                                                      int has_w, int has_b, int vec,  \
                                                      T* x,                           \
                                                      const Acc<T>::type* mean,       \
                                                      const Acc<T>::type* rstd,       \
                                                      const T* w, const T* b,         \
                                                      T* xhat) {                      \
        norm_fwd_body_##sfx(g, 1, want_xhat, has_w, has_b, vec, x, mean, rstd, w, b,  \
                            x, xhat);                                                 \
    }
LG_FOR_FLOATS(LG_NORM)

// norm_fwd_inplace followed by ReLU in the same pass, with the packed mask
// of the result's positives (bit e % 32 of word e / 32; ballots, so the
// loop runs whole warps: lane l of pass c takes run 32c + l, none past the
// end): y = x_hat * w + b rounded to T, then y > 0 ? y : 0 (NaN kept), the
// values, bits and x_hat of norm_fwd_inplace and relu_mask_fwd_inplace one
// after the other.
#define LG_NORM_RELU(sfx, T)                                                          \
    extern "C" __global__ void norm_fwd_relu_inplace_##sfx(                           \
        NormGeom g, int want_xhat, int has_w, int has_b, int vec, T* x,               \
        const Acc<T>::type* mean, const Acc<T>::type* rstd, const T* w, const T* b,   \
        T* xhat, unsigned int* mask) {                                                \
        typedef Acc<T>::type A;                                                       \
        const LgNormDivs divs = lg_norm_divs(g);                                      \
        const long long n = g.a * g.s * g.b, words = (n + 31) / 32;                   \
        const long long per_pass = 32 * LG_RUN;                                       \
        long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;     \
        long long warps = ((long long)blockDim.x * gridDim.x) >> 5;                   \
        int lane = threadIdx.x & 31;                                                  \
        for (long long c = warp; c * per_pass < n; c += warps) {                      \
            long long e0 = c * per_pass + lane * LG_RUN, left = n - e0;               \
            int cnt = left <= 0 ? 0 : left < LG_RUN ? (int)left : LG_RUN;            \
            unsigned int nib = 0;                                                     \
            if (cnt > 0) {                                                            \
                LgRun<T, LG_RUN> run, hat;                                            \
                run.load(x + e0, cnt, vec);                                           \
                LgNormAt at(e0, g, divs);                                             \
                for (int i = 0; i < cnt; ++i, at.next(g)) {                           \
                    T y = lg_norm_elem<T>(run.v[i], at, mean, rstd, has_w ? w : 0,    \
                                          has_b ? b : 0, want_xhat ? &hat.v[i] : 0);  \
                    A v = lg_load(y);                                                 \
                    bool pos = v > (A)0;                                              \
                    nib |= (unsigned int)pos << i;                                    \
                    /* NaN is not positive (bit 0) but stays NaN, as ReLU's */        \
                    run.v[i] = pos || v != v ? y : lg_store<T>((A)0);                 \
                }                                                                     \
                if (want_xhat) hat.store(xhat + e0, cnt, vec);                        \
                run.store(x + e0, cnt, vec);                                          \
            }                                                                         \
            unsigned int word = lg_runs_mask_word(nib);                               \
            long long wd = c * LG_RUN + lane;                                         \
            if (lane < LG_RUN && wd < words) mask[wd] = word;                         \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_NORM_RELU)

// The kernels that let CUDA save what the CPU saves: statistics come back
// unrounded in double (the host rounds them as for the CPU), and the
// gradients read the saved x_hat rather than recomputing it from x.
#define LG_NORM_SAVED(sfx, T)                                                         \
    /* Per statistic: the mean (0 unless centered) and the biased variance */         \
    /* (mean square when not centered), both unrounded doubles. */                    \
    extern "C" __global__ void norm_moments_##sfx(NormGeom g, int centered,           \
                                                  double* mean, double* var,          \
                                                  const T* x) {                       \
        __shared__ double buf[LG_NORM_THREADS];                                       \
        long long A = g.a, S = g.s, B = g.b;                                          \
        long long cnt = A * B;                                                        \
        double div = cnt > 0 ? (double)cnt : 1.0;                                     \
        for (long long s = blockIdx.x; s < S; s += gridDim.x) {                       \
            double m = 0;                                                             \
            if (centered) {                                                           \
                LgNormWalk it(threadIdx.x, B);                                        \
                for (long long k = threadIdx.x; k < cnt; k += LG_NORM_THREADS, it.next(B)) \
                    m += lg_to_f64(x[it.elem(s, S, B)]);                              \
                m = lg_norm_sum(m, buf) / div;                                        \
            }                                                                         \
            double v = 0;                                                             \
            LgNormWalk it(threadIdx.x, B);                                            \
            for (long long k = threadIdx.x; k < cnt; k += LG_NORM_THREADS, it.next(B)) { \
                double d = lg_to_f64(x[it.elem(s, S, B)]) - m;                        \
                v += d * d;                                                           \
            }                                                                         \
            v = lg_norm_sum(v, buf) / div;                                            \
            if (threadIdx.x == 0) {                                                   \
                mean[s] = m;                                                          \
                var[s] = v;                                                           \
            }                                                                         \
        }                                                                             \
    }                                                                                 \
    /* Input gradient per statistic s from the saved x_hat, gw = g * w and */         \
    /* scale[s] (rstd, or batch norm's w * invstd with has_w = 0):          */        \
    /*   mode 0 (centered): scale * (gw - mean(gw) - x_hat * mean(gw * x_hat)) */     \
    /*   mode 1 (RMS):      scale * (gw - x_hat * mean(gw * x_hat))          */       \
    /*   mode 2 (affine):   scale * gw (x_hat is not read)                   */       \
    /* mode is uniform over the grid, so the block-wide sums are reached by */       \
    /* every thread of a block or by none. */                                         \
    /* dx may be g itself: a block reads all of its statistic's g (the sums) */      \
    /* before any of them is written, and each element is then read and */           \
    /* written by one thread. */                                                      \
    static __device__ void norm_bwd_saved_body_##sfx(NormGeom geo, int mode,          \
                                                     int has_w, const T* xhat,        \
                                                     const Acc<T>::type* scale,       \
                                                     const T* g, const T* w, T* dx) { \
        __shared__ double buf[LG_NORM_THREADS];                                       \
        long long A = geo.a, S = geo.s, B = geo.b, P = geo.p, Lp = geo.lp;            \
        long long cnt = A * B;                                                        \
        double div = cnt > 0 ? (double)cnt : 1.0;                                     \
        for (long long s = blockIdx.x; s < S; s += gridDim.x) {                       \
            double r = (double)scale[s];                                              \
            double s1 = 0, s2 = 0;                                                    \
            if (mode != 2) {                                                          \
                LgNormWalk it(threadIdx.x, B);                                        \
                for (long long k = threadIdx.x; k < cnt; k += LG_NORM_THREADS, it.next(B)) { \
                    long long e = it.elem(s, S, B);                                   \
                    double gw = __dmul_rn(lg_to_f64(g[e]),                            \
                                          has_w ? lg_to_f64(w[e / Lp % P]) : 1.0);    \
                    s1 += gw;                                                         \
                    s2 += gw * lg_to_f64(xhat[e]);                                    \
                }                                                                     \
                s1 = lg_norm_sum(s1, buf) / div;                                      \
                s2 = lg_norm_sum(s2, buf) / div;                                      \
            }                                                                         \
            LgNormWalk it(threadIdx.x, B);                                            \
            for (long long k = threadIdx.x; k < cnt; k += LG_NORM_THREADS, it.next(B)) { \
                long long e = it.elem(s, S, B);                                       \
                double gw = __dmul_rn(lg_to_f64(g[e]),                                \
                                      has_w ? lg_to_f64(w[e / Lp % P]) : 1.0);        \
                double v = gw;                                                        \
                if (mode == 0)                                                        \
                    v = __dsub_rn(__dsub_rn(gw, s1), __dmul_rn(lg_to_f64(xhat[e]), s2)); \
                else if (mode == 1)                                                   \
                    v = __dsub_rn(gw, __dmul_rn(lg_to_f64(xhat[e]), s2));             \
                dx[e] = lg_from_f64<T>(__dmul_rn(r, v));                              \
            }                                                                         \
        }                                                                             \
    }                                                                                 \
    extern "C" __global__ void norm_bwd_saved_##sfx(NormGeom geo, int mode, int has_w, \
                                                    const T* xhat,                    \
                                                    const Acc<T>::type* scale,        \
                                                    const T* g, const T* w, T* dx) {  \
        norm_bwd_saved_body_##sfx(geo, mode, has_w, xhat, scale, g, w, dx);           \
    }                                                                                 \
    /* dx written over g (buffer reuse: nothing else holds g). */                     \
    extern "C" __global__ void norm_bwd_saved_inplace_##sfx(NormGeom geo, int mode,   \
                                                            int has_w, const T* xhat, \
                                                            const Acc<T>::type* scale, \
                                                            T* g, const T* w) {       \
        norm_bwd_saved_body_##sfx(geo, mode, has_w, xhat, scale, g, w, g);            \
    }                                                                                 \
    /* Parameter gradients from the saved x_hat: dw[p] = sum g * x_hat (when */       \
    /* want_w; x_hat is not read otherwise), db[p] = sum g (when want_b), over */     \
    /* the elements (o*P + p)*Lp + l; one block per parameter. */                     \
    extern "C" __global__ void norm_param_grad_saved_##sfx(NormGeom geo, int want_w,  \
                                                           int want_b, const T* xhat, \
                                                           const T* g, T* dw, T* db) { \
        __shared__ double buf[LG_NORM_THREADS];                                       \
        long long n = geo.a * geo.s * geo.b, P = geo.p, Lp = geo.lp;                  \
        long long per = P * Lp > 0 ? n / (P * Lp) * Lp : 0;                           \
        for (long long p = blockIdx.x; p < P; p += gridDim.x) {                       \
            double sw = 0, sb = 0;                                                    \
            LgNormWalk it(threadIdx.x, Lp);                                           \
            for (long long k = threadIdx.x; k < per; k += LG_NORM_THREADS, it.next(Lp)) { \
                long long e = it.elem(p, P, Lp);                                      \
                double gv = lg_to_f64(g[e]);                                          \
                sb += gv;                                                             \
                if (want_w) sw += gv * lg_to_f64(xhat[e]);                            \
            }                                                                         \
            sw = lg_norm_sum(sw, buf);                                                \
            sb = lg_norm_sum(sb, buf);                                                \
            if (threadIdx.x == 0) {                                                   \
                if (want_w) dw[p] = lg_from_f64<T>(sw);                               \
                if (want_b) db[p] = lg_from_f64<T>(sb);                               \
            }                                                                         \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_NORM_SAVED)

// The affine input gradient (norm_bwd_saved's mode 2: dx = scale[s] * (g *
// w[p]), w optional; no sums) element-wise in runs of LG_RUN over the whole
// grid, rather than one block per statistic: the same products, rounded
// the same way. dx may be g itself (each run is read whole before it is
// written, by the one thread that owns it).
#define LG_NORM_AFFINE_BWD(sfx, T)                                                    \
    static __device__ void norm_bwd_affine_body_##sfx(NormGeom geo, int has_w, int vec, \
                                                      const Acc<T>::type* scale,      \
                                                      const T* g, const T* w, T* dx) { \
        const LgNormDivs divs = lg_norm_divs(geo);                                    \
        long long n = geo.a * geo.s * geo.b;                                          \
        long long runs = (n + LG_RUN - 1) / LG_RUN;                                   \
        LG_GRID_LOOP(t, runs) {                                                       \
            long long e0 = t * LG_RUN;                                                \
            int cnt = n - e0 < LG_RUN ? (int)(n - e0) : LG_RUN;                       \
            LgRun<T, LG_RUN> in, out;                                                 \
            in.load(g + e0, cnt, vec);                                                \
            LgNormAt at(e0, geo, divs);                                               \
            for (int i = 0; i < cnt; ++i, at.next(geo)) {                             \
                double gw = __dmul_rn(lg_to_f64(in.v[i]),                             \
                                      has_w ? lg_to_f64(w[at.p]) : 1.0);              \
                out.v[i] = lg_from_f64<T>(__dmul_rn((double)scale[at.s], gw));        \
            }                                                                         \
            out.store(dx + e0, cnt, vec);                                             \
        }                                                                             \
    }                                                                                 \
    extern "C" __global__ void norm_bwd_affine_##sfx(NormGeom geo, int has_w, int vec, \
                                                     const Acc<T>::type* scale,       \
                                                     const T* g, const T* w, T* dx) { \
        norm_bwd_affine_body_##sfx(geo, has_w, vec, scale, g, w, dx);                 \
    }                                                                                 \
    /* dx written over g (buffer reuse: nothing else holds g). */                     \
    extern "C" __global__ void norm_bwd_affine_inplace_##sfx(NormGeom geo, int has_w, \
                                                             int vec,                 \
                                                             const Acc<T>::type* scale, \
                                                             T* g, const T* w) {      \
        norm_bwd_affine_body_##sfx(geo, has_w, vec, scale, g, w, g);                  \
    }
LG_FOR_FLOATS(LG_NORM_AFFINE_BWD)

// What one norm call derives, per statistic i < s, from its mean and
// variance (the batch's f64 moments, or batch norm's running statistics in
// T), so that nothing crosses to the host:
//   mean_out  = S(mean)                  (S: the statistics type, Acc<T>)
//   rstd_out  = S(1 / sqrt(var + eps))
//   scale_out = S(w * rstd_out), or rstd_out without w
// and, with run_mean/run_var, batch norm's running statistics in place from
// the unrounded moments (the variance times `unbias`):
//   r <- T((1 - momentum) * r + momentum * m * k)
// Thread 0 adds 1 to `counter` (num_batches_tracked) when given. A null
// pointer is an absent operand, never touched; mean null means 0. The f64
// operations are written uncontracted, in the order the CPU computes them.
template <typename Src, typename T>
static __device__ void norm_prep_body(long long s, double eps, double momentum, double unbias,
                                      const Src* mean, const Src* var, T* run_mean,
                                      T* run_var, const T* w, typename Acc<T>::type* mean_out,
                                      typename Acc<T>::type* rstd_out,
                                      typename Acc<T>::type* scale_out, long long* counter) {
    typedef typename Acc<T>::type S;
    LG_GRID_LOOP(i, s) {
        double m = mean ? lg_to_f64(mean[i]) : 0.0;
        double v = lg_to_f64(var[i]);
        if (run_mean) {
            double keep = __dsub_rn(1.0, momentum);
            run_mean[i] = lg_from_f64<T>(
                __dadd_rn(__dmul_rn(keep, lg_to_f64(run_mean[i])), __dmul_rn(momentum, m)));
            run_var[i] = lg_from_f64<T>(__dadd_rn(__dmul_rn(keep, lg_to_f64(run_var[i])),
                                                  __dmul_rn(__dmul_rn(momentum, v), unbias)));
        }
        S r = (S)__ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(v, eps)));
        if (mean_out) mean_out[i] = (S)m;
        if (rstd_out) rstd_out[i] = r;
        if (scale_out) scale_out[i] = w ? (S)__dmul_rn(lg_to_f64(w[i]), (double)r) : r;
    }
    if (counter && blockIdx.x == 0 && threadIdx.x == 0) *counter += 1;
}

#define LG_NORM_PREP(sfx, T)                                                            \
    /* From the batch's f64 moments (train mode, layer / group / RMS norm). */          \
    extern "C" __global__ void norm_prep_moments_##sfx(                                 \
        long long s, double eps, double momentum, double unbias, const double* mean,    \
        const double* var, T* run_mean, T* run_var, const T* w, Acc<T>::type* mean_out, \
        Acc<T>::type* rstd_out, Acc<T>::type* scale_out, long long* counter) {          \
        norm_prep_body<double, T>(s, eps, momentum, unbias, mean, var, run_mean, run_var, \
                                  w, mean_out, rstd_out, scale_out, counter);           \
    }                                                                                   \
    /* From batch norm's running statistics (eval mode; never updated here). */         \
    extern "C" __global__ void norm_prep_running_##sfx(                                 \
        long long s, double eps, const T* mean, const T* var, const T* w,               \
        Acc<T>::type* mean_out, Acc<T>::type* rstd_out, Acc<T>::type* scale_out) {      \
        norm_prep_body<T, T>(s, eps, 0.0, 1.0, mean, var, (T*)0, (T*)0, w, mean_out,    \
                             rstd_out, scale_out, (long long*)0);                        \
    }                                                                                   \
    /* scale = S(w * rstd) per statistic from an already rounded rstd. */               \
    extern "C" __global__ void norm_scale_##sfx(long long s, const T* w,                \
                                                const Acc<T>::type* rstd,               \
                                                Acc<T>::type* scale) {                  \
        LG_GRID_LOOP(i, s) {                                                            \
            scale[i] = w ? (Acc<T>::type)__dmul_rn(lg_to_f64(w[i]), (double)rstd[i]) : rstd[i]; \
        }                                                                               \
    }
LG_FOR_FLOATS(LG_NORM_PREP)
