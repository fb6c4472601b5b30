// Test kernels for the PTX interpreter (compiled to ../fixtures/basic.ptx).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" __global__ void add_f32(long long n, const float* x, const float* y, float* out) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (x[i] + y[i]) * 2.0f;
}

// Data-dependent loops: lanes of a warp leave at different iterations.
extern "C" __global__ void collatz(int n, unsigned* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned long long v = i + 1;
    unsigned steps = 0;
    while (v != 1) {
        if (v & 1) v = 3 * v + 1; else v >>= 1;
        steps++;
    }
    out[i] = steps;
}

// As relu_mask: divergent code, then a ballot of the whole warp.
extern "C" __global__ void ballot_mask(long long n, const float* x, float* y, unsigned* mask) {
    long long words = (n + 31) / 32;
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    long long warps = ((long long)blockDim.x * gridDim.x) >> 5;
    int lane = threadIdx.x & 31;
    for (long long w = warp; w < words; w += warps) {
        long long i = w * 32 + lane;
        bool pos = false;
        if (i < n) {
            float v = x[i];
            pos = v > 0;
            if (pos) y[i] = v; else if (v < -1.0f) y[i] = -1.0f; else y[i] = 0.0f;
        }
        unsigned bits = __ballot_sync(0xffffffffu, pos);
        if (lane == 0) mask[w] = bits;
    }
}

// Tree reduction in shared memory with barriers.
extern "C" __global__ void block_sum(long long n, const double* x, double* out) {
    __shared__ double buf[256];
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    buf[threadIdx.x] = i < n ? x[i] : 0.0;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = buf[0];
}

// NVRTC writes a CAS loop for bf16 atomicAdd on compute_80.
extern "C" __global__ void scatter_add_bf16(long long n, const int* idx, const __nv_bfloat16* src,
                                            __nv_bfloat16* dst) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&dst[idx[i]], src[i]);
}

extern "C" __global__ void atomics(long long n, const int* x, float* fsum, double* dsum,
                                   unsigned long long* count, int* imax, unsigned* bits,
                                   __half* hsum) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = x[i];
    atomicAdd(fsum, (float)v);
    atomicAdd(dsum, (double)v * 0.5);
    atomicAdd(count, 1ull);
    atomicMax(imax, v);
    atomicOr(bits, 1u << (v & 31));
    atomicAdd(hsum, __float2half((float)(v & 3)));
}

// Math-library code: calls to internal .func's, a local depot, module
// .global tables.
extern "C" __global__ void math_f64(long long n, const double* x, double* s, double* p) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        s[i] = sin(x[i]);
        p[i] = pow(x[i], 1.5);
    }
}

// Integer semantics of 64-bit index code.
extern "C" __global__ void int_ops(long long n, const long long* a, const long long* b,
                                   long long* out) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long x = a[i], y = b[i];
    unsigned long long ux = x, uy = y;
    long long* o = out + 12 * i;
    o[0] = y != 0 ? x / y : 0;
    o[1] = y != 0 ? x % y : 0;
    o[2] = uy != 0 ? (long long)(ux / uy) : 0;
    o[3] = __mul64hi(x, y);
    o[4] = (long long)__umul64hi(ux, uy);
    o[5] = x >> (y & 63);
    o[6] = (long long)(ux >> (uy & 63));
    o[7] = __clzll(x) + 100 * __popcll(x);
    o[8] = (long long)__brevll(ux);
    o[9] = min(x, y) ^ max(ux, uy);
    o[10] = (int)x / ((int)y | 1) + (unsigned)x % ((unsigned)y | 1u);
    o[11] = (short)x * (short)y + (unsigned char)x;
}

// f16/bf16 conversions through inline asm, as leangrad's kernels.
extern "C" __global__ void halves(long long n, const float* x, __half* h, __nv_bfloat16* b,
                                  float* back) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        __half hv = __float2half(x[i]);
        __nv_bfloat16 bv = __float2bfloat16(x[i]);
        h[i] = hv;
        b[i] = bv;
        back[i] = __half2float(hv) + __bfloat162float(bv);
    }
}

// Early return before a barrier: the returning threads exit (legal since
// Volta), the others synchronize.
extern "C" __global__ void early_return_barrier(int n, const float* x, float* out) {
    __shared__ float s[256];
    int t = threadIdx.x;
    if (t >= n) return;
    s[t] = x[t];
    __syncthreads();
    out[t] = s[n - 1 - t];
}
