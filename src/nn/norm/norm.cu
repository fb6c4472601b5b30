// Normalization layers over a contiguous input, as cpu.rs beside this file;
// launched from cuda.rs beside it.
//
// Geometry: `struct NormGeom` is the Rust `leangrad::nn::NormGeom`
// (src/nn/norm/mod.rs, #[repr(C)]): same fields in the same order, its usize
// fields laid out as these long longs. Statistics: the input is viewed as
// [a, s, b]; statistic i covers the elements (k*s + i)*b + j for all k < a,
// j < b:
//   batch norm  [outer, C, inner]   -> a = outer, s = C, b = inner
//   group norm  [N, C, spatial]     -> a = 1, s = N*groups, b = C/groups*spatial
//   layer / RMS [rows, len]         -> a = 1, s = rows, b = len
// Affine parameters: element e uses parameter (e / lp) % p (batch and group
// norm: p = C, lp = inner/spatial; layer/RMS norm: p = len, lp = 1). `seg`
// is the CPU's unit of work and is not used here.
// Reductions and the normalization run in double (as the CPU, which uses
// f64; the affine map with uncontracted __dmul_rn/__dadd_rn as Rust's); statistics are stored in the statistics type (double for f64,
// float otherwise: `Acc<T>`). Sums run over pieces of a statistic (or of a
// parameter's elements), a block of LG_NORM_THREADS each, joined in a fixed
// order (see "Sums over statistics in pieces"), so results are
// deterministic.

struct NormGeom {
    long long a, s, b, p, lp, seg;
};

#define LG_NORM_THREADS 256

__device__ __forceinline__ double lg_norm_sum(double v, double* buf) {
    buf[threadIdx.x] = v;
    for (int s = LG_NORM_THREADS / 2; s > 0; s >>= 1) {
        __syncthreads();
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    }
    __syncthreads();
    double r = buf[0];
    __syncthreads();
    return r;
}

// A thread of norm_fwd_* normalizes a run of LG_RUN consecutive elements:
// the statistic and parameter indices are divided out once per run and
// then stepped, and the run moves as one vector when `vec` (every buffer
// 16-byte aligned, checked by the host).

// Multiply-high dividers (LgDiv) by b, s, lp and p, made by a block's first
// thread, where every index of the input fits 31 bits (`narrow`).
struct LgNormDivs {
    LgDiv b, s, lp, p;
    bool narrow;
};

// The block's dividers for `g` (every thread of the block calls this once,
// before its loop: it synchronises the block).
__device__ __forceinline__ LgNormDivs lg_norm_divs(const NormGeom& g) {
    __shared__ LgNormDivs d;
    if (threadIdx.x == 0) {
        const long long most = 1LL << 31;
        d.narrow = g.a * g.s * g.b < most && g.b >= 1 && g.s >= 1 && g.lp >= 1 && g.p >= 1 &&
                   g.b < most && g.s < most && g.lp < most && g.p < most;
        if (d.narrow) {
            d.b = lg_div_make((unsigned int)g.b);
            d.s = lg_div_make((unsigned int)g.s);
            d.lp = lg_div_make((unsigned int)g.lp);
            d.p = lg_div_make((unsigned int)g.p);
        }
    }
    __syncthreads();
    return d;
}

// The parameter p = (e / Lp) % P of element e alone (multiply-highs where
// the dividers are narrow).
__device__ __forceinline__ long long lg_norm_param(long long e, const NormGeom& g,
                                                   const LgNormDivs& d) {
    if (!d.narrow) return e / g.lp % g.p;
    unsigned int q = lg_div(d.lp, (unsigned int)e);
    return q - lg_div(d.p, q) * (unsigned int)g.p;
}

// The statistic s = (e / B) % S and parameter p = (e / Lp) % P of element
// e (found by multiply-highs where the dividers are narrow), stepped one
// element at a time without a division.
struct LgNormAt {
    long long rb, s, rl, p;
    __device__ __forceinline__ LgNormAt(long long e, const NormGeom& g, const LgNormDivs& d) {
        if (d.narrow) {
            unsigned int u = (unsigned int)e, qb = lg_div(d.b, u), ql = lg_div(d.lp, u);
            rb = u - qb * (unsigned int)g.b;
            s = qb - lg_div(d.s, qb) * (unsigned int)g.s;
            rl = u - ql * (unsigned int)g.lp;
            p = ql - lg_div(d.p, ql) * (unsigned int)g.p;
        } else {
            rb = e % g.b;
            s = e / g.b % g.s;
            rl = e % g.lp;
            p = e / g.lp % g.p;
        }
    }
    __device__ __forceinline__ void next(const NormGeom& g) {
        if (++rb == g.b) {
            rb = 0;
            if (++s == g.s) s = 0;
        }
        if (++rl == g.lp) {
            rl = 0;
            if (++p == g.p) p = 0;
        }
    }
};

