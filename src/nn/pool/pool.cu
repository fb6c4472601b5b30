// 2-d pooling over contiguous [planes, h, w] planes (planes = N*C), as
// src/nn/pool/cpu.rs: max pooling recording the argmax as a u8 position
// ki*kw + kj inside its window (first maximum in window order; a NaN wins;
// an all-padding window gives -inf and position 0), and average / adaptive
// average pooling. Backward kernels gather (one thread per input element,
// visiting the outputs in row-major order) instead of scattering, so no
// atomics are used and the sums are deterministic; each addition is rounded
// in T as the CPU's.
//
// PoolGeom is `leangrad::nn::PoolGeom` (src/nn/pool/mod.rs, #[repr(C)], usize
// fields in this order): the two must stay in step.

struct PoolGeom {
    long long planes, h, w, oh, ow;
    long long k[2], s[2], p[2], d[2];
};

// `mode` is an `AvgPoolCode` (fixed windows with or without the padding
// counted, or adaptive). Writes the clipped window and returns the divisor.
__device__ __forceinline__ double lg_avg_window(const PoolGeom& g, int mode, long long i,
                                                long long j, long long* win) {
    if (mode == AvgPoolCode::Adaptive) {
        win[0] = i * g.h / g.oh;
        win[1] = ((i + 1) * g.h + g.oh - 1) / g.oh;
        win[2] = j * g.w / g.ow;
        win[3] = ((j + 1) * g.w + g.ow - 1) / g.ow;
        return (double)((win[1] - win[0]) * (win[3] - win[2]));
    }
    long long r0 = i * g.s[0] - g.p[0], c0 = j * g.s[1] - g.p[1];
    long long r1 = min(r0 + g.k[0], g.h + g.p[0]), c1 = min(c0 + g.k[1], g.w + g.p[1]);
    double padded = (double)((r1 - r0) * (c1 - c0));
    r0 = max(r0, 0LL);
    c0 = max(c0, 0LL);
    r1 = min(r1, g.h);
    c1 = min(c1, g.w);
    r1 = max(r1, r0);
    c1 = max(c1, c0);
    win[0] = r0; win[1] = r1; win[2] = c0; win[3] = c1;
    return mode == AvgPoolCode::FixedCountPad ? padded : (double)((r1 - r0) * (c1 - c0));
}

// The gradient of input element `e` of max pooling: the sum, in row-major
// output order, of the output gradients whose argmax is `e`, named either
// by the u8 window position `pos` or (when `pos` is null) by the flat
// in-plane index `idx`. Each addition is rounded in T. In-plane
// coordinates are of type I: int where every one fits (see
// lg_pool_narrow), which spares the 64-bit divisions, else long long.
template <typename T, typename I>
__device__ __forceinline__ T lg_max_pool_grad(const PoolGeom& g, long long e, const T* dy,
                                              const unsigned char* pos,
                                              const long long* idx) {
    typedef typename Acc<T>::type A;
    long long hw = g.h * g.w, pl = e / hw;
    I rem = (I)(e - pl * hw), W = (I)g.w, r = rem / W, c = rem - r * W;
    I K1 = (I)g.k[1], S0 = (I)g.s[0], S1 = (I)g.s[1], OH = (I)g.oh, OW = (I)g.ow;
    I P0 = (I)g.p[0], P1 = (I)g.p[1], D0 = (I)g.d[0], D1 = (I)g.d[1];
    long long base = pl * g.oh * g.ow;
    A acc = 0;
    // ki descending = output rows ascending (row-major output order)
    for (I ki = (I)g.k[0] - 1; ki >= 0; --ki) {
        I t = r + P0 - ki * D0;
        if (t < 0) continue;
        I i = t / S0;
        if (i * S0 != t || i >= OH) continue;
        for (I kj = K1 - 1; kj >= 0; --kj) {
            I u = c + P1 - kj * D1;
            if (u < 0) continue;
            I j = u / S1;
            if (j * S1 != u || j >= OW) continue;
            long long o = base + (long long)i * OW + j;
            bool hit = pos ? pos[o] == ki * K1 + kj : idx[o] == (long long)r * W + c;
            if (hit) acc = lg_load(lg_store<T>(acc + lg_load(dy[o])));
        }
    }
    return lg_store<T>(acc);
}

// Whether every in-plane coordinate and offset of `g` that
// lg_max_pool_grad forms fits an int: planes of fewer than 2^30 elements,
// sides, padding and kernel reach below 2^29.
__device__ __forceinline__ bool lg_pool_narrow(const PoolGeom& g) {
    const long long most = 1LL << 29;
    return g.h * g.w < 2 * most && g.oh * g.ow < 2 * most && g.h < most && g.w < most &&
           g.p[0] < most && g.p[1] < most && g.k[0] * g.d[0] < most &&
           g.k[1] * g.d[1] < most && g.s[0] < most && g.s[1] < most;
}

