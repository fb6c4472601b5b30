// Optimizer updates in place, per element, as src/optim (sgd.rs, adam.rs):
// every operation is done in T and rounded as the CPU's (half types compute
// each operation in float and round once), so results match bit for bit.
// Step-dependent constants come from the host as doubles and are converted
// to T here, as the CPU converts them.
//
// Gradient transform (GradTransform; `gmode` a `GradMapCode`): the identity,
// g * gparam (scale) or g clamped to [-gparam, gparam].
//
// The parameter is contiguous from element `poff` of its buffer; the
// gradient is read through its layout `gl` (any strides), as the CPU reads
// it in row-major order. State buffers are whole and contiguous. A state
// pointer that is not used (no momentum, no amsgrad) may point anywhere: it
// is never dereferenced.

// Correctly rounded single operations that the compiler never contracts
// into an FMA (the CPU rounds every product before adding it).
__device__ __forceinline__ float lg_add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double lg_add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float lg_sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double lg_sub_rn(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float lg_mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double lg_mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float lg_div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double lg_div_rn(double a, double b) { return __ddiv_rn(a, b); }

template <typename T> __device__ __forceinline__ T lg_tadd(T a, T b) {
    return lg_store<T>(lg_add_rn(lg_load(a), lg_load(b)));
}
template <typename T> __device__ __forceinline__ T lg_tsub(T a, T b) {
    return lg_store<T>(lg_sub_rn(lg_load(a), lg_load(b)));
}
template <typename T> __device__ __forceinline__ T lg_tmul(T a, T b) {
    return lg_store<T>(lg_mul_rn(lg_load(a), lg_load(b)));
}
template <typename T> __device__ __forceinline__ T lg_tdiv(T a, T b) {
    return lg_store<T>(lg_div_rn(lg_load(a), lg_load(b)));
}
template <typename T> __device__ __forceinline__ bool lg_tnan(T a) {
    return lg_load(a) != lg_load(a);
}

// A gradient value through the transform.
template <typename T> __device__ __forceinline__ T lg_grad_map(T v, int gmode, T gparam) {
    if (gmode == GradMapCode::Scale) return lg_tmul(v, gparam);
    if (gmode == GradMapCode::ClampAbs) {
        if (lg_load(v) < -lg_load(gparam)) return lg_store<T>(-lg_load(gparam));
        if (lg_load(v) > lg_load(gparam)) return gparam;
    }
    return v;
}

// Element i of the gradient (row-major through its layout), transformed.
template <typename T>
__device__ __forceinline__ T lg_grad(const T* g, const Strided& gl, long long i, int gmode,
                                     T gparam) {
    return lg_grad_map(g[lg_offset(gl, i)], gmode, gparam);
}

// One SGD update of an element: d = (maximize ? -g : g) + wd*p (if wd !=
// 0); with momentum: b = first ? d : b*momentum + (1-dampening)*d, d =
// nesterov ? d + momentum*b : b; p += -lr * d.
template <typename T> struct LgSgd {
    T tm, keep, twd, neg_lr;
    double wd;
    int nesterov, maximize, first, has_buf;
    __device__ __forceinline__ void apply(T& pv, T d, T& b) const {
        if (maximize) d = lg_store<T>(-lg_load(d));
        if (wd != 0.0) d = lg_tadd(d, lg_tmul(twd, pv));
        if (has_buf) {
            b = first ? d : lg_tadd(lg_tmul(b, tm), lg_tmul(keep, d));
            d = nesterov ? lg_tadd(d, lg_tmul(tm, b)) : b;
        }
        pv = lg_tadd(pv, lg_tmul(neg_lr, d));
    }
    static __device__ __forceinline__ LgSgd make(double lr, double momentum, double dampening,
                                                 double wd, int nesterov, int maximize,
                                                 int first, int has_buf) {
        return LgSgd{lg_from_f64<T>(momentum), lg_from_f64<T>(1.0 - dampening),
                     lg_from_f64<T>(wd),       lg_from_f64<T>(-lr),
                     wd,                       nesterov,
                     maximize,                 first,
                     has_buf};
    }
};

// One Adam / AdamW (+amsgrad) update of an element with the host's step
// constants (converted to T as the CPU converts them): ns = -lr/(1-beta1^t),
// bc2 = sqrt(1-beta2^t), w = 1-beta1 (small: w < 0.5), shrink = 1 - lr*wd;
// l2 adds wd*p to the gradient, decoupled multiplies p by shrink.
template <typename T> struct LgAdam {
    T ns, bc2, eps, w, omw, b2, omb2, twd, shrink;
    int small, l2, decoupled, maximize, amsgrad;
    __device__ __forceinline__ void apply(T& pv, T gv, T& mv, T& vv, T& mx) const {
        if (decoupled) pv = lg_tmul(pv, shrink);
        if (maximize) gv = lg_store<T>(-lg_load(gv));
        if (l2) gv = lg_tadd(gv, lg_tmul(twd, pv));
        mv = small ? lg_tadd(mv, lg_tmul(w, lg_tsub(gv, mv)))
                   : lg_tsub(gv, lg_tmul(lg_tsub(gv, mv), omw));
        vv = lg_tadd(lg_tmul(vv, b2), lg_tmul(lg_tmul(omb2, gv), gv));
        T sm = vv;
        if (amsgrad) {
            mx = (lg_tnan(vv) || lg_tnan(mx)) ? lg_tadd(vv, mx)
                                              : (lg_load(vv) > lg_load(mx) ? vv : mx);
            sm = mx;
        }
        T denom = lg_tadd(lg_tdiv(lg_store<T>(sqrt(lg_load(sm))), bc2), eps);
        pv = lg_tadd(pv, lg_tdiv(lg_tmul(ns, mv), denom));
    }
    static __device__ __forceinline__ LgAdam make(double neg_step, double bc2_sqrt, double eps,
                                                  double weight, double beta2, double wd,
                                                  double shrink, int l2, int decoupled,
                                                  int maximize, int amsgrad) {
        return LgAdam{lg_from_f64<T>(neg_step),     lg_from_f64<T>(bc2_sqrt),
                      lg_from_f64<T>(eps),          lg_from_f64<T>(weight),
                      lg_from_f64<T>(1.0 - weight), lg_from_f64<T>(beta2),
                      lg_from_f64<T>(1.0 - beta2),  lg_from_f64<T>(wd),
                      lg_from_f64<T>(shrink),       weight < 0.5,
                      l2,                           decoupled,
                      maximize,                     amsgrad};
    }
};

// The parameters of one multi-tensor update (PyTorch's `foreach`): up to
// LG_LIST tensors in one launch, mirrored by `TensorList` in
// src/optim/cuda.rs (LIST there). Tensor k has n[k] elements at address
// p[k], its gradient contiguous at g[k] and its state buffers at
// s[j][k] (0 where absent); its runs of LG_RUN elements are the list's runs
// start[k] .. start[k+1] (start[count]: all runs); vec[k]: every address of
// tensor k is 16-byte aligned.
#define LG_LIST 32
struct LgTensorList {
    long long start[LG_LIST + 1];
    long long n[LG_LIST];
    unsigned long long p[LG_LIST];
    unsigned long long g[LG_LIST];
    unsigned long long s[3][LG_LIST];
    int vec[LG_LIST];
    int count;
};

// The tensor holding the list's run r: the last k with start[k] <= r.
__device__ __forceinline__ int lg_list_find(const LgTensorList& L, long long r) {
    int lo = 0, hi = L.count - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (L.start[mid] <= r) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// Run r of a list: its tensor k, its first element e0 in it, its length,
// whether tensor k's buffers are aligned for vectors; at() the address of
// the run's first element in one of tensor k's buffers.
struct LgListRun {
    int k;
    long long e0;
    int cnt, vec;
    template <typename T> __device__ __forceinline__ T* at(unsigned long long base) const {
        return reinterpret_cast<T*>(base) + e0;
    }
};
__device__ __forceinline__ LgListRun lg_list_run(const LgTensorList& L, long long r) {
    int k = lg_list_find(L, r);
    long long e0 = (r - L.start[k]) * LG_RUN;
    return LgListRun{k, e0, lg_run_count(L.n[k], e0), L.vec[k]};
}

// The runs of a list this thread takes, grid-stride.
#define LG_LIST_LOOP(r, L)                                                            \
    for (long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;              \
         r < (L).start[(L).count]; r += (long long)blockDim.x * gridDim.x)

#define LG_OPTIM(sfx, T)                                                              \
    /* SGD (LgSgd) in runs of LG_RUN elements per thread; a gradient that is */      \
    /* contiguous (rank 1, stride 1 once coalesced) is read as runs too, one */       \
    /* vector each where `vec` says every buffer is 16-byte aligned there. */        \
    extern "C" __global__ void sgd_##sfx(long long n, int vec, double lr,            \
                                         double momentum, double dampening,           \
                                         double wd, int nesterov, int maximize,       \
                                         int first, int has_buf, int gmode,           \
                                         double gparam, T* p, long long poff,         \
                                         const T* g, Strided gl, T* buf) {            \
        LgSgd<T> u = LgSgd<T>::make(lr, momentum, dampening, wd, nesterov, maximize, first, \
                                    has_buf);                                         \
        T gp = lg_from_f64<T>(gparam);                                                \
        bool dense = gl.rank == 1 && gl.strides[0] == 1;                              \
        LG_RUN_LOOP(e0, n) {                                                          \
            int cnt = lg_run_count(n, e0);                                            \
            LgRun<T, LG_RUN> pv, gv, bv;                                              \
            pv.load(p + poff + e0, cnt, vec);                                         \
            if (dense) {                                                              \
                gv.load(g + gl.offset + e0, cnt, vec);                                \
            } else {                                                                  \
                LG_RUN_EACH(i, cnt) gv.v[i] = g[lg_offset(gl, e0 + i)];               \
            }                                                                         \
            if (has_buf && !first) bv.load(buf + e0, cnt, vec);                       \
            LG_RUN_EACH(i, cnt) u.apply(pv.v[i], lg_grad_map(gv.v[i], gmode, gp), bv.v[i]); \
            pv.store(p + poff + e0, cnt, vec);                                        \
            if (has_buf) bv.store(buf + e0, cnt, vec);                                \
        }                                                                             \
    }                                                                                 \
    /* Adam / AdamW (+amsgrad) with the host's step constants: neg_step = */          \
    /* -lr/(1-beta1^t), bc2_sqrt = sqrt(1-beta2^t), weight = 1-beta1, shrink = */     \
    /* 1 - lr*wd; l2 adds wd*p to the gradient, decoupled multiplies p by shrink. */  \
    extern "C" __global__ void adam_##sfx(long long n, double neg_step, double bc2_sqrt, \
                                          double eps, double weight, double beta2,    \
                                          double wd, double shrink, int l2,           \
                                          int decoupled, int maximize, int amsgrad,   \
                                          int gmode, double gparam, T* p,             \
                                          long long poff, const T* g, Strided gl,     \
                                          T* m, T* v, T* vmax) {                      \
        LgAdam<T> u = LgAdam<T>::make(neg_step, bc2_sqrt, eps, weight, beta2, wd, shrink, \
                                      l2, decoupled, maximize, amsgrad);              \
        T gp = lg_from_f64<T>(gparam);                                                \
        LG_GRID_LOOP(i, n) {                                                          \
            T pv = p[poff + i], mv = m[i], vv = v[i], mx;                             \
            if (amsgrad) mx = vmax[i];                                                \
            u.apply(pv, lg_grad(g, gl, i, gmode, gp), mv, vv, mx);                    \
            m[i] = mv;                                                                \
            v[i] = vv;                                                                \
            if (amsgrad) vmax[i] = mx;                                                \
            p[poff + i] = pv;                                                         \
        }                                                                             \
    }                                                                                 \
    /* SGD over a list of tensors (LgTensorList; state s[0]: the momentum */          \
    /* buffers), every contiguous gradient read as runs. */                          \
    extern "C" __global__ void sgd_list_##sfx(LgTensorList L, double lr, double momentum, \
                                              double dampening, double wd,            \
                                              int nesterov, int maximize, int first,  \
                                              int has_buf, int gmode, double gparam) { \
        LgSgd<T> u = LgSgd<T>::make(lr, momentum, dampening, wd, nesterov, maximize, first, \
                                    has_buf);                                         \
        T gp = lg_from_f64<T>(gparam);                                                \
        LG_LIST_LOOP(r, L) {                                                          \
            const LgListRun run = lg_list_run(L, r);                                  \
            const int k = run.k, cnt = run.cnt, vec = run.vec;                        \
            T *p = run.at<T>(L.p[k]), *b = run.at<T>(L.s[0][k]);                      \
            LgRun<T, LG_RUN> pv, gv, bv;                                              \
            pv.load(p, cnt, vec);                                                     \
            gv.load(run.at<const T>(L.g[k]), cnt, vec);                               \
            if (has_buf && !first) bv.load(b, cnt, vec);                              \
            LG_RUN_EACH(i, cnt) u.apply(pv.v[i], lg_grad_map(gv.v[i], gmode, gp), bv.v[i]); \
            pv.store(p, cnt, vec);                                                    \
            if (has_buf) bv.store(b, cnt, vec);                                       \
        }                                                                             \
    }                                                                                 \
    /* Adam over a list of tensors (state s[0] m, s[1] v, s[2] vmax), every */        \
    /* contiguous gradient read as runs. */                                           \
    extern "C" __global__ void adam_list_##sfx(LgTensorList L, double neg_step,       \
                                               double bc2_sqrt, double eps, double weight, \
                                               double beta2, double wd, double shrink, \
                                               int l2, int decoupled, int maximize,   \
                                               int amsgrad, int gmode, double gparam) { \
        LgAdam<T> u = LgAdam<T>::make(neg_step, bc2_sqrt, eps, weight, beta2, wd, shrink, \
                                      l2, decoupled, maximize, amsgrad);              \
        T gp = lg_from_f64<T>(gparam);                                                \
        LG_LIST_LOOP(r, L) {                                                          \
            const LgListRun run = lg_list_run(L, r);                                  \
            const int k = run.k, cnt = run.cnt, vec = run.vec;                        \
            T *p = run.at<T>(L.p[k]), *m = run.at<T>(L.s[0][k]);                      \
            T *v = run.at<T>(L.s[1][k]), *vm = run.at<T>(L.s[2][k]);                  \
            LgRun<T, LG_RUN> pv, gv, mv, vv, xv;                                      \
            pv.load(p, cnt, vec);                                                     \
            gv.load(run.at<const T>(L.g[k]), cnt, vec);                               \
            mv.load(m, cnt, vec);                                                     \
            vv.load(v, cnt, vec);                                                     \
            if (amsgrad) xv.load(vm, cnt, vec);                                       \
            LG_RUN_EACH(i, cnt) u.apply(pv.v[i], lg_grad_map(gv.v[i], gmode, gp), mv.v[i], \
                                        vv.v[i], xv.v[i]);                            \
            pv.store(p, cnt, vec);                                                    \
            mv.store(m, cnt, vec);                                                    \
            vv.store(v, cnt, vec);                                                    \
            if (amsgrad) xv.store(vm, cnt, vec);                                      \
        }                                                                             \
    }                                                                                 \
    /* clip_grad_value on CUDA: out (contiguous) = g (layout gl) clamped to */       \
    /* [-bound, bound] in T, NaN passing through (Tensor::clamp's rule). */           \
    extern "C" __global__ void clamp_abs_##sfx(long long n, double bound, T* out,     \
                                               const T* g, Strided gl) {              \
        T b = lg_from_f64<T>(bound);                                                  \
        LG_GRID_LOOP(i, n) { out[i] = lg_grad(g, gl, i, 2, b); }                      \
    }                                                                                 \
    /* Sum of squares, lane k of `lanes`: the f64 sum, in increasing i, of */         \
    /* g_i^2 over the i = k (mod lanes), as src/optim/kernels.rs sums them. */         \
    extern "C" __global__ void sumsq_lanes_##sfx(long long n, long long lanes,        \
                                                 const T* g, Strided gl,              \
                                                 double* part) {                      \
        LG_GRID_LOOP(k, lanes) {                                                      \
            double acc = 0.0;                                                         \
            for (long long i = k; i < n; i += lanes) {                                \
                double x = lg_to_f64(g[lg_offset(gl, i)]);                            \
                acc = __dadd_rn(acc, __dmul_rn(x, x));                                \
            }                                                                         \
            part[k] = acc;                                                            \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_OPTIM)

// Compact optimizer state (src/optim/compact.rs): Adam's moments kept in
// bf16 or in block-wise 8-bit, widened to T for the update (LgAdam, the
// same arithmetic as full state) and narrowed back through f32 as the CPU
// narrows them. State buffers come as addresses (a missing one, without
// amsgrad, is the gradient's address and never dereferenced).

// The two 8-bit maps (QuantMaps in src/optim/cuda.rs): signed for first
// moments, unsigned for second moments; each sorted ascending.
struct LgQuantMaps {
    float signed_map[256];
    float unsigned_map[256];
};

// T -> f32 as the CPU's FloatDType::to_f32, f32 -> T as its from_f32.
template <typename T> __device__ __forceinline__ float lg_narrow_f32(T v) {
    return (float)lg_load(v);
}
template <typename T> __device__ __forceinline__ T lg_widen_f32(float v) {
    return lg_store<T>((typename Acc<T>::type)v);
}

// The code nearest to x: a binary search over the midpoints of the sorted
// map, a value on a midpoint taking the lower code (QuantMap::encode).
__device__ __forceinline__ unsigned char lg_q8_encode(const float* map, float x) {
    int lo = 0, hi = 255;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (x > __fmul_rn(__fadd_rn(map[mid], map[mid + 1]), 0.5f)) lo = mid + 1;
        else hi = mid;
    }
    return (unsigned char)lo;
}

