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
// - input grad  gx[i, c, pix] = sum_{co, ki, kj} W[co, c, ki, kj] * gy[i, co, tap] (M = cig, N = n*HW, K = cg*kk;
//                per stride phase, N and K divided by about the strides' product)
// - weight grad gW[co, r]     = sum_{i, l} gy[i, co, l] * cols_i[r, l] (M = cg,  N = cig*kk, K = n*L)
// Every output is one block's: a tile of C (8 to 128 rows, 64 columns), its K in steps of 16,
// each product added with one fused multiply-add in K order (f32 for the
// half types and f32, f64 for f64), so results are the same from run to
// run; or, for tiles of 16 rows or more, by tensor-core mma.sync: always
// for f16 and bf16 (exact products, f32 sums), for f32 when TF32 is
// allowed (the `_tf32` kernels, operands rounded to TF32; the default).
// The weight gradient's K (every position of the batch) may be split into
// `splits` ranges summed into `slots` partial sums (each slot's ranges one
// after another, lg_wgrad_chain), which conv_split_sum adds in order.
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
// has BM = 8*R rows (R = 16, 8, 4, 2 or 1: cuda.rs picks the smallest tile that
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

// Round to TF32 (10 explicit mantissa bits, to nearest, ties away), as an
// mma.tf32 operand.
__device__ __forceinline__ unsigned lg_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// An element as a tile holds it: widened to its arithmetic type, and for
// f32 on tensor cores (TC) rounded to TF32 here, once per gathered
// element rather than at every fragment load.
template <bool TC, typename T>
__device__ __forceinline__ typename Acc<T>::type lg_tile_load(T v) {
    if constexpr (TC && sizeof(T) == 4) {
        return __uint_as_float(lg_tf32(v));
    } else {
        return lg_load(v);
    }
}

// One block's operand tiles: a[k][m] and b[k][n] of element type T as
// the product reads them (IgTiles::E): widened to T's arithmetic type
// (f32 ones rounded to TF32 once, as gathered, on tensor cores), their
// rows padded against bank conflicts: by one 16-byte vector for the A
// tile's transposed stores; with tensor cores (TC) both by 8 floats, so
// that the fragment loads of a warp (rows k + t%4, columns r + lane/4)
// fall in 32 distinct banks. The half types on tensor cores keep their
// bits instead (the specialisation below).
template <typename T, int BM, bool TC, bool PACKED = TC && sizeof(T) == 2> struct IgTiles {
    typedef typename Acc<T>::type E;
    static constexpr int PAD_A = TC ? 8 : 16 / sizeof(E), PAD_B = TC ? 8 : 0;
    // The A gatherers of step row k start rotated by 2*(k/A_TURN) rows
    // (0: not rotated), see lg_ig_a_row.
    static constexpr int A_TURN = TC ? 4 : 0;
    __align__(16) E b[LG_IG_BK][LG_IG_BN + PAD_B];
    __align__(16) E a[LG_IG_BK][BM + PAD_A];
    __device__ static E elem(T v) { return lg_tile_load<TC>(v); }
    __device__ E& at_a(int k, int m) { return a[k][m]; }
    __device__ E& at_b(int k, int n) { return b[k][n]; }
};
// The half types on tensor cores: each element's 16 bits as loaded, rows
// k and k+1 of a column side by side in one 32-bit word, the pair an mma
// operand register holds (one shared load per register, no conversion).
// A word row is 8 words longer than the tile (8 banks apart per pair), so
// a warp's fragment loads (pair rows q and q+4, columns lane/4) take 32
// distinct banks; the A gatherers of pair rows kp and kp+4 start 2 rows
// apart (A_TURN), so that a warp's 16 stored words do too.
template <typename T, int BM> struct IgTiles<T, BM, true, true> {
    typedef unsigned short E;
    static constexpr int A_TURN = 8;
    __align__(16) E a[LG_IG_BK / 2][BM + 8][2];
    __align__(16) E b[LG_IG_BK / 2][LG_IG_BN + 8][2];
    __device__ static E elem(T v) { return *reinterpret_cast<const E*>(&v); }
    __device__ E& at_a(int k, int m) { return a[k / 2][m][k % 2]; }
    __device__ E& at_b(int k, int n) { return b[k / 2][n][k % 2]; }
    __device__ unsigned word_a(int kp, int m) const {
        return *reinterpret_cast<const unsigned*>(a[kp][m]);
    }
    __device__ unsigned word_b(int kp, int n) const {
        return *reinterpret_cast<const unsigned*>(b[kp][n]);
    }
};