// Whether the 32-bit kernels (lg_max_pool_fwd_narrow, lg_max_pool_grad_d1)
// may run: every index below 2^31 (LgDiv's range) and every window reach
// within lg_pool_narrow.
__device__ __forceinline__ bool lg_pool_int32(const PoolGeom& g) {
    const long long most = 1LL << 31;
    return lg_pool_narrow(g) && g.planes * g.h * g.w < most && g.planes * g.oh * g.ow < most;
}

// Whether lg_max_pool_grad_d1 applies: lg_pool_int32 and dilation 1.
__device__ __forceinline__ bool lg_pool_fast(const PoolGeom& g) {
    return g.d[0] == 1 && g.d[1] == 1 && lg_pool_int32(g);
}

// Whether an input element of `g` lies in at most 2 windows along each
// axis (ceil(k/s) <= 2: kernels no more than twice the stride).
__device__ __forceinline__ bool lg_pool_ranges_2(const PoolGeom& g) {
    return g.k[0] <= 2 * g.s[0] && g.k[1] <= 2 * g.s[1];
}

// Max pooling's input gradient where lg_pool_fast holds: the same sums as
// lg_max_pool_grad over the whole input, in the same order (so the same
// bits), but the outputs whose windows hold (r, c) are found as the ranges
// i in [ceil((r + p0 - k0 + 1) / s0), (r + p0) / s0] and likewise j (no
// per-tap stride test), and every division is a multiply-high by a divider
// made once per block (LgDiv). RI and RJ, where not 0, are bounds known
// at compile time of each range's length (ceil(k/s): 2 for ResNet's 3x3/2
// pool), so that the loops unroll. Writes dx; called by every thread of
// the launch (it synchronises the block once).
template <typename T, int RI, int RJ>
__device__ __forceinline__ void lg_max_pool_grad_d1(const PoolGeom& g, T* dx, const T* dy,
                                                    const unsigned char* pos,
                                                    const long long* idx) {
    typedef typename Acc<T>::type A;
    __shared__ LgDiv divs[4];  // by w, h, s0, s1
    if (threadIdx.x == 0) {
        divs[0] = lg_div_make((unsigned int)g.w);
        divs[1] = lg_div_make((unsigned int)g.h);
        divs[2] = lg_div_make((unsigned int)g.s[0]);
        divs[3] = lg_div_make((unsigned int)g.s[1]);
    }
    __syncthreads();
    const LgDiv by_w = divs[0], by_h = divs[1], by_s0 = divs[2], by_s1 = divs[3];
    const int W = (int)g.w, H = (int)g.h, OH = (int)g.oh, OW = (int)g.ow;
    const int K0 = (int)g.k[0], K1 = (int)g.k[1], S0 = (int)g.s[0], S1 = (int)g.s[1];
    const int P0 = (int)g.p[0], P1 = (int)g.p[1];
    const unsigned int n = (unsigned int)(g.planes * g.h * g.w), plane_out = OH * OW;
    for (unsigned int e = blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += blockDim.x * gridDim.x) {
        unsigned int t = lg_div(by_w, e), pl = lg_div(by_h, t);
        int c = (int)(e - t * W), r = (int)(t - pl * H);
        int a = r + P0 - K0 + 1, b = c + P1 - K1 + 1;
        int i0 = a > 0 ? (int)lg_div(by_s0, a + S0 - 1) : 0;
        int j0 = b > 0 ? (int)lg_div(by_s1, b + S1 - 1) : 0;
        int i1 = min(OH - 1, (int)lg_div(by_s0, r + P0));
        int j1 = min(OW - 1, (int)lg_div(by_s1, c + P1));
        unsigned int base = pl * plane_out;
        A acc = 0;
        const int ni = RI > 0 ? RI : i1 - i0 + 1, nj = RJ > 0 ? RJ : j1 - j0 + 1;
#pragma unroll
        for (int di = 0; di < ni; ++di) {
            const int i = i0 + di;
            if (i > i1) break;
            int ki = r + P0 - i * S0;
            unsigned int row = base + (unsigned int)(i * OW);
#pragma unroll
            for (int dj = 0; dj < nj; ++dj) {
                const int j = j0 + dj;
                if (j > j1) break;
                unsigned int o = row + j;
                bool hit = pos ? pos[o] == ki * K1 + (c + P1 - j * S1)
                               : idx[o] == (long long)(r * W + c);
                if (hit) acc = lg_load(lg_store<T>(acc + lg_load(dy[o])));
            }
        }
        dx[e] = lg_store<T>(acc);
    }
}

