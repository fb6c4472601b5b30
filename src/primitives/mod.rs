//! The shared primitives (elementwise maps with broadcasting, reductions,
//! indexing, GEMM, casts and comparisons, bit packing): each entry is
//! the one dispatch seam of its kernel — the CPU kernel written once for every
//! float dtype, the meta arm, and the CUDA arm in `cuda/`.

mod anytype;
mod batch_sum;
mod bitmask;
pub(crate) mod cuda;
mod elementwise;
pub(crate) mod exp_reduction;
mod gemm;
mod index;
mod reduce;
mod strided;
mod widest;

pub(crate) use anytype::cast_in_place;
pub use anytype::{cast, compare_map, compare_scalar, select, CmpOp};
pub(crate) use batch_sum::matmul_sum_batches;
pub use bitmask::{get_bit, mask_words, pack_bits, unpack_bits};
pub(crate) use elementwise::{add_assign, check_pair, gather, AddK};
pub(crate) use elementwise::{
    assign_indexed, fill, map_and_assign, IndexedAssign, PairKernel, Source,
};
pub use elementwise::{
    binary_assign, binary_map, contiguous_copy, copy_into, unary_assign, unary_map, BinaryKernel,
    UnaryKernel, KERNEL_BLOCK,
};
#[allow(unused_imports)]
pub(crate) use gemm::{
    adds_alike, column_blocks, gemm_slices, matmul, matmul_into, usable as gemm_usable,
};
pub(crate) use index::{
    add_at, cat, corner, gather_offsets, read_indices, scatter_into_zeros, select_offsets, take,
};
pub(crate) use reduce::{arg_extremum, compact_indices, i64_indices, scatter_along, sum_scaled};
pub use reduce::{reduce_to, ReduceKind};
#[cfg(target_arch = "x86_64")]
pub(crate) use widest::transpose8x8;
pub(crate) use widest::{as_f32, as_f32_mut, avx2_fma, avx512, widest_vectors};
pub use widest::{cpu_path, CpuPath, CPU_PATH_VAR};
// Shared with the layer families' CPU kernels.
pub(crate) use elementwise::typed;
pub(crate) use elementwise::Dense;

/// Element count above which kernels split work across rayon's threads.
pub(crate) const PARALLEL_THRESHOLD: usize = 1 << 15;

/// Whether work over `n` elements runs on rayon's threads: `n` reaches
/// [`PARALLEL_THRESHOLD`] and the pool has more than one thread. With one
/// thread a parallel iterator called from outside the pool hands the work
/// to the pool's thread and puts the caller to sleep until it is done (two
/// context switches per kernel, nothing gained), so such work runs inline.
/// Callers keep the same partition of the work either way (sums are cut at
/// the same places), so values never depend on the thread count.
#[inline]
pub(crate) fn parallel(n: usize) -> bool {
    n >= PARALLEL_THRESHOLD && rayon::current_num_threads() > 1
}

/// Numbers in [−1, 1) from a fixed xorshift sequence, for the CPU kernels'
/// unit tests.
#[cfg(test)]
pub(crate) fn test_values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}
