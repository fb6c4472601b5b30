//! Shapes, strides and the views that need no copy.

use crate::{Error, Result};

/// How a tensor's elements sit in its storage: shape, strides (in elements)
/// and the offset of the first element. Broadcast dimensions have stride 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

/// Row-major strides of a shape.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut s = 1;
    for i in (0..shape.len()).rev() {
        strides[i] = s;
        s *= shape[i];
    }
    strides
}

/// The number of elements of `shape`, or a typed error for `op` when the
/// product does not fit in `usize` (a shape no device could hold).
pub fn checked_numel(op: &'static str, shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| Error::InvalidArgument {
            op,
            msg: format!("shape {shape:?} has more elements than a usize can count"),
        })
}

/// The shape two shapes broadcast to (NumPy rules), or a shape error.
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: a.to_vec(),
                    rhs: b.to_vec(),
                })
            }
        };
    }
    checked_numel(op, &out)?;
    Ok(out)
}

/// Resolves a possibly negative dimension index.
pub fn resolve_dim(op: &'static str, dim: isize, rank: usize) -> Result<usize> {
    let r = rank as isize;
    if dim < -r || dim >= r {
        return Err(Error::DimOutOfRange { op, dim, rank });
    }
    Ok(if dim < 0 {
        (dim + r) as usize
    } else {
        dim as usize
    })
}

impl Layout {
    /// A row-major layout starting at offset 0.
    pub fn contiguous(shape: &[usize]) -> Layout {
        Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    /// A layout from its parts (the caller guarantees it stays in bounds).
    pub(crate) fn from_parts(shape: Vec<usize>, strides: Vec<usize>, offset: usize) -> Layout {
        Layout {
            shape,
            strides,
            offset,
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Strides in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Offset of the first element, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the elements are row-major and dense (any offset).
    pub fn is_contiguous(&self) -> bool {
        let mut s = 1;
        for i in (0..self.shape.len()).rev() {
            if self.shape[i] != 1 && self.strides[i] != s {
                return false;
            }
            s *= self.shape[i];
        }
        true
    }

    /// The contiguous range of storage this layout covers, if it is contiguous.
    pub fn contiguous_range(&self) -> Option<std::ops::Range<usize>> {
        self.is_contiguous()
            .then(|| self.offset..self.offset + self.numel())
    }

    /// A view broadcast to `shape` (stride 0 on expanded dimensions).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Layout> {
        let err = || Error::ShapeMismatch {
            op: "broadcast_to",
            lhs: self.shape.clone(),
            rhs: shape.to_vec(),
        };
        if shape.len() < self.shape.len() {
            return Err(err());
        }
        let extra = shape.len() - self.shape.len();
        let mut strides = vec![0; shape.len()];
        for i in 0..shape.len() {
            if i < extra {
                continue;
            }
            let (d, s) = (self.shape[i - extra], self.strides[i - extra]);
            strides[i] = if d == shape[i] {
                s
            } else if d == 1 {
                0
            } else {
                return Err(err());
            };
        }
        Ok(Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }

    /// A view with dimensions reordered: output dim i is input dim `dims[i]`.
    pub fn permute(&self, dims: &[usize]) -> Result<Layout> {
        let rank = self.shape.len();
        let mut seen = vec![false; rank];
        if dims.len() != rank
            || dims
                .iter()
                .any(|&d| d >= rank || std::mem::replace(&mut seen[d], true))
        {
            return Err(Error::InvalidArgument {
                op: "permute",
                msg: format!("{dims:?} is not a permutation of 0..{rank}"),
            });
        }
        Ok(Layout {
            shape: dims.iter().map(|&d| self.shape[d]).collect(),
            strides: dims.iter().map(|&d| self.strides[d]).collect(),
            offset: self.offset,
        })
    }

    /// A view of `len` elements of dimension `dim` starting at `start`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Layout> {
        if dim >= self.shape.len() || start + len > self.shape[dim] {
            return Err(Error::InvalidArgument {
                op: "narrow",
                msg: format!(
                    "range {start}..{} of dim {dim} is outside shape {:?}",
                    start + len,
                    self.shape
                ),
            });
        }
        let mut shape = self.shape.clone();
        shape[dim] = len;
        Ok(Layout {
            shape,
            strides: self.strides.clone(),
            offset: self.offset + start * self.strides[dim],
        })
    }

    /// A contiguous layout reinterpreted with a new shape of the same size.
    pub fn reshape_contiguous(&self, shape: &[usize]) -> Option<Layout> {
        (self.is_contiguous() && shape.iter().product::<usize>() == self.numel()).then(|| Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: self.offset,
        })
    }

    /// Calls `f` with the storage offset of every element, in row-major order.
    pub fn for_each_offset(&self, mut f: impl FnMut(usize)) {
        if let Some(r) = self.contiguous_range() {
            r.for_each(f);
            return;
        }
        let rank = self.shape.len();
        if self.numel() == 0 {
            return;
        }
        let (inner, inner_stride) = (self.shape[rank - 1], self.strides[rank - 1]);
        let mut index = vec![0usize; rank - 1];
        let mut base = self.offset;
        loop {
            let mut o = base;
            for _ in 0..inner {
                f(o);
                o += inner_stride;
            }
            // Advance the outer multi-index like an odometer.
            let mut d = rank - 1;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                index[d] += 1;
                base += self.strides[d];
                if index[d] < self.shape[d] {
                    break;
                }
                base -= self.strides[d] * self.shape[d];
                index[d] = 0;
            }
        }
    }

    /// The storage offsets of every element, in row-major order (a host
    /// buffer of 8 bytes per element: [`Error::OutOfMemory`] when the host
    /// cannot hold it).
    pub fn offsets(&self) -> Result<Vec<usize>> {
        let mut v = crate::memory::host::try_vec(self.numel())?;
        self.for_each_offset(|o| v.push(o));
        Ok(v)
    }
}
