// Deliberately wrong warp-synchronous code (compiled to
// ../fixtures/warp_broken.ptx): the sanitizer must report each.

// A full-mask shuffle inside a branch taken by half of the warp.
extern "C" __global__ void shfl_divergent(const int* x, int* out) {
    int t = threadIdx.x;
    int v = x[t];
    if (t < 16) v = __shfl_down_sync(0xffffffffu, v, 1);
    out[t] = v;
}

// Lanes that returned early are read by the survivors' shuffles.
extern "C" __global__ void shfl_exited(int n, const int* x, int* out) {
    int t = threadIdx.x;
    if (t >= n) return;
    int v = x[t];
    v += __shfl_down_sync(0xffffffffu, v, 4);
    out[t] = v;
}

// A lane that is not in its own member mask.
extern "C" __global__ void shfl_not_member(const int* x, int* out) {
    int t = threadIdx.x;
    out[t] = __shfl_sync(0x0000ffffu, x[t], 0);
}

// Reads a lane outside the member mask.
extern "C" __global__ void shfl_non_member_source(const int* x, int* out) {
    int t = threadIdx.x;
    int v = x[t];
    if (t < 16) v = __shfl_sync(0x0000ffffu, v, 20);
    out[t] = v;
}

// A warp reduction in divergent code.
extern "C" __global__ void redux_divergent(const unsigned* x, unsigned* out) {
    int t = threadIdx.x;
    unsigned v = x[t];
    if (v & 1) v = __reduce_add_sync(0xffffffffu, v);
    out[t] = v;
}

// __syncwarp reached by part of the warp.
extern "C" __global__ void syncwarp_divergent(const int* x, int* out) {
    int t = threadIdx.x;
    if (x[t] > 3) __syncwarp();
    out[t] = 1;
}

// The same exchange as syncwarp_exchange without __syncwarp: a race.
extern "C" __global__ void exchange_without_syncwarp(const int* x, int* out) {
    __shared__ int s[64];
    int t = threadIdx.x;
    s[t] = x[t];
    out[t] = s[t ^ 1];
}
