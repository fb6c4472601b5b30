// Dynamic shared memory (compiled to ../fixtures/dynsmem.ptx): sizes set
// at launch, following the kernel's static shared arrays.

// A block-wide bitonic sort of blockDim.x keys (a power of two) in
// dynamic shared memory, as sort and top-k kernels do.
extern "C" __global__ void bitonic_sort(const float* x, float* out) {
    extern __shared__ float keys[];
    int t = threadIdx.x, n = blockDim.x;
    keys[t] = x[blockIdx.x * n + t];
    __syncthreads();
    for (int k = 2; k <= n; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            int p = t ^ j;
            if (p > t) {
                float a = keys[t], b = keys[p];
                bool up = (t & k) == 0;
                if ((a > b) == up) {
                    keys[t] = b;
                    keys[p] = a;
                }
            }
            __syncthreads();
        }
    }
    out[blockIdx.x * n + t] = keys[t];
}

// An exclusive block scan (Hillis-Steele, double-buffered) in dynamic
// shared memory next to a static array.
extern "C" __global__ void block_scan(const int* x, int* out, int* totals) {
    __shared__ int total;
    extern __shared__ int buf[];
    int t = threadIdx.x, n = blockDim.x;
    int* a = buf;
    int* b = buf + n;
    a[t] = t > 0 ? x[blockIdx.x * n + t - 1] : 0;
    __syncthreads();
    for (int o = 1; o < n; o <<= 1) {
        b[t] = t >= o ? a[t] + a[t - o] : a[t];
        __syncthreads();
        int* s = a;
        a = b;
        b = s;
    }
    if (t == n - 1) total = a[t] + x[blockIdx.x * n + t];
    __syncthreads();
    out[blockIdx.x * n + t] = a[t];
    if (t == 0) totals[blockIdx.x] = total;
}

// Reads element `i` of the dynamic array (out of bounds past the launch's size).
extern "C" __global__ void dyn_read(int i, int* out) {
    extern __shared__ int dyn[];
    dyn[threadIdx.x] = threadIdx.x;
    __syncthreads();
    if (threadIdx.x == 0) out[0] = dyn[i];
}
