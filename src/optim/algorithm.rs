//! What an optimization algorithm is to the update kernels: the
//! [`Algorithm`] trait (its per-element arithmetic over a parameter, its
//! gradient and its state) and the [`GradReader`] that hands it the
//! gradient in row-major order whatever its layout. Shared by the full- and
//! compact-state updates (`kernels.rs`, `compact.rs`).

use super::rule::{GradTransform, UpdateRule};
use crate::tensor::Layout;
use crate::{FloatDType, Result};

/// Reads a gradient in row-major order whatever its strides, applying a
/// [`GradTransform`] to each element.
pub struct GradReader<'a, T> {
    data: &'a [T],
    offsets: Option<Vec<usize>>,
    base: usize,
    transform: GradTransform,
    scale: T,
    bound: T,
}

impl<'a, T: FloatDType> GradReader<'a, T> {
    /// A reader over `data` laid out as `layout` (a strided layout lists
    /// its offsets: [`crate::Error::OutOfMemory`] when the host cannot).
    pub fn new(data: &'a [T], layout: &Layout, transform: GradTransform) -> Result<Self> {
        let (offsets, base) = match layout.contiguous_range() {
            Some(r) => (None, r.start),
            None => (Some(layout.offsets()?), 0),
        };
        Ok(GradReader::with_offsets(data, offsets, base, transform))
    }

    fn with_offsets(
        data: &'a [T],
        offsets: Option<Vec<usize>>,
        base: usize,
        transform: GradTransform,
    ) -> Self {
        let (scale, bound) = match transform {
            GradTransform::Scale(s) => (T::from_f64(s), T::zero()),
            GradTransform::ClampAbs(c) => (T::one(), T::from_f64(c)),
            GradTransform::Identity => (T::one(), T::zero()),
        };
        GradReader {
            data,
            offsets,
            base,
            transform,
            scale,
            bound,
        }
    }

    /// The untransformed element `i`.
    #[inline(always)]
    pub fn raw(&self, i: usize) -> T {
        match &self.offsets {
            None => self.data[self.base + i],
            Some(o) => self.data[o[i]],
        }
    }

    /// A reader over a dense slice (one chunk of a gradient).
    pub(super) fn dense(data: &'a [T], transform: GradTransform) -> Self {
        GradReader::with_offsets(data, None, 0, transform)
    }

    /// Element `i` after the transform.
    #[inline(always)]
    pub fn get(&self, i: usize) -> T {
        self.transformed(self.raw(i))
    }

    /// `g` after the transform.
    #[inline(always)]
    fn transformed(&self, g: T) -> T {
        match self.transform {
            GradTransform::Identity => g,
            GradTransform::Scale(_) => g * self.scale,
            GradTransform::ClampAbs(_) => {
                if g < -self.bound {
                    -self.bound
                } else if g > self.bound {
                    self.bound
                } else {
                    g
                }
            }
        }
    }

    /// Calls `pass` with the first `n` elements after the transform as an
    /// iterator whose form the compiler sees whole: a dense gradient without
    /// a transform is a plain slice iterator (the update loop vectorizes), a
    /// scaled one a multiply per element; a clamped or strided gradient goes
    /// through [`GradReader::get`]. The values are those of `get` in every
    /// form.
    #[inline(always)]
    pub fn elements<R>(&self, n: usize, pass: impl GradPass<T, R>) -> R {
        match (&self.offsets, self.transform) {
            (None, GradTransform::Identity) => {
                pass.run(self.data[self.base..self.base + n].iter().copied())
            }
            (None, GradTransform::Scale(_)) => {
                let scale = self.scale;
                pass.run(
                    self.data[self.base..self.base + n]
                        .iter()
                        .map(move |&g| g * scale),
                )
            }
            _ => pass.run((0..n).map(|i| self.get(i))),
        }
    }
}

/// An update loop over a gradient's elements, run by
/// [`GradReader::elements`] once per form of the gradient (a closure cannot
/// be generic over the iterator's type, a trait method can).
pub trait GradPass<T, R> {
    /// Runs the loop over `grad`, the gradient's elements in order.
    fn run(self, grad: impl Iterator<Item = T>) -> R;
}

