// Bilinear interpolation (as src/nn/upsample/cpu.rs; launched from
// src/nn/upsample/cuda.rs), forward and backward, bit for bit the CPU's:
// every fused multiply-add the CPU takes (PyTorch's CPU kernels' roundings)
// is an explicit lg_fma here, and the file is compiled with --fmad=false,
// so nothing else is fused.
//
// Forward: one thread per output element. Backward gathers: one thread per
// input element walks the outputs that read it in output order (rows, then
// columns, then the corners 00, 01, 10, 11), the order in which the CPU's
// scatter adds into that element, so no atomics are needed and the sums
// are deterministic.
//
// InterpGeom is `leangrad::nn::InterpGeom` (src/nn/upsample/mod.rs,
// #[repr(C)], the same fields in this order): the two must stay in step.

struct View4 {
    long long offset, batch, head, row, col;
};

struct InterpGeom {
    long long batch, channels, h, w, oh, ow;
    View4 x;
    double scale_h, scale_w;
    long long align_corners, mode, lanes;
};

__device__ __forceinline__ float lg_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double lg_fma(double a, double b, double c) { return __fma_rn(a, b, c); }

// PyTorch's floorf(src) as an integer: an f64 is rounded to f32 first.
__device__ __forceinline__ long long lg_floorf(float v) { return (long long)floorf(v); }
__device__ __forceinline__ long long lg_floorf(double v) {
    return (long long)floorf(__double2float_rn(v));
}

// Output o's tap along an axis of `len` inputs and `out` outputs: cpu.rs's
// `tap` step for step (`fused`: the source index as one fma; `round`: the
// weights rounded to T as PyTorch's generic kernel stores them).
template <typename T>
__device__ __forceinline__ void lg_interp_tap(long long o, long long len, long long out,
                                              typename Acc<T>::type scale, bool align,
                                              bool fused, bool round, long long* i0,
                                              long long* i1, typename Acc<T>::type* l0,
                                              typename Acc<T>::type* l1) {
    typedef typename Acc<T>::type A;
    if (len == out) {
        *i0 = o;
        *i1 = o;
        *l0 = (A)1;
        *l1 = (A)0;
        return;
    }
    A real;
    if (align) {
        real = scale * (A)o;
    } else {
        A h = (A)0.5;
        A d = (A)o + h;
        A s = fused ? lg_fma(scale, d, -h) : scale * d - h;
        real = s < (A)0 ? (A)0 : s;
    }
    long long lo = min(lg_floorf(real), len - 1);
    A d = real - (A)lo;
    d = d < (A)0 ? (A)0 : d;
    A w1 = (A)1 < d ? (A)1 : d;
    if (round) w1 = lg_load(lg_store<T>(w1));
    A w0 = (A)1 - w1;
    if (round) w0 = lg_load(lg_store<T>(w0));
    lo = max(lo, 0LL);
    *i0 = lo;
    *i1 = lo + (lo + 1 < len ? 1 : 0);
    *l0 = w0;
    *l1 = w1;
}

// The four corner products summed in `order` (cpu.rs's `corner_sum`): the
// first a plain product, each next one fused onto it.
template <typename A>
__device__ __forceinline__ A lg_corner_sum(const A* x, const A* w, int o0, int o1, int o2,
                                           int o3) {
    A s = x[o0] * w[o0];
    s = lg_fma(x[o1], w[o1], s);
    s = lg_fma(x[o2], w[o2], s);
    return lg_fma(x[o3], w[o3], s);
}

// Whether T is f16 (whose scalar tail sums in its own order; cpu.rs's
// F16_TAIL).
template <typename T> __device__ __forceinline__ bool lg_is_f16() { return false; }
template <> __device__ __forceinline__ bool lg_is_f16<__half>() { return true; }

