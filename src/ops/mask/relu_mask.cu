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

#define LG_RELU_MASK(sfx, T)                                                          \
    extern "C" __global__ void relu_mask_fwd_##sfx(double slope, long long n, T* y,  \
                                                   unsigned int* mask, const T* x,    \
                                                   Strided lx) {                      \
        lg_relu_mask_fwd<T>(slope, n, y, mask, x, &lx);                               \
    }                                                                                 \
    /* The same written over a contiguous x (buffer reuse: nothing else holds */    \
    /* x). */                                                                         \
    extern "C" __global__ void relu_mask_fwd_inplace_##sfx(double slope, long long n, \
                                                           T* x, unsigned int* mask) { \
        lg_relu_mask_fwd<T>(slope, n, x, mask, x, (const Strided*)0);                 \
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
    /* The same written over a contiguous g (buffer reuse: nothing else holds g). */  \
    extern "C" __global__ void relu_mask_bwd_inplace_##sfx(double slope, long long n, \
                                                           T* g,                      \
                                                           const unsigned int* mask) { \
        typedef Acc<T>::type A;                                                       \
        A s = lg_load(lg_from_f64<T>(slope));                                         \
        LG_GRID_LOOP(i, n) {                                                          \
            T gv = g[i];                                                              \
            bool bit = (mask[i >> 5] >> (i & 31)) & 1u;                               \
            g[i] = bit ? gv : lg_store<T>(slope == 0.0 ? (A)0 : lg_load(gv) * s);     \
        }                                                                             \
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
