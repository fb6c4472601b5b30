// Tensor-core instructions through inline PTX (compiled to
// ../fixtures/mma.ptx): one mma per kernel with its fragments gathered from
// row-major matrices exactly as the PTX ISA's "Matrix Fragments for
// mma.m16n8kK" sections place them (g = lane >> 2, t = lane % 4); ldmatrix
// in every form; and a small tensor-core GEMM (cp.async staging, ldmatrix,
// mma.sync). A is 16 x K, B is K x 8 ([k][n]), C and D are 16 x 8.

typedef unsigned short half_t;  // f16 or bf16 bits

__device__ unsigned pack(half_t lo, half_t hi) { return lo | (unsigned)hi << 16; }

// The f32 C fragment in, the D fragment out (rows g and g + 8, columns 2t
// and 2t + 1).
#define C_FRAG(C, c)                                                           \
    float c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], \
                  C[(g + 8) * 8 + 2 * t + 1]};
#define D_STORE(D, d)                                                          \
    D[g * 8 + 2 * t] = d[0];                                                   \
    D[g * 8 + 2 * t + 1] = d[1];                                               \
    D[(g + 8) * 8 + 2 * t] = d[2];                                             \
    D[(g + 8) * 8 + 2 * t + 1] = d[3];

// m16n8k8 .tf32: a0..a3 at (g, t), (g+8, t), (g, t+4), (g+8, t+4); b0, b1 at
// (t, g), (t+4, g). With cvt != 0 the kernel rounds A and B with
// cvt.rna.tf32.f32 first; otherwise the raw f32 bits go in.
extern "C" __global__ void mma_tf32_k8(const float* A, const float* B, const float* C, float* D,
                                       int cvt) {
    int l = threadIdx.x, g = l >> 2, t = l & 3;
    float af[4] = {A[g * 8 + t], A[(g + 8) * 8 + t], A[g * 8 + t + 4], A[(g + 8) * 8 + t + 4]};
    float bf[2] = {B[t * 8 + g], B[(t + 4) * 8 + g]};
    unsigned a[4], b[2];
    for (int i = 0; i < 4; i++) {
        if (cvt)
            asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(a[i]) : "f"(af[i]));
        else
            a[i] = __float_as_uint(af[i]);
    }
    for (int i = 0; i < 2; i++) {
        if (cvt)
            asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(b[i]) : "f"(bf[i]));
        else
            b[i] = __float_as_uint(bf[i]);
    }
    C_FRAG(C, c)
    float d[4];
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%11,%12,%13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
          "f"(c[1]), "f"(c[2]), "f"(c[3]));
    D_STORE(D, d)
}

// m16n8k4 .tf32: a0, a1 at (g, t), (g+8, t); b0 at (t, g).
extern "C" __global__ void mma_tf32_k4(const float* A, const float* B, const float* C, float* D) {
    int l = threadIdx.x, g = l >> 2, t = l & 3;
    unsigned a0 = __float_as_uint(A[g * 4 + t]), a1 = __float_as_uint(A[(g + 8) * 4 + t]);
    unsigned b0 = __float_as_uint(B[t * 8 + g]);
    C_FRAG(C, c)
    float d[4];
    asm volatile(
        "mma.sync.aligned.m16n8k4.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%8,%9,%10};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
    D_STORE(D, d)
}

// m16n8k16 halves: register r of A holds a(2r), a(2r+1) (low first) at row
// g + 8 (r % 2), columns 2t + 8 (r / 2) and the next; B register r holds
// rows 2t + 8r and 2t + 8r + 1 of column g.
#define K16_FRAGS                                                              \
    int l = threadIdx.x, g = l >> 2, t = l & 3;                                \
    unsigned a[4], b[2];                                                       \
    for (int r = 0; r < 4; r++) {                                              \
        int row = g + 8 * (r % 2), col = 2 * t + 8 * (r / 2);                  \
        a[r] = pack(A[row * 16 + col], A[row * 16 + col + 1]);                 \
    }                                                                          \
    for (int r = 0; r < 2; r++) {                                              \
        int row = 2 * t + 8 * r;                                               \
        b[r] = pack(B[row * 8 + g], B[(row + 1) * 8 + g]);                     \
    }

#define MMA_K16(TY)                                                                          \
    extern "C" __global__ void mma_##TY##_k16(const half_t* A, const half_t* B, const float* C, \
                                               float* D) {                                     \
        K16_FRAGS                                                                            \
        C_FRAG(C, c)                                                                         \
        float d[4];                                                                          \
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." #TY "." #TY                    \
                     ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"        \
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                        \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),     \
                       "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));                          \
        D_STORE(D, d)                                                                        \
    }
