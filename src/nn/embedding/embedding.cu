// Embedding lookup and its deterministic backward (as src/nn/embedding/cpu.rs;
// launched from src/nn/embedding/cuda.rs), reading the index tensor on the
// device: nothing goes through the host.
//
// Forward: one block per index row k; an index outside [0, num) is not
// followed (its row is written 0) and goes to the device's check record
// (lg_check_fail, op id `check_op`), which the host's next read reports.
//
// Backward without float atomics: the positions are sorted by weight row on
// the device. Key k is (idx[k] << 32) | k, so every key is distinct and any
// correct sort gives the same order: rows ascending, positions ascending
// inside a row (the order of the CPU's sequential loop). Positions of the
// padding row or of an index out of range get the largest key and are
// skipped. A block per sorted position that starts a row sums row k of g
// over the row's positions in k order, each addition rounded in T as the
// CPU, and adds the sum to the row of the gradient (a zeroed one, or the
// gradient already pending for a tied weight). Rows not used are untouched.

#define LG_EMB_NONE 0xffffffffffffffffULL

// out[k, c] = w[idx[k], c] for k < n_idx, c < dim (0 where idx[k] is out of
// range, which is recorded).
template <typename T, typename I>
__device__ __forceinline__ void lg_embedding_fwd(long long n_idx, long long dim, long long num,
                                                 T* out, const T* w, const I* idx,
                                                 long long* check, long long check_op) {
    for (long long k = blockIdx.x; k < n_idx; k += gridDim.x) {
        long long i = (long long)idx[k];
        bool ok = i >= 0 && i < num;
        if (!ok && threadIdx.x == 0) lg_check_fail(check, check_op, i, num);
        for (long long c = threadIdx.x; c < dim; c += blockDim.x)
            out[k * dim + c] = ok ? w[i * dim + c] : lg_store<T>(0.0f);
    }
}

// keys[k] = (idx[k] << 32) | k for the positions whose row gets a gradient,
// LG_EMB_NONE for the others and for the padding up to n_pad (a power of
// two for the sort).
template <typename I>
__device__ __forceinline__ void lg_embedding_keys(long long n_idx, long long n_pad,
                                                  long long num, long long padding,
                                                  const I* idx, unsigned long long* keys) {
    LG_GRID_LOOP(k, n_pad) {
        unsigned long long key = LG_EMB_NONE;
        if (k < n_idx) {
            long long i = (long long)idx[k];
            if (i >= 0 && i < num && i != padding)
                key = ((unsigned long long)i << 32) | (unsigned long long)k;
        }
        keys[k] = key;
    }
}

#define LG_EMBEDDING_INDEX(isfx, I)                                                  \
    extern "C" __global__ void embedding_keys_##isfx(long long n_idx, long long n_pad, \
                                                      long long num, long long padding, \
                                                      const I* idx,                   \
                                                      unsigned long long* keys) {     \
        lg_embedding_keys<I>(n_idx, n_pad, num, padding, idx, keys);                  \
    }
LG_EMBEDDING_INDEX(i64, long long)
LG_EMBEDDING_INDEX(u32, unsigned int)

// RoBERTa's position ids (as position_ids in cpu.rs): for `rows` rows of
// `len` token ids, `pad` where the token is `pad`, else `pad` plus the
// count of non-padding tokens up to and including it. One thread per row.
#define LG_EMBEDDING_POSITIONS(isfx, I)                                               \
    extern "C" __global__ void embedding_positions_##isfx(long long rows, long long len, \
                                                          long long pad, const I* ids,  \
                                                          long long* out) {             \
        LG_GRID_LOOP(r, rows) {                                                       \
            long long seen = 0;                                                       \
            for (long long c = 0; c < len; ++c) {                                     \
                bool padding = (long long)ids[r * len + c] == pad;                    \
                seen += padding ? 0 : 1;                                              \
                out[r * len + c] = padding ? pad : pad + seen;                        \
            }                                                                         \
        }                                                                             \
    }
LG_EMBEDDING_POSITIONS(i64, long long)
LG_EMBEDDING_POSITIONS(u32, unsigned int)

// Sorts keys[0..n) ascending, n a power of two: a bitonic network run by one
// block (its passes separated by barriers, which also order the global
// memory the block reads and writes).
extern "C" __global__ void embedding_sort(long long n, unsigned long long* keys) {
    for (long long size = 2; size <= n; size <<= 1) {
        for (long long stride = size >> 1; stride > 0; stride >>= 1) {
            for (long long i = threadIdx.x; i < n; i += blockDim.x) {
                long long j = i ^ stride;
                if (j > i) {
                    unsigned long long a = keys[i], b = keys[j];
                    bool up = (i & size) == 0;
                    if (up ? a > b : a < b) keys[i] = b, keys[j] = a;
                }
            }
            __syncthreads();
        }
    }
}

#define LG_EMBEDDING(sfx, T)                                                          \
    extern "C" __global__ void embedding_fwd_i64_##sfx(                              \
        long long n_idx, long long dim, long long num, T* out, const T* w,            \
        const long long* idx, long long* check, long long check_op) {                 \
        lg_embedding_fwd<T, long long>(n_idx, dim, num, out, w, idx, check, check_op); \
    }                                                                                 \
    extern "C" __global__ void embedding_fwd_u32_##sfx(                              \
        long long n_idx, long long dim, long long num, T* out, const T* w,            \
        const unsigned int* idx, long long* check, long long check_op) {              \
        lg_embedding_fwd<T, unsigned int>(n_idx, dim, num, out, w, idx, check, check_op); \
    }                                                                                 \
    /* gw[row] += sum of g[k] over the row's sorted positions, in k order. */         \
    extern "C" __global__ void embedding_bwd_##sfx(long long n, long long dim, T* gw,  \
                                                   const T* g,                        \
                                                   const unsigned long long* keys) {  \
        typedef Acc<T>::type A;                                                       \
        for (long long p = blockIdx.x; p < n; p += gridDim.x) {                       \
            unsigned long long key = keys[p];                                         \
            long long row = (long long)(key >> 32);                                   \
            if (key == LG_EMB_NONE || (p > 0 && (long long)(keys[p - 1] >> 32) == row)) \
                continue;                                                             \
            for (long long c = threadIdx.x; c < dim; c += blockDim.x) {               \
                A acc = 0;                                                            \
                for (long long q = p; q < n && keys[q] != LG_EMB_NONE &&              \
                                      (long long)(keys[q] >> 32) == row;              \
                     ++q)                                                             \
                    acc = lg_load(lg_store<T>(acc + lg_load(g[(long long)(keys[q] & 0xffffffffULL) * dim + c]))); \
                gw[row * dim + c] = lg_store<T>(lg_load(gw[row * dim + c]) + acc);   \
            }                                                                         \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_EMBEDDING)
