// Fused attention in the FlashAttention-2 manner (the formulas are
// src/nn/attention/flash/mod.rs's; launched from flash/cuda.rs). The scores of a
// tile of queries against a tile of keys live only in registers and shared
// memory; nothing of size lq x lk is ever written.
//
//   flash_fwd_*      one block per (b*h, query tile, chunk of OC output
//                    columns): online softmax over the key tiles (running
//                    max m, per-thread partial sums l, accumulator rescaled
//                    per tile), O = acc * drop_scale / l, lse = m + log(l).
//   flash_bwd_dq_*   one block per (b*h, query tile, chunk of dQ columns):
//                    pass 1 over the key tiles forms D_i = sum_j P_ij dP_ij
//                    (written to delta by chunk 0), pass 2 accumulates
//                    dQ = scale * dS K.
//   flash_bwd_dkv_*  one block per (b*kv head, key tile, chunk of columns): a
//                    loop over the group's query heads in order, and in each
//                    over the query tiles, accumulates dV = P'^T dO and
//                    dK = scale * dS^T Q, reading lse and delta.
//
// Grouped-query attention (FlashGeom::kv_heads < heads): query head h reads k
// and v at head h / group in place (never repeated); the mask, dropout, lse
// and delta are the query head's.
//
// No atomics: every sum runs in an order fixed by the shapes (the 16-lane
// shuffle butterflies give every lane the same bits, as IEEE addition is
// commutative), so results are bit-identical from run to run. Compute type
// A = Acc<T>: double for double, float otherwise; products are explicit
// fused multiply-adds (the files compile with --fmad=false). Thread t of the
// 256 is (ty, tx) = (t / 16, t % 16) and owns rows ty + 16a and columns
// tx + 16b of every tile, so a row's 16 owners are 16 lanes of one warp.
// Tasks are spread over the grid block-stride (any grid is correct; the loop
// is block-uniform, so __syncthreads and the shuffles are reached by all).

#define LG_FL_THREADS 256

// `leangrad::nn::ScoreGeom` (#[repr(C)]): usize as long long.
struct ScoreGeom {
    long long lq, lk;
    double scale;
    bool causal;
};

// `leangrad::nn::FlashGeom` (src/nn/attention/flash/mod.rs, #[repr(C)]).
// kv_heads: key/value heads; query head h reads head h / (heads / kv_heads).
struct FlashGeom {
    ScoreGeom score;
    long long batch, heads, d, dv, kv_heads;
};

// Query heads per key/value head (1 without key/value heads: then there are
// no query heads either).
__device__ __forceinline__ long long fl_group(const FlashGeom& g) {
    return g.kv_heads > 0 ? g.heads / g.kv_heads : 1;
}

// `leangrad::nn::View4`: element [b, h, r, c] of a view sits at
// offset + b*batch + h*head + r*row + c*col (stride 0 broadcasts).
struct View4 {
    long long offset, batch, head, row, col;
};

// Tile sizes per compute type (B: tile edge in rows/keys; DC: feature chunk
// of the dot products; OC: output columns per block). Static shared memory
// stays under 48 KB: float 41.7 KB forward, 33.5 KB backward; double 33.5 KB.
// flash/cuda.rs plans its grids with the same numbers (tile, OUT_CHUNK;
// a test reads these defines).
#define LG_FL_TILE 64
#define LG_FL_TILE_F64 32
#define LG_FL_OUT_CHUNK 64
template <typename A> struct FlCfg {
    enum { B = LG_FL_TILE, DC = 32, OC = LG_FL_OUT_CHUNK };
};
template <> struct FlCfg<double> {
    enum { B = LG_FL_TILE_F64, DC = 32, OC = LG_FL_OUT_CHUNK };
};

// The backward kernels' shared work tile: first the two DC-wide chunks of a
// dot product's operands, later a B x OC tile of one output chunk.
template <typename A> __device__ __forceinline__ constexpr int fl_work_len() {
    constexpr int B = FlCfg<A>::B, DC = FlCfg<A>::DC, OC = FlCfg<A>::OC;
    return 2 * B * (DC + 1) > B * (OC + 1) ? 2 * B * (DC + 1) : B * (OC + 1);
}

__device__ __forceinline__ float fl_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double fl_fma(double a, double b, double c) { return __fma_rn(a, b, c); }
__device__ __forceinline__ float fl_exp(float x) { return expf(x); }
__device__ __forceinline__ double fl_exp(double x) { return exp(x); }
__device__ __forceinline__ float fl_log(float x) { return logf(x); }
__device__ __forceinline__ double fl_log(double x) { return log(x); }
__device__ __forceinline__ float fl_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double fl_max(double a, double b) { return fmax(a, b); }