MMA_K16(f16)
MMA_K16(bf16)

// m16n8k8 halves: A register r at row g + 8r, columns 2t, 2t + 1; B's one
// register holds rows 2t, 2t + 1 of column g.
#define MMA_K8(TY)                                                                          \
    extern "C" __global__ void mma_##TY##_k8(const half_t* A, const half_t* B, const float* C, \
                                              float* D) {                                     \
        int l = threadIdx.x, g = l >> 2, t = l & 3;                                         \
        unsigned a0 = pack(A[g * 8 + 2 * t], A[g * 8 + 2 * t + 1]);                         \
        unsigned a1 = pack(A[(g + 8) * 8 + 2 * t], A[(g + 8) * 8 + 2 * t + 1]);             \
        unsigned b0 = pack(B[2 * t * 8 + g], B[(2 * t + 1) * 8 + g]);                       \
        C_FRAG(C, c)                                                                        \
        float d[4];                                                                         \
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32." #TY "." #TY                    \
                     ".f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};"                   \
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                       \
                     : "r"(a0), "r"(a1), "r"(b0), "f"(c[0]), "f"(c[1]), "f"(c[2]),          \
                       "f"(c[3]));                                                          \
        D_STORE(D, d)                                                                       \
    }
MMA_K8(f16)
MMA_K8(bf16)

// m16n8k16 .f16 with f16 accumulators: C/D register 0 holds (g, 2t) and
// (g, 2t + 1), register 1 the same columns of row g + 8.
extern "C" __global__ void mma_f16_k16_f16acc(const half_t* A, const half_t* B, const half_t* C,
                                              half_t* D) {
    K16_FRAGS
    unsigned c0 = pack(C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1]);
    unsigned c1 = pack(C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]);
    unsigned d0, d1;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, "
        "{%8,%9};"
        : "=r"(d0), "=r"(d1)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(c0), "r"(c1));
    D[g * 8 + 2 * t] = d0 & 0xffff;
    D[g * 8 + 2 * t + 1] = d0 >> 16;
    D[(g + 8) * 8 + 2 * t] = d1 & 0xffff;
    D[(g + 8) * 8 + 2 * t + 1] = d1 >> 16;
}

// 8-bit integer mma, A 16 x K and B K x 8 bytes, C and D s32. m16n8k32: A
// register r holds columns 4t + 16 (r / 2) .. +3 of row g + 8 (r % 2), B
// register r rows 4t + 16r .. +3 of column g; m16n8k16: A register r holds
// columns 4t .. 4t + 3 of row g + 8r, B's one register rows 4t .. 4t + 3.
__device__ unsigned pack4(const unsigned char* p, int stride) {
    return p[0] | (unsigned)p[stride] << 8 | (unsigned)p[2 * stride] << 16 |
           (unsigned)p[3 * stride] << 24;
}
#define I_FRAG(C, c)                                                           \
    int c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], \
                C[(g + 8) * 8 + 2 * t + 1]};