template <typename T>
__device__ __forceinline__ void lg_upsample_fwd(InterpGeom g, const T* x, T* y) {
    typedef typename Acc<T>::type A;
    bool corners = g.mode == InterpCode::Corners;
    bool wide = sizeof(A) == 8, narrow = sizeof(T) == 2;
    bool fused = corners || wide;
    bool align = g.align_corners != 0;
    A sh = (A)g.scale_h, sw = (A)g.scale_w;
    long long n = g.batch * g.channels * g.oh * g.ow;
    LG_GRID_LOOP(e, n) {
        long long j = e % g.ow, i = e / g.ow % g.oh, p = e / (g.ow * g.oh);
        long long c = p % g.channels, b = p / g.channels;
        long long r0, r1, c0, c1;
        A lh0, lh1, lw0, lw1;
        lg_interp_tap<T>(i, g.h, g.oh, sh, align, fused, !corners, &r0, &r1, &lh0, &lh1);
        lg_interp_tap<T>(j, g.w, g.ow, sw, align, fused, !corners, &c0, &c1, &lw0, &lw1);
        long long base = g.x.offset + b * g.x.batch + c * g.x.head;
        A v[4] = {lg_load(x[base + r0 * g.x.row + c0 * g.x.col]),
                  lg_load(x[base + r0 * g.x.row + c1 * g.x.col]),
                  lg_load(x[base + r1 * g.x.row + c0 * g.x.col]),
                  lg_load(x[base + r1 * g.x.row + c1 * g.x.col])};
        A out;
        if (corners) {
            A w[4] = {lh0 * lw0, lh0 * lw1, lh1 * lw0, lh1 * lw1};
            bool vec = c < g.lanes;
            // cpu.rs's HALF_VECTOR, WIDE_VECTOR, F16_TAIL, WIDE_TAIL.
            if (vec)
                out = narrow ? lg_corner_sum(v, w, 3, 2, 1, 0) : lg_corner_sum(v, w, 2, 3, 1, 0);
            else
                out = lg_is_f16<T>() ? lg_corner_sum(v, w, 0, 1, 2, 3)
                                     : lg_corner_sum(v, w, 1, 0, 2, 3);
        } else {
            A t0 = lg_fma(v[0], lw0, v[1] * lw1);
            A t1 = lg_fma(v[2], lw0, v[3] * lw1);
            out = lg_fma(t0, lh0, t1 * lh1);
        }
        y[e] = lg_store<T>(out);
    }
}

// The first output position along an axis whose lower source position is
// at least `at` (the source positions never decrease along the axis).
template <typename T>
__device__ __forceinline__ long long lg_interp_first(long long at, long long len,
                                                     long long out, typename Acc<T>::type scale,
                                                     bool align) {
    typedef typename Acc<T>::type A;
    long long lo = 0, hi = out;
    while (lo < hi) {
        long long mid = (lo + hi) / 2, i0, i1;
        A l0, l1;
        lg_interp_tap<T>(mid, len, out, scale, align, true, false, &i0, &i1, &l0, &l1);
        if (i0 < at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

template <typename T>
__device__ __forceinline__ void lg_upsample_bwd(InterpGeom g, const T* dy, T* dx) {
    typedef typename Acc<T>::type A;
    bool align = g.align_corners != 0;
    A sh = (A)g.scale_h, sw = (A)g.scale_w;
    long long n = g.batch * g.channels * g.h * g.w;
    LG_GRID_LOOP(e, n) {
        long long q = e % g.w, r = e / g.w % g.h, p = e / (g.w * g.h);
        long long c = p % g.channels, b = p / g.channels;
        long long base = g.x.offset + b * g.x.batch + c * g.x.head;
        // Outputs read input row r when their lower source row is r or r - 1.
        long long i = lg_interp_first<T>(r - 1, g.h, g.oh, sh, align);
        long long j_first = lg_interp_first<T>(q - 1, g.w, g.ow, sw, align);
        A acc = (A)0;
        for (; i < g.oh; ++i) {
            long long r0, r1;
            A lh0, lh1;
            lg_interp_tap<T>(i, g.h, g.oh, sh, align, true, false, &r0, &r1, &lh0, &lh1);
            if (r0 > r) break;
            bool a0 = r0 == r, a1 = r1 == r;
            if (!a0 && !a1) continue;
            for (long long j = j_first; j < g.ow; ++j) {
                long long c0, c1;
                A lw0, lw1;
                lg_interp_tap<T>(j, g.w, g.ow, sw, align, true, false, &c0, &c1, &lw0, &lw1);
                if (c0 > q) break;
                bool b0 = c0 == q, b1 = c1 == q;
                if (!b0 && !b1) continue;
                A gv = lg_load(dy[base + i * g.x.row + j * g.x.col]);
                if (a0 && b0) acc = lg_fma(lh0 * lw0, gv, acc);
                if (a0 && b1) acc = lg_fma(lh0 * lw1, gv, acc);
                if (a1 && b0) acc = lg_fma(lh1 * lw0, gv, acc);
                if (a1 && b1) acc = lg_fma(lh1 * lw1, gv, acc);
            }
        }
        dx[e] = lg_store<T>(acc);
    }
}

#define LG_UPSAMPLE(sfx, T)                                                                   \
    extern "C" __global__ void upsample_bilinear_fwd_##sfx(InterpGeom g, const T* x, T* y) {  \
        lg_upsample_fwd<T>(g, x, y);                                                          \
    }                                                                                         \
    extern "C" __global__ void upsample_bilinear_bwd_##sfx(InterpGeom g, const T* dy,         \
                                                           T* dx) {                           \
        lg_upsample_bwd<T>(g, dy, dx);                                                        \
    }
LG_FOR_FLOATS(LG_UPSAMPLE)
