// Shared prelude of every leangrad kernel file. The Rust side prepends this
// text to each kernels/*.cu source before NVRTC compiles it (NVRTC is given
// no virtual headers), so every file sees these helpers.
//
// Conventions
// - Element types: float, double, __half, __nv_bfloat16, unsigned char (u8),
//   unsigned int (u32), long long (i64). Half types compute in float.
// - A `Strided` argument describes how to read a tensor of any layout:
//   logical element `i` (row-major over `shape`) sits at
//   `offset + sum_d coord_d * strides[d]` elements from the buffer start.
//   Broadcasting is a stride of 0. Must match src/cuda/layout.rs.
// - Every kernel uses a grid-stride loop, so any grid size is correct.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define LG_MAX_RANK 8

// +infinity (NVRTC has no <math.h> INFINITY); converts exactly to double.
#define LG_INF (__int_as_float(0x7f800000))

struct Strided {
    long long rank;
    long long offset;
    long long shape[LG_MAX_RANK];
    long long strides[LG_MAX_RANK];
};

// Division by a divisor fixed for a whole launch, as a multiply-high, an
// add and a shift instead of a division (tens of instructions on the GPU):
// the round-up method of Granlund and Montgomery, exact for every
// dividend n < 2^31 and divisor 1 <= d < 2^31 (then umulhi(n, m) + n
// < 2^32). A kernel makes its dividers once (lg_div_make costs a 64-bit
// division: once per block, or once per thread where a thread does much)
// and uses lg_div per element.
struct LgDiv {
    unsigned int m, s;
};

__device__ __forceinline__ LgDiv lg_div_make(unsigned int d) {
    // The smallest s with 2^s >= d.
    unsigned int s = d > 1 ? 32 - __clz(d - 1) : 0;
    unsigned long long m = ((1ull << 32) * ((1ull << s) - d)) / d + 1;
    LgDiv v = {(unsigned int)m, s};
    return v;
}

__device__ __forceinline__ unsigned int lg_div(const LgDiv& v, unsigned int n) {
    return (__umulhi(n, v.m) + n) >> v.s;
}

// Buffer offset (in elements) of logical element `i`.
__device__ __forceinline__ long long lg_offset(const Strided& l, long long i) {
    // Rank 1 (what a contiguous or coalesced layout becomes): no division.
    if (l.rank == 1) return l.offset + i * l.strides[0];
    long long off = l.offset;
    for (long long d = l.rank - 1; d >= 0; --d) {
        long long s = l.shape[d];
        off += (i % s) * l.strides[d];
        i /= s;
    }
    return off;
}

#define LG_GRID_LOOP(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (long long)blockDim.x * gridDim.x)

// Elements one thread of the run kernels handles (the norms' apply, the
// in-place ReLUs, axpy_dense): RUN in src/cuda/check.rs. A run never
// straddles a 32-element mask word.
#define LG_RUN 4

// The runs of LG_RUN elements of [0, n) this thread takes, grid-stride: the
// body sees `e0`, a run's first element; lg_run_count(n, e0) its length
// (LG_RUN, fewer at the end).
#define LG_RUN_LOOP(e0, n)                                                            \
    for (long long e0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * LG_RUN;  \
         e0 < (n); e0 += (long long)blockDim.x * gridDim.x * LG_RUN)
__device__ __forceinline__ int lg_run_count(long long n, long long e0) {
    return n - e0 < LG_RUN ? (int)(n - e0) : LG_RUN;
}

// The elements i < cnt of a run, unrolled with constant indices: a loop to
// a run-time count would index the run's values dynamically and move them
// from registers to local memory.
#define LG_RUN_EACH(i, cnt) \
    _Pragma("unroll") for (int i = 0; i < LG_RUN; ++i) if (i < (cnt))