// Tile element (k, m) of A (lg_put_a) or (k, n) of B (lg_put_b) := *p
// where `in`, else 0 (p is not read then).
template <typename S, typename T>
__device__ __forceinline__ void lg_put_a(S& s, int k, int m, bool in, const T* p) {
    s.at_a(k, m) = in ? S::elem(*p) : typename S::E(0);
}
template <typename S, typename T>
__device__ __forceinline__ void lg_put_b(S& s, int k, int n, bool in, const T* p) {
    s.at_b(k, n) = in ? S::elem(*p) : typename S::E(0);
}

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
template <typename T, typename A, int R>
__device__ __forceinline__ void lg_ig_mac(const IgTiles<T, 8 * R, false>& s, A (&acc)[R][4],
                                          int tm, int tn) {
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

// The TF32 tensor-core layout of a tile of BM = 8*R rows (f32 kernels with
// TF32 on, R >= 2): its 4 warps as WM x WN, each warp MI x NI fragments
// of mma.m16n8k8 (16 x 8 outputs each, MI*NI = R so that a thread holds
// the 4R accumulators of the FMA layout: acc[mi*NI + ni][e] is element e
// of fragment (mi, ni)).
template <int R> struct IgWarps {
    static constexpr int BM = 8 * R, WM = BM >= 64 ? 2 : 1, WN = 4 / WM;
    static constexpr int MI = BM / WM / 16, NI = LG_IG_BN / WN / 8;
    static_assert(MI * NI == R, "a tensor-core tile holds the FMA layout's accumulators");
};

// One mma.sync.m16n8kK: d += a (16 x K) * b (K x 8), fragments of 32-bit
// registers, f32 accumulators.
template <typename T> __device__ __forceinline__ void lg_mma(float (&d)[4], const unsigned (&a)[4],
                                                             const unsigned (&b)[2]);
template <> __device__ __forceinline__ void lg_mma<float>(float (&d)[4], const unsigned (&a)[4],
                                                          const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void lg_mma<__half>(float (&d)[4], const unsigned (&a)[4],
                                                           const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void lg_mma<__nv_bfloat16>(float (&d)[4],
                                                                  const unsigned (&a)[4],
                                                                  const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Where thread (g, q) (g = lane/4, q = lane%4) reads its mma fragment
// registers in the PTX ISA's layouts: register e of A's tile row `row` + r
// (B's column `col` + c) at the mma step's first k is a[(k + 4e)*ROW_A + r]
// (b[(k + 4e)*ROW_B + c]), a and b pointing at the tile's row q: for TF32 (m16n8k8)
// register e holds k + q + 4e (one value, rounded to TF32 as the tile was
// gathered); for the half types (m16n8k16, a tile step is one mma step)
// the pair 2q + 8e, 2q + 8e + 1, the tile's word row q + 4e.
template <typename T, int BM, bool PACKED = sizeof(T) == 2> struct IgFrags {
    static constexpr int ROW_A = BM + 8, ROW_B = LG_IG_BN + 8;
    const unsigned *a, *b;
    __device__ IgFrags(const IgTiles<T, BM, true>& s, int q, int row, int col)
        : a(reinterpret_cast<const unsigned*>(&s.a[q][row])),
          b(reinterpret_cast<const unsigned*>(&s.b[q][col])) {}
};
template <typename T, int BM> struct IgFrags<T, BM, true> {
    static constexpr int ROW_A = BM + 8, ROW_B = LG_IG_BN + 8;
    const unsigned *a, *b;
    __device__ IgFrags(const IgTiles<T, BM, true>& s, int q, int row, int col)
        : a(reinterpret_cast<const unsigned*>(s.a[q][row])),
          b(reinterpret_cast<const unsigned*>(s.b[q][col])) {}
};

// acc += the tile's product over its 16 k on tensor cores: per k step of
// mma (8 for TF32, 16 for the half types) MI*NI mma.sync per warp (the PTX
// ISA's layouts: A holds rows g and g+8, B column g, C rows g and g+8 at
// columns 2q and 2q+1).
template <typename T, int R>
__device__ __forceinline__ void lg_ig_mma(const IgTiles<T, 8 * R, true>& s, float (&acc)[R][4],
                                          int t) {
    typedef IgWarps<R> W;
    typedef IgFrags<T, 8 * R> F;
    constexpr int MMA_K = sizeof(T) == 2 ? 16 : 8;
    const int warp = t / 32;
    const int m0 = warp / W::WN * (W::BM / W::WM), n0 = warp % W::WN * (LG_IG_BN / W::WN);
    const F f(s, t % 4, m0 + t % 32 / 4, n0 + t % 32 / 4);
#pragma unroll
    for (int k = 0; k < LG_IG_BK; k += MMA_K) {
        unsigned a[W::MI][4], b[W::NI][2];
#pragma unroll
        for (int mi = 0; mi < W::MI; ++mi) {
            // Registers 0 and 1: rows g and g+8 of the first k half; 2, 3 the second.
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const unsigned* at = f.a + (k + 4 * e) * F::ROW_A + mi * 16;
                a[mi][2 * e] = at[0];
                a[mi][2 * e + 1] = at[8];
            }
        }
#pragma unroll
        for (int ni = 0; ni < W::NI; ++ni) {
#pragma unroll
            for (int e = 0; e < 2; ++e) b[ni][e] = f.b[(k + 4 * e) * F::ROW_B + ni * 8];
        }
#pragma unroll
        for (int mi = 0; mi < W::MI; ++mi) {
#pragma unroll
            for (int ni = 0; ni < W::NI; ++ni) lg_mma<T>(acc[mi * W::NI + ni], a[mi], b[ni]);
        }
    }
}

// The tile row and column of thread t's accumulator acc[i][j].
template <int R, bool TC> __device__ __forceinline__ int lg_acc_row(int t, int i, int j) {
    if constexpr (TC) {
        typedef IgWarps<R> W;
        return t / 32 / W::WN * (W::BM / W::WM) + i / W::NI * 16 + t % 32 / 4 + j / 2 * 8;
    } else {
        return t / 16 * R + i;
    }
}
template <int R, bool TC> __device__ __forceinline__ int lg_acc_col(int t, int i, int j) {
    if constexpr (TC) {
        typedef IgWarps<R> W;
        return t / 32 % W::WN * (LG_IG_BN / W::WN) + i % W::NI * 8 + t % 4 * 2 + j % 2;
    } else {
        return t % 16 * 4 + j;
    }
}

// acc += the tile's product: tensor cores or fused multiply-adds.
template <typename T, typename A, int R, bool TC>
__device__ __forceinline__ void lg_ig_product(const IgTiles<T, 8 * R, TC>& s, A (&acc)[R][4],
                                              int t) {
    if constexpr (TC) {
        lg_ig_mma<T, R>(s, acc, t);
    } else {
        lg_ig_mac<T, A, R>(s, acc, t / 16 * R, t % 16 * 4);
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

// Where the columns of a tile land in an [n, c, plane] output: column q is
// position u*row + v (u = rest / row, v = rest % row) of item q / per_item
// (rest = q % per_item), at plane offset at0 + u*du + v*dv.
struct IgCols {
    long long per_item, row, at0, du, dv;
};

// How many distinct tile columns a thread's accumulators cover (2*NI with
// tensor cores, 4 without), which of them acc[i][j] is in, and its column.
template <int R, bool TC> __device__ __forceinline__ constexpr int lg_acc_ncols() {
    if constexpr (TC) {
        return 2 * IgWarps<R>::NI;
    } else {
        return 4;
    }
}
template <int R, bool TC> __device__ __forceinline__ int lg_acc_col_index(int i, int j) {
    if constexpr (TC) {
        return i % IgWarps<R>::NI * 2 + j % 2;
    } else {
        return j;
    }
}
template <int R, bool TC> __device__ __forceinline__ int lg_acc_col_at(int t, int k) {
    if constexpr (TC) {
        return lg_acc_col<R, TC>(t, k / 2, k % 2);
    } else {
        return lg_acc_col<R, TC>(t, 0, k);
    }
}

// The same for rows: how many distinct tile rows a thread's accumulators
// cover (2*MI with tensor cores, R without), which of them acc[i][j] is
// in, and its row.
template <int R, bool TC> __device__ __forceinline__ constexpr int lg_acc_nrows() {
    if constexpr (TC) {
        return 2 * IgWarps<R>::MI;
    } else {
        return R;
    }
}
template <int R, bool TC> __device__ __forceinline__ int lg_acc_row_index(int i, int j) {
    if constexpr (TC) {
        return i / IgWarps<R>::NI * 2 + j / 2;
    } else {
        return i;
    }
}
template <int R, bool TC> __device__ __forceinline__ int lg_acc_row_at(int t, int r) {
    if constexpr (TC) {
        return lg_acc_row<R, TC>(t, r / 2 * IgWarps<R>::NI, r % 2 * 2);
    } else {
        return lg_acc_row<R, TC>(t, r, 0);
    }
}

// Stores a tile of products into out ([n, c, plane], the tile's rows the
// channels grp*rows + m of its group, m < rows, its columns the positions
// q < P of the batch placed by `cols`), each added to bias[channel] when
// there is a bias. Each of the thread's distinct columns is placed once
// (its item and plane offset by multiply-highs where every index fits 31
// bits, else by 64-bit divisions); its elements are then whole planes apart.
template <typename T, int R, bool TC>
__device__ __forceinline__ void lg_ig_store_nchw(T* out, const T* bias,
                                                 const typename Acc<T>::type (&acc)[R][4],
                                                 IgTile tile, int t, long long rows,
                                                 long long c, long long plane, long long P,
                                                 IgCols cols) {
    constexpr int NC = lg_acc_ncols<R, TC>();
    long long at[NC];
    bool ok[NC];
    const long long most = 1LL << 31;
    if (P < most && cols.per_item < most && cols.row < most) {
        const LgDiv by_item = lg_div_make((unsigned int)cols.per_item);
        const LgDiv by_row = lg_div_make((unsigned int)cols.row);
#pragma unroll
        for (int k = 0; k < NC; ++k) {
            long long q = tile.n0 + lg_acc_col_at<R, TC>(t, k);
            ok[k] = q < P;
            unsigned int qq = ok[k] ? (unsigned int)q : 0u;
            unsigned int item = lg_div(by_item, qq), rest = qq - item * (unsigned int)cols.per_item;
            unsigned int u = lg_div(by_row, rest), v = rest - u * (unsigned int)cols.row;
            at[k] = (long long)item * c * plane + cols.at0 + u * cols.du + v * cols.dv;
        }
    } else {
#pragma unroll
        for (int k = 0; k < NC; ++k) {
            long long q = tile.n0 + lg_acc_col_at<R, TC>(t, k);
            ok[k] = q < P;
            long long item = q / cols.per_item, rest = q % cols.per_item;
            at[k] = item * c * plane + cols.at0 + rest / cols.row * cols.du +
                    rest % cols.row * cols.dv;
        }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const int k = lg_acc_col_index<R, TC>(i, j);
            long long m = tile.m0 + lg_acc_row<R, TC>(t, i, j);
            if (!ok[k] || m >= rows) continue;
            long long ch = tile.grp * rows + m;
            typename Acc<T>::type v = bias ? lg_load(bias[ch]) + acc[i][j] : acc[i][j];
            out[at[k] + ch * plane] = lg_store<T>(v);
        }
    }
}

// The first of the A rows thread t gathers (its others 8, 16, … further):
// the 16 threads of one k take the 8 row offsets twice, and where a
// tile's k rows are a multiple of 8 banks apart (IgTiles::A_TURN) the two
// warps' halves are rotated by 2*(k/A_TURN) so that a warp's 32 stores
// land in distinct banks.
template <typename S> __device__ __forceinline__ int lg_ig_a_row(int t) {
    const int apart = LG_IG_THREADS / LG_IG_BK;
    if constexpr (S::A_TURN > 0) {
        return (t / LG_IG_BK + 2 * (t % LG_IG_BK / S::A_TURN)) % apart;
    } else {
        return t / LG_IG_BK;
    }
}

// The A rows thread t gathers in a tile whose rows start at m0 (the same
// for every K step, so computed once per tile): rows m0 + lg_ig_a_row(t)
// + 8i (i < R), at element that row * stride + i * step of the source;
// the first `valid` of them lie before `rows`.
template <int R> struct IgRows {
    long long off, step;
    int valid;
};
template <typename S, int R>
__device__ __forceinline__ IgRows<R> lg_ig_rows(long long m0, long long rows, long long stride,
                                                int t) {
    const int apart = LG_IG_THREADS / LG_IG_BK;
    long long m = m0 + lg_ig_a_row<S>(t), left = rows > m ? (rows - m + apart - 1) / apart : 0;
    return IgRows<R>{m * stride, apart * stride, (int)(left < R ? left : R)};
}

// The A tile of a step: a[k][m] = src[start + the row's offset] for its
// rows and steps k < ks (start: this thread's step k's row start), 0
// elsewhere. Each row's element is one `step` past the last (a pointer
// increment, not a product, per element).
template <typename T, int R, bool TC>
__device__ __forceinline__ void lg_ig_gather_a(IgTiles<T, 8 * R, TC>& s, const T* src,
                                               long long start, const IgRows<R>& rows,
                                               long long ks, int t) {
    typedef IgTiles<T, 8 * R, TC> S;
    const int kq = t % LG_IG_BK, m = lg_ig_a_row<S>(t), apart = LG_IG_THREADS / LG_IG_BK;
    const T* p = src + start + rows.off;
    if (kq < ks && rows.valid == R) {
#pragma unroll
        for (int i = 0; i < R; ++i, p += rows.step) s.at_a(kq, m + apart * i) = S::elem(*p);
    } else {
#pragma unroll
        for (int i = 0; i < R; ++i, p += rows.step) {
            bool ok = kq < ks && i < rows.valid;
            lg_put_a(s, kq, m + apart * i, ok, p);
        }
    }
}

// The B rows t / LG_IG_BN + j * (LG_IG_THREADS / LG_IG_BN) of thread t's
// column in a uniform step: src[0], src[step], src[2*step], … where the
// step's tap reaches inside (`in`), zeros elsewhere.
template <typename T, int R, bool TC>
__device__ __forceinline__ void lg_ig_gather_b(IgTiles<T, 8 * R, TC>& s, const T* src,
                                               long long step, bool in, int t) {
    typedef IgTiles<T, 8 * R, TC> S;
    const int n = t % LG_IG_BN, k = t / LG_IG_BN, apart = LG_IG_THREADS / LG_IG_BN;
    if (in) {
#pragma unroll
        for (int j = 0; j < LG_IG_B_LOADS; ++j, src += step) {
            s.at_b(k + apart * j, n) = S::elem(*src);
        }
    } else {
#pragma unroll
        for (int j = 0; j < LG_IG_B_LOADS; ++j) lg_put_b(s, k + apart * j, n, false, src);
    }
}

// acc += one tap's uniform steps (lg_conv_fwd, lg_conv_dgrad): its
// `channels` rows of K, LG_IG_BK per step; A from wp, whose rows are
// `a_next` elements apart; B (where the tap reaches inside, `in`) from bp,
// whose rows are `b_next` apart (this thread's rows `b_rows` apart).
template <typename T, typename A, int R, bool TC>
__device__ __forceinline__ void lg_ig_tap_steps(IgTiles<T, 8 * R, TC>& s, A (&acc)[R][4],
                                                const IgRows<R>& arows, const T* wp,
                                                long long a_next, const T* bp, long long b_rows,
                                                long long b_next, bool in, long long channels,
                                                int t) {
    for (long long c0 = 0; c0 < channels; c0 += LG_IG_BK) {
        lg_ig_gather_a<T, R, TC>(s, wp, 0, arows, LG_IG_BK, t);
        lg_ig_gather_b<T, R, TC>(s, bp, b_rows, in, t);
        wp += LG_IG_BK * a_next, bp += LG_IG_BK * b_next;
        __syncthreads();
        lg_ig_product<T, A, R, TC>(s, acc, t);
        __syncthreads();
    }
}

// y ([n, cout, oh, ow]) = bias + W (*) x, every element written. K runs
// tap-major (row r = tap*cig + c, tap = ki*kw + kj), so that where cig is a
// multiple of LG_IG_BK (`uniform`) every step's rows share one tap: each
// thread then tests its column against a tap once, for all of the tap's
// steps, and gathers its elements one input plane apart through pointers
// that move on by LG_IG_BK channels per step, with no table. Otherwise a
// table of the step's rows (LG_IG_BK threads, divisions) serves every
// thread.
template <typename T, int R, bool TC>
__device__ void lg_conv_fwd(const ConvGeom& g, T* y, const T* x, const T* w, const T* bias) {
    typedef typename Acc<T>::type A;
    __shared__ IgTiles<T, 8 * R, TC> s;
    __shared__ long long tab_w[LG_IG_BK], tab_off[LG_IG_BK];
    __shared__ long long tab_dy[LG_IG_BK], tab_dx[LG_IG_BK];
    const long long kk = g.kh * g.kw, L = g.oh * g.ow, HW = g.h * g.w;
    const long long cig = g.cin / g.groups, cg = g.cout / g.groups;
    const long long K = cig * kk, P = g.n * L;
    const long long tiles_m = (cg + 8 * R - 1) / (8 * R);
    const long long tiles_n = (P + LG_IG_BN - 1) / LG_IG_BN;
    const bool uniform = cig % LG_IG_BK == 0;
    // A thread's B rows are t / LG_IG_BN + j * B_STEP (j < LG_IG_B_LOADS).
    const int B_STEP = LG_IG_THREADS / LG_IG_BN;
    const int t = threadIdx.x;
    for (long long b = blockIdx.x; b < g.groups * tiles_m * tiles_n; b += gridDim.x) {
        IgTile tile = lg_ig_tile(b, tiles_m, tiles_n, 8 * R);
        // The column this thread gathers: position p of the batch.
        long long p = tile.n0 + t % LG_IG_BN;
        bool p_ok = p < P;
        long long l = p_ok ? p % L : 0, item = p_ok ? p / L : 0;
        long long iy0 = l / g.ow * g.stride[0] - g.pad[0];
        long long ix0 = l % g.ow * g.stride[1] - g.pad[1];
        long long xbase = (item * g.cin + tile.grp * cig) * HW + iy0 * g.w + ix0;
        const long long xrow = xbase + t / LG_IG_BN * HW, xstep = B_STEP * HW;
        const IgRows<R> arows = lg_ig_rows<decltype(s), R>(tile.m0, cg, K, t);
        const long long wbase = tile.grp * cg * K;
        A acc[R][4] = {};
        for (long long ki = 0; uniform && ki < g.kh; ++ki) {
            for (long long kj = 0; kj < g.kw; ++kj) {
                const long long dy = ki * g.dil[0], dx = kj * g.dil[1];
                const bool in = p_ok && lg_inside(iy0 + dy, g.h) && lg_inside(ix0 + dx, g.w);
                const T* wp = w + wbase + t % LG_IG_BK * kk + ki * g.kw + kj;
                const T* xp = x + xrow + dy * g.w + dx;
                lg_ig_tap_steps<T, A, R, TC>(s, acc, arows, wp, kk, xp, xstep, HW, in, cig, t);
            }
        }
        // Otherwise a table of the step's rows.
        for (long long k0 = 0; !uniform && k0 < K; k0 += LG_IG_BK) {
            if (t < LG_IG_BK) {
                long long r = k0 + t, tap = r / cig, c = r % cig;
                long long dy = tap / g.kw * g.dil[0], dx = tap % g.kw * g.dil[1];
                tab_w[t] = r < K ? c * kk + tap : 0;
                tab_dy[t] = r < K ? dy : LG_IG_OUTSIDE;
                tab_dx[t] = dx;
                tab_off[t] = c * HW + dy * g.w + dx;
            }
            __syncthreads();
            lg_ig_gather_a<T, R, TC>(s, w, wbase + tab_w[t % LG_IG_BK], arows, K - k0, t);
#pragma unroll
            for (int j = 0; j < LG_IG_B_LOADS; ++j) {
                int kq = t / LG_IG_BN + B_STEP * j;
                long long iy = iy0 + tab_dy[kq], ix = ix0 + tab_dx[kq];
                bool in = p_ok && lg_inside(iy, g.h) && lg_inside(ix, g.w);
                lg_put_b(s, kq, t % LG_IG_BN, in, x + (xbase + tab_off[kq]));
            }
            __syncthreads();
            lg_ig_product<T, A, R, TC>(s, acc, t);
            __syncthreads();
        }
        lg_ig_store_nchw<T, R, TC>(y, bias, acc, tile, t, cg, g.cout, L, P, IgCols{L, L, 0, 0, 1});
    }
}

// One axis of a stride phase of the input gradient. The input coordinates
// i with (i + pad) % stride == q (the phase) are first + u*stride for
// u < count; only the taps k with (k*dil) % stride == q reach them (`taps`
// of them), and tap k of coordinate u reads output coordinate
// base + u - (k*dil - q)/stride.
struct IgAxisPhase {
    long long first, count, taps, base;
};
__device__ __forceinline__ IgAxisPhase lg_axis_phase(long long len, long long k, long long s,
                                                     long long p, long long d, long long q) {
    IgAxisPhase a;
    if (s == 1) {  // every coordinate, every tap: no divisions (most layers)
        a.first = 0, a.count = len, a.taps = k, a.base = p;
        return a;
    }
    a.first = ((q - p) % s + s) % s;
    a.count = a.first < len ? (len - a.first + s - 1) / s : 0;
    a.taps = 0;
    for (long long ki = 0; ki < k; ++ki) a.taps += (ki * d) % s == q;
    // first + p - q is a multiple of s and not negative (first + p ≡ q).
    a.base = (a.first + p - q) / s;
    return a;
}
// (k*dil - q)/stride for the j-th tap k of phase q (see IgAxisPhase) and
// that tap's k in `k_out`.
__device__ __forceinline__ long long lg_axis_tap(long long j, long long k, long long s,
                                                 long long d, long long q, long long& k_out) {
    if (s == 1) {  // the j-th tap is tap j
        k_out = j;
        return j * d;
    }
    long long ki = 0;
    for (long long seen = 0; ki < k; ++ki) {
        if ((ki * d) % s == q && seen++ == j) break;
    }
    k_out = ki;
    return (ki * d - q) / s;
}

// gx ([n, cin, h, w]) = bias + the transposed convolution of gy by W (the
// input gradient; `bias`, per input channel, only for conv_transpose2d),
// every element written. The input positions are taken one stride phase
// at a time ((iy + pad) % stride, (ix + pad) % stride): each phase is a
// dense product with only the taps that reach it (K = cg * taps_y *
// taps_x), so a stride-2 layer does not multiply the three quarters of
// its taps that fall between output positions. Blocks enumerate (phase,
// group, tile) with every phase given the tiles of the largest one. K runs
// tap-major (row r = tap*cg + co), uniform steps as in lg_conv_fwd where
// cg is a multiple of LG_IG_BK.
template <typename T, int R, bool TC>
__device__ void lg_conv_dgrad(const ConvGeom& g, T* gx, const T* gy, const T* w, const T* bias) {
    typedef typename Acc<T>::type A;
    __shared__ IgTiles<T, 8 * R, TC> s;
    __shared__ long long tab_w[LG_IG_BK], tab_gy[LG_IG_BK];
    __shared__ long long tab_dy[LG_IG_BK], tab_dx[LG_IG_BK];
    const long long sy = g.stride[0], sx = g.stride[1];
    const long long kk = g.kh * g.kw, L = g.oh * g.ow, HW = g.h * g.w;
    const long long cig = g.cin / g.groups, cg = g.cout / g.groups, Kw = cig * kk;
    const long long tiles_m = (cig + 8 * R - 1) / (8 * R);
    const long long most = g.n * ((g.h + sy - 1) / sy) * ((g.w + sx - 1) / sx);
    const long long tiles_n = (most + LG_IG_BN - 1) / LG_IG_BN;
    const long long per_phase = g.groups * tiles_m * tiles_n;
    const bool uniform = cg % LG_IG_BK == 0;
    const int B_STEP = LG_IG_THREADS / LG_IG_BN;
    const int t = threadIdx.x;
    for (long long b = blockIdx.x; b < sy * sx * per_phase; b += gridDim.x) {
        // One phase (stride 1, most layers): no divisions for it.
        const bool phased = sy * sx > 1;
        const long long phase = phased ? b / per_phase : 0;
        const long long qy = phased ? phase / sx : 0, qx = phased ? phase % sx : 0;
        const IgAxisPhase py = lg_axis_phase(g.h, g.kh, sy, g.pad[0], g.dil[0], qy);
        const IgAxisPhase px = lg_axis_phase(g.w, g.kw, sx, g.pad[1], g.dil[1], qx);
        const long long plane = py.count * px.count, P = g.n * plane;
        const long long taps = py.taps * px.taps, K = cg * taps;
        IgTile tile = lg_ig_tile(b - phase * per_phase, tiles_m, tiles_n, 8 * R);
        if (tile.n0 >= P) continue;  // this phase has fewer tiles
        // The input position this thread gathers taps for: (u, v) of the phase.
        long long p = tile.n0 + t % LG_IG_BN;
        bool p_ok = p < P;
        long long at = p_ok ? p % plane : 0, item = p_ok ? p / plane : 0;
        long long oy0 = py.base + at / px.count, ox0 = px.base + at % px.count;
        long long gybase = (item * g.cout + tile.grp * cg) * L + oy0 * g.ow + ox0;
        const long long gyrow = gybase + t / LG_IG_BN * L, gystep = B_STEP * L;
        const IgRows<R> arows = lg_ig_rows<decltype(s), R>(tile.m0, cig, kk, t);
        A acc[R][4] = {};
        // Uniform steps, the phase's taps (jy, jx) in turn: kernel tap
        // (ki, kj), output offset (my, mx), as in lg_conv_fwd.
        for (long long jy = 0; uniform && jy < py.taps; ++jy) {
            long long ki, kj;
            const long long my = lg_axis_tap(jy, g.kh, sy, g.dil[0], qy, ki);
            for (long long jx = 0; jx < px.taps; ++jx) {
                const long long mx = lg_axis_tap(jx, g.kw, sx, g.dil[1], qx, kj);
                const bool in = p_ok && lg_inside(oy0 - my, g.oh) && lg_inside(ox0 - mx, g.ow);
                const T* wp = w + (tile.grp * cg + t % LG_IG_BK) * Kw + ki * g.kw + kj;
                const T* gp = gy + gyrow - my * g.ow - mx;
                lg_ig_tap_steps<T, A, R, TC>(s, acc, arows, wp, Kw, gp, gystep, L, in, cg, t);
            }
        }
        // Otherwise a table of the step's rows.
        for (long long k0 = 0; !uniform && k0 < K; k0 += LG_IG_BK) {
            if (t < LG_IG_BK) {
                long long r = k0 + t, tap = r / cg, co = r % cg, tki, tkj;
                long long tmy = lg_axis_tap(tap / px.taps, g.kh, sy, g.dil[0], qy, tki);
                long long tmx = lg_axis_tap(tap % px.taps, g.kw, sx, g.dil[1], qx, tkj);
                tab_w[t] = (tile.grp * cg + co) * Kw + tki * g.kw + tkj;
                tab_gy[t] = co * L - tmy * g.ow - tmx;
                tab_dy[t] = r < K ? tmy : -LG_IG_OUTSIDE;
                tab_dx[t] = tmx;
            }
            __syncthreads();
            lg_ig_gather_a<T, R, TC>(s, w, tab_w[t % LG_IG_BK], arows, K - k0, t);
#pragma unroll
            for (int j = 0; j < LG_IG_B_LOADS; ++j) {
                int kq = t / LG_IG_BN + B_STEP * j;
                long long oy = oy0 - tab_dy[kq], ox = ox0 - tab_dx[kq];
                bool in = p_ok && lg_inside(oy, g.oh) && lg_inside(ox, g.ow);
                lg_put_b(s, kq, t % LG_IG_BN, in, gy + (gybase + tab_gy[kq]));
            }
            __syncthreads();
            lg_ig_product<T, A, R, TC>(s, acc, t);
            __syncthreads();
        }
        IgCols cols{plane, px.count, py.first * g.w + px.first, sy * g.w, sx};
        lg_ig_store_nchw<T, R, TC>(gx, bias, acc, tile, t, cig, g.cin, HW, P, cols);
    }
}

// Whether every one of v is true.
template <int N> __device__ __forceinline__ bool lg_all(const bool (&v)[N]) {
    bool all = true;
#pragma unroll
    for (int i = 0; i < N; ++i) all = all && v[i];
    return all;
}

// A step's A elements of one thread in lg_dgrad_phase_rows_steps (rows
// m + 8i of step row kq) or its B elements (rows t / LG_IG_BN + 2j of
// column t % LG_IG_BN): *at[i] where in[i] (every one when ALL, with no
// test each), 0 elsewhere; each pointer then moves on by `step`.
template <bool ALL, typename S, typename T, int R>
__device__ __forceinline__ void lg_phase_rows_put_a(S& s, int kq, int m, const bool (&in)[R],
                                                    const T* (&at)[R], long long step) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
        lg_put_a(s, kq, m + LG_IG_THREADS / LG_IG_BK * i, ALL || in[i], at[i]);
        at[i] += step;
    }
}
template <bool ALL, typename S, typename T>
__device__ __forceinline__ void lg_phase_rows_put_b(S& s, int t, const bool (&in)[LG_IG_B_LOADS],
                                                    const T* (&at)[LG_IG_B_LOADS],
                                                    long long step) {
#pragma unroll
    for (int j = 0; j < LG_IG_B_LOADS; ++j) {
        const int k = t / LG_IG_BN + LG_IG_THREADS / LG_IG_BN * j;
        lg_put_b(s, k, t % LG_IG_BN, ALL || in[j], at[j]);
        at[j] += step;
    }
}

// The K steps of lg_conv_dgrad_phase_rows where one step of LG_IG_BK rows
// holds whole channels (LG_IG_BK a multiple of the dys*dxs output offsets,
// as the 7x7/2 stem's 16): every row of a step keeps its offset from step
// to step and only its channel moves on, so each thread finds its
// elements' offsets and bounds once (not per step from shared tables) and
// walks its pointers by whole channels. The same products in the same
// order as the general loop (the same bits). `gy` points at the tile
// column's (item, group, u, v); the a_* arrays are the caller's per-row
// weight base, phase and phase base.
template <typename T, typename A, int R, bool TC>
__device__ __forceinline__ void lg_dgrad_phase_rows_steps(
    const ConvGeom& g, IgTiles<T, 8 * R, TC>& s, A (&acc)[R][4], const T* gy, bool p_ok,
    long long u, long long v, long long dy_max, long long dys, long long dx_max, long long dxs,
    const T* w, const long long (&a_w)[R], const long long (&a_qy)[R],
    const long long (&a_qx)[R], const long long (&a_by)[R], const long long (&a_bx)[R],
    const bool (&a_ok)[R]) {
    // offsets divides LG_IG_BK (16), so it and dxs are powers of two:
    // shifts and masks, not divisions.
    const int t = threadIdx.x, offsets = (int)(dys * dxs), per_step = LG_IG_BK / offsets;
    const int o_bits = __popc(offsets - 1), x_bits = __popc((int)dxs - 1);
    const long long L = g.oh * g.ow, kk = g.kh * g.kw;
    const long long cg = g.cout / g.groups, Kw = g.cin / g.groups * kk;
    // B: element j of this thread is row kq = channel kq / offsets of the
    // step, offset kq % offsets: (dy, dx), inside or not for every step.
    const T* b_at[LG_IG_B_LOADS];
    int b_co[LG_IG_B_LOADS];
    bool b_in[LG_IG_B_LOADS];
#pragma unroll
    for (int j = 0; j < LG_IG_B_LOADS; ++j) {
        int kq = t / LG_IG_BN + LG_IG_THREADS / LG_IG_BN * j, o = kq & (offsets - 1);
        long long dy = dy_max - (o >> x_bits), dx = dx_max - (o & (dxs - 1));
        b_co[j] = kq >> o_bits;
        b_in[j] = p_ok && lg_inside(u + dy, g.oh) && lg_inside(v + dx, g.ow);
        b_at[j] = gy + (b_in[j] ? b_co[j] * L + dy * g.ow + dx : 0);
    }
    // A: row mq of this thread's R rows, step row kq = t % LG_IG_BK.
    const int kq = t % LG_IG_BK, a_co = kq >> o_bits, o = kq & (offsets - 1);
    const long long ady = dy_max - (o >> x_bits), adx = dx_max - (o & (dxs - 1));
    const T* a_at[R];
    bool a_in[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
        long long ki = a_qy[i] + (a_by[i] - ady) * g.stride[0];
        long long kj = a_qx[i] + (a_bx[i] - adx) * g.stride[1];
        a_in[i] = a_ok[i] && lg_inside(ki, g.kh) && lg_inside(kj, g.kw);
        a_at[i] = w + (a_in[i] ? a_w[i] + a_co * Kw + ki * g.kw + kj : 0);
    }
    // Whole steps, then the rows of a last step past the last channel as 0.
    const long long full = cg / per_step, b_step = per_step * L, a_step = per_step * Kw;
    const int left = (int)(cg - full * per_step);
    // Whether all of the warp's A (B) elements are inside: then the warp
    // gathers them with no test each (most warps, away from the borders).
    bool a_all = __all_sync(0xffffffffu, lg_all(a_in));
    bool b_all = __all_sync(0xffffffffu, lg_all(b_in));
    for (long long step = 0; step < full + (left > 0); ++step) {
        if (step == full) {
#pragma unroll
            for (int i = 0; i < R; ++i) a_in[i] = a_in[i] && a_co < left;
#pragma unroll
            for (int j = 0; j < LG_IG_B_LOADS; ++j) b_in[j] = b_in[j] && b_co[j] < left;
            a_all = __all_sync(0xffffffffu, lg_all(a_in));
            b_all = __all_sync(0xffffffffu, lg_all(b_in));
        }
        const int m = lg_ig_a_row<IgTiles<T, 8 * R, TC>>(t);
        if (a_all) {
            lg_phase_rows_put_a<true>(s, kq, m, a_in, a_at, a_step);
        } else {
            lg_phase_rows_put_a<false>(s, kq, m, a_in, a_at, a_step);
        }
        if (b_all) {
            lg_phase_rows_put_b<true>(s, t, b_in, b_at, b_step);
        } else {
            lg_phase_rows_put_b<false>(s, t, b_in, b_at, b_step);
        }
        __syncthreads();
        lg_ig_product<T, A, R, TC>(s, acc, t);
        __syncthreads();
    }
}

// Stores the phase-rows input gradient's tile: row (c, q) of a group,
// column (item, u, v) of the P = n*U*V phase positions, at input
// (first_qy + u*sy, first_qx + v*sx), each added to bias[channel] when
// there is one. Each of the thread's distinct rows and columns is placed
// once (their divisions are not repeated per output).
template <typename T, int R, bool TC>
__device__ __forceinline__ void lg_phase_rows_store(T* gx, const T* bias,
                                                    const typename Acc<T>::type (&acc)[R][4],
                                                    IgTile tile, int t, const ConvGeom& g,
                                                    long long P, long long V) {
    typedef typename Acc<T>::type A;
    const long long sy = g.stride[0], sx = g.stride[1], S = sy * sx, HW = g.h * g.w;
    const long long cig = g.cin / g.groups, rows = cig * S, U = (g.h + sy - 1) / sy;
    constexpr int NR = lg_acc_nrows<R, TC>(), NC = lg_acc_ncols<R, TC>();
    long long r_ch[NR], r_fy[NR], r_fx[NR];
    bool r_ok[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) {
        long long m = tile.m0 + lg_acc_row_at<R, TC>(t, r);
        r_ok[r] = m < rows;
        long long c = m / S, q = m % S, qy = q / sx, qx = q % sx;
        r_ch[r] = tile.grp * cig + c;
        r_fy[r] = ((qy - g.pad[0]) % sy + sy) % sy;
        r_fx[r] = ((qx - g.pad[1]) % sx + sx) % sx;
    }
    long long c_at[NC], c_y[NC], c_x[NC];
    bool c_ok[NC];
#pragma unroll
    for (int k = 0; k < NC; ++k) {
        long long col = tile.n0 + lg_acc_col_at<R, TC>(t, k);
        c_ok[k] = col < P;
        long long ci = col / (U * V), ca = col % (U * V);
        c_y[k] = ca / V * sy, c_x[k] = ca % V * sx;
        c_at[k] = ci * g.cin * HW;
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int r = lg_acc_row_index<R, TC>(i, j), k = lg_acc_col_index<R, TC>(i, j);
            long long iy = r_fy[r] + c_y[k], ix = r_fx[r] + c_x[k];
            if (!r_ok[r] || !c_ok[k] || iy >= g.h || ix >= g.w) continue;
            A val = bias ? lg_load(bias[r_ch[r]]) + acc[i][j] : acc[i][j];
            gx[c_at[k] + r_ch[r] * HW + iy * g.w + ix] = lg_store<T>(val);
        }
    }
}

// The input gradient with the stride phases as rows instead (for few input
// channels, where a phase's product would fill few rows of its tiles;
// dilation 1): row m of a group is channel m / S of phase m % S (S = sy*sx
// phases, q = qy*sx + qx), column (item, u, v) is that phase's input
// position (first_qy + u*sy, first_qx + v*sx), and K runs over (co, jy, jx)
// for the output offsets dy = dy_max - jy (dys of them; same for x) that
// some phase's tap reads: position (u, v) of every phase reads gy at
// (u + dy, v + dx), so one gathered B tile serves all phases. A row's A is
// W at the tap k = q + (base_q - d)*stride of its phase, 0 where there is
// none, so each row sums only its own taps (channel-major, where
// lg_conv_dgrad runs tap-major).
template <typename T, int R, bool TC>
__device__ void lg_conv_dgrad_phase_rows(const ConvGeom& g, long long dy_max, long long dys,
                                     long long dx_max, long long dxs, T* gx, const T* gy,
                                     const T* w, const T* bias) {
    typedef typename Acc<T>::type A;
    __shared__ IgTiles<T, 8 * R, TC> s;
    __shared__ long long tab_co[LG_IG_BK], tab_gy[LG_IG_BK];
    __shared__ long long tab_dy[LG_IG_BK], tab_dx[LG_IG_BK];
    const long long sy = g.stride[0], sx = g.stride[1], S = sy * sx;
    const long long kk = g.kh * g.kw, L = g.oh * g.ow, HW = g.h * g.w;
    const long long cig = g.cin / g.groups, cg = g.cout / g.groups, Kw = cig * kk;
    const long long rows = cig * S, U = (g.h + sy - 1) / sy, V = (g.w + sx - 1) / sx;
    const long long P = g.n * U * V;
    const long long tiles_m = (rows + 8 * R - 1) / (8 * R);
    const long long tiles_n = (P + LG_IG_BN - 1) / LG_IG_BN;
    const int t = threadIdx.x;
    for (long long b = blockIdx.x; b < g.groups * tiles_m * tiles_n; b += gridDim.x) {
        IgTile tile = lg_ig_tile(b, tiles_m, tiles_n, 8 * R);
        long long K = cg * dys * dxs;
        // The rows this thread gathers A for: channel, phase and base.
        long long a_w[R], a_qy[R], a_qx[R], a_by[R], a_bx[R];
        bool a_ok[R];
#pragma unroll
        for (int i = 0; i < R; ++i) {
            long long m = tile.m0 + lg_ig_a_row<decltype(s)>(t) + LG_IG_THREADS / LG_IG_BK * i;
            a_ok[i] = m < rows;
            long long c = m / S, q = m % S;
            a_qy[i] = q / sx;
            a_qx[i] = q % sx;
            a_by[i] = ((a_qy[i] - g.pad[0]) % sy + sy) % sy;
            a_by[i] = (a_by[i] + g.pad[0] - a_qy[i]) / sy;
            a_bx[i] = ((a_qx[i] - g.pad[1]) % sx + sx) % sx;
            a_bx[i] = (a_bx[i] + g.pad[1] - a_qx[i]) / sx;
            a_w[i] = tile.grp * cg * Kw + c * kk;
        }
        // The phase position this thread gathers B for.
        long long p = tile.n0 + t % LG_IG_BN;
        bool p_ok = p < P;
        long long item = p_ok ? p / (U * V) : 0, at = p_ok ? p % (U * V) : 0;
        long long u = at / V, v = at % V;
        long long gybase = (item * g.cout + tile.grp * cg) * L + u * g.ow + v;
        A acc[R][4] = {};
        if (LG_IG_BK % (dys * dxs) == 0) {
            lg_dgrad_phase_rows_steps<T, A, R, TC>(g, s, acc, gy + gybase, p_ok, u, v, dy_max, dys,
                                                   dx_max, dxs, w, a_w, a_qy, a_qx, a_by, a_bx,
                                                   a_ok);
            K = 0;  // every step is done
        }
        for (long long k0 = 0; k0 < K; k0 += LG_IG_BK) {
            if (t < LG_IG_BK) {
                long long r = k0 + t, co = r / (dys * dxs);
                long long dy = dy_max - r % (dys * dxs) / dxs, dx = dx_max - r % dxs;
                tab_co[t] = r < K ? co : -1;
                tab_gy[t] = co * L + dy * g.ow + dx;
                tab_dy[t] = r < K ? dy : LG_IG_OUTSIDE;
                tab_dx[t] = dx;
            }
            __syncthreads();
#pragma unroll
            for (int i = 0; i < R; ++i) {
                int kq = t % LG_IG_BK, mq = lg_ig_a_row<decltype(s)>(t) + LG_IG_THREADS / LG_IG_BK * i;
                long long ki = a_qy[i] + (a_by[i] - tab_dy[kq]) * sy;
                long long kj = a_qx[i] + (a_bx[i] - tab_dx[kq]) * sx;
                bool ok = a_ok[i] && tab_co[kq] >= 0 && lg_inside(ki, g.kh) && lg_inside(kj, g.kw);
                lg_put_a(s, kq, mq, ok, w + (a_w[i] + tab_co[kq] * Kw + ki * g.kw + kj));
            }
#pragma unroll
            for (int j = 0; j < LG_IG_B_LOADS; ++j) {
                int kq = t / LG_IG_BN + LG_IG_THREADS / LG_IG_BN * j;
                long long oy = u + tab_dy[kq], ox = v + tab_dx[kq];
                bool in = p_ok && lg_inside(oy, g.oh) && lg_inside(ox, g.ow);
                lg_put_b(s, kq, t % LG_IG_BN, in, gy + (gybase + tab_gy[kq]));
            }
            __syncthreads();
            lg_ig_product<T, A, R, TC>(s, acc, t);
            __syncthreads();
        }
        lg_phase_rows_store<T, R, TC>(gx, bias, acc, tile, t, g, P, V);
    }
}

// A position of the weight gradient's K, as a chunk's table holds it: its
// offset in gy at the group's first channel, its offset in x at channel 0
// and the top-left input coordinate (iy, ix) of its taps; iy is
// LG_IG_OUTSIDE past the split's end. I is int where every offset fits 31
// bits (one 16-byte shared load per gathered element), else long long.
template <typename I> struct __align__(16) WgPos {
    I gy, x, iy, ix;
};

// Whether 0 <= v < len, in 32 bits.
__device__ __forceinline__ bool lg_inside(int v, int len) {
    return (unsigned int)v < (unsigned int)len;
}

// What the weight gradient's K steps of one tile share: the column row
// this thread gathers B for (its channel's x offset and tap (rdy, rdx);
// rdy = LG_IG_OUTSIDE for a row past the end, so that no position's tap
// is inside), x's height and width, and the A rows it gathers.
template <typename I, int R> struct WgCol {
    I roff, rdy, rdx, h, w;
    IgRows<R> arows;
};

// Positions c0 + t (t < LG_IG_THREADS) of the weight gradient's K as the
// table `tab` holds them (WgPos), by multiply-highs where I is int.
template <typename I>
__device__ __forceinline__ void lg_wgrad_table(const ConvGeom& g, WgPos<I>* tab, long long grp,
                                               long long p, long long end, const LgDiv& by_l,
                                               const LgDiv& by_ow) {
    const long long L = g.oh * g.ow, cg = g.cout / g.groups;
    long long item, l, oy, ox;
    if constexpr (sizeof(I) == 4) {
        unsigned int q = (unsigned int)p, it = lg_div(by_l, q);
        unsigned int at = q - it * (unsigned int)L, y = lg_div(by_ow, at);
        item = it, l = at, oy = y, ox = at - y * (unsigned int)g.ow;
    } else {
        item = p / L, l = p % L, oy = l / g.ow, ox = l % g.ow;
    }
    const long long iy0 = oy * g.stride[0] - g.pad[0], ix0 = ox * g.stride[1] - g.pad[1];
    WgPos<I> e;
    e.gy = (I)((item * g.cout + grp * cg) * L + l);
    e.x = (I)(item * g.cin * g.h * g.w + iy0 * g.w + ix0);
    e.iy = (I)(p < end ? iy0 : LG_IG_OUTSIDE);
    e.ix = (I)ix0;
    tab[threadIdx.x] = e;
}

// acc += the weight gradient's product over positions first..end of one
// tile, LG_IG_BK positions per step: every LG_IG_THREADS positions the
// block's threads place one position each in the table (one division-free
// pass, one barrier), which the chunk's steps then read: A (gy) at the
// position's gy offset, B (x) at its x offset plus the column's, inside
// where the position's coordinate plus the column's tap is.
template <typename T, int R, bool TC, typename I>
__device__ __forceinline__ void lg_wgrad_steps(const ConvGeom& g,
                                               IgTiles<T, 8 * R, TC>& s,
                                               WgPos<I>* tab, typename Acc<T>::type (&acc)[R][4],
                                               const T* gy, const T* x, long long grp,
                                               long long first, long long end,
                                               const WgCol<I, R>& col, const LgDiv& by_l,
                                               const LgDiv& by_ow) {
    typedef typename Acc<T>::type A;
    const int t = threadIdx.x, n = t % LG_IG_BN, B_STEP = LG_IG_THREADS / LG_IG_BN;
    for (long long c0 = first; c0 < end; c0 += LG_IG_THREADS) {
        lg_wgrad_table<I>(g, tab, grp, c0 + t, end, by_l, by_ow);
        __syncthreads();
        const long long left = end - c0;
        const int steps = left < LG_IG_THREADS ? (int)((left + LG_IG_BK - 1) / LG_IG_BK)
                                               : LG_IG_THREADS / LG_IG_BK;
        for (int st = 0; st < steps; ++st) {
            const WgPos<I>* e = tab + st * LG_IG_BK;
            lg_ig_gather_a<T, R, TC>(s, gy, e[t % LG_IG_BK].gy, col.arows,
                                     left - st * LG_IG_BK, t);
#pragma unroll
            for (int j = 0; j < LG_IG_B_LOADS; ++j) {
                const int kq = t / LG_IG_BN + B_STEP * j;
                const WgPos<I> pe = e[kq];
                const bool in =
                    lg_inside(pe.iy + col.rdy, col.h) & lg_inside(pe.ix + col.rdx, col.w);
                lg_put_b(s, kq, n, in, x + (pe.x + col.roff));
            }
            __syncthreads();
            lg_ig_product<T, A, R, TC>(s, acc, t);
            __syncthreads();
        }
    }
}

// f(e, v) for each of thread t's accumulators v of a weight gradient's
// tile that lies inside the output ([cout, cig*kk] per group), e its
// element's index there.
template <typename T, int R, bool TC, typename F>
__device__ __forceinline__ void lg_wgrad_each(const typename Acc<T>::type (&acc)[R][4],
                                              IgTile tile, long long cg, long long Kw, int t,
                                              F f) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int i = 0; i < R; ++i) {
            long long q = tile.n0 + lg_acc_col<R, TC>(t, i, j);
            long long m = tile.m0 + lg_acc_row<R, TC>(t, i, j);
            if (q < Kw && m < cg) f((tile.grp * cg + m) * Kw + q, acc[i][j]);
        }
    }
}

