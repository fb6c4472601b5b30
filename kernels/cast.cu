// Casts between every pair of dtypes, through double with Rust's `as`
// semantics (as the CPU backend's `T::from_f64(x.to_f64())`). The input may
// have any layout; the output is contiguous. Named cast_<from>_<to>.

#define LG_CAST(fs, FT, ts, TT)                                                       \
    extern "C" __global__ void cast_##fs##_##ts(long long n, TT* out,                \
                                                const FT* x, Strided lx) {            \
        LG_GRID_LOOP(i, n) { out[i] = lg_from_f64<TT>(lg_to_f64(x[lg_offset(lx, i)])); } \
    }

#define LG_CAST_FROM(fs, FT)                                                          \
    LG_CAST(fs, FT, f32, float) LG_CAST(fs, FT, f64, double)                          \
    LG_CAST(fs, FT, f16, __half) LG_CAST(fs, FT, bf16, __nv_bfloat16)                 \
    LG_CAST(fs, FT, u8, unsigned char) LG_CAST(fs, FT, u32, unsigned int)             \
    LG_CAST(fs, FT, i64, long long)

LG_CAST_FROM(f32, float)
LG_CAST_FROM(f64, double)
LG_CAST_FROM(f16, __half)
LG_CAST_FROM(bf16, __nv_bfloat16)
LG_CAST_FROM(u8, unsigned char)
LG_CAST_FROM(u32, unsigned int)
LG_CAST_FROM(i64, long long)

// In-place casts between dtypes of one element size, over a whole buffer:
// each thread reads its element and writes the converted one over it (the
// same conversion as above). Named cast_inplace_<from>_<to>.
#define LG_CAST_INPLACE(fs, FT, ts, TT)                                               \
    extern "C" __global__ void cast_inplace_##fs##_##ts(long long n, FT* x) {          \
        static_assert(sizeof(FT) == sizeof(TT), "an in-place cast keeps the size");    \
        LG_GRID_LOOP(i, n) {                                                          \
            const TT y = lg_from_f64<TT>(lg_to_f64(x[i]));                            \
            reinterpret_cast<TT*>(x)[i] = y;                                          \
        }                                                                             \
    }

LG_CAST_INPLACE(f16, __half, bf16, __nv_bfloat16)
LG_CAST_INPLACE(bf16, __nv_bfloat16, f16, __half)
LG_CAST_INPLACE(f32, float, u32, unsigned int)
LG_CAST_INPLACE(u32, unsigned int, f32, float)
LG_CAST_INPLACE(f64, double, i64, long long)
LG_CAST_INPLACE(i64, long long, f64, double)
