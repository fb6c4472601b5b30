// Embedding lookup and its deterministic backward (as src/nn/embedding/cpu.rs;
// launched from src/nn/embedding/cuda.rs).
// Indices are i64 and were checked against the table on the host.
//
// Backward without float atomics: the host groups the positions by weight
// row (CSR: `starts[u] .. starts[u+1]` of `pos`, positions ascending, for
// the u-th used row `rows[u]`); one block per used row sums row k of g over
// its positions in k order, each addition rounded in T as the CPU's
// sequential loop, and writes the row of the zeroed gradient. Rows not used
// stay 0.

#define LG_EMBEDDING(sfx, T)                                                          \
    /* out[k, c] = w[idx[k], c] for k < n_idx, c < dim. */                            \
    extern "C" __global__ void embedding_fwd_##sfx(long long n_idx, long long dim,   \
                                                   T* out, const T* w,                \
                                                   const long long* idx) {            \
        LG_GRID_LOOP(e, n_idx * dim) { out[e] = w[idx[e / dim] * dim + e % dim]; }    \
    }                                                                                 \
    extern "C" __global__ void embedding_bwd_##sfx(long long used, long long dim,    \
                                                   T* gw, const T* g,                 \
                                                   const long long* rows,             \
                                                   const long long* starts,           \
                                                   const long long* pos) {            \
        typedef Acc<T>::type A;                                                       \
        for (long long u = blockIdx.x; u < used; u += gridDim.x) {                    \
            long long row = rows[u];                                                  \
            for (long long c = threadIdx.x; c < dim; c += blockDim.x) {               \
                A acc = 0;                                                            \
                for (long long q = starts[u]; q < starts[u + 1]; ++q)                 \
                    acc = lg_load(lg_store<T>(acc + lg_load(g[pos[q] * dim + c])));   \
                gw[row * dim + c] = lg_store<T>(acc);                                 \
            }                                                                         \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_EMBEDDING)
