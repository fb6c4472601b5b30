// The convolutions' kernels, launched from cuda.rs beside this file: forward,
// input gradient and weight gradient as implicit GEMMs (the im2col columns
// are never written: each tile of them is gathered from the input straight
// into shared memory), the split weight gradient's ordered sum, and the
// per-channel sum for bias gradients. 2-d throughout (1-d is h = kh = 1),
// with stride, padding, dilation and groups.
//
// The three products, per group (cg = cout/groups, cig = cin/groups,
// kk = kh*kw, L = oh*ow, HW = h*w; column row r = c*kk + ki*kw + kj):
// - forward      y[i, co, l]  = sum_r  W[co, r] * cols_i[r, l]        (M = cg,  N = n*L,  K = cig*kk)
// - input grad  gx[i, c, pix] = sum_{co, ki, kj} W[co, c, ki, kj] * gy[i, co, tap] (M = cig, N = n*HW, K = cg*kk)
// - weight grad gW[co, r]     = sum_{i, l} gy[i, co, l] * cols_i[r, l] (M = cg,  N = cig*kk, K = n*L)
// Every output is one block's: a 64x64 tile of C, its K in steps of 16,
// each product added with one fused multiply-add in K order (f32 for the
// half types and f32, f64 for f64), so results are the same from run to
// run. The weight gradient's K (every position of the batch) may be split
// into `splits` ranges whose partial sums are added in range order by
// conv_split_sum.
//
// `struct ConvGeom` is the Rust `leangrad::nn::ConvGeom` (src/nn/conv/mod.rs,
// #[repr(C)]): same fields in the same order, its usize fields laid out as
// these long longs.

struct ConvGeom {
    long long n, cin, h, w, cout, kh, kw;
    long long stride[2], pad[2], dil[2];
    long long groups, oh, ow;
};

// Tile sizes (cuda.rs launches LG_IG_THREADS threads per block): thread t
// computes rows t/16 + 16i and columns t%16 + 16j of the tile, i, j < 4.
#define LG_IG_BM 64
#define LG_IG_BN 64
#define LG_IG_BK 16
#define LG_IG_THREADS 256
// A tap offset that puts any coordinate far outside the input: the marker
// of a column row (or position) past the end of K.
#define LG_IG_OUTSIDE (-(1 << 30))

template <typename A> __device__ __forceinline__ A lg_fma(A a, A b, A c);
template <> __device__ __forceinline__ float lg_fma<float>(float a, float b, float c) {
    return fmaf(a, b, c);
}
template <> __device__ __forceinline__ double lg_fma<double>(double a, double b, double c) {
    return fma(a, b, c);
}

// One block's operand tiles: a[k][m] (one column of padding against bank
// conflicts when the A tile is stored transposed) and b[k][n].
template <typename A> struct IgTiles {
    A a[LG_IG_BK][LG_IG_BM + 1];
    A b[LG_IG_BK][LG_IG_BN];
};

// acc[i][j] += a[k][tm + 16i] * b[k][tn + 16j] for k in order.
template <typename A>
__device__ __forceinline__ void lg_ig_mac(const IgTiles<A>& s, A (&acc)[4][4], int tm, int tn) {
#pragma unroll
    for (int k = 0; k < LG_IG_BK; ++k) {
        A a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = s.a[k][tm + 16 * i];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = s.b[k][tn + 16 * j];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = lg_fma(a[i], b[j], acc[i][j]);
    }
}

// Whether 0 <= v < len.
__device__ __forceinline__ bool lg_inside(long long v, long long len) {
    return (unsigned long long)v < (unsigned long long)len;
}

// Tile `b` of `tiles_m * tiles_n` tiles per group: its group, first row and
// first column.
struct IgTile {
    long long grp, m0, n0;
};
__device__ __forceinline__ IgTile lg_ig_tile(long long b, long long tiles_m, long long tiles_n) {
    long long per = tiles_m * tiles_n, rest = b % per;
    return IgTile{b / per, rest / tiles_n * LG_IG_BM, rest % tiles_n * LG_IG_BN};
}

