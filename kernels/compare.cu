// Comparisons (u8 results, 1 = true) for every dtype, and `where`.
// The op is a `CompareOp` (declared from src/op_code.rs).

template <typename C> __device__ __forceinline__ unsigned char lg_cmp(int op, C a, C b) {
    switch (op) {
    case CompareOp::Eq: return a == b;
    case CompareOp::Ne: return a != b;
    case CompareOp::Lt: return a < b;
    case CompareOp::Le: return a <= b;
    case CompareOp::Gt: return a > b;
    case CompareOp::Ge: return a >= b;
    default: return 0;
    }
}

// Values are compared as double, except i64 which compares exactly.
template <typename T> struct CmpType { typedef double type; };
template <> struct CmpType<long long> { typedef long long type; };
template <typename T> __device__ __forceinline__ typename CmpType<T>::type lg_cmp_value(T v) {
    return lg_to_f64(v);
}
template <> __device__ __forceinline__ long long lg_cmp_value<long long>(long long v) { return v; }

#define LG_COMPARE(sfx, T)                                                            \
    extern "C" __global__ void compare_##sfx(int op, long long n, unsigned char* out,\
                                             const T* a, Strided la,                  \
                                             const T* b, Strided lb) {                \
        LG_GRID_LOOP(i, n) {                                                          \
            out[i] = lg_cmp(op, lg_cmp_value(a[lg_offset(la, i)]),                    \
                            lg_cmp_value(b[lg_offset(lb, i)]));                       \
        }                                                                             \
    }                                                                                 \
    extern "C" __global__ void compare_scalar_##sfx(int op, double s, long long n,   \
                                                    unsigned char* out,               \
                                                    const T* a, Strided la) {         \
        LG_GRID_LOOP(i, n) { out[i] = lg_cmp(op, lg_to_f64(a[lg_offset(la, i)]), s); } \
    }
LG_FOR_FLOATS(LG_COMPARE)
LG_COMPARE(u8, unsigned char)
LG_COMPARE(u32, unsigned int)
LG_COMPARE(i64, long long)

// out[i] = cond[i] != 0 ? a[i] : b[i], by element size in bytes (the bits
// are copied, so one kernel per size serves every dtype).
#define LG_WHERE(bytes, T)                                                            \
    extern "C" __global__ void where_##bytes(long long n, T* out,                    \
                                             const unsigned char* cond, Strided lc,   \
                                             const T* a, Strided la,                  \
                                             const T* b, Strided lb) {                \
        LG_GRID_LOOP(i, n) {                                                          \
            out[i] = cond[lg_offset(lc, i)] ? a[lg_offset(la, i)] : b[lg_offset(lb, i)]; \
        }                                                                             \
    }
LG_WHERE(1, unsigned char)
LG_WHERE(2, unsigned short)
LG_WHERE(4, unsigned int)
LG_WHERE(8, unsigned long long)
