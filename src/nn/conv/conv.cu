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

// Tile sizes (cuda.rs launches LG_IG_THREADS threads per block): a tile
// has BM = 8*R rows (R = 8, 4 or 1: cuda.rs picks the smallest tile that
// holds the layer's rows, so a 3-channel or depthwise layer does not
// compute 64 rows of zeros) and LG_IG_BN columns; thread t computes rows
// R*(t/16) + i, i < R, and columns 4*(t%16) + j, j < 4, reading each
// step's R + 4 operands from shared memory (as 16-byte vectors where R
// allows). Each thread gathers R elements of the A tile and
// LG_IG_B_LOADS of the B tile per step.
#define LG_IG_BN 64
#define LG_IG_BK 16
#define LG_IG_THREADS 128
#define LG_IG_B_LOADS (LG_IG_BN * LG_IG_BK / LG_IG_THREADS)
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

// One block's operand tiles: a[k][m] (padded by one 16-byte vector against
// bank conflicts when the A tile is stored transposed) and b[k][n].
template <typename A, int BM> struct IgTiles {
    __align__(16) A a[LG_IG_BK][BM + 16 / sizeof(A)];
    __align__(16) A b[LG_IG_BK][LG_IG_BN];
};

// out[0..4] = p[0..4], p 16-byte aligned, as 16-byte shared loads.
__device__ __forceinline__ void lg_ld4(const float* p, float (&out)[4]) {
    float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
}
__device__ __forceinline__ void lg_ld4(const double* p, double (&out)[4]) {
    double2 u = reinterpret_cast<const double2*>(p)[0], v = reinterpret_cast<const double2*>(p)[1];
    out[0] = u.x, out[1] = u.y, out[2] = v.x, out[3] = v.y;
}

// acc[i][j] += a[k][tm + i] * b[k][tn + j] for k in order (tm = R*(t/16),
// tn = 4*(t%16)).
template <typename A, int R>
__device__ __forceinline__ void lg_ig_mac(const IgTiles<A, 8 * R>& s, A (&acc)[R][4], int tm,
                                          int tn) {
#pragma unroll
    for (int k = 0; k < LG_IG_BK; ++k) {
        A a[R], b[4];
        if constexpr (R % 4 == 0) {
#pragma unroll
            for (int i = 0; i < R; i += 4) {
                A v[4];
                lg_ld4(&s.a[k][tm + i], v);
#pragma unroll
                for (int q = 0; q < 4; ++q) a[i + q] = v[q];
            }
        } else {
#pragma unroll
            for (int i = 0; i < R; ++i) a[i] = s.a[k][tm + i];
        }
        lg_ld4(&s.b[k][tn], b);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
            for (int i = 0; i < R; ++i) acc[i][j] = lg_fma(a[i], b[j], acc[i][j]);
        }
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
__device__ __forceinline__ IgTile lg_ig_tile(long long b, long long tiles_m, long long tiles_n,
                                             long long bm) {
    long long per = tiles_m * tiles_n, rest = b % per;
    return IgTile{b / per, rest / tiles_n * bm, rest % tiles_n * LG_IG_BN};
}

// Stores a tile of products into out ([n, c, plane], the tile's rows the
// channels grp*rows + m of its group, m < rows, its columns the positions
// q < P of the batch), each added to bias[channel] when there is a bias.
template <typename T, int R>
__device__ __forceinline__ void lg_ig_store_nchw(T* out, const T* bias,
                                                 const typename Acc<T>::type (&acc)[R][4],
                                                 IgTile tile, int tm, int tn, long long rows,
                                                 long long c, long long plane, long long P) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        long long q = tile.n0 + tn + j;
        if (q >= P) continue;
        long long item = q / plane, at = q % plane;
#pragma unroll
        for (int i = 0; i < R; ++i) {
            long long m = tile.m0 + tm + i;
            if (m >= rows) continue;
            long long ch = tile.grp * rows + m;
            typename Acc<T>::type v = bias ? lg_load(bias[ch]) + acc[i][j] : acc[i][j];
            out[(item * c + ch) * plane + at] = lg_store<T>(v);
        }
    }
}

// The A tile of a step from a table of row starts: a[k][m] = src[tab[k] +
// (m0 + m) * stride] for rows m0 + m < rows and steps k < ks, 0 elsewhere.
template <typename T, int R>
__device__ __forceinline__ void lg_ig_gather_a(IgTiles<typename Acc<T>::type, 8 * R>& s,
                                               const T* src, const long long* tab,
                                               long long stride, long long rows, long long m0,
                                               long long ks, int t) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
        int kq = t % LG_IG_BK, mq = t / LG_IG_BK + LG_IG_THREADS / LG_IG_BK * i;
        long long m = m0 + mq;
        bool ok = m < rows && kq < ks;
        s.a[kq][mq] = ok ? lg_load(src[tab[kq] + m * stride]) : (typename Acc<T>::type)0;
    }
}