// y ([n, cout, oh, ow]) = bias + W (*) x, every element written.
template <typename T>
__device__ void lg_conv_fwd(const ConvGeom& g, T* y, const T* x, const T* w, const T* bias) {
    typedef typename Acc<T>::type A;
    __shared__ IgTiles<A> s;
    __shared__ long long tab_off[LG_IG_BK];
    __shared__ long long tab_dy[LG_IG_BK], tab_dx[LG_IG_BK];
    const long long kk = g.kh * g.kw, L = g.oh * g.ow, HW = g.h * g.w;
    const long long cig = g.cin / g.groups, cg = g.cout / g.groups;
    const long long K = cig * kk, P = g.n * L;
    const long long tiles_m = (cg + LG_IG_BM - 1) / LG_IG_BM;
    const long long tiles_n = (P + LG_IG_BN - 1) / LG_IG_BN;
    const int t = threadIdx.x, tm = t / 16, tn = t % 16;
    for (long long b = blockIdx.x; b < g.groups * tiles_m * tiles_n; b += gridDim.x) {
        IgTile tile = lg_ig_tile(b, tiles_m, tiles_n);
        // The column this thread gathers: position p of the batch.
        long long p = tile.n0 + t % LG_IG_BN;
        bool p_ok = p < P;
        long long l = p_ok ? p % L : 0, item = p_ok ? p / L : 0;
        long long iy0 = l / g.ow * g.stride[0] - g.pad[0];
        long long ix0 = l % g.ow * g.stride[1] - g.pad[1];
        long long xbase = (item * g.cin + tile.grp * cig) * HW + iy0 * g.w + ix0;
        A acc[4][4] = {};
        for (long long k0 = 0; k0 < K; k0 += LG_IG_BK) {
            if (t < LG_IG_BK) {
                long long r = k0 + t, c = r / kk, ki = r % kk / g.kw, kj = r % g.kw;
                tab_dy[t] = r < K ? ki * g.dil[0] : LG_IG_OUTSIDE;
                tab_dx[t] = kj * g.dil[1];
                tab_off[t] = c * HW + ki * g.dil[0] * g.w + kj * g.dil[1];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                int kq = t % LG_IG_BK, mq = t / LG_IG_BK + 16 * i;
                long long m = tile.m0 + mq, r = k0 + kq;
                bool ok = m < cg && r < K;
                s.a[kq][mq] = ok ? lg_load(w[(tile.grp * cg + m) * K + r]) : (A)0;
            }
            __syncthreads();
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                int kq = t / LG_IG_BN + 4 * j;
                long long iy = iy0 + tab_dy[kq], ix = ix0 + tab_dx[kq];
                bool in = p_ok && lg_inside(iy, g.h) && lg_inside(ix, g.w);
                s.b[kq][t % LG_IG_BN] = in ? lg_load(x[xbase + tab_off[kq]]) : (A)0;
            }
            __syncthreads();
            lg_ig_mac(s, acc, tm, tn);
            __syncthreads();
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            long long q = tile.n0 + tn + 16 * j;
            if (q >= P) continue;
            long long qi = q / L, ql = q % L;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                long long m = tile.m0 + tm + 16 * i;
                if (m >= cg) continue;
                long long co = tile.grp * cg + m;
                A v = bias ? lg_load(bias[co]) + acc[i][j] : acc[i][j];
                y[(qi * g.cout + co) * L + ql] = lg_store<T>(v);
            }
        }
    }
}