// Adds a tile's products of split `split` into its slot (split % slots of
// part, cout*cig*kk values of A each), the slot's splits one after another
// in order: the first writes its products, each later one waits until the
// tile's counter says the one before it is done (its block is an earlier
// one of the grid, see MAX_SPLIT_BLOCKS in workspace.rs), adds its own to
// what it reads and counts itself done. The values are then the same from
// run to run.
template <typename T, int R, bool TC>
__device__ __forceinline__ void lg_wgrad_chain(const typename Acc<T>::type (&acc)[R][4],
                                               typename Acc<T>::type* part, unsigned int* counter,
                                               long long split, long long slots, IgTile tile,
                                               long long cg, long long Kw, long long n, int t) {
    typedef typename Acc<T>::type A;
    const unsigned int link = (unsigned int)(split / slots);
    A* dst = part + split % slots * n;
    if (link > 0) {
        if (t == 0) {
            while (atomicAdd(counter, 0u) != link) {
            }
            __threadfence();
        }
        __syncthreads();
    }
    lg_wgrad_each<T, R, TC>(acc, tile, cg, Kw, t, [&](long long e, A v) {
        // The earlier splits' sum, read past this SM's L1.
        dst[e] = link > 0 ? __ldcg(dst + e) + v : v;
    });
    if (counter) {
        __threadfence();
        __syncthreads();
        if (t == 0) atomicExch(counter, link + 1);
    }
}

