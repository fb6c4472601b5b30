// Layout kernels that move bits without looking at them, one per element
// size in bytes: strided copy (make contiguous) and fill.

// out[i] = x[offset of logical element i]: any layout to contiguous, in
// runs of LG_RUN elements per thread (LgRunOffsets: one index chain per
// run). A run that is contiguous in x too moves as one vector where both
// ends are aligned (`vec`: out is 16-byte aligned; x's run is tested),
// for element sizes whose runs fill whole 8-byte words.
#define LG_COPY(bytes, T)                                                             \
    extern "C" __global__ void copy_strided_##bytes(long long n, int vec, T* out,    \
                                                    const T* x, Strided lx) {         \
        constexpr bool words = sizeof(T) * LG_RUN % 8 == 0;                           \
        constexpr unsigned long long align = sizeof(T) * LG_RUN < 16 ? sizeof(T) * LG_RUN : 16; \
        LG_RUN_LOOP(e0, n) {                                                          \
            int cnt = lg_run_count(n, e0);                                            \
            LgRunOffsets<LG_RUN> at(lx, e0, cnt);                                     \
            LgRun<T, LG_RUN> v;                                                       \
            const T* src = x + at.off[0];                                             \
            bool whole = words && at.unit && (unsigned long long)src % align == 0;   \
            if (whole) {                                                              \
                v.load(src, cnt, 1);                                                  \
            } else {                                                                  \
                LG_RUN_EACH(k, cnt) v.v[k] = x[at.off[k]];                            \
            }                                                                         \
            v.store(out + e0, cnt, words && vec);                                     \
        }                                                                             \
    }                                                                                 \
    extern "C" __global__ void fill_##bytes(long long n, T* out,                     \
                                            unsigned long long bits) {                \
        T v = (T)bits;                                                                \
        LG_GRID_LOOP(i, n) { out[i] = v; }                                            \
    }
LG_COPY(1, unsigned char)
LG_COPY(2, unsigned short)
LG_COPY(4, unsigned int)
LG_COPY(8, unsigned long long)