// y ([n, cout, oh, ow]) = bias + W (*) x, every element written.
template <typename T, int R>
__device__ void lg_conv_fwd(const ConvGeom& g, T* y, const T* x, const T* w, const T* bias) {
    typedef typename Acc<T>::type A;
    __shared__ IgTiles<A, 8 * R> s;
    __shared__ long long tab_off[LG_IG_BK];
    __shared__ long long tab_dy[LG_IG_BK], tab_dx[LG_IG_BK];
    const long long kk = g.kh * g.kw, L = g.oh * g.ow, HW = g.h * g.w;
    const long long cig = g.cin / g.groups, cg = g.cout / g.groups;
    const long long K = cig * kk, P = g.n * L;
    const long long tiles_m = (cg + 8 * R - 1) / (8 * R);
    const long long tiles_n = (P + LG_IG_BN - 1) / LG_IG_BN;
    const int t = threadIdx.x, tm = t / 16 * R, tn = t % 16 * 4;
    for (long long b = blockIdx.x; b < g.groups * tiles_m * tiles_n; b += gridDim.x) {
        IgTile tile = lg_ig_tile(b, tiles_m, tiles_n, 8 * R);
        // The column this thread gathers: position p of the batch.
        long long p = tile.n0 + t % LG_IG_BN;
        bool p_ok = p < P;
        long long l = p_ok ? p % L : 0, item = p_ok ? p / L : 0;
        long long iy0 = l / g.ow * g.stride[0] - g.pad[0];
        long long ix0 = l % g.ow * g.stride[1] - g.pad[1];
        long long xbase = (item * g.cin + tile.grp * cig) * HW + iy0 * g.w + ix0;
        A acc[R][4] = {};
        for (long long k0 = 0; k0 < K; k0 += LG_IG_BK) {
            if (t < LG_IG_BK) {
                long long r = k0 + t, c = r / kk, ki = r % kk / g.kw, kj = r % g.kw;
                tab_dy[t] = r < K ? ki * g.dil[0] : LG_IG_OUTSIDE;
                tab_dx[t] = kj * g.dil[1];
                tab_off[t] = c * HW + ki * g.dil[0] * g.w + kj * g.dil[1];
            }
#pragma unroll
            for (int i = 0; i < R; ++i) {
                int kq = t % LG_IG_BK, mq = t / LG_IG_BK + LG_IG_THREADS / LG_IG_BK * i;
                long long m = tile.m0 + mq, r = k0 + kq;
                bool ok = m < cg && r < K;
                s.a[kq][mq] = ok ? lg_load(w[(tile.grp * cg + m) * K + r]) : (A)0;
            }
            __syncthreads();
#pragma unroll
            for (int j = 0; j < LG_IG_B_LOADS; ++j) {
                int kq = t / LG_IG_BN + LG_IG_THREADS / LG_IG_BN * j;
                long long iy = iy0 + tab_dy[kq], ix = ix0 + tab_dx[kq];
                bool in = p_ok && lg_inside(iy, g.h) && lg_inside(ix, g.w);
                s.b[kq][t % LG_IG_BN] = in ? lg_load(x[xbase + tab_off[kq]]) : (A)0;
            }
            __syncthreads();
            lg_ig_mac(s, acc, tm, tn);
            __syncthreads();
        }
        lg_ig_store_nchw(y, bias, acc, tile, tm, tn, cg, g.cout, L, P);
    }
}

