//! How kernels read tensors of any layout: the `Strided` argument, which
//! mirrors `struct Strided` in `kernels/common.cuh`.

use crate::{Error, Result};
use cudarc::driver::DeviceRepr;

/// The most dims a kernel argument describes (`LG_MAX_RANK`).
pub const MAX_RANK: usize = 8;

/// A tensor's shape, strides and offset (in elements), passed to kernels by
/// value. Logical element `i` (row-major over `shape`) is read at
/// `offset + Σ coord_d · strides[d]`; broadcasting is a stride of 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strided {
    rank: i64,
    offset: i64,
    shape: [i64; MAX_RANK],
    strides: [i64; MAX_RANK],
}

// SAFETY: a plain `repr(C)` struct of integers, laid out as the kernels'
// `struct Strided` (8-byte fields, no padding).
unsafe impl DeviceRepr for Strided {}

impl Strided {
    /// A layout from shape, strides and offset, all in elements. A rank-0
    /// tensor is one element.
    pub fn new(shape: &[usize], strides: &[usize], offset: usize) -> Result<Strided> {
        if shape.len() > MAX_RANK || shape.len() != strides.len() {
            return Err(Error::InvalidArgument {
                op: "cuda layout",
                msg: format!(
                    "rank {} with {} strides (kernels take rank <= {MAX_RANK})",
                    shape.len(),
                    strides.len()
                ),
            });
        }
        let mut s = Strided {
            rank: shape.len() as i64,
            offset: offset as i64,
            shape: [1; MAX_RANK],
            strides: [0; MAX_RANK],
        };
        for (d, (&n, &st)) in shape.iter().zip(strides).enumerate() {
            s.shape[d] = n as i64;
            s.strides[d] = st as i64;
        }
        Ok(s)
    }

    /// A contiguous row-major layout of `shape`.
    pub fn contiguous(shape: &[usize]) -> Result<Strided> {
        Strided::new(shape, &contiguous_strides(shape), 0)
    }

    /// Number of logical elements.
    pub fn numel(&self) -> usize {
        self.shape[..self.rank as usize].iter().product::<i64>() as usize
    }

    /// The shape.
    pub fn shape(&self) -> Vec<usize> {
        self.shape[..self.rank as usize]
            .iter()
            .map(|&n| n as usize)
            .collect()
    }

    /// The strides, in elements.
    pub fn strides(&self) -> Vec<usize> {
        self.strides[..self.rank as usize]
            .iter()
            .map(|&n| n as usize)
            .collect()
    }

    /// The offset of the first element, in elements.
    pub fn offset(&self) -> usize {
        self.offset as usize
    }

    /// The same elements in the same (row-major) order with size-1 dims
    /// dropped and adjacent dims merged where the strides allow: a
    /// contiguous layout becomes rank 1, which kernels index without
    /// divisions. Launch wrappers pass this; shapes are checked before.
    pub fn coalesced(&self) -> Strided {
        let r = self.rank as usize;
        if self.shape[..r].contains(&0) {
            return *self;
        }
        let mut dims: Vec<(i64, i64)> = Vec::with_capacity(r);
        for d in 0..r {
            let (n, st) = (self.shape[d], self.strides[d]);
            if n == 1 {
                continue;
            }
            match dims.last_mut() {
                Some(last) if last.1 == st * n => *last = (last.0 * n, st),
                _ => dims.push((n, st)),
            }
        }
        let mut out = Strided {
            rank: dims.len() as i64,
            offset: self.offset,
            shape: [1; MAX_RANK],
            strides: [0; MAX_RANK],
        };
        for (d, (n, st)) in dims.into_iter().enumerate() {
            out.shape[d] = n;
            out.strides[d] = st;
        }
        out
    }

    /// The largest element index (plus one) this layout reads: what the
    /// buffer must hold. 0 for an empty layout.
    pub fn extent(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        let r = self.rank as usize;
        let last: i64 = (0..r).map(|d| (self.shape[d] - 1) * self.strides[d]).sum();
        (self.offset + last + 1) as usize
    }
}

/// Row-major strides of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// The layout that reads a tensor of `shape`/`strides`/`offset` as if it had
/// the (broadcast) shape `out`: dims aligned on the right, stride 0 where the
/// tensor has size 1 or lacks the dim. Errors if the shapes do not broadcast.
pub fn broadcast_strides(
    shape: &[usize],
    strides: &[usize],
    offset: usize,
    out: &[usize],
) -> Result<Strided> {
    let bad = || Error::ShapeMismatch {
        op: "broadcast",
        lhs: shape.to_vec(),
        rhs: out.to_vec(),
    };
    if shape.len() > out.len() || shape.len() != strides.len() {
        return Err(bad());
    }
    let lead = out.len() - shape.len();
    let mut st = vec![0; out.len()];
    for d in 0..shape.len() {
        if shape[d] == out[lead + d] {
            st[lead + d] = strides[d];
        } else if shape[d] != 1 {
            return Err(bad());
        }
    }
    Strided::new(out, &st, offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_kernel_struct_and_broadcasts() {
        assert_eq!(std::mem::size_of::<Strided>(), 16 + 16 * MAX_RANK);
        let b = broadcast_strides(&[3, 1], &[1, 1], 2, &[4, 3, 5]).unwrap();
        assert_eq!(b.shape(), vec![4, 3, 5]);
        assert_eq!((b.strides[0], b.strides[1], b.strides[2]), (0, 1, 0));
        assert_eq!(b.extent(), 5);
        assert!(broadcast_strides(&[2], &[1], 0, &[3]).is_err());
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(Strided::contiguous(&[]).unwrap().numel(), 1);
        let c = Strided::contiguous(&[2, 1, 3, 4]).unwrap().coalesced();
        assert_eq!((c.shape(), c.strides()), (vec![24], vec![1]));
        // A transpose cannot merge; a broadcast row merges its zero strides.
        let t = Strided::new(&[3, 2], &[1, 3], 5).unwrap().coalesced();
        assert_eq!(
            (t.shape(), t.strides(), t.offset()),
            (vec![3, 2], vec![1, 3], 5)
        );
        let b = broadcast_strides(&[4], &[1], 0, &[2, 3, 4])
            .unwrap()
            .coalesced();
        assert_eq!((b.shape(), b.strides()), (vec![6, 4], vec![0, 1]));
        assert_eq!(
            Strided::new(&[1, 1], &[7, 7], 2)
                .unwrap()
                .coalesced()
                .numel(),
            1
        );
    }
}
