// Indexing with i64 indices: gather, index_select and scatter-add along a
// dim. Out-of-range indices are not followed: the kernel records one in
// status (2 x i64, zeroed by the host: [0] = the index, [1] = 1 if any) and
// the host turns it into Error::IndexOutOfRange.

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

__device__ __forceinline__ bool lg_index_ok(long long k, long long size, long long* status) {
    if (k >= 0 && k < size) return true;
    status[0] = k;
    status[1] = 1;
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
                                              long long* status) {                    \
        long long coord[LG_MAX_RANK];                                                 \
        LG_GRID_LOOP(i, n) {                                                          \
            lg_coords(li, i, coord);                                                  \
            long long k = index[lg_offset(li, i)];                                    \
            if (lg_index_ok(k, lx.shape[dim], status))                                \
                out[i] = x[lg_offset_at(lx, coord, dim, k)];                          \
        }                                                                             \
    }                                                                                 \
    extern "C" __global__ void index_select_##bytes(long long dim, long long n,      \
                                                    T* out, Strided lo,               \
                                                    const T* x, Strided lx,           \
                                                    const long long* index,           \
                                                    long long* status) {              \
        long long coord[LG_MAX_RANK];                                                 \
        LG_GRID_LOOP(i, n) {                                                          \
            lg_coords(lo, i, coord);                                                  \
            long long k = index[coord[dim]];                                          \
            if (lg_index_ok(k, lx.shape[dim], status))                                \
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
                                                 long long* status) {                 \
        long long coord[LG_MAX_RANK];                                                 \
        LG_GRID_LOOP(i, n) {                                                          \
            lg_coords(li, i, coord);                                                  \
            long long k = index[lg_offset(li, i)];                                    \
            if (lg_index_ok(k, lo.shape[dim], status))                                \
                atomicAdd(out + lg_offset_at(lo, coord, dim, k), src[lg_offset(ls, i)]); \
        }                                                                             \
    }
LG_FOR_FLOATS(LG_SCATTER_ADD)