// gx ([n, cin, h, w]) = bias + the transposed convolution of gy by W (the
// input gradient; `bias`, per input channel, only for conv_transpose2d),
// every element written.
template <typename T, int R>
__device__ void lg_conv_dgrad(const ConvGeom& g, T* gx, const T* gy, const T* w, const T* bias) {
    typedef typename Acc<T>::type A;
    __shared__ IgTiles<A, 8 * R> s;
    __shared__ long long tab_w[LG_IG_BK], tab_gy[LG_IG_BK];
    __shared__ long long tab_dy[LG_IG_BK], tab_dx[LG_IG_BK];
    const long long kk = g.kh * g.kw, L = g.oh * g.ow, HW = g.h * g.w;
    const long long cig = g.cin / g.groups, cg = g.cout / g.groups;
    const long long Kw = cig * kk, K = cg * kk, P = g.n * HW;
    const long long tiles_m = (cig + 8 * R - 1) / (8 * R);
    const long long tiles_n = (P + LG_IG_BN - 1) / LG_IG_BN;
    const bool unit = g.stride[0] == 1 && g.stride[1] == 1;
    const int t = threadIdx.x, tm = t / 16 * R, tn = t % 16 * 4;
    for (long long b = blockIdx.x; b < g.groups * tiles_m * tiles_n; b += gridDim.x) {
        IgTile tile = lg_ig_tile(b, tiles_m, tiles_n, 8 * R);
        // The input position this thread gathers taps for.
        long long p = tile.n0 + t % LG_IG_BN;
        bool p_ok = p < P;
        long long pix = p_ok ? p % HW : 0, item = p_ok ? p / HW : 0;
        long long ty0 = pix / g.w + g.pad[0], tx0 = pix % g.w + g.pad[1];
        long long gybase = (item * g.cout + tile.grp * cg) * L;
        A acc[R][4] = {};
        for (long long k0 = 0; k0 < K; k0 += LG_IG_BK) {
            if (t < LG_IG_BK) {
                long long r = k0 + t, co = r / kk, ki = r % kk / g.kw, kj = r % g.kw;
                tab_w[t] = (tile.grp * cg + co) * Kw + ki * g.kw + kj;
                tab_gy[t] = co * L;
                tab_dy[t] = r < K ? ki * g.dil[0] : -LG_IG_OUTSIDE;
                tab_dx[t] = kj * g.dil[1];
            }
            __syncthreads();
            lg_ig_gather_a<T, R>(s, w, tab_w, kk, cig, tile.m0, K - k0, t);
#pragma unroll
            for (int j = 0; j < LG_IG_B_LOADS; ++j) {
                int kq = t / LG_IG_BN + LG_IG_THREADS / LG_IG_BN * j;
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
        lg_ig_store_nchw(gx, bias, acc, tile, tm, tn, cig, g.cin, HW, P);
    }
}

// The weight gradient over the batch positions of split `split` (of
// `splits`, `chunk` positions each, a multiple of LG_IG_BK): with one split
// gw ([cout, cin/groups, kh, kw]) itself, every element written; with more,
// the split's partial sums in part[split] (cout*cig*kk values of A each).
template <typename T, int R>
__device__ void lg_conv_wgrad(const ConvGeom& g, long long splits, long long chunk, T* gw,
                              typename Acc<T>::type* part, const T* gy, const T* x) {
    typedef typename Acc<T>::type A;
    __shared__ IgTiles<A, 8 * R> s;
    __shared__ long long tab_gy[LG_IG_BK], tab_x[LG_IG_BK];
    __shared__ long long tab_iy[LG_IG_BK], tab_ix[LG_IG_BK];
    const long long kk = g.kh * g.kw, L = g.oh * g.ow, HW = g.h * g.w;
    const long long cig = g.cin / g.groups, cg = g.cout / g.groups;
    const long long Kw = cig * kk, P = g.n * L;
    const long long tiles_m = (cg + 8 * R - 1) / (8 * R);
    const long long tiles_n = (Kw + LG_IG_BN - 1) / LG_IG_BN;
    const long long tiles = g.groups * tiles_m * tiles_n;
    const int t = threadIdx.x, tm = t / 16 * R, tn = t % 16 * 4;
    for (long long b = blockIdx.x; b < splits * tiles; b += gridDim.x) {
        long long split = b / tiles;
        IgTile tile = lg_ig_tile(b % tiles, tiles_m, tiles_n, 8 * R);
        // The column row this thread gathers: r = (c, ki, kj).
        long long r = tile.n0 + t % LG_IG_BN;
        bool r_ok = r < Kw;
        long long c = r / kk, ki = r % kk / g.kw, kj = r % g.kw;
        long long rdy = ki * g.dil[0], rdx = kj * g.dil[1];
        long long roff = (tile.grp * cig + c) * HW + rdy * g.w + rdx;
        long long first = split * chunk, end = min(P, first + chunk);
        A acc[R][4] = {};
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
            lg_ig_gather_a<T, R>(s, gy, tab_gy, L, cg, tile.m0, end - k0, t);
#pragma unroll
            for (int j = 0; j < LG_IG_B_LOADS; ++j) {
                int kq = t / LG_IG_BN + LG_IG_THREADS / LG_IG_BN * j;
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
            long long q = tile.n0 + tn + j;
            if (q >= Kw) continue;
#pragma unroll
            for (int i = 0; i < R; ++i) {
                long long m = tile.m0 + tm + i;
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

// The three passes for tiles of BM = 8*R rows.
#define LG_CONV_TILE(sfx, T, BM, R)                                                   \
    extern "C" __global__ void conv_fwd_m##BM##_##sfx(ConvGeom g, T* y, const T* x,   \
                                                      const T* w, const T* bias) {    \
        lg_conv_fwd<T, R>(g, y, x, w, bias);                                          \
    }                                                                                 \
    extern "C" __global__ void conv_dgrad_m##BM##_##sfx(ConvGeom g, T* gx, const T* gy, \
                                                        const T* w, const T* bias) {  \
        lg_conv_dgrad<T, R>(g, gx, gy, w, bias);                                      \
    }                                                                                 \
    extern "C" __global__ void conv_wgrad_m##BM##_##sfx(                              \
        ConvGeom g, long long splits, long long chunk, T* gw, Acc<T>::type* part,     \
        const T* gy, const T* x) {                                                    \
        lg_conv_wgrad<T, R>(g, splits, chunk, gw, part, gy, x);                       \
    }

#define LG_CONV(sfx, T)                                                               \
    LG_CONV_TILE(sfx, T, 64, 8)                                                       \
    LG_CONV_TILE(sfx, T, 32, 4)                                                       \
    LG_CONV_TILE(sfx, T, 8, 1)                                                        \
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