// The weight gradient over the batch positions of split `split` of
// `splits` (positions split*P/splits up to (split+1)*P/splits): with one split
// gw ([cout, cin/groups, kh, kw]) itself, every element written; with more,
// added into its slot of `part` (lg_wgrad_chain; `counters`, one per slot
// and tile, zeroed, where a slot takes more than one split).
// Offsets in 32 bits where x, gy and the positions fit 31 bits.
template <typename T, int R, bool TC>
__device__ void lg_conv_wgrad(const ConvGeom& g, long long splits, long long slots, T* gw,
                              typename Acc<T>::type* part, unsigned int* counters, const T* gy,
                              const T* x) {
    typedef typename Acc<T>::type A;
    __shared__ IgTiles<T, 8 * R, TC> s;
    __shared__ WgPos<long long> tab_raw[LG_IG_THREADS];
    const long long kk = g.kh * g.kw, L = g.oh * g.ow, HW = g.h * g.w;
    const long long cig = g.cin / g.groups, cg = g.cout / g.groups;
    const long long Kw = cig * kk, P = g.n * L;
    const long long tiles_m = (cg + 8 * R - 1) / (8 * R);
    const long long tiles_n = (Kw + LG_IG_BN - 1) / LG_IG_BN;
    const long long tiles = g.groups * tiles_m * tiles_n;
    const int t = threadIdx.x;
    const long long most = 1LL << 31;
    // Past x's end by at most a tap's reach (an offset of a gather that is
    // outside and not made).
    const long long reach = (g.kh * g.dil[0] + g.pad[0] + 1) * g.w + g.kw * g.dil[1] + g.pad[1];
    const bool narrow = P + LG_IG_THREADS < most && g.n * g.cin * HW + reach < most &&
                        g.n * g.cout * L < most;
    const LgDiv by_l = lg_div_make(narrow ? (unsigned int)L : 1u);
    const LgDiv by_ow = lg_div_make(narrow ? (unsigned int)g.ow : 1u);
    for (long long b = blockIdx.x; b < splits * tiles; b += gridDim.x) {
        long long split = b / tiles;
        IgTile tile = lg_ig_tile(b % tiles, tiles_m, tiles_n, 8 * R);
        // The column row this thread gathers: r = (c, ki, kj).
        long long r = tile.n0 + t % LG_IG_BN;
        long long c = r / kk, ki = r % kk / g.kw, kj = r % g.kw;
        long long rdy = ki * g.dil[0], rdx = kj * g.dil[1];
        long long roff = (tile.grp * cig + c) * HW + rdy * g.w + rdx;
        long long first = split * P / splits, end = (split + 1) * P / splits;
        const IgRows<R> arows = lg_ig_rows<decltype(s), R>(tile.m0, cg, L, t);
        A acc[R][4] = {};
        if (r >= Kw) rdy = LG_IG_OUTSIDE;
        if (narrow) {
            WgCol<int, R> col{(int)roff, (int)rdy, (int)rdx, (int)g.h, (int)g.w, arows};
            lg_wgrad_steps<T, R, TC, int>(g, s, reinterpret_cast<WgPos<int>*>(tab_raw), acc, gy,
                                          x, tile.grp, first, end, col, by_l, by_ow);
        } else {
            WgCol<long long, R> col{roff, rdy, rdx, g.h, g.w, arows};
            lg_wgrad_steps<T, R, TC, long long>(g, s, tab_raw, acc, gy, x, tile.grp, first, end,
                                                col, by_l, by_ow);
        }
        if (splits > 1) {
            unsigned int* counter =
                splits > slots ? counters + split % slots * tiles + b % tiles : nullptr;
            lg_wgrad_chain<T, R, TC>(acc, part, counter, split, slots, tile, cg, Kw, g.cout * Kw,
                                     t);
            continue;
        }
        lg_wgrad_each<T, R, TC>(acc, tile, cg, Kw, t, [&](long long e, A v) {
            gw[e] = lg_store<T>(v);
        });
    }
}