// Max pooling's input gradient (every element of dx), by the fastest of
// the loops above that applies to `g`; the argmax named by `pos` or `idx`
// as lg_max_pool_grad's. Called by every thread of the launch.
template <typename T>
__device__ __forceinline__ void lg_max_pool_bwd(const PoolGeom& g, T* dx, const T* dy,
                                                const unsigned char* pos, const long long* idx) {
    const long long n = g.planes * g.h * g.w;
    if (lg_pool_fast(g) && lg_pool_ranges_2(g)) {
        lg_max_pool_grad_d1<T, 2, 2>(g, dx, dy, pos, idx);
    } else if (lg_pool_fast(g)) {
        lg_max_pool_grad_d1<T, 0, 0>(g, dx, dy, pos, idx);
    } else if (lg_pool_narrow(g)) {
        LG_GRID_LOOP(e, n) { dx[e] = lg_max_pool_grad<T, int>(g, e, dy, pos, idx); }
    } else {
        LG_GRID_LOOP(e, n) { dx[e] = lg_max_pool_grad<T, long long>(g, e, dy, pos, idx); }
    }
}

// Max pooling forward where lg_pool_int32 holds (any dilation): the
// maximum and its window position of every output, as the general loop
// below, with 32-bit indices and the output's coordinates found by
// multiply-highs (LgDiv, made once per block); the window K0 x K1 known at
// compile time where not 0 (3x3, ResNet's), so that its loops unroll.
// Called by every thread of the launch (it synchronises the block once).
template <typename T, int K0, int K1>
__device__ __forceinline__ void lg_max_pool_fwd_narrow(const PoolGeom& g, T* y,
                                                       unsigned char* pos, const T* x) {
    typedef typename Acc<T>::type A;
    __shared__ LgDiv divs[2];  // by ow, oh
    if (threadIdx.x == 0) {
        divs[0] = lg_div_make((unsigned int)g.ow);
        divs[1] = lg_div_make((unsigned int)g.oh);
    }
    __syncthreads();
    const LgDiv by_ow = divs[0], by_oh = divs[1];
    const int W = (int)g.w, H = (int)g.h, OH = (int)g.oh, OW = (int)g.ow;
    const int k0 = K0 > 0 ? K0 : (int)g.k[0], k1 = K1 > 0 ? K1 : (int)g.k[1];
    const int S0 = (int)g.s[0], S1 = (int)g.s[1];
    const int P0 = (int)g.p[0], P1 = (int)g.p[1], D0 = (int)g.d[0], D1 = (int)g.d[1];
    const unsigned int n = (unsigned int)(g.planes * g.oh * g.ow), plane_in = H * W;
    for (unsigned int e = blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += blockDim.x * gridDim.x) {
        unsigned int t = lg_div(by_ow, e), pl = lg_div(by_oh, t);
        int j = (int)(e - t * OW), i = (int)(t - pl * OH);
        const T* plane = x + pl * plane_in;
        A best = -LG_INF;
        int at = -1;  // none yet: the first tap inside is taken whatever it holds
#pragma unroll
        for (int ki = 0; ki < k0; ++ki) {
            int r = i * S0 + ki * D0 - P0;
            if (r < 0 || r >= H) continue;
#pragma unroll
            for (int kj = 0; kj < k1; ++kj) {
                int c = j * S1 + kj * D1 - P1;
                if (c < 0 || c >= W) continue;
                A v = lg_load(plane[r * W + c]);
                if (at < 0 || v > best || (v != v && best == best)) {
                    best = v;
                    at = ki * k1 + kj;
                }
            }
        }
        y[e] = lg_store<T>(best);
        pos[e] = (unsigned char)(at < 0 ? 0 : at);
    }
}