// What the forward applies to an element: its statistic's mean and rstd
// and its parameter's w and b (1 and 0 where absent), as doubles.
struct LgNormVals {
    double m, r, w, b;
    template <typename S, typename T>
    __device__ __forceinline__ LgNormVals(const LgNormAt& at, const S* mean, const S* rstd,
                                          const T* wp, const T* bp)
        : m((double)mean[at.s]), r((double)rstd[at.s]), w(wp ? lg_to_f64(wp[at.p]) : 1.0),
          b(bp ? lg_to_f64(bp[at.p]) : 0.0) {}
};

// The LgNormVals of a run's elements in turn (`v`, then next() after each
// element): read once where the run of cnt elements from e0 lies on one
// statistic and one parameter (batch and group norm's runs inside a
// plane), stepped and read again per element otherwise.
template <typename T> struct LgNormRunVals {
    typedef typename Acc<T>::type S;
    const NormGeom& g;
    LgNormAt at;
    const bool uniform;
    const S *mean, *rstd;
    const T *w, *b;
    LgNormVals v;
    __device__ __forceinline__ LgNormRunVals(long long e0, int cnt, const NormGeom& geo,
                                             const LgNormDivs& d, const S* mn, const S* rs,
                                             const T* wp, const T* bp)
        : g(geo), at(e0, geo, d), uniform(at.rb + cnt <= geo.b && at.rl + cnt <= geo.lp),
          mean(mn), rstd(rs), w(wp), b(bp), v(at, mn, rs, wp, bp) {}
    __device__ __forceinline__ void next() {
        if (uniform) return;
        at.next(g);
        v = LgNormVals(at, mean, rstd, w, b);
    }
};

// One element of the norms' forward: x_hat = (x - m) * r in double,
// written rounded to T where `hat` is given, and y = x_hat * w + b with
// uncontracted products, rounded to T.
template <typename T>
__device__ __forceinline__ T lg_norm_elem(T x, const LgNormVals& v, T* hat) {
    double h = (lg_to_f64(x) - v.m) * v.r;
    if (hat) *hat = lg_from_f64<T>(h);
    return lg_from_f64<T>(__dadd_rn(__dmul_rn(h, v.w), v.b));
}

#define LG_NORM(sfx, T)                                                               \
    /* y = x_hat * w + b (w, b optional) and/or x_hat = (x - mean) * rstd, both */   \
    /* rounded to T; the statistic of element e is (e / B) % S. */                    \
    /* y may be x itself: each run is read whole before it is written, by the */     \
    /* one thread that owns it. */                                                    \
    static __device__ void norm_fwd_body_##sfx(NormGeom g, int want_y, int want_xhat, \
                                               int has_w, int has_b, int vec,         \
                                               const T* x, const Acc<T>::type* mean,  \
                                               const Acc<T>::type* rstd, const T* w,  \
                                               const T* b, T* y, T* xhat) {           \
        const LgNormDivs divs = lg_norm_divs(g);                                      \
        long long n = g.a * g.s * g.b;                                                \
        LG_RUN_LOOP(e0, n) {                                                          \
            int cnt = lg_run_count(n, e0);                                            \
            LgRun<T, LG_RUN> in, hat, out;                                       \
            in.load(x + e0, cnt, vec);                                                \
            LgNormRunVals<T> rv(e0, cnt, g, divs, mean, rstd, has_w ? w : 0,          \
                                has_b ? b : 0);                                       \
            LG_RUN_EACH(i, cnt) {                                                     \
                T yv = lg_norm_elem<T>(in.v[i], rv.v, want_xhat ? &hat.v[i] : 0);     \
                if (want_y) out.v[i] = yv;                                            \
                rv.next();                                                            \
            }                                                                         \
            if (want_xhat) hat.store(xhat + e0, cnt, vec);                            \
            if (want_y) out.store(y + e0, cnt, vec);                                  \
        }                                                                             \
    }                                                                                 \
    extern "C" __global__ void norm_fwd_##sfx(NormGeom g, int want_y, int want_xhat,  \
                                              int has_w, int has_b, int vec,          \
                                              const T* x, const Acc<T>::type* mean,   \
                                              const Acc<T>::type* rstd, const T* w,   \
                                              const T* b, T* y, T* xhat) {            \
        norm_fwd_body_##sfx(g, want_y, want_xhat, has_w, has_b, vec, x, mean, rstd,   \
                            w, b, y, xhat);                                           \
    }                                                                                 \
    /* y written over x (buffer reuse: nothing else holds x). */                      \
    extern "C" __global__ void norm_fwd_inplace_##sfx(NormGeom g, int want_xhat,      \
                                                      int has_w, int has_b, int vec,  \
                                                      T* x,                           \
                                                      const Acc<T>::type* mean,       \
                                                      const Acc<T>::type* rstd,       \
                                                      const T* w, const T* b,         \
                                                      T* xhat) {                      \
        norm_fwd_body_##sfx(g, 1, want_xhat, has_w, has_b, vec, x, mean, rstd, w, b,  \
                            x, xhat);                                                 \
    }
