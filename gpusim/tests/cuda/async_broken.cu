// Deliberately wrong asynchronous copies (compiled to
// ../fixtures/async_broken.ptx): the sanitizer must report each.
#include <cuda_pipeline.h>

// Reads its own copy's destination before any wait.
extern "C" __global__ void read_before_wait(const float* x, float* out) {
    __shared__ __align__(16) float s[128];
    int t = threadIdx.x;
    __pipeline_memcpy_async(&s[t * 4], &x[t * 4], 16);
    __pipeline_commit();
    out[t] = s[t * 4];
    __pipeline_wait_prior(0);
}

// Another thread reads the destination after a barrier, but the issuing
// thread never waited before the barrier: the copy is still in flight.
extern "C" __global__ void barrier_without_wait(const float* x, float* out) {
    __shared__ __align__(16) float s[32];
    int t = threadIdx.x;
    __pipeline_memcpy_async(&s[t], &x[t], 4);
    __pipeline_commit();
    __syncthreads();
    out[t] = s[(t + 1) % 32];
    __pipeline_wait_prior(0);
}

// Waits, but other threads read without a barrier after the wait.
extern "C" __global__ void wait_without_barrier(const float* x, float* out) {
    __shared__ __align__(16) float s[32];
    int t = threadIdx.x;
    __pipeline_memcpy_async(&s[t], &x[t], 4);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    out[t] = s[(t + 1) % 32];
}

// Writes over the destination of a copy still in flight.
extern "C" __global__ void write_over_pending(const float* x, float* out) {
    __shared__ __align__(16) float s[32];
    int t = threadIdx.x;
    __pipeline_memcpy_async(&s[t], &x[t], 4);
    __pipeline_commit();
    s[t] = 1.0f;
    __pipeline_wait_prior(0);
    out[t] = s[t];
}

// wait_group 1 leaves the most recent group in flight; its data is read.
extern "C" __global__ void wait_too_shallow(const float* x, float* out) {
    __shared__ __align__(16) float s[64];
    int t = threadIdx.x;
    __pipeline_memcpy_async(&s[t], &x[t], 4);
    __pipeline_commit();
    __pipeline_memcpy_async(&s[32 + t], &x[32 + t], 4);
    __pipeline_commit();
    __pipeline_wait_prior(1);
    out[t] = s[t] + s[32 + t];
    __pipeline_wait_prior(0);
}

// Committed, never waited for.
extern "C" __global__ void never_waited(const float* x, float* out) {
    __shared__ __align__(16) float s[32];
    int t = threadIdx.x;
    __pipeline_memcpy_async(&s[t], &x[t], 4);
    __pipeline_commit();
    out[t] = x[t];
}

// Never committed: wait_group 0 does not cover it.
extern "C" __global__ void never_committed(const float* x, float* out) {
    __shared__ __align__(16) float s[32];
    int t = threadIdx.x;
    __pipeline_memcpy_async(&s[t], &x[t], 4);
    __pipeline_wait_prior(0);
    out[t] = x[t];
}

// Copies from past the end of the source (n elements).
extern "C" __global__ void source_out_of_bounds(int n, const float* x, float* out) {
    __shared__ __align__(16) float s[64];
    int t = threadIdx.x;
    __pipeline_memcpy_async(&s[t], &x[t + n - 16], 4);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    out[t] = s[t];
}

// A 16-byte copy whose destination is only 4-byte aligned.
extern "C" __global__ void misaligned_destination(const float* x, float* out) {
    __shared__ __align__(16) float s[160];
    int t = threadIdx.x;
    unsigned d = (unsigned)__cvta_generic_to_shared(&s[t * 4 + 1]);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(x + t * 4));
    asm volatile("cp.async.wait_all;");
    out[t] = s[t * 4 + 1];
}

// The destination range ends past the shared array.
extern "C" __global__ void destination_out_of_bounds(const float* x, float* out) {
    __shared__ __align__(16) float s[32];
    int t = threadIdx.x;
    unsigned d = (unsigned)__cvta_generic_to_shared(&s[0]) + 16 * t;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(x + t * 4));
    asm volatile("cp.async.wait_all;");
    out[t] = x[t];
}