// The four kernels for tiles of BM = 8*R rows (TC: TF32 tensor cores,
// instantiated for f32 as the `_tf32` kernels).
#define LG_CONV_TILE_AS(sfx, T, BM, R, TC)                                            \
    extern "C" __global__ void conv_fwd_m##BM##_##sfx(ConvGeom g, T* y, const T* x,   \
                                                      const T* w, const T* bias) {    \
        lg_conv_fwd<T, R, TC>(g, y, x, w, bias);                                      \
    }                                                                                 \
    extern "C" __global__ void conv_dgrad_m##BM##_##sfx(ConvGeom g, T* gx, const T* gy, \
                                                        const T* w, const T* bias) {  \
        lg_conv_dgrad<T, R, TC>(g, gx, gy, w, bias);                                  \
    }                                                                                 \
    extern "C" __global__ void conv_dgrad_phase_rows_m##BM##_##sfx(                   \
        ConvGeom g, long long dy_max, long long dys, long long dx_max, long long dxs,  \
        T* gx, const T* gy, const T* w, const T* bias) {                              \
        lg_conv_dgrad_phase_rows<T, R, TC>(g, dy_max, dys, dx_max, dxs, gx, gy, w, bias); \
    }                                                                                 \
    extern "C" __global__ void conv_wgrad_m##BM##_##sfx(                              \
        ConvGeom g, long long splits, long long slots, T* gw, Acc<T>::type* part,     \
        unsigned int* counters, const T* gy, const T* x) {                            \
        lg_conv_wgrad<T, R, TC>(g, splits, slots, gw, part, counters, gy, x);         \
    }