LG_FOR_FLOATS(LG_NORM)

// norm_fwd_inplace followed by ReLU in the same pass, with the packed mask
// of the result's positives (bit e % 32 of word e / 32; ballots, so the
// loop runs whole warps: lane l of pass c takes run 32c + l, none past the
// end): y = x_hat * w + b rounded to T, then y > 0 ? y : 0 (NaN kept), the
// values, bits and x_hat of norm_fwd_inplace and relu_mask_fwd_inplace one
// after the other.
#define LG_NORM_RELU(sfx, T)                                                          \
    extern "C" __global__ void norm_fwd_relu_inplace_##sfx(                           \
        NormGeom g, int want_xhat, int has_w, int has_b, int vec, T* x,               \
        const Acc<T>::type* mean, const Acc<T>::type* rstd, const T* w, const T* b,   \
        T* xhat, unsigned int* mask) {                                                \
        typedef Acc<T>::type A;                                                       \
        const LgNormDivs divs = lg_norm_divs(g);                                      \
        const long long n = g.a * g.s * g.b, words = (n + 31) / 32;                   \
        const long long per_pass = 32 * LG_RUN;                                       \
        long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;     \
        long long warps = ((long long)blockDim.x * gridDim.x) >> 5;                   \
        int lane = threadIdx.x & 31;                                                  \
        for (long long c = warp; c * per_pass < n; c += warps) {                      \
            long long e0 = c * per_pass + lane * LG_RUN, left = n - e0;               \
            int cnt = left <= 0 ? 0 : left < LG_RUN ? (int)left : LG_RUN;            \
            unsigned int nib = 0;                                                     \
            if (cnt > 0) {                                                            \
                LgRun<T, LG_RUN> run, hat;                                            \
                run.load(x + e0, cnt, vec);                                           \
                LgNormRunVals<T> rv(e0, cnt, g, divs, mean, rstd, has_w ? w : 0,      \
                                    has_b ? b : 0);                                   \
                LG_RUN_EACH(i, cnt) {                                                 \
                    T y = lg_norm_elem<T>(run.v[i], rv.v, want_xhat ? &hat.v[i] : 0); \
                    A v = lg_load(y);                                                 \
                    bool pos = v > (A)0;                                              \
                    nib |= (unsigned int)pos << i;                                    \
                    /* NaN is not positive (bit 0) but stays NaN, as ReLU's */        \
                    run.v[i] = pos || v != v ? y : lg_store<T>((A)0);                 \
                    rv.next();                                                        \
                }                                                                     \
                if (want_xhat) hat.store(xhat + e0, cnt, vec);                        \
                run.store(x + e0, cnt, vec);                                          \
            }                                                                         \
            unsigned int word = lg_runs_mask_word(nib);                               \
            long long wd = c * LG_RUN + lane;                                         \
            if (lane < LG_RUN && wd < words) mask[wd] = word;                         \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_NORM_RELU)

// ---- Sums over statistics in pieces (two-level, deterministic) ----
//
// The kernels that let CUDA save what the CPU saves: statistics come back
// unrounded in double (the host rounds them as for the CPU), and the
// gradients read the saved x_hat rather than recomputing it from x.
//
// A statistic's A*B elements are numbered k = a*B + b (a < A, b < B: the
// element (a*S + s)*B + b). The host cuts each statistic into `chunks`
// pieces of `len` consecutive k (whole rows, or a multiple of LG_RUN: a
// piece never starts inside a run; the last piece may be shorter: chunks
// = ceil(A*B / len); `Pieces` in cuda.rs), so that a layer with few
// statistics (a ResNet stem's 64 channels) still spreads over the whole
// GPU: block iteration w (blockIdx.x, then + gridDim.x, …) takes piece
// (s, c) = (w / chunks, w % chunks). A piece sums in a fixed order (each
// thread's runs in turn, then lg_norm_sum's tree) into part[2w] and
// part[2w + 1]; the kernel after it adds a statistic's pieces in the order
// c = 0, 1, …, so every result is deterministic. With one piece per
// statistic the block finishes its statistic itself and `part` is unused.

// Runs of LG_RUN consecutive k of the piece [lo, hi) of statistic s that
// one thread takes: lo + LG_RUN * (threadIdx.x + i * blockDim.x), each
// with the column b of its first k and that k's element e, both stepped
// without a division or a product: k += stride moves e by
// (stride / B) * S*B + stride % B, and a column past the row's end moves
// e on to the next row of the statistic, (S - 1) * B further.
struct LgPieceRuns {
    long long k, hi, stride, b, e, db, de, wrap;
    __device__ __forceinline__ LgPieceRuns(long long lo, long long end, long long s,
                                           long long S, long long B)
        : k(lo + (long long)threadIdx.x * LG_RUN), hi(end),
          stride((long long)blockDim.x * LG_RUN), wrap((S - 1) * B) {
        // B = 0 means no elements (lo = hi = 0): nothing is visited.
        const long long a = B > 0 ? k / B : 0;
        b = B > 0 ? k % B : 0;
        e = (a * S + s) * B + b;
        db = B > 0 ? stride % B : 0;
        de = (B > 0 ? stride / B : 0) * S * B + db;
    }
    __device__ __forceinline__ bool more() const { return k < hi; }
    __device__ __forceinline__ int count() const {
        return hi - k < LG_RUN ? (int)(hi - k) : LG_RUN;
    }
    __device__ __forceinline__ void next(long long B) {
        k += stride;
        b += db;
        e += de;
        if (b >= B) {
            b -= B;
            e += wrap;
        }
    }
};

// The piece of block iteration w: statistic s and its k range [lo, hi).
struct LgPiece {
    long long s, lo, hi;
    __device__ __forceinline__ LgPiece(long long w, long long cnt, long long len,
                                       long long chunks)
        : s(w / chunks), lo(w % chunks * len), hi(lo + len < cnt ? lo + len : cnt) {}
};

// Every block iteration w of a pieces kernel (uniform over the block).
#define LG_PIECES(w, g, chunks) \
    for (long long w = blockIdx.x; w < (g).s * (chunks); w += gridDim.x)

// Calls f(e, cnt) over the thread's share of piece p: cnt consecutive
// elements from element e, a whole run at once (cnt = LG_RUN: one vector
// when aligned) where rows hold whole runs (B a multiple of LG_RUN, and
// runs start at multiples of LG_RUN), one element at a time otherwise and
// for a piece's short last run.
template <typename F>
__device__ __forceinline__ void lg_piece_visit(const NormGeom& g, const LgPiece& p, F f) {
    const long long S = g.s, B = g.b;
    LgPieceRuns r(p.lo, p.hi, p.s, S, B);
    if (B % LG_RUN == 0) {
        // Whole runs with a constant count (their loops unroll unguarded),
        // then at most one short run, inside its row.
        for (; r.k + LG_RUN <= p.hi; r.next(B)) f(r.e, LG_RUN);
        for (int i = 0; i < r.count(); ++i) f(r.e + i, 1);
        return;
    }
    for (; r.more(); r.next(B)) {
        long long b = r.b, e = r.e;
        for (int i = 0; i < r.count(); ++i) {
            f(e, 1);
            ++e;
            if (++b == B) {
                b = 0;
                e += r.wrap;
            }
        }
    }
}

// Statistic s's sum j (0 or 1) over its pieces, in piece order.
__device__ __forceinline__ double lg_piece_total(const double* part, long long s,
                                                 long long chunks, int j) {
    double t = 0;
    for (long long c = 0; c < chunks; ++c) t += part[(s * chunks + c) * 2 + j];
    return t;
}

// The weight w[p] of element e (1 without w) for gw = g * w[p]: batch
// norm's parameter is its statistic (`per_stat`, read once per piece);
// group and layer norm find it per element.
template <typename T> struct LgGradWeight {
    const T* w;
    bool per_stat;
    double ws;
    __device__ __forceinline__ LgGradWeight(const T* wp, const NormGeom& g, long long s)
        : w(wp), per_stat(g.p == g.s && g.lp == g.b),
          ws(wp && g.p == g.s && g.lp == g.b ? lg_to_f64(wp[s]) : 1.0) {}
    __device__ __forceinline__ double at(long long e, const NormGeom& g,
                                         const LgNormDivs& d) const {
        return w && !per_stat ? lg_to_f64(w[lg_norm_param(e, g, d)]) : ws;
    }
};

// A piece's block-wide sums s1 = sum gw and (when want2) s2 = sum gw * x_hat,
// gw = g * w[p] rounded (w null: g itself).
template <typename T>
__device__ void lg_piece_grad_sums(const NormGeom& g, const LgNormDivs& d, const LgPiece& p,
                                   int vec, int want2, const T* xhat, const T* gr, const T* w,
                                   double* buf, double& s1, double& s2) {
    const LgGradWeight<T> wt(w, g, p.s);
    double t1 = 0, t2 = 0;
    lg_piece_visit(g, p, [&](long long e, int cnt) {
        LgRun<T, LG_RUN> gv, hv;
        gv.load(gr + e, cnt, vec);
        if (want2) hv.load(xhat + e, cnt, vec);
        LG_RUN_EACH(i, cnt) {
            double gw = __dmul_rn(lg_to_f64(gv.v[i]), wt.at(e + i, g, d));
            t1 += gw;
            if (want2) t2 += gw * lg_to_f64(hv.v[i]);
        }
    });
    s1 = lg_norm_sum(t1, buf);
    s2 = want2 ? lg_norm_sum(t2, buf) : 0.0;
}

// The input gradient over a piece from its statistic's means m1 = mean(gw)
// and m2 = mean(gw * x_hat) and scale r (rstd, or batch norm's w * invstd
// with w null), `mode` a `NormGradCode`:
//   Centered:   r * (gw - m1 - x_hat * m2)
//   Uncentered: r * (gw - x_hat * m2)   (RMS norm)
// dx may be g itself: each stretch is read whole before it is written, by
// the one thread that owns it.
template <typename T>
__device__ void lg_piece_grad_apply(const NormGeom& g, const LgNormDivs& d, const LgPiece& p,
                                    int vec, int mode, const T* xhat,
                                    const typename Acc<T>::type* scale, const T* gr,
                                    const T* w, double m1, double m2, T* dx) {
    const LgGradWeight<T> wt(w, g, p.s);
    const double r = (double)scale[p.s];
    lg_piece_visit(g, p, [&](long long e, int cnt) {
        LgRun<T, LG_RUN> gv, hv, out;
        gv.load(gr + e, cnt, vec);
        hv.load(xhat + e, cnt, vec);
        LG_RUN_EACH(i, cnt) {
            double gw = __dmul_rn(lg_to_f64(gv.v[i]), wt.at(e + i, g, d));
            double hm = __dmul_rn(lg_to_f64(hv.v[i]), m2);
            double v = mode == NormGradCode::Centered ? __dsub_rn(__dsub_rn(gw, m1), hm) : __dsub_rn(gw, hm);
            out.v[i] = lg_from_f64<T>(__dmul_rn(r, v));
        }
        out.store(dx + e, cnt, vec);
    });
}

// Per statistic: the mean (0 unless centered) and the biased variance (the
// mean square when not centered), unrounded doubles. A piece's sums are
// its sum and its squared deviations from its own mean (centered: a
// second pass over the piece, which the first left in cache), or its sum
// of squares; norm_moments_combine joins pieces.
#define LG_NORM_MOMENTS(sfx, T)                                                       \
    extern "C" __global__ void norm_moments_##sfx(NormGeom g, long long len,          \
                                                  long long chunks, int centered,     \
                                                  int vec, const T* x, double* part,  \
                                                  double* mean, double* var) {        \
        __shared__ double buf[LG_NORM_THREADS];                                       \
        const long long cnt = g.a * g.b;                                              \
        LG_PIECES(it, g, chunks) {                                                    \
            const LgPiece p(it, cnt, len, chunks);                                    \
            const double n = p.hi > p.lo ? (double)(p.hi - p.lo) : 1.0;               \
            double sum = 0, m = 0;                                                    \
            if (centered) {                                                           \
                double t = 0;                                                         \
                lg_piece_visit(g, p, [&](long long e, int k) {                        \
                    LgRun<T, LG_RUN> r;                                               \
                    r.load(x + e, k, vec);                                            \
                    LG_RUN_EACH(i, k) t += lg_to_f64(r.v[i]);                         \
                });                                                                   \
                sum = lg_norm_sum(t, buf);                                            \
                m = sum / n;                                                          \
            }                                                                         \
            double q = 0;                                                             \
            lg_piece_visit(g, p, [&](long long e, int k) {                            \
                LgRun<T, LG_RUN> r;                                                   \
                r.load(x + e, k, vec);                                                \
                LG_RUN_EACH(i, k) {                                                   \
                    double dv = lg_to_f64(r.v[i]) - m;                                \
                    q += dv * dv;                                                     \
                }                                                                     \
            });                                                                       \
            q = lg_norm_sum(q, buf);                                                  \
            if (threadIdx.x == 0) {                                                   \
                if (chunks == 1) {                                                    \
                    mean[p.s] = m;                                                    \
                    var[p.s] = q / n;                                                 \
                } else {                                                              \
                    part[2 * it] = sum;                                               \
                    part[2 * it + 1] = q;                                             \
                }                                                                     \
            }                                                                         \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_NORM_MOMENTS)

// The moments of each statistic from its pieces (norm_moments with
// chunks > 1): mean = (the pieces' sums, in order) / cnt; variance = the
// pieces' squared deviations plus each piece's n_c * (m_c - mean)^2 (the
// exact split of the two-pass sum; m_c the piece's mean), over cnt.
extern "C" __global__ void norm_moments_combine(long long S, long long cnt, long long len,
                                                long long chunks, int centered,
                                                const double* part, double* mean,
                                                double* var) {
    const double div = cnt > 0 ? (double)cnt : 1.0;
    LG_GRID_LOOP(s, S) {
        const double m = centered ? lg_piece_total(part, s, chunks, 0) / div : 0.0;
        double q = 0;
        for (long long c = 0; c < chunks; ++c) {
            const double* pc = part + (s * chunks + c) * 2;
            q += pc[1];
            if (centered) {
                const long long lo = c * len;
                const double n = (double)((lo + len < cnt ? lo + len : cnt) - lo);
                const double dm = pc[0] / n - m;
                q += n * dm * dm;
            }
        }
        mean[s] = m;
        var[s] = q / div;
    }
}

// The input gradient from the saved x_hat, gw = g * w (has_w) and scale[s]
// (lg_piece_grad_apply's two modes; the affine mode has no sums and
// runs norm_bwd_affine). norm_bwd_* (join 0) sums each piece and, with
// one piece per statistic, applies it; with more, a second launch (join 1)
// adds a statistic's pieces and applies each piece. The *_inplace kernels write
// dx over g (buffer reuse: nothing else holds g); every sum of a statistic
// is complete before any of its elements is written.
#define LG_NORM_GRAD(sfx, T)                                                          \
    static __device__ void norm_bwd_body_##sfx(NormGeom g, long long len,             \
                                               long long chunks, int join, int mode,  \
                                               int has_w, int vec, const T* xhat,     \
                                               const Acc<T>::type* scale,             \
                                               const T* gr, const T* w, double* part, \
                                               T* dx) {                               \
        __shared__ double buf[LG_NORM_THREADS];                                       \
        const LgNormDivs divs = lg_norm_divs(g);                                      \
        const long long cnt = g.a * g.b;                                              \
        const double div = cnt > 0 ? (double)cnt : 1.0;                               \
        const T* wp = has_w ? w : (const T*)0;                                        \
        LG_PIECES(it, g, chunks) {                                                    \
            const LgPiece p(it, cnt, len, chunks);                                    \
            double m1, m2;                                                            \
            if (join) {                                                               \
                if (threadIdx.x < 2)                                                  \
                    buf[threadIdx.x] = lg_piece_total(part, p.s, chunks, threadIdx.x) / div; \
                __syncthreads();                                                      \
                m1 = buf[0];                                                          \
                m2 = buf[1];                                                          \
                __syncthreads(); /* before buf is written again */                    \
            } else {                                                                  \
                double s1, s2;                                                        \
                lg_piece_grad_sums<T>(g, divs, p, vec, 1, xhat, gr, wp, buf, s1, s2); \
                if (chunks > 1) {                                                     \
                    if (threadIdx.x == 0) {                                           \
                        part[2 * it] = s1;                                            \
                        part[2 * it + 1] = s2;                                        \
                    }                                                                 \
                    continue;                                                         \
                }                                                                     \
                m1 = s1 / div;                                                        \
                m2 = s2 / div;                                                        \
            }                                                                         \
            lg_piece_grad_apply<T>(g, divs, p, vec, mode, xhat, scale, gr, wp, m1, m2, \
                                   dx);                                               \
        }                                                                             \
    }                                                                                 \
    /* join 0: sum each piece (and apply it, with one piece per statistic); */       \
    /* join 1: add a statistic's pieces and apply each piece. */                     \
    extern "C" __global__ void norm_bwd_##sfx(NormGeom g, long long len, long long chunks, \
                                              int join, int mode, int has_w, int vec, \
                                              const T* xhat, const Acc<T>::type* scale, \
                                              const T* gr, const T* w, double* part,  \
                                              T* dx) {                                \
        norm_bwd_body_##sfx(g, len, chunks, join, mode, has_w, vec, xhat, scale, gr,  \
                            w, part, dx);                                             \
    }                                                                                 \
    extern "C" __global__ void norm_bwd_inplace_##sfx(NormGeom g, long long len,      \
                                                      long long chunks, int join,     \
                                                      int mode, int has_w, int vec,   \
                                                      const T* xhat,                  \
                                                      const Acc<T>::type* scale,      \
                                                      T* gr, const T* w, double* part) { \
        norm_bwd_body_##sfx(g, len, chunks, join, mode, has_w, vec, xhat, scale, gr,  \
                            w, part, gr);                                             \
    }
