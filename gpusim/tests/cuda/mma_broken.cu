// Deliberately wrong tensor-core code (compiled to
// ../fixtures/mma_broken.ptx): the sanitizer must report each.

__device__ void mma16816(float* d, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// An mma inside a branch taken by half of the warp.
extern "C" __global__ void mma_divergent(const unsigned* x, float* out) {
    int l = threadIdx.x;
    unsigned a[4] = {x[l], x[l], x[l], x[l]}, b[2] = {x[l], x[l]};
    float d[4] = {0, 0, 0, 0};
    if (x[l] & 1) mma16816(d, a, b);
    out[l] = d[0];
}

// Lanes that returned early do not take part in the mma.
extern "C" __global__ void mma_after_exit(int n, const unsigned* x, float* out) {
    int l = threadIdx.x;
    if (l >= n) return;
    unsigned a[4] = {x[l], x[l], x[l], x[l]}, b[2] = {x[l], x[l]};
    float d[4] = {0, 0, 0, 0};
    mma16816(d, a, b);
    out[l] = d[0];
}

__device__ void ldm_x4(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// Row `off` of a 32 x 8 b16 tile: lane l supplies row l shifted by `shift`
// bytes; with `fill` = 0 the tile is never written.
extern "C" __global__ void ldmatrix_rows(int shift, int fill, const unsigned short* x,
                                         unsigned* out) {
    __shared__ __align__(16) unsigned short s[32 * 8];
    int l = threadIdx.x;
    if (fill)
        for (int i = 0; i < 8; i++) s[l * 8 + i] = x[l * 8 + i];
    __syncwarp();
    unsigned r[4];
    ldm_x4(r, (unsigned)__cvta_generic_to_shared(s) + l * 16 + shift);
    out[l] = r[0] ^ r[1] ^ r[2] ^ r[3];
}

// ldmatrix in divergent code.
extern "C" __global__ void ldmatrix_divergent(const unsigned short* x, unsigned* out) {
    __shared__ __align__(16) unsigned short s[32 * 8];
    int l = threadIdx.x;
    for (int i = 0; i < 8; i++) s[l * 8 + i] = x[l * 8 + i];
    __syncwarp();
    unsigned r[4] = {0, 0, 0, 0};
    if (l < 24) ldm_x4(r, (unsigned)__cvta_generic_to_shared(&s[l * 8]));
    out[l] = r[0];
}

// Warp 0 writes the tile, warp 1 loads it without a barrier.
extern "C" __global__ void ldmatrix_race(const unsigned short* x, unsigned* out) {
    __shared__ __align__(16) unsigned short s[32 * 8];
    int t = threadIdx.x, l = t % 32;
    if (t < 32)
        for (int i = 0; i < 8; i++) s[l * 8 + i] = x[l * 8 + i];
    if (t >= 32) {
        unsigned r[4];
        ldm_x4(r, (unsigned)__cvta_generic_to_shared(&s[l * 8]));
        out[l] = r[0];
    }
}

// The tile is loaded with cp.async and read by ldmatrix before the wait.
extern "C" __global__ void ldmatrix_before_wait(const unsigned short* x, unsigned* out) {
    __shared__ __align__(16) unsigned short s[32 * 8];
    int l = threadIdx.x;
    unsigned d = (unsigned)__cvta_generic_to_shared(&s[l * 8]);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(x + l * 8));
    asm volatile("cp.async.commit_group;");
    unsigned r[4];
    ldm_x4(r, d);
    asm volatile("cp.async.wait_group 0;");
    out[l] = r[0];
}

// ldmatrix through a generic address that points to global memory.
extern "C" __global__ void ldmatrix_global(const unsigned short* x, unsigned* out) {
    int l = threadIdx.x;
    unsigned r0;
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.b16 {%0}, [%1];" : "=r"(r0) : "l"(x + l * 8));
    out[l] = r0;
}