// N consecutive elements of one thread (a "run"): loaded and stored as
// one vector (16 bytes, or 8 for a run of four 2-byte elements) when `vec`
// says every buffer the kernel moves runs through is aligned to it and the
// run is whole (`cnt == N`), element by element otherwise. N * sizeof(T)
// must be a multiple of 8.
template <typename T, int N> struct LgRun {
    T v[N];
    __device__ __forceinline__ void load(const T* p, int cnt, int vec) {
        if (vec && cnt == N) {
            copy(reinterpret_cast<unsigned int*>(v), reinterpret_cast<const unsigned int*>(p));
        } else {
#pragma unroll
            for (int i = 0; i < N; ++i)
                if (i < cnt) v[i] = p[i];
        }
    }
    __device__ __forceinline__ void store(T* p, int cnt, int vec) const {
        if (vec && cnt == N) {
            copy(reinterpret_cast<unsigned int*>(p), reinterpret_cast<const unsigned int*>(v));
        } else {
#pragma unroll
            for (int i = 0; i < N; ++i)
                if (i < cnt) p[i] = v[i];
        }
    }
    static __device__ __forceinline__ void copy(unsigned int* d, const unsigned int* s) {
        constexpr int words = sizeof(T) * N / 4;
        if (words == 2) {
            *reinterpret_cast<uint2*>(d) = *reinterpret_cast<const uint2*>(s);
        } else {
            for (int i = 0; i < words; i += 4)
                *reinterpret_cast<uint4*>(d + i) = *reinterpret_cast<const uint4*>(s + i);
        }
    }
};

// The packed mask words (bit i of word i/32 for element i) of one warp's
// pass over 32 consecutive runs of LG_RUN elements, lane l holding run l
// and its bits in `nib` (bit i: element i of the run): every lane of the
// warp calls it (LG_RUN ballots); lane k < LG_RUN gets word k of the pass.
__device__ __forceinline__ unsigned int lg_runs_mask_word(unsigned int nib) {
    static_assert(LG_RUN == 4, "a mask word is 8 lanes' runs of 4 elements");
    unsigned int b[LG_RUN];
#pragma unroll
    for (int j = 0; j < LG_RUN; ++j) b[j] = __ballot_sync(0xffffffffu, (nib >> j) & 1u);
    const int k = threadIdx.x & (LG_RUN - 1);
    unsigned int word = 0;
#pragma unroll
    for (int j = 0; j < LG_RUN; ++j) {
        // Bit m of byte k (lane 8k + m's element j) to bit 4m + j.
        unsigned int v = b[j] >> (8 * k) & 0xffu;
        v = (v | v << 12) & 0x000f000fu;
        v = (v | v << 6) & 0x03030303u;
        v = (v | v << 3) & 0x11111111u;
        word |= v << j;
    }
    return word;
}

// Records bad input in the device's check record (src/cuda/checks.rs: four
// i64 words [recorded, index, size, op]) for the host's next read to
// report; the first to record wins, later ones are dropped.
__device__ __forceinline__ void lg_check_fail(long long* record, long long op, long long index,
                                              long long size) {
    if (atomicCAS((unsigned long long*)record, 0ULL, 1ULL) == 0ULL) {
        record[1] = index;
        record[2] = size;
        record[3] = op;
    }
}

// The arithmetic type of an element type: double for double, float otherwise.
template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };

template <typename T> __device__ __forceinline__ typename Acc<T>::type lg_load(T v) {
    return (typename Acc<T>::type)v;
}
template <> __device__ __forceinline__ float lg_load<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float lg_load<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}

template <typename T> __device__ __forceinline__ T lg_store(typename Acc<T>::type v) {
    return (T)v;
}
template <> __device__ __forceinline__ __half lg_store<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 lg_store<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

// Any element to double (exact for every float type; as Rust's `as f64`).
template <typename T> __device__ __forceinline__ double lg_to_f64(T v) { return (double)v; }
template <> __device__ __forceinline__ double lg_to_f64<__half>(__half v) {
    return (double)__half2float(v);
}
template <> __device__ __forceinline__ double lg_to_f64<__nv_bfloat16>(__nv_bfloat16 v) {
    return (double)__bfloat162float(v);
}