// Elements per quantisation block (QUANT_BLOCK) and threads per block of
// the 8-bit kernels (Q8_THREADS): each thread takes LG_Q8_PER elements,
// LG_Q8_THREADS apart.
#define LG_Q8_BLOCK 2048
#define LG_Q8_THREADS 256
#define LG_Q8_PER (LG_Q8_BLOCK / LG_Q8_THREADS)

// The largest of the block's values v (fmaxf: NaN ignored, as the CPU's
// f32::max), every thread getting it.
__device__ __forceinline__ float lg_q8_block_max(float v, float* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int s = LG_Q8_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    float r = red[0];
    __syncthreads();
    return r;
}

// The 8-bit code of x under scale absmax (0 stands for 0 when absmax is 0).
template <typename T>
__device__ __forceinline__ unsigned char lg_q8_code(const float* map, T x, float absmax) {
    return lg_q8_encode(map, absmax > 0.f ? __fdiv_rn(lg_narrow_f32(x), absmax) : 0.f);
}

#define LG_OPTIM_COMPACT(sfx, T)                                                      \
    /* Adam with bf16 moments: one thread per element. */                             \
    extern "C" __global__ void adam_bf16_state_##sfx(                                 \
        long long n, double neg_step, double bc2_sqrt, double eps, double weight,     \
        double beta2, double wd, double shrink, int l2, int decoupled, int maximize,  \
        int amsgrad, int gmode, double gparam, T* p, long long poff, const T* g,      \
        Strided gl, unsigned long long ma, unsigned long long va,                     \
        unsigned long long xa) {                                                      \
        LgAdam<T> u = LgAdam<T>::make(neg_step, bc2_sqrt, eps, weight, beta2, wd, shrink, \
                                      l2, decoupled, maximize, amsgrad);              \
        T gp = lg_from_f64<T>(gparam);                                                \
        __nv_bfloat16 *m = (__nv_bfloat16*)ma, *v = (__nv_bfloat16*)va;               \
        __nv_bfloat16* vmax = (__nv_bfloat16*)xa;                                     \
        LG_GRID_LOOP(i, n) {                                                          \
            T pv = p[poff + i], mx;                                                   \
            T mv = lg_widen_f32<T>(__bfloat162float(m[i]));                           \
            T vv = lg_widen_f32<T>(__bfloat162float(v[i]));                           \
            if (amsgrad) mx = lg_widen_f32<T>(__bfloat162float(vmax[i]));             \
            u.apply(pv, lg_grad(g, gl, i, gmode, gp), mv, vv, mx);                    \
            m[i] = __float2bfloat16_rn(lg_narrow_f32(mv));                            \
            v[i] = __float2bfloat16_rn(lg_narrow_f32(vv));                            \
            if (amsgrad) vmax[i] = __float2bfloat16_rn(lg_narrow_f32(mx));            \
            p[poff + i] = pv;                                                         \
        }                                                                             \
    }                                                                                 \
    /* Adam with 8-bit moments: block b of LG_Q8_THREADS threads updates */           \
    /* quantisation block b (codes mc/vc/xc, scales ma/va/xa), then */                \
    /* quantises the new moments with the block's new absmax. */                      \
    extern "C" __global__ void adam_q8_state_##sfx(                                   \
        long long n, double neg_step, double bc2_sqrt, double eps, double weight,     \
        double beta2, double wd, double shrink, int l2, int decoupled, int maximize,  \
        int amsgrad, int gmode, double gparam, T* p, long long poff, const T* g,      \
        Strided gl, LgQuantMaps maps, unsigned long long mc, unsigned long long ma,   \
        unsigned long long vc, unsigned long long va, unsigned long long xc,          \
        unsigned long long xa) {                                                      \
        __shared__ float smap[256], umap[256], red[LG_Q8_THREADS];                    \
        smap[threadIdx.x] = maps.signed_map[threadIdx.x];                             \
        umap[threadIdx.x] = maps.unsigned_map[threadIdx.x];                           \
        __syncthreads();                                                              \
        LgAdam<T> u = LgAdam<T>::make(neg_step, bc2_sqrt, eps, weight, beta2, wd, shrink, \
                                      l2, decoupled, maximize, amsgrad);              \
        T gp = lg_from_f64<T>(gparam);                                                \
        unsigned char *mq = (unsigned char*)mc, *vq = (unsigned char*)vc;             \
        unsigned char* xq = (unsigned char*)xc;                                       \
        float *mabs = (float*)ma, *vabs = (float*)va, *xabs = (float*)xa;             \
        const long long b = blockIdx.x, base = b * LG_Q8_BLOCK + threadIdx.x;         \
        const float am = mabs[b], av = vabs[b], ax = amsgrad ? xabs[b] : 0.f;         \
        T mv[LG_Q8_PER], vv[LG_Q8_PER], xv[LG_Q8_PER];                                \
        float lm = 0.f, lv = 0.f, lx = 0.f;                                           \
        _Pragma("unroll") for (int k = 0; k < LG_Q8_PER; ++k) {                       \
            long long i = base + (long long)k * LG_Q8_THREADS;                        \
            if (i >= n) continue;                                                     \
            T pv = p[poff + i];                                                       \
            mv[k] = lg_widen_f32<T>(__fmul_rn(smap[mq[i]], am));                      \
            vv[k] = lg_widen_f32<T>(__fmul_rn(umap[vq[i]], av));                      \
            if (amsgrad) xv[k] = lg_widen_f32<T>(__fmul_rn(umap[xq[i]], ax));         \
            u.apply(pv, lg_grad(g, gl, i, gmode, gp), mv[k], vv[k], xv[k]);           \
            p[poff + i] = pv;                                                         \
            lm = fmaxf(lm, fabsf(lg_narrow_f32(mv[k])));                              \
            lv = fmaxf(lv, fabsf(lg_narrow_f32(vv[k])));                              \
            if (amsgrad) lx = fmaxf(lx, fabsf(lg_narrow_f32(xv[k])));                 \
        }                                                                             \
        const float nm = lg_q8_block_max(lm, red), nv = lg_q8_block_max(lv, red);     \
        const float nx = amsgrad ? lg_q8_block_max(lx, red) : 0.f;                    \
        _Pragma("unroll") for (int k = 0; k < LG_Q8_PER; ++k) {                       \
            long long i = base + (long long)k * LG_Q8_THREADS;                        \
            if (i >= n) continue;                                                     \
            mq[i] = lg_q8_code(smap, mv[k], nm);                                      \
            vq[i] = lg_q8_code(umap, vv[k], nv);                                      \
            if (amsgrad) xq[i] = lg_q8_code(umap, xv[k], nx);                         \
        }                                                                             \
        if (threadIdx.x == 0) {                                                       \
            mabs[b] = nm;                                                             \
            vabs[b] = nv;                                                             \
            if (amsgrad) xabs[b] = nx;                                                \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_OPTIM_COMPACT)

// The lanes' partial sums (`pow2` of them, a power of two, zero-padded)
// added as a fixed pairwise tree, the CPU's order: at each level s = pow2/2,
// pow2/4, ..., 1, part[k] += part[k + s] for k < s. One block; every thread
// runs every level (the __syncthreads are outside the divergent inner loop).
// `out[0]` gets the total.
extern "C" __global__ void sumsq_tree(long long pow2, double* part, double* out) {
    if (blockIdx.x != 0) return;
    for (long long s = pow2 / 2; s >= 1; s /= 2) {
        for (long long k = threadIdx.x; k < s; k += blockDim.x) {
            part[k] = __dadd_rn(part[k], part[k + s]);
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = part[0];
}
