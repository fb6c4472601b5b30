//! Row-by-row walks over strided and broadcast layouts: the elementwise
//! kernels' path for operands that are not one dense range (a bias
//! broadcast over rows, a per-channel scale, a transposed or permuted
//! view). Dimensions are merged wherever every operand allows, the last
//! merged dimension is the row, and each row's first element is found by
//! an odometer: no table of per-element offsets (8 bytes per element) and
//! no indirect load per element, and a row whose elements are adjacent is
//! handed to the dense loops as a slice.

use crate::tensor::Layout;
use std::ops::Range;

/// `N` layouts of one shape walked together, row by row, in row-major
/// order.
pub(crate) struct Rows<const N: usize> {
    /// Elements per row.
    len: usize,
    /// Each operand's stride along a row.
    step: [usize; N],
    /// The dimensions outside the row, outermost first: size and each
    /// operand's stride.
    outer: Vec<(usize, [usize; N])>,
    /// Each operand's offset of its first element.
    start: [usize; N],
    /// Number of rows.
    count: usize,
}

impl<const N: usize> Rows<N> {
    /// The walk over `layouts`, which share one shape (the caller
    /// broadcast them to it).
    pub(crate) fn new(layouts: [&Layout; N]) -> Self {
        let shape = layouts[0].shape();
        debug_assert!(layouts.iter().all(|l| l.shape() == shape));
        let mut dims: Vec<(usize, [usize; N])> = Vec::with_capacity(shape.len());
        for (d, &size) in shape.iter().enumerate() {
            if size == 1 {
                continue;
            }
            let strides: [usize; N] = std::array::from_fn(|k| layouts[k].strides()[d]);
            if let Some((outer_size, outer_strides)) = dims.last_mut() {
                // The previous dimension steps over exactly this one in
                // every operand: the two are one dimension.
                if (0..N).all(|k| outer_strides[k] == strides[k] * size) {
                    *outer_size *= size;
                    *outer_strides = strides;
                    continue;
                }
            }
            dims.push((size, strides));
        }
        let (len, step) = dims.pop().unwrap_or((1, [0; N]));
        let count = dims.iter().map(|&(size, _)| size).product();
        Rows {
            len,
            step,
            outer: dims,
            start: std::array::from_fn(|k| layouts[k].offset()),
            count,
        }
    }

    /// Elements per row.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Each operand's stride along a row (1: the row is a slice).
    pub(crate) fn step(&self) -> [usize; N] {
        self.step
    }

    /// Number of rows.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Calls `f` with each operand's offset of the first element of every
    /// row in `rows`, in order.
    pub(crate) fn each(&self, rows: Range<usize>, mut f: impl FnMut([usize; N])) {
        if rows.is_empty() {
            return;
        }
        let mut index = vec![0usize; self.outer.len()];
        let mut at = self.start;
        let mut rest = rows.start;
        for (d, &(size, strides)) in self.outer.iter().enumerate().rev() {
            index[d] = rest % size;
            rest /= size;
            for k in 0..N {
                at[k] += index[d] * strides[k];
            }
        }
        for _ in rows {
            f(at);
            // Advance the outer multi-index like an odometer.
            for (d, &(size, strides)) in self.outer.iter().enumerate().rev() {
                index[d] += 1;
                for k in 0..N {
                    at[k] += strides[k];
                }
                if index[d] < size {
                    break;
                }
                index[d] = 0;
                for k in 0..N {
                    at[k] -= strides[k] * size;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element's offsets, walked row by row, against the layouts'
    /// own per-element offsets.
    fn walked<const N: usize>(layouts: [&Layout; N], rows: Range<usize>) -> Vec<[usize; N]> {
        let w = Rows::new(layouts);
        let mut out = Vec::new();
        w.each(rows, |at| {
            for i in 0..w.len() {
                out.push(std::array::from_fn(|k| at[k] + i * w.step()[k]));
            }
        });
        out
    }

    #[test]
    fn rows_visit_every_offset_of_permuted_and_broadcast_layouts() {
        let a = Layout::contiguous(&[2, 3, 4, 5])
            .permute(&[0, 2, 1, 3])
            .unwrap();
        let b = Layout::contiguous(&[4, 1, 5])
            .broadcast_to(&[2, 4, 3, 5])
            .unwrap();
        let (oa, ob) = (a.offsets().unwrap(), b.offsets().unwrap());
        let w = Rows::new([&a, &b]);
        assert_eq!((w.count(), w.len(), w.step()), (24, 5, [1, 1]));
        let all = walked([&a, &b], 0..w.count());
        let want: Vec<[usize; 2]> = oa.iter().zip(&ob).map(|(&x, &y)| [x, y]).collect();
        assert_eq!(all, want);
        // A range of rows starts where the whole walk passes it.
        assert_eq!(walked([&a, &b], 7..13), want[7 * 5..13 * 5].to_vec());
    }

    #[test]
    fn contiguous_and_bias_rows_merge_into_long_rows() {
        let y = Layout::contiguous(&[2, 128, 768]);
        let bias = Layout::contiguous(&[768])
            .broadcast_to(&[2, 128, 768])
            .unwrap();
        let w = Rows::new([&y, &bias]);
        assert_eq!((w.count(), w.len(), w.step()), (256, 768, [1, 1]));
        let channel = Layout::contiguous(&[3, 1, 1])
            .broadcast_to(&[2, 3, 4, 4])
            .unwrap();
        let x = Layout::contiguous(&[2, 3, 4, 4]);
        let w = Rows::new([&x, &channel]);
        assert_eq!((w.count(), w.len(), w.step()), (6, 16, [1, 0]));
        let scalar = Layout::contiguous(&[1, 1]);
        let w = Rows::new([&scalar]);
        assert_eq!((w.count(), w.len()), (1, 1));
        assert_eq!(walked([&scalar], 0..1), vec![[0]]);
    }

    #[test]
    fn an_offset_view_starts_at_its_offset() {
        let base = Layout::contiguous(&[6, 8]);
        let v = base.narrow(1, 2, 5).unwrap().narrow(0, 1, 4).unwrap();
        let want: Vec<[usize; 1]> = v.offsets().unwrap().into_iter().map(|o| [o]).collect();
        assert_eq!(walked([&v], 0..4), want);
    }
}
