// Philox4x32-10 streams, bit-identical to src/rng/mod.rs: word w of the
// stream for `seed` is word w%4 of philox(counter = [b, b>>32, 0, 0] with
// b = w/4, key = [seed, seed>>32]). Uniforms use the top 24 bits of a word;
// normals use words 2k, 2k+1 of block j/2 (Box-Muller, in double). Dropout
// (keep element i iff the uniform of word offset+i is >= p) is in
// src/nn/dropout/dropout.cu.

// lg_philox, lg_word and lg_unit live in common.cuh (shared with dropout.cu).

// The raw words offset .. offset+n (for bit-exact tests).
extern "C" __global__ void philox_words(unsigned long long seed, unsigned long long offset,
                                        long long n, unsigned int* out) {
    LG_GRID_LOOP(i, n) { out[i] = lg_word(seed, offset + i); }
}

#define LG_RANDOM(sfx, T)                                                             \
    extern "C" __global__ void uniform_##sfx(unsigned long long seed,                \
                                             unsigned long long offset, long long n,  \
                                             T* out) {                                \
        LG_GRID_LOOP(i, n) { out[i] = lg_from_f64<T>(lg_unit(lg_word(seed, offset + i))); } \
    }                                                                                 \
    extern "C" __global__ void normal_##sfx(unsigned long long seed,                 \
                                            unsigned long long offset, long long n,   \
                                            T* out) {                                 \
        LG_GRID_LOOP(i, n) {                                                          \
            unsigned long long j = offset + i;                                        \
            uint4 w = lg_philox(j / 2, seed);                                         \
            unsigned int a = j % 2 == 0 ? w.x : w.z, b = j % 2 == 0 ? w.y : w.w;      \
            double u1 = ((double)(a >> 8) + 1.0) / 16777216.0;                        \
            double u2 = (double)(b >> 8) / 16777216.0;                                \
            double r = sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);      \
            out[i] = lg_from_f64<T>(r);                                               \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_RANDOM)
