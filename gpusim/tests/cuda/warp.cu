// Warp-level primitives (compiled to ../fixtures/warp.ptx): shuffles,
// votes, reductions and matches, as fast kernels and other frameworks'
// kernels use them.

// The classic two-level block reduction: a shuffle tree in each warp,
// warp sums through shared memory, a shuffle tree again in warp 0.
__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

extern "C" __global__ void block_reduce_sum(int n, const float* x, float* out) {
    __shared__ float sums[32];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.0f;
    v = warp_sum(v);
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    if (lane == 0) sums[wid] = v;
    __syncthreads();
    if (wid == 0) {
        int nw = (blockDim.x + 31) >> 5;
        v = lane < nw ? sums[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0) out[blockIdx.x] = v;
    }
}

// Every shuffle mode of the CUDA API with a sub-warp width.
extern "C" __global__ void shfl_modes(const int* x, int width, int delta, int* out) {
    int t = threadIdx.x;
    int v = x[t];
    out[4 * t + 0] = __shfl_sync(0xffffffffu, v, delta, width);
    out[4 * t + 1] = __shfl_up_sync(0xffffffffu, v, delta, width);
    out[4 * t + 2] = __shfl_down_sync(0xffffffffu, v, delta, width);
    out[4 * t + 3] = __shfl_xor_sync(0xffffffffu, v, delta, width);
}

// 64-bit values shuffle as two 32-bit halves.
extern "C" __global__ void shfl_f64(const double* x, double* out) {
    int t = threadIdx.x;
    out[t] = __shfl_xor_sync(0xffffffffu, x[t], 1) + __shfl_sync(0xffffffffu, x[t], 31 - (t & 31));
}

// Warp-inclusive scan with shfl.up (the building block of CUB-style scans).
extern "C" __global__ void warp_scan(const int* x, int* out) {
    int t = threadIdx.x, lane = t & 31;
    int v = x[t];
    for (int o = 1; o < 32; o <<= 1) {
        int u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    out[t] = v;
}

// sm_80 warp reductions, votes and matches.
extern "C" __global__ void redux_vote_match(const unsigned* x, unsigned* out) {
    int t = threadIdx.x;
    unsigned v = x[t];
    unsigned* o = out + 12 * t;
    o[0] = __reduce_add_sync(0xffffffffu, v);
    o[1] = __reduce_min_sync(0xffffffffu, v);
    o[2] = __reduce_max_sync(0xffffffffu, v);
    o[3] = (unsigned)__reduce_min_sync(0xffffffffu, (int)v);
    o[4] = (unsigned)__reduce_max_sync(0xffffffffu, (int)v);
    o[5] = __reduce_and_sync(0xffffffffu, v);
    o[6] = __reduce_or_sync(0xffffffffu, v);
    o[7] = __reduce_xor_sync(0xffffffffu, v);
    o[8] = __match_any_sync(0xffffffffu, v & 3);
    int pred;
    o[9] = __match_all_sync(0xffffffffu, v & 1, &pred);
    o[10] = (unsigned)pred | (__any_sync(0xffffffffu, v > 100) << 1) |
            (__all_sync(0xffffffffu, v > 0) << 2) | (__uni_sync(0xffffffffu, v & 1) << 3);
    o[11] = __activemask();
}

// Half-warp reductions with a sub-mask: lanes 0-15 and 16-31 separately,
// in divergent code (each half is a converged group of its own mask).
extern "C" __global__ void half_warp_sum(const int* x, int* out) {
    int t = threadIdx.x;
    int v = x[t];
    if ((t & 31) < 16) {
        for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0x0000ffffu, v, o);
    } else {
        for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffff0000u, v, o);
    }
    out[t] = v;
}

// Warp-synchronous exchange through shared memory ordered by __syncwarp.
extern "C" __global__ void syncwarp_exchange(const int* x, int* out) {
    __shared__ int s[64];
    int t = threadIdx.x;
    s[t] = x[t];
    __syncwarp();
    out[t] = s[t ^ 1];
}