LG_FOR_FLOATS(LG_NORM_GRAD)

// Parameter gradients from the saved x_hat: dw[p] = sum g * x_hat (when
// want_w; x_hat is not read otherwise) and db[p] = sum g (when want_b),
// rounded once to T. `g` here is the parameters' geometry [n / (P*Lp), P,
// Lp] (parameter p's elements are (o*P + p)*Lp + l): norm_param_sums_*
// sums pieces (and writes dw, db with one piece per parameter),
// norm_param_combine_* adds the pieces of each parameter in order.
#define LG_NORM_PARAM(sfx, T)                                                         \
    extern "C" __global__ void norm_param_sums_##sfx(NormGeom g, long long len,       \
                                                     long long chunks, int want_w,    \
                                                     int want_b, int vec,             \
                                                     const T* xhat, const T* gr,      \
                                                     double* part, T* dw, T* db) {    \
        __shared__ double buf[LG_NORM_THREADS];                                       \
        const LgNormDivs divs = lg_norm_divs(g);                                      \
        const long long cnt = g.a * g.b;                                              \
        LG_PIECES(it, g, chunks) {                                                    \
            const LgPiece p(it, cnt, len, chunks);                                    \
            double sb, sw;                                                            \
            lg_piece_grad_sums<T>(g, divs, p, vec, want_w, xhat, gr, (const T*)0, buf, \
                                  sb, sw);                                            \
            if (threadIdx.x == 0) {                                                   \
                if (chunks > 1) {                                                     \
                    part[2 * it] = sb;                                                \
                    part[2 * it + 1] = sw;                                            \
                } else {                                                              \
                    if (want_w) dw[p.s] = lg_from_f64<T>(sw);                         \
                    if (want_b) db[p.s] = lg_from_f64<T>(sb);                         \
                }                                                                     \
            }                                                                         \
        }                                                                             \
    }                                                                                 \
    extern "C" __global__ void norm_param_combine_##sfx(long long P, long long chunks, \
                                                        int want_w, int want_b,       \
                                                        const double* part, T* dw,    \
                                                        T* db) {                      \
        LG_GRID_LOOP(p, P) {                                                          \
            if (want_w) dw[p] = lg_from_f64<T>(lg_piece_total(part, p, chunks, 1));   \
            if (want_b) db[p] = lg_from_f64<T>(lg_piece_total(part, p, chunks, 0));   \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_NORM_PARAM)

// The affine input gradient (norm_bwd_saved's NormGradCode::Affine: dx = scale[s] * (g *
// w[p]), w optional; no sums) element-wise in runs of LG_RUN over the whole
// grid, rather than one block per statistic: the same products, rounded
// the same way. dx may be g itself (each run is read whole before it is
// written, by the one thread that owns it).
#define LG_NORM_AFFINE_BWD(sfx, T)                                                    \
    static __device__ void norm_bwd_affine_body_##sfx(NormGeom geo, int has_w, int vec, \
                                                      const Acc<T>::type* scale,      \
                                                      const T* g, const T* w, T* dx) { \
        const LgNormDivs divs = lg_norm_divs(geo);                                    \
        long long n = geo.a * geo.s * geo.b;                                          \
        LG_RUN_LOOP(e0, n) {                                                          \
            int cnt = lg_run_count(n, e0);                                            \
            LgRun<T, LG_RUN> in, out;                                                 \
            in.load(g + e0, cnt, vec);                                                \
            /* scale[s] read as the statistic's values (v.m; v.r unused) */          \
            LgNormRunVals<T> rv(e0, cnt, geo, divs, scale, scale, has_w ? w : 0,      \
                                (const T*)0);                                         \
            LG_RUN_EACH(i, cnt) {                                                     \
                double gw = __dmul_rn(lg_to_f64(in.v[i]), rv.v.w);                    \
                out.v[i] = lg_from_f64<T>(__dmul_rn(rv.v.m, gw));                     \
                rv.next();                                                            \
            }                                                                         \
            out.store(dx + e0, cnt, vec);                                             \
        }                                                                             \
    }                                                                                 \
    extern "C" __global__ void norm_bwd_affine_##sfx(NormGeom geo, int has_w, int vec, \
                                                     const Acc<T>::type* scale,       \
                                                     const T* g, const T* w, T* dx) { \
        norm_bwd_affine_body_##sfx(geo, has_w, vec, scale, g, w, dx);                 \
    }                                                                                 \
    /* dx written over g (buffer reuse: nothing else holds g). */                     \
    extern "C" __global__ void norm_bwd_affine_inplace_##sfx(NormGeom geo, int has_w, \
                                                             int vec,                 \
                                                             const Acc<T>::type* scale, \
                                                             T* g, const T* w) {      \
        norm_bwd_affine_body_##sfx(geo, has_w, vec, scale, g, w, g);                  \
    }
