//! CPU kernels shared by the ops: elementwise maps with broadcasting and
//! reductions, written once for every float dtype through small traits.

mod anytype;
mod bitmask;
mod elementwise;
mod index;
mod reduce;

pub use elementwise::{binary_assign, binary_map, contiguous_copy, copy_into, unary_map, BinaryKernel, UnaryKernel};
#[allow(unused_imports)]
pub(crate) use elementwise::gather;
pub(crate) use index::{add_at, cat, corner, gather_offsets, read_indices, scatter_into_zeros, select_offsets, take};
pub use anytype::{cast, compare_map, compare_scalar, select, CmpOp};
pub use bitmask::{get_bit, mask_scale, mask_words, pack_bits, positive_mask, unpack_bits};
pub use reduce::{reduce_to, ReduceKind};

/// Element count above which kernels split work across rayon's threads.
pub(crate) const PARALLEL_THRESHOLD: usize = 1 << 15;
