// Dropout with the keep rule of src/rng (`lg_keep` in common.cuh): element i
// of the draw (seed, offset) is kept iff the 24-bit uniform of Philox word
// offset + i is >= p. Launched from src/nn/dropout/cuda.rs: the replayed
// apply (forward, and lean backward on the incoming gradient), the byte
// keep mask SaveAll stores and the apply from it, and the packed 1-bit keep
// mask (bit i of word i/32, written by one warp per word with
// __ballot_sync; blocks a multiple of 32 threads) with the apply from such
// a mask, for callers that store the mask instead of replaying it.

// out[i] = keep(i) ? x[i] * scale : 0, the product rounded in T as the CPU.
#define LG_DROPOUT(sfx, T)                                                            \
    extern "C" __global__ void dropout_##sfx(unsigned long long seed,                \
                                             unsigned long long offset, double p,     \
                                             double scale, long long n, T* out,       \
                                             const T* x, Strided lx) {                \
        typedef Acc<T>::type A;                                                       \
        A s = lg_load(lg_from_f64<T>(scale));                                         \
        LG_GRID_LOOP(i, n) {                                                          \
            bool keep = lg_keep(seed, offset, i, p);                                    \
            out[i] = keep ? lg_store<T>(lg_load(x[lg_offset(lx, i)]) * s) : lg_store<T>((A)0); \
        }                                                                             \
    }                                                                                 \
    /* The same written over a contiguous x (buffer reuse: nothing else holds x). */  \
    extern "C" __global__ void dropout_inplace_##sfx(unsigned long long seed,         \
                                                     unsigned long long offset,       \
                                                     double p, double scale,          \
                                                     long long n, T* x) {             \
        typedef Acc<T>::type A;                                                       \
        A s = lg_load(lg_from_f64<T>(scale));                                         \
        LG_GRID_LOOP(i, n) {                                                          \
            bool keep = lg_keep(seed, offset, i, p);                                    \
            x[i] = keep ? lg_store<T>(lg_load(x[i]) * s) : lg_store<T>((A)0);         \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_DROPOUT)

// The keep-mask as bytes (1 = kept): what the save-everything policy stores.
extern "C" __global__ void dropout_mask(unsigned long long seed, unsigned long long offset,
                                        double p, long long n, unsigned char* out) {
    LG_GRID_LOOP(i, n) { out[i] = lg_unit(lg_word(seed, offset + i)) >= p; }
}

extern "C" __global__ void dropout_bits(unsigned long long seed, unsigned long long offset,
                                        double p, long long n, unsigned int* mask) {
    long long words = (n + 31) / 32;
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    long long warps = ((long long)blockDim.x * gridDim.x) >> 5;
    int lane = threadIdx.x & 31;
    for (long long w = warp; w < words; w += warps) {
        long long i = w * 32 + lane;
        bool keep = i < n && lg_keep(seed, offset, (unsigned long long)i, p);
        unsigned int bits = __ballot_sync(0xffffffffu, keep);
        if (lane == 0) mask[w] = bits;
    }
}

// out[i] = bit(i) ? x[i] * scale : 0, the product rounded in T as the CPU.
#define LG_DROPOUT_MASKED(sfx, T)                                                     \
    extern "C" __global__ void dropout_masked_##sfx(double scale, long long n, T* out, \
                                                    const T* x, Strided lx,           \
                                                    const unsigned int* mask) {       \
        typedef Acc<T>::type A;                                                       \
        A s = lg_load(lg_from_f64<T>(scale));                                         \
        LG_GRID_LOOP(i, n) {                                                          \
            bool bit = (mask[i >> 5] >> (i & 31)) & 1u;                               \
            out[i] = bit ? lg_store<T>(lg_load(x[lg_offset(lx, i)]) * s) : lg_store<T>((A)0); \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_DROPOUT_MASKED)

// out[i] = m[i] ? x[i] * scale : 0 from a byte mask m (1 = kept; what the
// save-all policy keeps, as PyTorch), both read through their layouts: one
// kernel, so backward allocates only the gradient, as on the CPU.
#define LG_DROPOUT_BYTE_MASKED(sfx, T)                                                \
    extern "C" __global__ void dropout_byte_masked_##sfx(double scale, long long n,   \
                                                         T* out, const T* x, Strided lx, \
                                                         const unsigned char* m, Strided lm) { \
        typedef Acc<T>::type A;                                                       \
        A s = lg_load(lg_from_f64<T>(scale));                                         \
        LG_GRID_LOOP(i, n) {                                                          \
            bool keep = m[lg_offset(lm, i)] != 0;                                     \
            out[i] = keep ? lg_store<T>(lg_load(x[lg_offset(lx, i)]) * s) : lg_store<T>((A)0); \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_DROPOUT_BYTE_MASKED)