// gx ([n, cin, h, w]) = bias + the transposed convolution of gy by W (the
// input gradient; `bias`, per input channel, only for conv_transpose2d),
// every element written.
template <typename T>
__device__ void lg_conv_dgrad(const ConvGeom& g, T* gx, const T* gy, const T* w, const T* bias) {
    typedef typename Acc<T>::type A;
    __shared__ IgTiles<A> s;
    __shared__ long long tab_w[LG_IG_BK], tab_gy[LG_IG_BK];
    __shared__ long long tab_dy[LG_IG_BK], tab_dx[LG_IG_BK];
    const long long kk = g.kh * g.kw, L = g.oh * g.ow, HW = g.h * g.w;
    const long long cig = g.cin / g.groups, cg = g.cout / g.groups;
    const long long Kw = cig * kk, K = cg * kk, P = g.n * HW;
    const long long tiles_m = (cig + LG_IG_BM - 1) / LG_IG_BM;
    const long long tiles_n = (P + LG_IG_BN - 1) / LG_IG_BN;
    const bool unit = g.stride[0] == 1 && g.stride[1] == 1;
    const int t = threadIdx.x, tm = t / 16, tn = t % 16;
    for (long long b = blockIdx.x; b < g.groups * tiles_m * tiles_n; b += gridDim.x) {
        IgTile tile = lg_ig_tile(b, tiles_m, tiles_n);
        // The input position this thread gathers taps for.
        long long p = tile.n0 + t % LG_IG_BN;
        bool p_ok = p < P;
        long long pix = p_ok ? p % HW : 0, item = p_ok ? p / HW : 0;
        long long ty0 = pix / g.w + g.pad[0], tx0 = pix % g.w + g.pad[1];
        long long gybase = (item * g.cout + tile.grp * cg) * L;
        A acc[4][4] = {};
        for (long long k0 = 0; k0 < K; k0 += LG_IG_BK) {
            if (t < LG_IG_BK) {
                long long r = k0 + t, co = r / kk, ki = r % kk / g.kw, kj = r % g.kw;
                tab_w[t] = (tile.grp * cg + co) * Kw + ki * g.kw + kj;
                tab_gy[t] = co * L;
                tab_dy[t] = r < K ? ki * g.dil[0] : -LG_IG_OUTSIDE;
                tab_dx[t] = kj * g.dil[1];
            }
            __syncthreads();
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                int kq = t % LG_IG_BK, mq = t / LG_IG_BK + 16 * i;
                long long m = tile.m0 + mq;
                bool ok = m < cig && k0 + kq < K;
                s.a[kq][mq] = ok ? lg_load(w[tab_w[kq] + m * kk]) : (A)0;
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                int kq = t / LG_IG_BN + 4 * j;
                long long ty = ty0 - tab_dy[kq], tx = tx0 - tab_dx[kq], oy = ty, ox = tx;
                bool in = p_ok;
                if (!unit) {
                    in = in && ty >= 0 && tx >= 0 && ty % g.stride[0] == 0 &&
                         tx % g.stride[1] == 0;
                    oy = ty / g.stride[0];
                    ox = tx / g.stride[1];
                }
                in = in && lg_inside(oy, g.oh) && lg_inside(ox, g.ow);
                s.b[kq][t % LG_IG_BN] =
                    in ? lg_load(gy[gybase + tab_gy[kq] + oy * g.ow + ox]) : (A)0;
            }
            __syncthreads();
            lg_ig_mac(s, acc, tm, tn);
            __syncthreads();
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            long long q = tile.n0 + tn + 16 * j;
            if (q >= P) continue;
            long long qi = q / HW, qp = q % HW;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                long long m = tile.m0 + tm + 16 * i;
                if (m >= cig) continue;
                long long c = tile.grp * cig + m;
                A v = bias ? lg_load(bias[c]) + acc[i][j] : acc[i][j];
                gx[(qi * g.cin + c) * HW + qp] = lg_store<T>(v);
            }
        }
    }
}

// The weight gradient over the batch positions of split `split` (of
// `splits`, `chunk` positions each, a multiple of LG_IG_BK): with one split
// gw ([cout, cin/groups, kh, kw]) itself, every element written; with more,
// the split's partial sums in part[split] (cout*cig*kk values of A each).
template <typename T>
__device__ void lg_conv_wgrad(const ConvGeom& g, long long splits, long long chunk, T* gw,
                              typename Acc<T>::type* part, const T* gy, const T* x) {
    typedef typename Acc<T>::type A;
    __shared__ IgTiles<A> s;
    __shared__ long long tab_gy[LG_IG_BK], tab_x[LG_IG_BK];
    __shared__ long long tab_iy[LG_IG_BK], tab_ix[LG_IG_BK];
    const long long kk = g.kh * g.kw, L = g.oh * g.ow, HW = g.h * g.w;
    const long long cig = g.cin / g.groups, cg = g.cout / g.groups;
    const long long Kw = cig * kk, P = g.n * L;
    const long long tiles_m = (cg + LG_IG_BM - 1) / LG_IG_BM;
    const long long tiles_n = (Kw + LG_IG_BN - 1) / LG_IG_BN;
    const long long tiles = g.groups * tiles_m * tiles_n;
    const int t = threadIdx.x, tm = t / 16, tn = t % 16;
    for (long long b = blockIdx.x; b < splits * tiles; b += gridDim.x) {
        long long split = b / tiles;
        IgTile tile = lg_ig_tile(b % tiles, tiles_m, tiles_n);
        // The column row this thread gathers: r = (c, ki, kj).
        long long r = tile.n0 + t % LG_IG_BN;
        bool r_ok = r < Kw;
        long long c = r / kk, ki = r % kk / g.kw, kj = r % g.kw;
        long long rdy = ki * g.dil[0], rdx = kj * g.dil[1];
        long long roff = (tile.grp * cig + c) * HW + rdy * g.w + rdx;
        long long first = split * chunk, end = min(P, first + chunk);
        A acc[4][4] = {};
        for (long long k0 = first; k0 < end; k0 += LG_IG_BK) {
            if (t < LG_IG_BK) {
                long long p = k0 + t, item = p / L, l = p % L;
                long long iy0 = l / g.ow * g.stride[0] - g.pad[0];
                long long ix0 = l % g.ow * g.stride[1] - g.pad[1];
                tab_gy[t] = (item * g.cout + tile.grp * cg) * L + l;
                tab_x[t] = item * g.cin * HW + iy0 * g.w + ix0;
                tab_iy[t] = p < end ? iy0 : LG_IG_OUTSIDE;
                tab_ix[t] = ix0;
            }
            __syncthreads();
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                int kq = t % LG_IG_BK, mq = t / LG_IG_BK + 16 * i;
                long long m = tile.m0 + mq;
                bool ok = m < cg && k0 + kq < end;
                s.a[kq][mq] = ok ? lg_load(gy[tab_gy[kq] + m * L]) : (A)0;
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                int kq = t / LG_IG_BN + 4 * j;
                long long iy = tab_iy[kq] + rdy, ix = tab_ix[kq] + rdx;
                bool in = r_ok && lg_inside(iy, g.h) && lg_inside(ix, g.w);
                s.b[kq][t % LG_IG_BN] = in ? lg_load(x[tab_x[kq] + roff]) : (A)0;
            }
            __syncthreads();
            lg_ig_mac(s, acc, tm, tn);
            __syncthreads();
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            long long q = tile.n0 + tn + 16 * j;
            if (q >= Kw) continue;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                long long m = tile.m0 + tm + 16 * i;
                if (m >= cg) continue;
                long long e = (tile.grp * cg + m) * Kw + q;
                if (splits == 1) {
                    gw[e] = lg_store<T>(acc[i][j]);
                } else {
                    part[split * g.cout * Kw + e] = acc[i][j];
                }
            }
        }
    }
}