// Whether T's tiles of 16 rows or more run on tensor cores by default: the
// half types (exact products, f32 sums, as their fused multiply-adds);
// f32 only with TF32 allowed (the `tf32` kernels below).
template <typename T> struct LgTensorCores { static constexpr bool on = false; };
template <> struct LgTensorCores<__half> { static constexpr bool on = true; };
template <> struct LgTensorCores<__nv_bfloat16> { static constexpr bool on = true; };

// Every tile height (8 rows: fused multiply-adds, below an m16 fragment).
#define LG_CONV_TILES(sfx, T, TC)                                                     \
    LG_CONV_TILE_AS(sfx, T, 128, 16, TC)                                              \
    LG_CONV_TILE_AS(sfx, T, 64, 8, TC)                                                \
    LG_CONV_TILE_AS(sfx, T, 32, 4, TC)                                                \
    LG_CONV_TILE_AS(sfx, T, 16, 2, TC)                                                \
    LG_CONV_TILE_AS(sfx, T, 8, 1, false)

// TF32 tensor-core tiles (16 rows or more: an m16 fragment's height).
LG_CONV_TILE_AS(tf32, float, 128, 16, true)
LG_CONV_TILE_AS(tf32, float, 64, 8, true)
LG_CONV_TILE_AS(tf32, float, 32, 4, true)
LG_CONV_TILE_AS(tf32, float, 16, 2, true)

#define LG_CONV(sfx, T)                                                               \
    LG_CONV_TILES(sfx, T, LgTensorCores<T>::on)                                       \
    /* gw[e] = the sum over s < splits of part[s*n + e] (slots), in order. */        \
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