// Max and sum over the 16 lanes that own one tile row (every lane of the
// warp must call them; each lane gets the same bits).
template <typename A> __device__ __forceinline__ A fl_max16(A v) {
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) v = fl_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
template <typename A> __device__ __forceinline__ A fl_sum16(A v) {
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One operand (q, k, v or dO) of one (b, h): element [r, c] at p[r*rs + c*cs].
template <typename T> struct FlOp {
    const T* p;
    long long rs, cs;
};

template <typename T>
__device__ __forceinline__ FlOp<T> fl_op(const T* base, const View4& v, long long b, long long h) {
    FlOp<T> o;
    o.p = base + (v.offset + b * v.batch + h * v.head);
    o.rs = v.row;
    o.cs = v.col;
    return o;
}

// What every task of a call shares: sizes, scale, mask and dropout.
template <typename A> struct FlCall {
    int lq, lk, d, dv;
    bool causal;
    A scale;
    // Mask (a `MaskCode`): None, Float (additive, type A) or Bool (U8, 0 removes); element
    // [i, j] of this (b, h) at mask[mbase + i*mrs + j*mcs].
    int mask_kind;
    const void* mask;
    long long mbase, mrs, mcs;
    View4 vm;
    // Dropout replayed from (seed, offset) at element row*lk + j.
    int drop;
    unsigned long long seed, offset;
    double p;
    A dscale;
};

template <typename A>
__device__ __forceinline__ FlCall<A> fl_call(const FlashGeom& g, const View4& vm, int mask_kind,
                                             const void* mask, int drop, unsigned long long seed,
                                             unsigned long long offset, double p,
                                             double drop_scale) {
    FlCall<A> c;
    c.lq = (int)g.score.lq;
    c.lk = (int)g.score.lk;
    c.d = (int)g.d;
    c.dv = (int)g.dv;
    c.causal = g.score.causal;
    c.scale = (A)g.score.scale;
    c.mask_kind = mask_kind;
    c.mask = mask;
    c.vm = vm;
    c.mbase = 0;
    c.mrs = vm.row;
    c.mcs = vm.col;
    c.drop = drop;
    c.seed = seed;
    c.offset = offset;
    c.p = p;
    c.dscale = drop ? (A)drop_scale : (A)1;
    return c;
}

// Points the call's mask at batch entry b, head h.
template <typename A>
__device__ __forceinline__ void fl_mask_at(FlCall<A>& c, long long b, long long h) {
    c.mbase = c.vm.offset + b * c.vm.batch + h * c.vm.head;
}

// The logit of query i, key j from the dot product s: -inf outside the
// tensors and above the diagonal when causal; a removed U8 position adds
// -inf (a NaN score stays NaN, as the unfused kernel).
template <typename A>
__device__ __forceinline__ A fl_logit(const FlCall<A>& c, A s, int i, int j) {
    if (i >= c.lq || j >= c.lk || (c.causal && j > i)) return -(A)LG_INF;
    A x = c.scale * s;
    if (c.mask_kind != MaskCode::None) {
        long long at = c.mbase + (long long)i * c.mrs + (long long)j * c.mcs;
        if (c.mask_kind == MaskCode::Float)
            x = x + ((const A*)c.mask)[at];
        else if (!((const unsigned char*)c.mask)[at])
            x = x + -(A)LG_INF;
    }
    return x;
}

// The keep rule out of line: inlined at every tile element, the ten Philox
// rounds would dominate the kernels' code size.
__device__ __noinline__ bool fl_keep_at(unsigned long long seed, unsigned long long offset,
                                        unsigned long long i, double p) {
    return lg_keep(seed, offset, i, p);
}

// Whether dropout keeps score (row, j) (always without dropout).
template <typename A>
__device__ __forceinline__ bool fl_keep(const FlCall<A>& c, long long row, int j) {
    if (!c.drop) return true;
    return fl_keep_at(c.seed, c.offset, (unsigned long long)(row * c.lk + j), c.p);
}

// P from logit x and the row's saved lse (0 for a fully masked row).
template <typename A> __device__ __forceinline__ A fl_prob(A x, A lse) {
    return lse == -(A)LG_INF ? (A)0 : fl_exp(x - lse);
}

// Rows [r0, r0 + R) and columns [c0, c0 + C) of `o` into s (row stride LD)
// in the compute type, zeros outside nr rows and nc columns. Consecutive
// threads read consecutive columns: coalesced when the column stride is 1.
// C divides the block, so each thread keeps one column and steps a pointer
// down the rows (no per-element index arithmetic).
template <typename T, typename A, int R, int C, int LD>
__device__ __forceinline__ void fl_load(A* s, const FlOp<T>& o, int r0, int nr, int c0, int nc) {
    constexpr int STEP = LG_FL_THREADS / C;
    const int cc = threadIdx.x % C, r1 = threadIdx.x / C;
    const bool col_in = c0 + cc < nc;
    const T* p = o.p + (long long)(r0 + r1) * o.rs + (long long)(c0 + cc) * o.cs;
    const long long step = STEP * o.rs;
#pragma unroll
    for (int k = 0; k < R / STEP; ++k, p += step) {
        int r = r1 + k * STEP;
        A v = (A)0;
        if (col_in && r0 + r < nr) v = lg_load(*p);
        s[r * LD + cc] = v;
    }
}

// acc[a][b] = sum_c X[xr0 + ty + 16a][c] * Y[yr0 + tx + 16b][c] over the
// n features, in chunks of DC through the shared tiles sX and sY (each
// B x (DC + 1)). Starts with a barrier, so the caller's last reads of sX and
// sY (or anything aliased on them) are complete before they are written.
template <typename T, typename A>
__device__ __forceinline__ void fl_dots(A (&acc)[FlCfg<A>::B / 16][FlCfg<A>::B / 16], A* sX,
                                        A* sY, const FlOp<T>& x, int xr0, int xn,
                                        const FlOp<T>& y, int yr0, int yn, int n) {
    constexpr int B = FlCfg<A>::B, DC = FlCfg<A>::DC, R = B / 16;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
#pragma unroll
    for (int a = 0; a < R; ++a)
#pragma unroll
        for (int b = 0; b < R; ++b) acc[a][b] = (A)0;
    for (int c0 = 0; c0 < n; c0 += DC) {
        __syncthreads();
        fl_load<T, A, B, DC, DC + 1>(sX, x, xr0, xn, c0, n);
        fl_load<T, A, B, DC, DC + 1>(sY, y, yr0, yn, c0, n);
        __syncthreads();
        int cn = min(DC, n - c0);
#pragma unroll 4
        for (int c = 0; c < cn; ++c) {
            A xa[R], yb[R];
#pragma unroll
            for (int a = 0; a < R; ++a) xa[a] = sX[(ty + 16 * a) * (DC + 1) + c];
#pragma unroll
            for (int b = 0; b < R; ++b) yb[b] = sY[(tx + 16 * b) * (DC + 1) + c];
#pragma unroll
            for (int a = 0; a < R; ++a)
#pragma unroll
                for (int b = 0; b < R; ++b) acc[a][b] = fl_fma(xa[a], yb[b], acc[a][b]);
        }
    }
}

// acc[a][o] += sum_{t < tn} sA[ty + 16a][t] * sB[t][tx + 16o]: the product
// of a B x B tile (row stride B + 1) and a B x OC tile (row stride OC + 1).
template <typename A>
__device__ __forceinline__ void fl_accum(A (&acc)[FlCfg<A>::B / 16][FlCfg<A>::OC / 16],
                                         const A* sA, const A* sB, int tn) {
    constexpr int B = FlCfg<A>::B, OC = FlCfg<A>::OC, R = B / 16, RO = OC / 16;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
#pragma unroll 4
    for (int t = 0; t < tn; ++t) {
        A pa[R], vb[RO];
#pragma unroll
        for (int a = 0; a < R; ++a) pa[a] = sA[(ty + 16 * a) * (B + 1) + t];
#pragma unroll
        for (int o = 0; o < RO; ++o) vb[o] = sB[t * (OC + 1) + tx + 16 * o];
#pragma unroll
        for (int a = 0; a < R; ++a)
#pragma unroll
            for (int o = 0; o < RO; ++o) acc[a][o] = fl_fma(pa[a], vb[o], acc[a][o]);
    }
}

// Writes this thread's tile values v[a][b] at sA[ty + 16a][tx + 16b] after a
// barrier (the previous readers of sA and of what the caller loads next are
// done).
template <typename A>
__device__ __forceinline__ void fl_put(A* sA, const A (&v)[FlCfg<A>::B / 16][FlCfg<A>::B / 16]) {
    constexpr int B = FlCfg<A>::B, R = B / 16;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    __syncthreads();
#pragma unroll
    for (int a = 0; a < R; ++a)
#pragma unroll
        for (int b = 0; b < R; ++b) sA[(ty + 16 * a) * (B + 1) + tx + 16 * b] = v[a][b];
}

// Stores acc * f at rows r0 + ty + 16a (< nr) and columns c0 + tx + 16o
// (< nc) of the dense [.., nr, nc] output of (b, h) index bh.
template <typename T, typename A>
__device__ __forceinline__ void fl_store(T* out, const A (&acc)[FlCfg<A>::B / 16][FlCfg<A>::OC / 16],
                                         const A (&f)[FlCfg<A>::B / 16], long long bh, int r0,
                                         int nr, int c0, int nc) {
    constexpr int B = FlCfg<A>::B, OC = FlCfg<A>::OC, R = B / 16, RO = OC / 16;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
#pragma unroll
    for (int a = 0; a < R; ++a) {
        int r = r0 + ty + 16 * a;
        if (r >= nr) continue;
        T* row = out + (bh * nr + r) * nc;
#pragma unroll
        for (int o = 0; o < RO; ++o) {
            int col = c0 + tx + 16 * o;
            if (col < nc) row[col] = lg_store<T>(acc[a][o] * f[a]);
        }
    }
}

// One forward task: query tile i0 of (b, h) index bh, output columns
// [vc*OC, vc*OC + OC). sU holds K chunks, then the V tile.
template <typename T, typename A>
__device__ __forceinline__ void fl_fwd_task(const FlCall<A>& c, const FlOp<T>& Q, const FlOp<T>& K,
                                            const FlOp<T>& V, long long bh, int i0, int vc, T* out,
                                            A* lse, A* sX, A* sU, A* sP) {
    constexpr int B = FlCfg<A>::B, OC = FlCfg<A>::OC, R = B / 16, RO = OC / 16;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const A NEG = -(A)LG_INF;
    A m[R], l[R], o[R][RO];
#pragma unroll
    for (int a = 0; a < R; ++a) {
        m[a] = NEG;
        l[a] = (A)0;
#pragma unroll
        for (int q = 0; q < RO; ++q) o[a][q] = (A)0;
    }
    // Causal: key tiles wholly above the diagonal are skipped.
    int kend = c.causal ? min(c.lk, i0 + B) : c.lk;
    for (int j0 = 0; j0 < kend; j0 += B) {
        A s[R][R];
        fl_dots<T, A>(s, sX, sU, Q, i0, c.lq, K, j0, c.lk, c.d);
#pragma unroll
        for (int a = 0; a < R; ++a) {
            int i = i0 + ty + 16 * a;
            A mx = NEG;
#pragma unroll
            for (int b = 0; b < R; ++b) {
                s[a][b] = fl_logit(c, s[a][b], i, j0 + tx + 16 * b);
                mx = fl_max(mx, s[a][b]);
            }
            A mn = fl_max(m[a], fl_max16(mx));
            // A row with no key yet: exp(-inf - 0) = 0 everywhere.
            A base = mn == NEG ? (A)0 : mn;
            A alpha = fl_exp(m[a] - base);
            m[a] = mn;
            l[a] *= alpha;
#pragma unroll
            for (int q = 0; q < RO; ++q) o[a][q] *= alpha;
#pragma unroll
            for (int b = 0; b < R; ++b) {
                A e = fl_exp(s[a][b] - base);
                l[a] += e;
                s[a][b] = fl_keep(c, bh * c.lq + i, j0 + tx + 16 * b) ? e : (A)0;
            }
        }
        fl_put(sP, s);
        fl_load<T, A, B, OC, OC + 1>(sU, V, j0, c.lk, vc * OC, c.dv);
        __syncthreads();
        fl_accum(o, sP, sU, min(B, c.lk - j0));
    }
    A f[R];
#pragma unroll
    for (int a = 0; a < R; ++a) {
        A total = fl_sum16(l[a]);
        int i = i0 + ty + 16 * a;
        if (vc == 0 && tx == 0 && i < c.lq)
            lse[bh * c.lq + i] = m[a] == NEG ? NEG : m[a] + fl_log(total);
        f[a] = total > (A)0 ? c.dscale / total : (A)0;
    }
    fl_store<T, A>(out, o, f, bh, i0, c.lq, vc * OC, c.dv);
}

template <typename T>
__device__ __forceinline__ void fl_forward(const FlashGeom& g, const View4& vq, const View4& vk,
                                           const View4& vv, const View4& vm, int mask_kind,
                                           int drop, unsigned long long seed,
                                           unsigned long long offset, double p, double drop_scale,
                                           T* out, typename Acc<T>::type* lse, const T* q,
                                           const T* k, const T* v, const void* mask) {
    typedef typename Acc<T>::type A;
    constexpr int B = FlCfg<A>::B, DC = FlCfg<A>::DC, OC = FlCfg<A>::OC;
    __shared__ A sX[B * (DC + 1)];
    __shared__ A sU[B * (OC + 1)];
    __shared__ A sP[B * (B + 1)];
    FlCall<A> c = fl_call<A>(g, vm, mask_kind, mask, drop, seed, offset, p, drop_scale);
    long long bhn = g.batch * g.heads;
    long long qtiles = (c.lq + B - 1) / B;
    long long chunks = max(1, (c.dv + OC - 1) / OC);
    long long tasks = bhn * qtiles * chunks;
    for (long long task = blockIdx.x; task < tasks; task += gridDim.x) {
        int vc = (int)(task % chunks);
        int qt = (int)(task / chunks % qtiles);
        long long bh = task / chunks / qtiles;
        long long b = bh / g.heads, h = bh % g.heads;
        long long kh = h / fl_group(g);
        fl_mask_at(c, b, h);
        fl_fwd_task<T, A>(c, fl_op(q, vq, b, h), fl_op(k, vk, b, kh), fl_op(v, vv, b, kh), bh,
                          qt * B, vc, out, lse, sX, sU, sP);
    }
}

// Pass 1 and 2 of the dQ kernel share this: the logits of query tile i0
// against key tile j0 into s, P into s, dropout(dP) into dp.
template <typename T, typename A>
__device__ __forceinline__ void fl_bwd_probs(const FlCall<A>& c, A (&s)[FlCfg<A>::B / 16][FlCfg<A>::B / 16],
                                             A (&dp)[FlCfg<A>::B / 16][FlCfg<A>::B / 16],
                                             const A (&lse)[FlCfg<A>::B / 16], const FlOp<T>& Q,
                                             const FlOp<T>& K, const FlOp<T>& V,
                                             const FlOp<T>& DO, long long bh, int i0, int j0, A* sX,
                                             A* sY) {
    constexpr int R = FlCfg<A>::B / 16;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    fl_dots<T, A>(s, sX, sY, Q, i0, c.lq, K, j0, c.lk, c.d);
    fl_dots<T, A>(dp, sX, sY, DO, i0, c.lq, V, j0, c.lk, c.dv);
#pragma unroll
    for (int a = 0; a < R; ++a) {
        int i = i0 + ty + 16 * a;
#pragma unroll
        for (int b = 0; b < R; ++b) {
            int j = j0 + tx + 16 * b;
            s[a][b] = fl_prob(fl_logit(c, s[a][b], i, j), lse[a]);
            dp[a][b] = fl_keep(c, bh * c.lq + i, j) ? dp[a][b] * c.dscale : (A)0;
        }
    }
}

// One dQ task: D of query tile i0 (written to delta by chunk 0 when asked),
// then, when need_dq, dQ columns [qc*OC, qc*OC + OC).
template <typename T, typename A>
__device__ __forceinline__ void fl_dq_task(const FlCall<A>& c, const FlOp<T>& Q, const FlOp<T>& K,
                                           const FlOp<T>& V, const FlOp<T>& DO, long long bh,
                                           int i0, int qc, int need_dq, int write_delta, T* dq,
                                           A* delta, const A* lse, A* sW, A* sA) {
    constexpr int B = FlCfg<A>::B, DC = FlCfg<A>::DC, OC = FlCfg<A>::OC, R = B / 16, RO = OC / 16;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    A* sX = sW;
    A* sY = sW + B * (DC + 1);
    A L[R], D[R];
#pragma unroll
    for (int a = 0; a < R; ++a) {
        int i = i0 + ty + 16 * a;
        L[a] = i < c.lq ? lse[bh * c.lq + i] : -(A)LG_INF;
        D[a] = (A)0;
    }
    int kend = c.causal ? min(c.lk, i0 + B) : c.lk;
    A s[R][R], dp[R][R], acc[R][RO];
#pragma unroll
    for (int a = 0; a < R; ++a)
#pragma unroll
        for (int o = 0; o < RO; ++o) acc[a][o] = (A)0;
    // One loop for both passes (the tile code once in the binary): pass 0
    // sums D, pass 1 accumulates dQ.
    for (int pass = 0; pass < 2; ++pass) {
        if (pass == 1) {
#pragma unroll
            for (int a = 0; a < R; ++a) {
                D[a] = fl_sum16(D[a]);
                int i = i0 + ty + 16 * a;
                if (write_delta && qc == 0 && tx == 0 && i < c.lq) delta[bh * c.lq + i] = D[a];
            }
            if (!need_dq) return;
        }
        for (int j0 = 0; j0 < kend; j0 += B) {
            fl_bwd_probs<T, A>(c, s, dp, L, Q, K, V, DO, bh, i0, j0, sX, sY);
            if (pass == 0) {
#pragma unroll
                for (int a = 0; a < R; ++a)
#pragma unroll
                    for (int b = 0; b < R; ++b) D[a] = fl_fma(s[a][b], dp[a][b], D[a]);
                continue;
            }
#pragma unroll
            for (int a = 0; a < R; ++a)
#pragma unroll
                for (int b = 0; b < R; ++b) s[a][b] = s[a][b] * (dp[a][b] - D[a]);
            fl_put(sA, s);
            fl_load<T, A, B, OC, OC + 1>(sW, K, j0, c.lk, qc * OC, c.d);
            __syncthreads();
            fl_accum(acc, sA, sW, min(B, c.lk - j0));
        }
    }
    A f[R];
#pragma unroll
    for (int a = 0; a < R; ++a) f[a] = c.scale;
    fl_store<T, A>(dq, acc, f, bh, i0, c.lq, qc * OC, c.d);
}

template <typename T>
__device__ __forceinline__ void fl_backward_dq(const FlashGeom& g, const View4& vq, const View4& vk,
                                               const View4& vv, const View4& vdo, const View4& vm,
                                               int mask_kind, int drop, unsigned long long seed,
                                               unsigned long long offset, double p,
                                               double drop_scale, int need_dq, int write_delta,
                                               T* dq, typename Acc<T>::type* delta,
                                               const typename Acc<T>::type* lse, const T* q,
                                               const T* k, const T* v, const T* dout,
                                               const void* mask) {
    typedef typename Acc<T>::type A;
    constexpr int B = FlCfg<A>::B, OC = FlCfg<A>::OC;
    // sW: the sX, sY chunks of the dot products, then the K tile of dQ.
    __shared__ A sW[fl_work_len<A>()];
    __shared__ A sA[B * (B + 1)];
    FlCall<A> c = fl_call<A>(g, vm, mask_kind, mask, drop, seed, offset, p, drop_scale);
    long long bhn = g.batch * g.heads;
    long long qtiles = (c.lq + B - 1) / B;
    long long chunks = need_dq ? max(1, (c.d + OC - 1) / OC) : 1;
    long long tasks = bhn * qtiles * chunks;
    for (long long task = blockIdx.x; task < tasks; task += gridDim.x) {
        int qc = (int)(task % chunks);
        int qt = (int)(task / chunks % qtiles);
        long long bh = task / chunks / qtiles;
        long long b = bh / g.heads, h = bh % g.heads;
        long long kh = h / fl_group(g);
        fl_mask_at(c, b, h);
        fl_dq_task<T, A>(c, fl_op(q, vq, b, h), fl_op(k, vk, b, kh), fl_op(v, vv, b, kh),
                         fl_op(dout, vdo, b, h), bh, qt * B, qc, need_dq, write_delta, dq, delta,
                         lse, sW, sA);
    }
}

// One query head's share of a dK/dV task: query head bh (index b*heads + h:
// its lse, delta and dropout rows; the call's mask points at it) against key
// tile j0 of its key/value head, added into this thread's accumulators ak
// (dK / scale) and av (dV), columns [ch*OC, ch*OC + OC). The tiles are
// transposed: rows are keys (j = j0 + ty + 16a), columns queries.
template <typename T, typename A>
__device__ __forceinline__ void fl_dkv_head(const FlCall<A>& c, const FlOp<T>& Q, const FlOp<T>& K,
                                            const FlOp<T>& V, const FlOp<T>& DO, long long bh,
                                            int j0, int ch, bool do_dk, bool do_dv,
                                            A (&ak)[FlCfg<A>::B / 16][FlCfg<A>::OC / 16],
                                            A (&av)[FlCfg<A>::B / 16][FlCfg<A>::OC / 16],
                                            const A* lse, const A* delta, A* sW, A* sA) {
    constexpr int B = FlCfg<A>::B, DC = FlCfg<A>::DC, OC = FlCfg<A>::OC, R = B / 16;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    A* sX = sW;
    A* sY = sW + B * (DC + 1);
    // Causal: query tiles wholly before the key tile see none of its keys.
    for (int i0 = c.causal ? j0 : 0; i0 < c.lq; i0 += B) {
        A s[R][R], dp[R][R];
        fl_dots<T, A>(s, sX, sY, K, j0, c.lk, Q, i0, c.lq, c.d);
        if (do_dk) fl_dots<T, A>(dp, sX, sY, V, j0, c.lk, DO, i0, c.lq, c.dv);
#pragma unroll
        for (int b = 0; b < R; ++b) {
            int i = i0 + tx + 16 * b;
            A L = i < c.lq ? lse[bh * c.lq + i] : -(A)LG_INF;
            A D = do_dk && i < c.lq ? delta[bh * c.lq + i] : (A)0;
#pragma unroll
            for (int a = 0; a < R; ++a) {
                int j = j0 + ty + 16 * a;
                bool in = i < c.lq && j < c.lk;
                A pr = fl_prob(fl_logit(c, s[a][b], i, j), L);
                bool keep = fl_keep(c, bh * c.lq + i, j);
                // s becomes dropout(P), dp becomes dS (0 outside the tensors).
                A dpd = do_dk && keep ? dp[a][b] * c.dscale : (A)0;
                dp[a][b] = in && do_dk ? pr * (dpd - D) : (A)0;
                s[a][b] = in && keep ? pr * c.dscale : (A)0;
            }
        }
        int in_n = min(B, c.lq - i0);
        if (do_dv) {
            fl_put(sA, s);
            fl_load<T, A, B, OC, OC + 1>(sW, DO, i0, c.lq, ch * OC, c.dv);
            __syncthreads();
            fl_accum(av, sA, sW, in_n);
        }
        if (do_dk) {
            fl_put(sA, dp);
            fl_load<T, A, B, OC, OC + 1>(sW, Q, i0, c.lq, ch * OC, c.d);
            __syncthreads();
            fl_accum(ak, sA, sW, in_n);
        }
    }
}

// What a dK/dV task reads of the query side: q and dO with their views,
// and lse and delta (rows of query heads).
template <typename T, typename A> struct FlQuerySide {
    const T* q;
    const T* dout;
    View4 vq, vdo;
    const A* lse;
    const A* delta;
};

// One dK/dV task: key tile j0 of key/value head kh of batch entry b, columns
// [ch*OC, ch*OC + OC) of dK (when do_dk and inside d) and of dV (likewise):
// the group's query heads kh*group .. in order, each over its query tiles,
// summed into one accumulator (a fixed order, no atomics), stored once.
template <typename T, typename A>
__device__ __forceinline__ void fl_dkv_task(FlCall<A>& c, const FlashGeom& g,
                                            const FlQuerySide<T, A>& x, const FlOp<T>& K,
                                            const FlOp<T>& V, long long b, long long kh, int j0,
                                            int ch, bool do_dk, bool do_dv, T* dk, T* dv, A* sW,
                                            A* sA) {
    constexpr int B = FlCfg<A>::B, OC = FlCfg<A>::OC, R = B / 16, RO = OC / 16;
    A ak[R][RO], av[R][RO];
#pragma unroll
    for (int a = 0; a < R; ++a)
#pragma unroll
        for (int o = 0; o < RO; ++o) ak[a][o] = av[a][o] = (A)0;
    long long group = fl_group(g);
    for (long long e = 0; e < group; ++e) {
        long long h = kh * group + e;
        fl_mask_at(c, b, h);
        fl_dkv_head<T, A>(c, fl_op(x.q, x.vq, b, h), K, V, fl_op(x.dout, x.vdo, b, h),
                          b * g.heads + h, j0, ch, do_dk, do_dv, ak, av, x.lse, x.delta, sW, sA);
    }
    long long kvh = b * g.kv_heads + kh;
    A f[R];
    if (do_dk) {
#pragma unroll
        for (int a = 0; a < R; ++a) f[a] = c.scale;
        fl_store<T, A>(dk, ak, f, kvh, j0, c.lk, ch * OC, c.d);
    }
    if (do_dv) {
#pragma unroll
        for (int a = 0; a < R; ++a) f[a] = (A)1;
        fl_store<T, A>(dv, av, f, kvh, j0, c.lk, ch * OC, c.dv);
    }
}

template <typename T>
__device__ __forceinline__ void fl_backward_dkv(const FlashGeom& g, const View4& vq,
                                                const View4& vk, const View4& vv,
                                                const View4& vdo, const View4& vm, int mask_kind,
                                                int drop, unsigned long long seed,
                                                unsigned long long offset, double p,
                                                double drop_scale, int need_dk, int need_dv,
                                                T* dk, T* dv, const typename Acc<T>::type* lse,
                                                const typename Acc<T>::type* delta, const T* q,
                                                const T* k, const T* v, const T* dout,
                                                const void* mask) {
    typedef typename Acc<T>::type A;
    constexpr int B = FlCfg<A>::B, OC = FlCfg<A>::OC;
    // sW: the sX, sY chunks of the dot products, then the dO or Q tile.
    __shared__ A sW[fl_work_len<A>()];
    __shared__ A sA[B * (B + 1)];
    FlCall<A> c = fl_call<A>(g, vm, mask_kind, mask, drop, seed, offset, p, drop_scale);
    FlQuerySide<T, A> x;
    x.q = q;
    x.dout = dout;
    x.vq = vq;
    x.vdo = vdo;
    x.lse = lse;
    x.delta = delta;
    long long kvn = g.batch * g.kv_heads;
    long long ktiles = (c.lk + B - 1) / B;
    int kc = need_dk ? (c.d + OC - 1) / OC : 0, vc = need_dv ? (c.dv + OC - 1) / OC : 0;
    long long chunks = max(kc, vc);
    long long tasks = kvn * ktiles * chunks;
    for (long long task = blockIdx.x; task < tasks; task += gridDim.x) {
        int ch = (int)(task % chunks);
        int kt = (int)(task / chunks % ktiles);
        long long kvh = task / chunks / ktiles;
        long long b = kvh / g.kv_heads, kh = kvh % g.kv_heads;
        fl_dkv_task<T, A>(c, g, x, fl_op(k, vk, b, kh), fl_op(v, vv, b, kh), b, kh, kt * B, ch,
                          ch < kc, ch < vc, dk, dv, sW, sA);
    }
}

// Parameters (flash/cuda.rs launches them in this order):
//   forward: (FlashGeom g, View4 q, k, v, mask, i32 mask_kind, i32 drop,
//     u64 seed, u64 offset, f64 p, f64 drop_scale, T* out, A* lse,
//     const T* q, k, v, const void* mask)
//   dq: (g, views q, k, v, dO, mask, mask_kind, drop, seed, offset, p,
//     drop_scale, i32 need_dq, i32 write_delta, T* dq, A* delta,
//     const A* lse, const T* q, k, v, dO, const void* mask)
//   dkv: (g, views q, k, v, dO, mask, mask_kind, drop, seed, offset, p,
//     drop_scale, i32 need_dk, i32 need_dv, T* dk, T* dv, const A* lse,
//     const A* delta, const T* q, k, v, dO, const void* mask)
#define LG_FLASH(sfx, T)                                                                      \
    extern "C" __global__ void __launch_bounds__(LG_FL_THREADS) flash_fwd_##sfx(              \
        FlashGeom g, View4 vq, View4 vk, View4 vv, View4 vm, int mask_kind, int drop,         \
        unsigned long long seed, unsigned long long offset, double p, double drop_scale,      \
        T* out, Acc<T>::type* lse, const T* q, const T* k, const T* v, const void* mask) {    \
        fl_forward<T>(g, vq, vk, vv, vm, mask_kind, drop, seed, offset, p, drop_scale, out,   \
                      lse, q, k, v, mask);                                                    \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(LG_FL_THREADS) flash_bwd_dq_##sfx(           \
        FlashGeom g, View4 vq, View4 vk, View4 vv, View4 vdo, View4 vm, int mask_kind,        \
        int drop, unsigned long long seed, unsigned long long offset, double p,               \
        double drop_scale, int need_dq, int write_delta, T* dq, Acc<T>::type* delta,          \
        const Acc<T>::type* lse, const T* q, const T* k, const T* v, const T* dout,           \
        const void* mask) {                                                                   \
        fl_backward_dq<T>(g, vq, vk, vv, vdo, vm, mask_kind, drop, seed, offset, p,           \
                          drop_scale, need_dq, write_delta, dq, delta, lse, q, k, v, dout,    \
                          mask);                                                              \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(LG_FL_THREADS) flash_bwd_dkv_##sfx(          \
        FlashGeom g, View4 vq, View4 vk, View4 vv, View4 vdo, View4 vm, int mask_kind,        \
        int drop, unsigned long long seed, unsigned long long offset, double p,               \
        double drop_scale, int need_dk, int need_dv, T* dk, T* dv, const Acc<T>::type* lse,   \
        const Acc<T>::type* delta, const T* q, const T* k, const T* v, const T* dout,         \
        const void* mask) {                                                                   \
        fl_backward_dkv<T>(g, vq, vk, vv, vdo, vm, mask_kind, drop, seed, offset, p,          \
                           drop_scale, need_dk, need_dv, dk, dv, lse, delta, q, k, v, dout,   \
                           mask);                                                             \
    }
LG_FOR_FLOATS(LG_FLASH)
