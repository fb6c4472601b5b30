// ReLU / LeakyReLU saving a 1-bit packed mask (src/ops/mask/): bit i
// of word i/32 is set iff x[i] > 0. One warp writes one word with
// __ballot_sync, so blocks must be a multiple of 32 threads (256 is used).
// Backward reads only the mask: dx = bit ? g : g * slope (exactly 0 when
// slope is 0), the product rounded in T as the CPU.

// Forward: y = x > 0 ? x : (slope == 0 ? 0 : x * slope), NaN kept; mask bits
// as above. x is read through lx, or contiguously when lx is null; y may be
// x itself (contiguous): each element is read, then written, by one thread.
template <typename T>
static __device__ void lg_relu_mask_fwd(double slope, long long n, T* y, unsigned int* mask,
                                        const T* x, const Strided* lx) {
    typedef typename Acc<T>::type A;
    A s = lg_load(lg_from_f64<T>(slope));
    long long words = (n + 31) / 32;
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    long long warps = ((long long)blockDim.x * gridDim.x) >> 5;
    int lane = threadIdx.x & 31;
    for (long long w = warp; w < words; w += warps) {
        long long i = w * 32 + lane;
        bool pos = false;
        if (i < n) {
            T xv = x[lx ? lg_offset(*lx, i) : i];
            A v = lg_load(xv);
            pos = v > (A)0;
            /* NaN is not positive (bit 0) but stays NaN, as on the CPU */
            y[i] = pos ? xv : lg_store<T>((slope == 0.0 && v == v) ? (A)0 : v * s);
        }
        unsigned int bits = __ballot_sync(0xffffffffu, pos);
        if (lane == 0) mask[w] = bits;
    }
}

// lg_relu_mask_fwd over a contiguous x written in place, in runs of
// LG_RUN elements per lane (one vector where x is aligned: `vec`): a
// warp covers 4 mask words per pass, lane 8w + k holding bits 4k..4k+3 of
// word w, gathered from four ballots (one per run element) by lanes 0-3.
// With an `addend` (contiguous, aligned as x), of x + addend rounded to T
// (an in-place add's result, then its ReLU).
template <typename T>
static __device__ void lg_relu_mask_fwd_runs(double slope, long long n, T* x,
                                             unsigned int* mask, int vec,
                                             const T* addend = nullptr) {
    typedef typename Acc<T>::type A;
    A s = lg_load(lg_from_f64<T>(slope));
    const long long words = (n + 31) / 32, per_pass = 32 * LG_RUN;
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    long long warps = ((long long)blockDim.x * gridDim.x) >> 5;
    int lane = threadIdx.x & 31;
    for (long long c = warp; c * per_pass < n; c += warps) {
        long long e0 = c * per_pass + lane * LG_RUN;
        long long left = n - e0;
        int cnt = left <= 0 ? 0 : left < LG_RUN ? (int)left : LG_RUN;
        LgRun<T, LG_RUN> run;
        unsigned int nib = 0;
        if (cnt > 0) {
            run.load(x + e0, cnt, vec);
            if (addend) {
                LgRun<T, LG_RUN> add;
                add.load(addend + e0, cnt, vec);
                LG_RUN_EACH(i, cnt) run.v[i] = lg_store<T>(lg_load(run.v[i]) + lg_load(add.v[i]));
            }
            LG_RUN_EACH(i, cnt) {
                A v = lg_load(run.v[i]);
                bool pos = v > (A)0;
                nib |= (unsigned int)pos << i;
                /* NaN is not positive (bit 0) but stays NaN, as on the CPU */
                if (!pos) run.v[i] = lg_store<T>((slope == 0.0 && v == v) ? (A)0 : v * s);
            }
            run.store(x + e0, cnt, vec);
        }
        unsigned int word = lg_runs_mask_word(nib);
        long long w = c * LG_RUN + lane;
        if (lane < LG_RUN && w < words) mask[w] = word;
    }
}

// The backward over a contiguous g written in place, in runs of
// LG_RUN elements per thread: one mask nibble per run, one vector
// where g is aligned (`vec`).
template <typename T>
static __device__ void lg_relu_mask_bwd_runs(double slope, long long n, T* g,
                                             const unsigned int* mask, int vec) {
    typedef typename Acc<T>::type A;
    A s = lg_load(lg_from_f64<T>(slope));
    LG_RUN_LOOP(e0, n) {
        int cnt = lg_run_count(n, e0);
        unsigned int bits = mask[e0 >> 5] >> (e0 & 31);
        LgRun<T, LG_RUN> run;
        run.load(g + e0, cnt, vec);
        LG_RUN_EACH(i, cnt) {
            if (!(bits >> i & 1u))
                run.v[i] = lg_store<T>(slope == 0.0 ? (A)0 : lg_load(run.v[i]) * s);
        }
        run.store(g + e0, cnt, vec);
    }
}

