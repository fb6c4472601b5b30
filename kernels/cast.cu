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