LG_FOR_FLOATS(LG_NORM_AFFINE_BWD)

// What one norm call derives, per statistic i < s, from its mean and
// variance (the batch's f64 moments, or batch norm's running statistics in
// T), so that nothing crosses to the host:
//   mean_out  = S(mean)                  (S: the statistics type, Acc<T>)
//   rstd_out  = S(1 / sqrt(var + eps))
//   scale_out = S(w * rstd_out), or rstd_out without w
// and, with run_mean/run_var, batch norm's running statistics in place from
// the unrounded moments (the variance times `unbias`):
//   r <- T((1 - momentum) * r + momentum * m * k)
// Thread 0 adds 1 to `counter` (num_batches_tracked) when given. A null
// pointer is an absent operand, never touched; mean null means 0. The f64
// operations are written uncontracted, in the order the CPU computes them.
template <typename Src, typename T>
static __device__ void norm_prep_body(long long s, double eps, double momentum, double unbias,
                                      const Src* mean, const Src* var, T* run_mean,
                                      T* run_var, const T* w, typename Acc<T>::type* mean_out,
                                      typename Acc<T>::type* rstd_out,
                                      typename Acc<T>::type* scale_out, long long* counter) {
    typedef typename Acc<T>::type S;
    LG_GRID_LOOP(i, s) {
        double m = mean ? lg_to_f64(mean[i]) : 0.0;
        double v = lg_to_f64(var[i]);
        if (run_mean) {
            double keep = __dsub_rn(1.0, momentum);
            run_mean[i] = lg_from_f64<T>(
                __dadd_rn(__dmul_rn(keep, lg_to_f64(run_mean[i])), __dmul_rn(momentum, m)));
            run_var[i] = lg_from_f64<T>(__dadd_rn(__dmul_rn(keep, lg_to_f64(run_var[i])),
                                                  __dmul_rn(__dmul_rn(momentum, v), unbias)));
        }
        S r = (S)__ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(v, eps)));
        if (mean_out) mean_out[i] = (S)m;
        if (rstd_out) rstd_out[i] = r;
        if (scale_out) scale_out[i] = w ? (S)__dmul_rn(lg_to_f64(w[i]), (double)r) : r;
    }
    if (counter && blockIdx.x == 0 && threadIdx.x == 0) *counter += 1;
}

