// Convolution helpers, as cpu.rs beside this file: im2col / col2im for 2-d (1-d is
// h = kh = 1) with stride, padding and dilation, the bias fill and the
// per-channel sum for bias gradients. Groups need nothing here: the column
// rows of group g are the contiguous block g*K .. (g+1)*K (K = cin/groups *
// kh*kw), which the GEMMs address directly.
//
// Columns of item i: [cin*kh*kw, oh*ow], row r = (c*kh + ki)*kw + kj,
// column l = oy*ow + ox; a chunk of nb items is [nb, cin*kh*kw, oh*ow].
// Launched from cuda.rs beside this file. `struct ConvGeom` is the Rust
// `leangrad::nn::ConvGeom` (src/nn/conv/mod.rs, #[repr(C)]): same fields in
// the same order, its usize fields laid out as these long longs.

struct ConvGeom {
    long long n, cin, h, w, cout, kh, kw;
    long long stride[2], pad[2], dil[2];
    long long groups, oh, ow;
};

#define LG_CONV(sfx, T)                                                               \
    /* cols of items first .. first+nb of x ([n, cin, h, w]). */                     \
    extern "C" __global__ void im2col_##sfx(ConvGeom g, long long first, long long nb, \
                                            T* cols, const T* x) {                    \
        long long kk = g.kh * g.kw, L = g.oh * g.ow, rows = g.cin * kk;               \
        long long n = nb * rows * L;                                                  \
        LG_GRID_LOOP(e, n) {                                                          \
            long long l = e % L, r = e / L % rows, i = first + e / (L * rows);        \
            long long c = r / kk, ki = r % kk / g.kw, kj = r % g.kw;                  \
            long long iy = l / g.ow * g.stride[0] + ki * g.dil[0] - g.pad[0];         \
            long long ix = l % g.ow * g.stride[1] + kj * g.dil[1] - g.pad[1];         \
            bool in = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;                     \
            cols[e] = in ? x[((i * g.cin + c) * g.h + iy) * g.w + ix] : lg_store<T>(0); \
        }                                                                             \
    }                                                                                 \
    /* Folds the columns of items first .. first+nb back into gx ([n, cin, h, w]), */ \
    /* overwriting those items (or, with accumulate, adding to what they hold: */     \
    /* the transposed convolution's bias): each input element gathers its taps */     \
    /* in (ki, kj) order, the CPU's order of additions, each rounded in T. */         \
    extern "C" __global__ void col2im_##sfx(ConvGeom g, long long first, long long nb, \
                                            int accumulate, T* gx, const T* cols) {   \
        typedef Acc<T>::type A;                                                       \
        long long kk = g.kh * g.kw, L = g.oh * g.ow, rows = g.cin * kk;               \
        long long n = nb * g.cin * g.h * g.w;                                         \
        LG_GRID_LOOP(e, n) {                                                          \
            long long ix = e % g.w, iy = e / g.w % g.h, c = e / (g.w * g.h) % g.cin;  \
            long long item = e / (g.w * g.h * g.cin);                                 \
            const T* base = cols + item * rows * L;                                   \
            A acc = accumulate ? lg_load(gx[first * g.cin * g.h * g.w + e]) : (A)0;   \
            for (long long ki = 0; ki < g.kh; ++ki) {                                 \
                long long ty = iy + g.pad[0] - ki * g.dil[0];                         \
                if (ty < 0 || ty % g.stride[0] != 0 || ty / g.stride[0] >= g.oh) continue; \
                for (long long kj = 0; kj < g.kw; ++kj) {                             \
                    long long tx = ix + g.pad[1] - kj * g.dil[1];                     \
                    if (tx < 0 || tx % g.stride[1] != 0 || tx / g.stride[1] >= g.ow) continue; \
                    long long r = c * kk + ki * g.kw + kj;                            \
                    long long l = ty / g.stride[0] * g.ow + tx / g.stride[1];         \
                    acc = lg_load(lg_store<T>(acc + lg_load(base[r * L + l])));       \
                }                                                                     \
            }                                                                         \
            gx[first * g.cin * g.h * g.w + e] = lg_store<T>(acc);                     \
        }                                                                             \
    }                                                                                 \
    /* y[(i*c + ch)*l + j] = b[ch] for the n*c*l outputs. */                          \
    extern "C" __global__ void conv_fill_bias_##sfx(long long n, long long c,        \
                                                    long long l, T* y, const T* b) {  \
        LG_GRID_LOOP(e, n) { y[e] = b[e / l % c]; }                                   \
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
