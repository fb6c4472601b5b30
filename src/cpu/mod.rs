//! CPU kernels shared by the ops: elementwise maps with broadcasting and
//! reductions, written once for every float dtype through small traits.

mod batch_sum;
mod elementwise;
mod gemm;
mod loss;
mod reduce;
mod softmax;

pub(crate) use batch_sum::matmul_sum_batches;
pub use elementwise::{binary_assign, binary_map, contiguous_copy, copy_into, unary_map, BinaryKernel, UnaryKernel};
#[allow(unused_imports)]
pub(crate) use elementwise::gather;
#[allow(unused_imports)]
pub(crate) use gemm::{matmul, matmul_into};
pub(crate) use loss::{cross_entropy_backward, cross_entropy_forward};
pub(crate) use reduce::{arg_extremum, compact_indices, i64_indices, scatter_along, sum_scaled};
pub use reduce::{reduce_to, ReduceKind};
pub(crate) use softmax::{softmax_backward, softmax_forward};

/// Element count above which kernels split work across rayon's threads.
pub(crate) const PARALLEL_THRESHOLD: usize = 1 << 15;