#define LG_NORM_PREP(sfx, T)                                                            \
    /* From the batch's f64 moments (train mode, layer / group / RMS norm). */          \
    extern "C" __global__ void norm_prep_moments_##sfx(                                 \
        long long s, double eps, double momentum, double unbias, const double* mean,    \
        const double* var, T* run_mean, T* run_var, const T* w, Acc<T>::type* mean_out, \
        Acc<T>::type* rstd_out, Acc<T>::type* scale_out, long long* counter) {          \
        norm_prep_body<double, T>(s, eps, momentum, unbias, mean, var, run_mean, run_var, \
                                  w, mean_out, rstd_out, scale_out, counter);           \
    }                                                                                   \
    /* From batch norm's running statistics (eval mode; never updated here). */         \
    extern "C" __global__ void norm_prep_running_##sfx(                                 \
        long long s, double eps, const T* mean, const T* var, const T* w,               \
        Acc<T>::type* mean_out, Acc<T>::type* rstd_out, Acc<T>::type* scale_out) {      \
        norm_prep_body<T, T>(s, eps, 0.0, 1.0, mean, var, (T*)0, (T*)0, w, mean_out,    \
                             rstd_out, scale_out, (long long*)0);                        \
    }                                                                                   \
    /* scale = S(w * rstd) per statistic from an already rounded rstd. */               \
    extern "C" __global__ void norm_scale_##sfx(long long s, const T* w,                \
                                                const Acc<T>::type* rstd,               \
                                                Acc<T>::type* scale) {                  \
        LG_GRID_LOOP(i, s) {                                                            \
            scale[i] = w ? (Acc<T>::type)__dmul_rn(lg_to_f64(w[i]), (double)rstd[i]) : rstd[i]; \
        }                                                                               \
    }
LG_FOR_FLOATS(LG_NORM_PREP)