#define MMA_I8_K32(NAME, TYPES)                                                               \
    extern "C" __global__ void NAME(const unsigned char* A, const unsigned char* B, const int* C, \
                                    int* D) {                                                 \
        int l = threadIdx.x, g = l >> 2, t = l & 3;                                          \
        unsigned a[4], b[2];                                                                 \
        for (int r = 0; r < 4; r++)                                                          \
            a[r] = pack4(&A[(g + 8 * (r % 2)) * 32 + 4 * t + 16 * (r / 2)], 1);               \
        for (int r = 0; r < 2; r++) b[r] = pack4(&B[(4 * t + 16 * r) * 8 + g], 8);            \
        I_FRAG(C, c)                                                                         \
        int d[4];                                                                            \
        asm volatile("mma.sync.aligned.m16n8k32.row.col" TYPES                               \
                     " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"            \
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])                        \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),     \
                       "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));                          \
        D_STORE(D, d)                                                                        \
    }
MMA_I8_K32(mma_s8_u8_k32, ".s32.s8.u8.s32")
MMA_I8_K32(mma_s8_s8_k32_sat, ".satfinite.s32.s8.s8.s32")

extern "C" __global__ void mma_u8_s8_k16(const unsigned char* A, const unsigned char* B,
                                         const int* C, int* D) {
    int l = threadIdx.x, g = l >> 2, t = l & 3;
    unsigned a0 = pack4(&A[g * 16 + 4 * t], 1), a1 = pack4(&A[(g + 8) * 16 + 4 * t], 1);
    unsigned b0 = pack4(&B[4 * t * 8 + g], 8);
    I_FRAG(C, c)
    int d[4];
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%8,%9,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
    D_STORE(D, d)
}

// ldmatrix of a 32 x 8 b16 array (four 8x8 matrices stacked by rows) in
// shared memory: lane i supplies row i's address; every lane writes what it
// received (x1: one register, x2: two, x4: four; trans: transposed).
#define LDM(NAME, NUM, TRANS, N)                                                      \
    extern "C" __global__ void NAME(const half_t* src, unsigned* out) {               \
        __shared__ __align__(16) half_t s[32 * 8];                                    \
        int l = threadIdx.x;                                                          \
        for (int i = 0; i < 8; i++) s[l * 8 + i] = src[l * 8 + i];                    \
        __syncwarp();                                                                 \
        unsigned addr = (unsigned)__cvta_generic_to_shared(&s[l * 8]);                \
        unsigned r[4] = {0, 0, 0, 0};                                                 \
        LDM_##NUM(TRANS);                                                             \
        for (int i = 0; i < N; i++) out[l * N + i] = r[i];                            \
    }
#define LDM_x1(TRANS) \
    asm volatile("ldmatrix.sync.aligned.m8n8.x1" TRANS ".shared.b16 {%0}, [%1];" : "=r"(r[0]) : "r"(addr))
#define LDM_x2(TRANS)                                                                         \
    asm volatile("ldmatrix.sync.aligned.m8n8.x2" TRANS ".shared.b16 {%0,%1}, [%2];"           \
                 : "=r"(r[0]), "=r"(r[1])                                                     \
                 : "r"(addr))
#define LDM_x4(TRANS)                                                                         \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4" TRANS ".shared.b16 {%0,%1,%2,%3}, [%4];"     \
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])                             \
                 : "r"(addr))
LDM(ldmatrix_x1, x1, "", 1)
LDM(ldmatrix_x2, x2, "", 2)
LDM(ldmatrix_x4, x4, "", 4)
LDM(ldmatrix_x1_trans, x1, ".trans", 1)
LDM(ldmatrix_x2_trans, x2, ".trans", 2)
LDM(ldmatrix_x4_trans, x4, ".trans", 4)

// ldmatrix.x4 through a generic address (no .shared).
extern "C" __global__ void ldmatrix_generic(const half_t* src, unsigned* out) {
    __shared__ __align__(16) half_t s[32 * 8];
    int l = threadIdx.x;
    for (int i = 0; i < 8; i++) s[l * 8 + i] = src[l * 8 + i];
    __syncwarp();
    unsigned r0, r1, r2, r3;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "l"(&s[l * 8]));
    out[l * 4] = r0;
    out[l * 4 + 1] = r1;
    out[l * 4 + 2] = r2;
    out[l * 4 + 3] = r3;
}