#define LG_RELU_MASK(sfx, T)                                                          \
    extern "C" __global__ void relu_mask_fwd_##sfx(double slope, long long n, T* y,  \
                                                   unsigned int* mask, const T* x,    \
                                                   Strided lx) {                      \
        lg_relu_mask_fwd<T>(slope, n, y, mask, x, &lx);                               \
    }                                                                                 \
    /* The same written over a contiguous x (buffer reuse: nothing else holds */    \
    /* x), in runs. */                                                                \
    extern "C" __global__ void relu_mask_fwd_inplace_##sfx(double slope, long long n, \
                                                           T* x, unsigned int* mask,  \
                                                           int vec) {                 \
        lg_relu_mask_fwd_runs<T>(slope, n, x, mask, vec);                             \
    }                                                                                 \
    /* The same of x + b (both contiguous): an in-place add, then the above. */     \
    extern "C" __global__ void add_relu_mask_fwd_inplace_##sfx(                      \
        double slope, long long n, T* x, unsigned int* mask, int vec, const T* b) {   \
        lg_relu_mask_fwd_runs<T>(slope, n, x, mask, vec, b);                          \
    }                                                                                 \
    extern "C" __global__ void relu_mask_bwd_##sfx(double slope, long long n, T* dx, \
                                                   const T* g, Strided lg,            \
                                                   const unsigned int* mask) {        \
        typedef Acc<T>::type A;                                                       \
        A s = lg_load(lg_from_f64<T>(slope));                                         \
        LG_GRID_LOOP(i, n) {                                                          \
            T gv = g[lg_offset(lg, i)];                                               \
            bool bit = (mask[i >> 5] >> (i & 31)) & 1u;                               \
            dx[i] = bit ? gv : lg_store<T>(slope == 0.0 ? (A)0 : lg_load(gv) * s);    \
        }                                                                             \
    }                                                                                 \
    /* The same written over a contiguous g (buffer reuse: nothing else holds g), */ \
    /* in runs. */                                                                    \
    extern "C" __global__ void relu_mask_bwd_inplace_##sfx(double slope, long long n, \
                                                           T* g,                      \
                                                           const unsigned int* mask,  \
                                                           int vec) {                 \
        lg_relu_mask_bwd_runs<T>(slope, n, g, mask, vec);                             \
    }
LG_FOR_FLOATS(LG_RELU_MASK)

// The mask alone, for any test `x > 0` (positive_mask of src/ops/mask/).
#define LG_POSITIVE_MASK(sfx, T)                                                      \
    extern "C" __global__ void positive_mask_##sfx(long long n, unsigned int* mask,  \
                                                   const T* x, Strided lx) {          \
        long long words = (n + 31) / 32;                                              \
        long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;     \
        long long warps = ((long long)blockDim.x * gridDim.x) >> 5;                   \
        int lane = threadIdx.x & 31;                                                  \
        for (long long w = warp; w < words; w += warps) {                             \
            long long i = w * 32 + lane;                                              \
            bool pos = i < n && lg_load(x[lg_offset(lx, i)]) > 0;                     \
            unsigned int bits = __ballot_sync(0xffffffffu, pos);                      \
            if (lane == 0) mask[w] = bits;                                            \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_POSITIVE_MASK)

// The mask of `lo <= x <= hi` (clamp's pass-through rule; NaN fails both
// tests), compared in double as the CPU's `mask_where` (every float type
// converts to double exactly). The word loop is warp-uniform, so every lane
// reaches __ballot_sync.
#define LG_WITHIN_MASK(sfx, T)                                                        \
    extern "C" __global__ void within_mask_##sfx(double lo, double hi, long long n,  \
                                                 unsigned int* mask, const T* x,      \
                                                 Strided lx) {                        \
        long long words = (n + 31) / 32;                                              \
        long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;     \
        long long warps = ((long long)blockDim.x * gridDim.x) >> 5;                   \
        int lane = threadIdx.x & 31;                                                  \
        for (long long w = warp; w < words; w += warps) {                             \
            long long i = w * 32 + lane;                                              \
            bool in = false;                                                          \
            if (i < n) {                                                              \
                double v = lg_to_f64(x[lg_offset(lx, i)]);                            \
                in = v >= lo && v <= hi;                                              \
            }                                                                         \
            unsigned int bits = __ballot_sync(0xffffffffu, in);                       \
            if (lane == 0) mask[w] = bits;                                            \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_WITHIN_MASK)
