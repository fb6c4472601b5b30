// Layout kernels that move bits without looking at them, one per element
// size in bytes: strided copy (make contiguous) and fill.

// out[i] = x[offset of logical element i]: any layout to contiguous.
#define LG_COPY(bytes, T)                                                             \
    extern "C" __global__ void copy_strided_##bytes(long long n, T* out,             \
                                                    const T* x, Strided lx) {         \
        LG_GRID_LOOP(i, n) { out[i] = x[lg_offset(lx, i)]; }                          \
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
