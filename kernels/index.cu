// Indexing with i64 indices: gather, index_select and scatter-add along a
// dim. Out-of-range indices are not followed: the kernel records one in
// the device's check record (lg_check_fail, op id `check_op`), which the
// host's next read reports as Error::IndexOutOfRange.

// Splits logical element i of shape l.shape into coordinates.
__device__ __forceinline__ void lg_coords(const Strided& l, long long i, long long* coord) {
    for (long long d = l.rank - 1; d >= 0; --d) {
        coord[d] = i % l.shape[d];
        i /= l.shape[d];
    }
}

// Offset in `l` of coordinates `coord`, with coordinate `dim` replaced by `k`.
__device__ __forceinline__ long long lg_offset_at(const Strided& l, const long long* coord,
                                                  long long dim, long long k) {
    long long off = l.offset;
    for (long long d = 0; d < l.rank; ++d) off += (d == dim ? k : coord[d]) * l.strides[d];
    return off;
}

__device__ __forceinline__ bool lg_index_ok(long long k, long long size, long long* check,
                                            long long check_op) {
    if (k >= 0 && k < size) return true;
    lg_check_fail(check, check_op, k, size);
    return false;
}

// gather: out (contiguous, the index's shape) [.., i_dim, ..] =
// x[.., index[.., i_dim, ..], ..]; li has the index's shape.
// index_select: out (contiguous, x's shape with dim of size len(index))
// [.., i, ..] = x[.., index[i], ..]; lo has the output's shape.
#define LG_GATHER(bytes, T)                                                           \
    extern "C" __global__ void gather_##bytes(long long dim, long long n, T* out,    \
                                              const T* x, Strided lx,                 \
                                              const long long* index, Strided li,     \
                                              long long* check, long long check_op) {                    \
        long long coord[LG_MAX_RANK];                                                 \
        LG_GRID_LOOP(i, n) {                                                          \
            lg_coords(li, i, coord);                                                  \
            long long k = index[lg_offset(li, i)];                                    \
            if (lg_index_ok(k, lx.shape[dim], check, check_op))                                \
                out[i] = x[lg_offset_at(lx, coord, dim, k)];                          \
        }                                                                             \
    }                                                                                 \
    extern "C" __global__ void index_select_##bytes(long long dim, long long n,      \
                                                    T* out, Strided lo,               \
                                                    const T* x, Strided lx,           \
                                                    const long long* index,           \
                                                    long long* check, long long check_op) {              \
        long long coord[LG_MAX_RANK];                                                 \
        LG_GRID_LOOP(i, n) {                                                          \
            lg_coords(lo, i, coord);                                                  \
            long long k = index[coord[dim]];                                          \
            if (lg_index_ok(k, lx.shape[dim], check, check_op))                                \
                out[i] = x[lg_offset_at(lx, coord, dim, k)];                          \
        }                                                                             \
    }
LG_GATHER(1, unsigned char)
LG_GATHER(2, unsigned short)
LG_GATHER(4, unsigned int)
LG_GATHER(8, unsigned long long)

// scatter-add: out[.., index[.., i_dim, ..], ..] += src[.., i_dim, ..] for every
// element of src (li has src's shape, index and src share it); out is
// updated in place through its layout lo. Atomic adds (f16/bf16 need sm_80).
#define LG_SCATTER_ADD(sfx, T)                                                        \
    extern "C" __global__ void scatter_add_##sfx(long long dim, long long n,         \
                                                 T* out, Strided lo,                  \
                                                 const T* src, Strided ls,            \
                                                 const long long* index, Strided li,  \
                                                 long long* check, long long check_op) {                 \
        long long coord[LG_MAX_RANK];                                                 \
        LG_GRID_LOOP(i, n) {                                                          \
            lg_coords(li, i, coord);                                                  \
            long long k = index[lg_offset(li, i)];                                    \
            if (lg_index_ok(k, lo.shape[dim], check, check_op))                                \
                atomicAdd(out + lg_offset_at(lo, coord, dim, k), src[lg_offset(ls, i)]); \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_SCATTER_ADD)

// scatter_along (the backward of max/min along a dim): out, zeroed by the
// host and contiguous of the input's shape (`len` elements along the dim,
// `inner` elements per step of it), gets g[p] at index idx[p] along the dim
// for every element p of g (the keepdim shape, read through lg) and of idx
// (the same count in the same row-major order, read through li). Each p
// writes its own lane, so there are no races and the result is exact.
// As the CPU, a negative i64 index reads as 0.
template <typename T, typename I>
__device__ __forceinline__ void lg_scatter_along(long long len, long long inner, long long n,
                                                 T* out, const T* g, const Strided& lg,
                                                 const I* idx, const Strided& li,
                                                 long long* check, long long check_op) {
    LG_GRID_LOOP(p, n) {
        long long k = (long long)idx[lg_offset(li, p)];
        if (k < 0) k = 0;
        if (lg_index_ok(k, len, check, check_op))
            out[((p / inner) * len + k) * inner + p % inner] = g[lg_offset(lg, p)];
    }
}
#define LG_SCATTER_ALONG_I(bytes, T, isfx, I)                                         \
    extern "C" __global__ void scatter_along_##bytes##_##isfx(                       \
        long long len, long long inner, long long n, T* out, const T* g, Strided lg,  \
        const I* idx, Strided li, long long* check, long long check_op) {                                \
        lg_scatter_along<T, I>(len, inner, n, out, g, lg, idx, li, check, check_op);           \
    }
#define LG_SCATTER_ALONG(bytes, T)                                                    \
    LG_SCATTER_ALONG_I(bytes, T, u8, unsigned char)                                   \
    LG_SCATTER_ALONG_I(bytes, T, u32, unsigned int)                                   \
    LG_SCATTER_ALONG_I(bytes, T, i64, long long)
LG_SCATTER_ALONG(1, unsigned char)
LG_SCATTER_ALONG(2, unsigned short)
LG_SCATTER_ALONG(4, unsigned int)
LG_SCATTER_ALONG(8, unsigned long long)

// place: out[offset of logical element i in lo] = x[i] for the n elements
// of the contiguous x (lo's shape): writes a block into a larger (zeroed)
// tensor, e.g. scatter_add's source gradient into the corner its index
// covers. lo must not address one element twice (the host builds it from
// a contiguous layout).
#define LG_PLACE(bytes, T)                                                            \
    extern "C" __global__ void place_##bytes(long long n, T* out, Strided lo,        \
                                             const T* x) {                            \
        LG_GRID_LOOP(i, n) { out[lg_offset(lo, i)] = x[i]; }                          \
    }
LG_PLACE(1, unsigned char)
LG_PLACE(2, unsigned short)
LG_PLACE(4, unsigned int)
LG_PLACE(8, unsigned long long)