#define LG_CONV(sfx, T)                                                               \
    extern "C" __global__ void conv_fwd_##sfx(ConvGeom g, T* y, const T* x, const T* w, \
                                              const T* bias) {                        \
        lg_conv_fwd<T>(g, y, x, w, bias);                                             \
    }                                                                                 \
    extern "C" __global__ void conv_dgrad_##sfx(ConvGeom g, T* gx, const T* gy,       \
                                                const T* w, const T* bias) {          \
        lg_conv_dgrad<T>(g, gx, gy, w, bias);                                         \
    }                                                                                 \
    extern "C" __global__ void conv_wgrad_##sfx(ConvGeom g, long long splits,         \
                                                long long chunk, T* gw,               \
                                                Acc<T>::type* part, const T* gy,      \
                                                const T* x) {                         \
        lg_conv_wgrad<T>(g, splits, chunk, gw, part, gy, x);                          \
    }                                                                                 \
    /* gw[e] = the sum over s < splits of part[s*n + e], in split order. */           \
    extern "C" __global__ void conv_split_sum_##sfx(long long n, long long splits,   \
                                                    T* gw, const Acc<T>::type* part) { \
        typedef Acc<T>::type A;                                                       \
        LG_GRID_LOOP(e, n) {                                                          \
            A v = part[e];                                                            \
            for (long long s = 1; s < splits; ++s) v = v + part[s * n + e];           \
            gw[e] = lg_store<T>(v);                                                   \
        }                                                                             \
    }                                                                                 \
    /* out[ch] = sum over i < n, j < l of gy[(i*c + ch)*l + j], in double; one */     \
    /* block of 256 threads per channel, fixed tree order. */                         \
    extern "C" __global__ void channel_sum_##sfx(long long n, long long c, long long l, \
                                                 T* out, const T* gy) {               \
        __shared__ double buf[256];                                                   \
        for (long long ch = blockIdx.x; ch < c; ch += gridDim.x) {                    \
            double s = 0;                                                             \
            for (long long k = threadIdx.x; k < n * l; k += 256)                      \
                s += lg_to_f64(gy[(k / l * c + ch) * l + k % l]);                     \
            buf[threadIdx.x] = s;                                                     \
            for (int st = 128; st > 0; st >>= 1) {                                    \
                __syncthreads();                                                      \
                if (threadIdx.x < st) buf[threadIdx.x] += buf[threadIdx.x + st];      \
            }                                                                         \
            __syncthreads();                                                          \
            if (threadIdx.x == 0) out[ch] = lg_from_f64<T>(buf[0]);                   \
            __syncthreads();                                                          \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_CONV)