// C = A * B (M x K times K x N, row-major halves, f32 C); M and N multiples
// of 32, K of 16. A block of 4 warps computes a 32 x 32 tile, each warp a
// 16 x 16 part as two m16n8k16 mmas per k-step. Tiles of A and B are
// staged in shared memory with 16-byte cp.async, the next k-tile in flight
// while ldmatrix (A: x4; B: x4.trans of the row-major k x n tile) feeds the
// mmas of the current one.
#define BM 32
#define BN 32
#define BK 16
#define PAD 8
#define TC_GEMM(TY)                                                                           \
    extern "C" __global__ void tc_gemm_##TY(int M, int N, int K, const half_t* A,              \
                                            const half_t* B, float* C) {                       \
        __shared__ __align__(16) half_t As[2][BM][BK + PAD];                                   \
        __shared__ __align__(16) half_t Bs[2][BK][BN + PAD];                                   \
        int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;                               \
        int bm = blockIdx.y * BM, bn = blockIdx.x * BN;                                        \
        int wm = (warp / 2) * 16, wn = (warp % 2) * 16;                                        \
        float acc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};                                        \
        auto load = [&](int kt, int s) {                                                       \
            const half_t* src;                                                                 \
            half_t* dst;                                                                       \
            if (tid < 64) {                                                                    \
                int r = tid / 2, c = (tid % 2) * 8;                                            \
                src = &A[(bm + r) * K + kt * BK + c];                                          \
                dst = &As[s][r][c];                                                            \
            } else {                                                                           \
                int i = tid - 64, r = i / 4, c = (i % 4) * 8;                                  \
                src = &B[(kt * BK + r) * N + bn + c];                                          \
                dst = &Bs[s][r][c];                                                            \
            }                                                                                  \
            unsigned d = (unsigned)__cvta_generic_to_shared(dst);                              \
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src));       \
            asm volatile("cp.async.commit_group;");                                            \
        };                                                                                     \
        int ktiles = K / BK;                                                                   \
        load(0, 0);                                                                            \
        for (int kt = 0; kt < ktiles; kt++) {                                                  \
            int s = kt & 1;                                                                    \
            if (kt + 1 < ktiles) {                                                             \
                load(kt + 1, s ^ 1);                                                           \
                asm volatile("cp.async.wait_group 1;");                                        \
            } else {                                                                           \
                asm volatile("cp.async.wait_group 0;");                                        \
            }                                                                                  \
            __syncthreads();                                                                   \
            unsigned a[4], b[4];                                                               \
            unsigned pa = (unsigned)__cvta_generic_to_shared(                                  \
                &As[s][wm + lane % 16][(lane / 16) * 8]);                                      \
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"       \
                         : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])                      \
                         : "r"(pa));                                                           \
            unsigned pb = (unsigned)__cvta_generic_to_shared(                                  \
                &Bs[s][lane % 16][wn + (lane / 16) * 8]);                                      \
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];" \
                         : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])                      \
                         : "r"(pb));                                                           \
            for (int nt = 0; nt < 2; nt++) {                                                   \
                float* c = acc[nt];                                                            \
                asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." #TY "." #TY              \
                             ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"      \
                             : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                  \
                             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[2 * nt]),     \
                               "r"(b[2 * nt + 1]));                                            \
            }                                                                                  \
            __syncthreads();                                                                   \
        }                                                                                      \
        int g = lane >> 2, t = lane & 3;                                                       \
        for (int nt = 0; nt < 2; nt++) {                                                       \
            int row = bm + wm + g, col = bn + wn + nt * 8 + 2 * t;                             \
            C[row * N + col] = acc[nt][0];                                                     \
            C[row * N + col + 1] = acc[nt][1];                                                 \
            C[(row + 8) * N + col] = acc[nt][2];                                               \
            C[(row + 8) * N + col + 1] = acc[nt][3];                                           \
        }                                                                                      \
    }
TC_GEMM(f16)
TC_GEMM(bf16)