/// One optimization algorithm's per-element arithmetic and hyper-parameters.
///
/// Implemented by [`crate::optim::Sgd`] and [`crate::optim::Adam`]; a
/// parameter group holds one value of it.
pub trait Algorithm: Clone + std::fmt::Debug + Sync {
    /// The algorithm's name, for errors.
    const NAME: &'static str;
    /// The learning rate.
    fn lr(&self) -> f64;
    /// Sets the learning rate (schedulers call this).
    fn set_lr(&mut self, lr: f64);
    /// Checks the hyper-parameters (as torch.optim's constructors do).
    fn validate(&self) -> Result<()>;
    /// How many state tensors (each the parameter's shape and dtype) one
    /// parameter needs: they are created, zeroed, on its first update.
    fn state_slots(&self) -> usize;
    /// Whether state slot `slot` is never negative (a second moment): its
    /// 8-bit form then uses the unsigned map
    /// ([`StateFormat::Blockwise8`](super::StateFormat)). Default: false.
    fn slot_is_nonnegative(&self, slot: usize) -> bool {
        let _ = slot;
        false
    }
    /// Updates `param` in place from `grad`; `step` counts this parameter's
    /// updates, 1 on the first; `state` has [`Algorithm::state_slots`] slices.
    fn update<T: FloatDType>(
        &self,
        step: u64,
        param: &mut [T],
        grad: &GradReader<'_, T>,
        state: &mut [&mut [T]],
    );
    /// The update as plain hyper-parameters, for devices that run it as one
    /// kernel (CUDA). `None` (the default, for algorithms of your own):
    /// such a device answers [`Error::NotOnCuda`](crate::Error::NotOnCuda).
    fn rule(&self) -> Option<UpdateRule> {
        None
    }
}

/// Elements `start..start + n` (row-major) of the gradient `data` viewed
/// by `layout`, whose `contiguous_range()` is `contiguous`: a slice when
/// the view is contiguous, else gathered ([`gather_range`]). The chunked
/// updates (full and compact state) read their chunk's gradient with it.
pub(super) fn dense_range<'a, T: Copy>(
    data: &'a [T],
    layout: &Layout,
    contiguous: &Option<std::ops::Range<usize>>,
    start: usize,
    n: usize,
) -> std::borrow::Cow<'a, [T]> {
    match contiguous {
        Some(r) => std::borrow::Cow::Borrowed(&data[r.start + start..r.start + start + n]),
        None => std::borrow::Cow::Owned(gather_range(data, layout, start, n)),
    }
}

/// Elements `start..start + n` (row-major) of the strided view `layout`
/// of `data`: an odometer over the multi-index from `start`'s.
pub(super) fn gather_range<T: Copy>(data: &[T], layout: &Layout, start: usize, n: usize) -> Vec<T> {
    let (shape, strides) = (layout.shape(), layout.strides());
    let rank = shape.len();
    let mut out = Vec::with_capacity(n);
    if rank == 0 {
        out.extend((0..n).map(|_| data[layout.offset()]));
        return out;
    }
    let mut index = vec![0usize; rank];
    let mut rest = start;
    let mut offset = layout.offset();
    for d in (0..rank).rev() {
        index[d] = rest % shape[d];
        rest /= shape[d];
        offset += index[d] * strides[d];
    }
    let (inner, inner_stride) = (shape[rank - 1], strides[rank - 1]);
    while out.len() < n {
        let run = (inner - index[rank - 1]).min(n - out.len());
        out.extend((0..run).map(|k| data[offset + k * inner_stride]));
        offset += run * inner_stride;
        index[rank - 1] += run;
        // Carry into the outer dimensions like an odometer.
        let mut d = rank - 1;
        while index[d] == shape[d] && d > 0 {
            offset -= shape[d] * strides[d];
            index[d] = 0;
            d -= 1;
            index[d] += 1;
            offset += strides[d];
        }
    }
    out
}
