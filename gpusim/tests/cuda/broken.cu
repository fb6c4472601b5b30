// Deliberately broken kernels: each must fail with a sanitizer fault
// (compiled to ../fixtures/broken.ptx).

extern "C" __global__ void off_by_one(int n, float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i] = 1.0f;
}

extern "C" __global__ void copy_f32(int n, const float* x, float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i];
}

extern "C" __global__ void shared_race(float* out) {
    // volatile: the store and the load both stay in the PTX.
    volatile __shared__ float s;
    s = (float)threadIdx.x;
    out[threadIdx.x] = s;
}

extern "C" __global__ void divergent_barrier(int* out) {
    __shared__ int s[64];
    if (threadIdx.x < 16) {
        s[threadIdx.x] = 1;
        __syncthreads();
    }
    out[threadIdx.x] = 2;
}

extern "C" __global__ void misaligned(const char* p, float* out) {
    out[threadIdx.x] = *(const float*)(p + 1 + 4 * threadIdx.x);
}

extern "C" __global__ void shared_uninit(float* out) {
    __shared__ float s[64];
    if (threadIdx.x < 32) s[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
}

extern "C" __global__ void traps(int* out) {
    if (threadIdx.x == 5) __trap();
    out[threadIdx.x] = 1;
}