#define LG_POOL(sfx, T)                                                               \
    extern "C" __global__ void max_pool2d_fwd_##sfx(PoolGeom g, T* y, unsigned char* pos, \
                                                    const T* x) {                     \
        typedef Acc<T>::type A;                                                       \
        if (lg_pool_int32(g)) {                                                       \
            if (g.k[0] == 3 && g.k[1] == 3) {                                         \
                lg_max_pool_fwd_narrow<T, 3, 3>(g, y, pos, x);                        \
            } else {                                                                  \
                lg_max_pool_fwd_narrow<T, 0, 0>(g, y, pos, x);                        \
            }                                                                         \
            return;                                                                   \
        }                                                                             \
        long long n = g.planes * g.oh * g.ow;                                         \
        LG_GRID_LOOP(e, n) {                                                          \
            long long pl = e / (g.oh * g.ow), i = e / g.ow % g.oh, j = e % g.ow;      \
            const T* plane = x + pl * g.h * g.w;                                      \
            A best = -LG_INF;                                                         \
            int at = 0;                                                               \
            bool found = false;                                                       \
            for (long long ki = 0; ki < g.k[0]; ++ki) {                               \
                long long r = i * g.s[0] + ki * g.d[0] - g.p[0];                      \
                if (r < 0 || r >= g.h) continue;                                      \
                for (long long kj = 0; kj < g.k[1]; ++kj) {                           \
                    long long c = j * g.s[1] + kj * g.d[1] - g.p[1];                  \
                    if (c < 0 || c >= g.w) continue;                                  \
                    A v = lg_load(plane[r * g.w + c]);                                \
                    if (!found || v > best || (v != v && best == best)) {             \
                        best = v;                                                     \
                        at = (int)(ki * g.k[1] + kj);                                 \
                        found = true;                                                 \
                    }                                                                 \
                }                                                                     \
            }                                                                         \
            y[e] = lg_store<T>(best);                                                 \
            pos[e] = (unsigned char)at;                                               \
        }                                                                             \
    }                                                                                 \
    extern "C" __global__ void max_pool2d_bwd_##sfx(PoolGeom g, T* dx, const T* dy,   \
                                                    const unsigned char* pos) {       \
        lg_max_pool_bwd<T>(g, dx, dy, pos, 0);                                        \
    }                                                                                 \
    /* The same from flat in-plane input indices (SaveAll's i64 indices). */          \
    extern "C" __global__ void max_pool2d_bwd_flat_##sfx(PoolGeom g, T* dx, const T* dy, \
                                                         const long long* idx) {      \
        lg_max_pool_bwd<T>(g, dx, dy, 0, idx);                                        \
    }                                                                                 \
    extern "C" __global__ void avg_pool2d_fwd_##sfx(PoolGeom g, int mode, T* y,       \
                                                    const T* x) {                     \
        long long n = g.planes * g.oh * g.ow;                                         \
        LG_GRID_LOOP(e, n) {                                                          \
            long long pl = e / (g.oh * g.ow), i = e / g.ow % g.oh, j = e % g.ow;      \
            const T* plane = x + pl * g.h * g.w;                                      \
            long long win[4];                                                         \
            double div = lg_avg_window(g, mode, i, j, win);                           \
            double s = 0;                                                             \
            for (long long r = win[0]; r < win[1]; ++r)                               \
                for (long long c = win[2]; c < win[3]; ++c) s += lg_to_f64(plane[r * g.w + c]); \
            y[e] = lg_from_f64<T>(s / div);                                           \
        }                                                                             \
    }                                                                                 \
    extern "C" __global__ void avg_pool2d_bwd_##sfx(PoolGeom g, int mode, T* dx,      \
                                                    const T* dy) {                    \
        typedef Acc<T>::type A;                                                       \
        long long n = g.planes * g.h * g.w;                                           \
        LG_GRID_LOOP(e, n) {                                                          \
            long long pl = e / (g.h * g.w), r = e / g.w % g.h, c = e % g.w;           \
            long long base = pl * g.oh * g.ow;                                        \
            /* output rows/cols whose windows may hold (r, c) */                      \
            /* adaptive: a superset of the rows (cols) whose windows hold r (c) */    \
            long long i0 = max(0LL, r * g.oh / g.h - 1);                              \
            long long i1 = min(g.oh, ((r + 1) * g.oh + g.h - 1) / g.h + 1);           \
            long long j0 = max(0LL, c * g.ow / g.w - 1);                              \
            long long j1 = min(g.ow, ((c + 1) * g.ow + g.w - 1) / g.w + 1);           \
            if (mode != AvgPoolCode::Adaptive) {                                                          \
                long long a = r + g.p[0] - g.k[0] + 1, b = c + g.p[1] - g.k[1] + 1;   \
                i0 = a <= 0 ? 0 : (a + g.s[0] - 1) / g.s[0];                          \
                j0 = b <= 0 ? 0 : (b + g.s[1] - 1) / g.s[1];                          \
                i1 = min(g.oh, (r + g.p[0]) / g.s[0] + 1);                            \
                j1 = min(g.ow, (c + g.p[1]) / g.s[1] + 1);                            \
            }                                                                         \
            A acc = 0;                                                                \
            for (long long i = i0; i < i1; ++i)                                       \
                for (long long j = j0; j < j1; ++j) {                                 \
                    long long win[4];                                                 \
                    double div = lg_avg_window(g, mode, i, j, win);                   \
                    if (r < win[0] || r >= win[1] || c < win[2] || c >= win[3]) continue; \
                    T share = lg_from_f64<T>(lg_to_f64(dy[base + i * g.ow + j]) / div); \
                    acc = lg_load(lg_store<T>(acc + lg_load(share)));                 \
                }                                                                     \
            dx[e] = lg_store<T>(acc);                                                 \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_POOL)
