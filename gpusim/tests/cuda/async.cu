// Asynchronous copies global -> shared (compiled to ../fixtures/async.ptx):
// cuda_pipeline.h's primitives and inline cp.async with src-size and
// ignore-src operands.
#include <cuda_pipeline.h>

// Doubles n floats (n a multiple of 4) through shared memory, tile by tile:
// while one tile is processed the next is in flight (double buffering).
extern "C" __global__ void pipeline_double(int n, const float* x, float* out) {
    __shared__ __align__(16) float buf[2][256 * 4];
    int t = threadIdx.x;
    int tile = blockDim.x * 4;
    int ntiles = (n + tile - 1) / tile;
    int first = blockIdx.x;
    int stride = gridDim.x;
    int s = 0;
    if (first < ntiles && first * tile + t * 4 < n)
        __pipeline_memcpy_async(&buf[0][t * 4], &x[first * tile + t * 4], 16);
    __pipeline_commit();
    for (int i = first; i < ntiles; i += stride) {
        int next = i + stride;
        if (next < ntiles && next * tile + t * 4 < n)
            __pipeline_memcpy_async(&buf[s ^ 1][t * 4], &x[next * tile + t * 4], 16);
        __pipeline_commit();
        __pipeline_wait_prior(1);  // the current tile has landed
        __syncthreads();
        // Each thread reads another thread's chunk: the barrier orders it.
        int j = (t * 4 + 4 * 37) % tile;
        int at = i * tile + j;
        if (at < n) {
            for (int q = 0; q < 4; q++) out[at + q] = 2.0f * buf[s][j + q];
        }
        __syncthreads();  // the buffer is refilled next iteration
        s ^= 1;
    }
    __pipeline_wait_prior(0);
}

#define TILE 16

// C = A * B (M x K times K x N, row-major f32): 16x16 tiles staged through
// shared memory with 4-byte cp.async, the next k-tile in flight while the
// current one is used; elements outside the matrices are zero-filled with
// src-size 0.
extern "C" __global__ void async_matmul(int M, int N, int K, const float* A, const float* B,
                                        float* C) {
    __shared__ float As[2][TILE][TILE];
    __shared__ float Bs[2][TILE][TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
    int ktiles = (K + TILE - 1) / TILE;
    auto load = [&](int kt, int s) {
        int ak = kt * TILE + tx, bk = kt * TILE + ty;
        bool ain = row < M && ak < K, bin = bk < K && col < N;
        // An out-of-range element reads nothing (src-size 0) from a valid
        // address and becomes 0.
        const float* ap = ain ? &A[row * K + ak] : A;
        const float* bp = bin ? &B[bk * N + col] : B;
        unsigned as = (unsigned)__cvta_generic_to_shared(&As[s][ty][tx]);
        unsigned bs = (unsigned)__cvta_generic_to_shared(&Bs[s][ty][tx]);
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(as), "l"(ap),
                     "r"(ain ? 4 : 0));
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(bs), "l"(bp),
                     "r"(bin ? 4 : 0));
        asm volatile("cp.async.commit_group;");
    };
    float acc = 0.0f;
    load(0, 0);
    for (int kt = 0; kt < ktiles; kt++) {
        int s = kt & 1;
        if (kt + 1 < ktiles) {
            load(kt + 1, s ^ 1);
            asm volatile("cp.async.wait_group 1;");
        } else {
            asm volatile("cp.async.wait_group 0;");
        }
        __syncthreads();
        for (int k = 0; k < TILE; k++) acc = acc + As[s][ty][k] * Bs[s][k][tx];
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = acc;
}

// Lane t copies 16 bytes with src-size t % 17 (cp.async.cg), and 8 bytes
// with ignore-src = (t % 3 == 0) (cp.async.ca); then writes both back.
extern "C" __global__ void async_fill(const unsigned char* x, unsigned char* out16,
                                      unsigned char* out8) {
    __shared__ __align__(16) unsigned char s16[32 * 16];
    __shared__ __align__(16) unsigned char s8[32 * 8];
    int t = threadIdx.x;
    unsigned d16 = (unsigned)__cvta_generic_to_shared(&s16[t * 16]);
    unsigned d8 = (unsigned)__cvta_generic_to_shared(&s8[t * 8]);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d16), "l"(x + t * 16),
                 "r"(t % 17));
    asm volatile(
        "{ .reg .pred p; setp.eq.u32 p, %2, 0;\n"
        "  cp.async.ca.shared::cta.global [%0], [%1], 8, p; }" ::"r"(d8),
        "l"(x + t * 8), "r"(t % 3));
    asm volatile("cp.async.wait_all;");
    for (int i = 0; i < 16; i++) out16[t * 16 + i] = s16[t * 16 + i];
    for (int i = 0; i < 8; i++) out8[t * 8 + i] = s8[t * 8 + i];
}

// wait_group N completes all but the N most recent groups: three groups of
// one copy each, then wait_group 2 (first lands), 1 (second), 0 (third);
// an empty group committed in between counts as a group.
extern "C" __global__ void async_groups(const int* x, int* out) {
    __shared__ __align__(16) int s[4 * 32];
    int t = threadIdx.x;
    for (int g = 0; g < 3; g++) {
        __pipeline_memcpy_async(&s[g * 32 + t], &x[g * 32 + t], 4);
        __pipeline_commit();
    }
    __pipeline_commit();  // an empty group
    __pipeline_wait_prior(3);
    out[t] = s[t];
    __pipeline_wait_prior(2);
    out[32 + t] = s[32 + t];
    __pipeline_wait_prior(0);
    out[64 + t] = s[64 + t];
}