// double to any element, with Rust's `as` semantics for integers
// (truncate toward zero, saturate, NaN to 0) and round-to-nearest for floats.
template <typename T> __device__ __forceinline__ T lg_from_f64(double v) { return (T)v; }
// Half types round through f32 (two roundings), exactly as the CPU's
// `WithDType::from_f64` and PyTorch's `c10::Half(float)` do.
template <> __device__ __forceinline__ __half lg_from_f64<__half>(double v) {
    return __float2half_rn(__double2float_rn(v));
}
template <> __device__ __forceinline__ __nv_bfloat16 lg_from_f64<__nv_bfloat16>(double v) {
    return __float2bfloat16_rn(__double2float_rn(v));
}
template <> __device__ __forceinline__ unsigned char lg_from_f64<unsigned char>(double v) {
    if (!(v > 0.0)) return 0;
    return v >= 255.0 ? 255 : (unsigned char)v;
}
template <> __device__ __forceinline__ unsigned int lg_from_f64<unsigned int>(double v) {
    if (!(v > 0.0)) return 0;
    return v >= 4294967295.0 ? 4294967295u : (unsigned int)v;
}
template <> __device__ __forceinline__ long long lg_from_f64<long long>(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return 9223372036854775807LL;
    if (v <= -9223372036854775808.0) return (-9223372036854775807LL - 1);
    return (long long)v;
}

// Offsets in `l` of the logical elements e0 .. e0+cnt-1 of a run (cnt <= N):
// one division chain for e0; the elements in e0's innermost row follow it
// by that dim's stride (a run that crosses rows takes a chain per element
// past the row). `unit`: the whole run lies in one row of stride 1, so it
// is contiguous in memory.
template <int N> struct LgRunOffsets {
    long long off[N];
    bool unit;
    __device__ __forceinline__ LgRunOffsets(const Strided& l, long long e0, int cnt) {
        long long i = e0, o = l.offset, col = 0;
        for (long long d = l.rank - 1; d >= 0; --d) {
            long long s = l.shape[d], c = i % s;
            if (d == l.rank - 1) col = c;
            o += c * l.strides[d];
            i /= s;
        }
        long long row = l.rank > 0 ? l.shape[l.rank - 1] : 1;
        long long step = l.rank > 0 ? l.strides[l.rank - 1] : 0;
        bool in_row = col + cnt <= row;
        unit = in_row && step == 1;
#pragma unroll
        for (int k = 0; k < N; ++k)
            off[k] = k == 0 || in_row ? o + k * step : (k < cnt ? lg_offset(l, e0 + k) : o);
    }
};

// Instantiates `KERNEL(suffix, type)` for the four float types.
#define LG_FOR_FLOATS(KERNEL) \
    KERNEL(f32, float) KERNEL(f64, double) KERNEL(f16, __half) KERNEL(bf16, __nv_bfloat16)

// Philox4x32-10, bit-identical to src/rng/mod.rs (used by random.cu and
// dropout.cu): block `block` of the stream for `seed`, word `w` of it, and
// the 24-bit uniform in [0, 1) of a word.
__device__ __forceinline__ uint4 lg_philox(unsigned long long block, unsigned long long seed) {
    unsigned int c0 = (unsigned int)block, c1 = (unsigned int)(block >> 32), c2 = 0, c3 = 0;
    unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    }
    return make_uint4(c0, c1, c2, c3);
}

__device__ __forceinline__ unsigned int lg_word(unsigned long long seed, unsigned long long w) {
    uint4 r = lg_philox(w / 4, seed);
    switch (w % 4) {
    case 0: return r.x;
    case 1: return r.y;
    case 2: return r.z;
    default: return r.w;
    }
}

__device__ __forceinline__ double lg_unit(unsigned int x) {
    return (double)(x >> 8) * (1.0 / 16777216.0);
}

// Dropout keeps element `i` of the draw at `offset` iff its uniform is >= p
// (`crate::rng::dropout_keep`).
__device__ __forceinline__ bool lg_keep(unsigned long long seed, unsigned long long offset,
                                        unsigned long long i, double p) {
    return lg_unit(lg_word(seed, offset + i)) >= p;
}
