// Half-precision math from cuda_fp16.h / cuda_bf16.h and byte permutes
// (compiled to ../fixtures/half.ptx), as other frameworks' kernels use them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// Transcendentals: cuda_fp16.hpp's inline PTX (`.reg.b32` without a space).
extern "C" __global__ void half_math(int n, const __half* x, __half* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __half v = x[i];
    __half* o = out + 8 * i;
    o[0] = hexp(v);
    o[1] = hsqrt(__habs(v));
    o[2] = hlog(__habs(v));
    o[3] = hsin(v);
    o[4] = hcos(v);
    o[5] = hexp2(v);
    o[6] = hrsqrt(__habs(v));
    o[7] = hrcp(v);
}

// Packed arithmetic on half2 and bf162.
extern "C" __global__ void half2_arith(int n, const __half2* a, const __half2* b, const __half2* c,
                                       __half2* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __half2 x = a[i], y = b[i], z = c[i];
    __half2* o = out + 8 * i;
    o[0] = __hadd2(x, y);
    o[1] = __hsub2(x, y);
    o[2] = __hmul2(x, y);
    o[3] = __hfma2(x, y, z);
    o[4] = __hneg2(x);
    o[5] = __habs2(x);
    o[6] = __hmin2(x, y);
    o[7] = __hmax2(x, y);
}

extern "C" __global__ void bf162_arith(int n, const __nv_bfloat162* a, const __nv_bfloat162* b,
                                       const __nv_bfloat162* c, __nv_bfloat162* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __nv_bfloat162 x = a[i], y = b[i], z = c[i];
    __nv_bfloat162* o = out + 8 * i;
    o[0] = __hadd2(x, y);
    o[1] = __hsub2(x, y);
    o[2] = __hmul2(x, y);
    o[3] = __hfma2(x, y, z);
    o[4] = __hneg2(x);
    o[5] = __habs2(x);
    o[6] = __hmin2(x, y);
    o[7] = __hmax2(x, y);
}

// Comparisons of half and half2 (bool results and packed masks).
extern "C" __global__ void half_cmp(int n, const __half2* a, const __half2* b, unsigned* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __half2 x = a[i], y = b[i];
    __half xl = __low2half(x), yl = __low2half(y);
    unsigned* o = out + 8 * i;
    o[0] = __heq(xl, yl) | __hne(xl, yl) << 1 | __hlt(xl, yl) << 2 | __hle(xl, yl) << 3 |
           __hgt(xl, yl) << 4 | __hge(xl, yl) << 5 | __hisnan(xl) << 6 | __hequ(xl, yl) << 7 |
           __hltu(xl, yl) << 8 | __hgeu(xl, yl) << 9;
    o[1] = __hbeq2(x, y) | __hblt2(x, y) << 1 | __hbgeu2(x, y) << 2;
    __half2 e = __heq2(x, y), l = __hlt2(x, y), g = __hgtu2(x, y);
    o[2] = *(unsigned*)&e;
    o[3] = *(unsigned*)&l;
    o[4] = *(unsigned*)&g;
    o[5] = __heq2_mask(x, y);
    o[6] = __hlt2_mask(x, y);
    __half m = __hmax(xl, yl);
    o[7] = *(unsigned short*)&m;
}

// __byte_perm (prmt.b32 default mode) over every selector pattern.
extern "C" __global__ void byte_perm(int n, const unsigned* a, const unsigned* b, const unsigned* s,
                                     unsigned* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __byte_perm(a[i], b[i], s[i]);
}
