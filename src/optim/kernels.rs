//! The update kernels: one pass over a contiguous parameter, its gradient
//! (any layout) and its state tensors, all in place.
//!
//! Every algorithm's arithmetic is written once, generic over the float
//! element type, with the scalars converted to that type first (as
//! PyTorch converts Python floats to the tensor's type). The same function
//! serves the usual path (`.grad` after backward) and the fused path (the
//! gradient handed over by backward), so both give bit-identical parameters.

use super::algorithm::dense_range;
pub use super::algorithm::{Algorithm, GradPass, GradReader};
use super::compact::{self, StateFormat};
use super::rule::{GradTransform, PendingUpdate, NORM_LANES};
use crate::autograd::no_grad;
use crate::dtype::CpuData;
use crate::tensor::Layout;
use crate::{DType, Error, FloatDType, Result, Tensor, WithDType};
use half::{bf16, f16};

fn typed<'a, T: WithDType>(d: &'a CpuData, op: &'static str) -> Result<&'a [T]> {
    T::cpu_slice(d).ok_or(Error::DTypeMismatch {
        op,
        expected: T::DTYPE,
        got: d.dtype(),
    })
}

fn typed_mut<'a, T: WithDType>(d: &'a mut CpuData, op: &'static str) -> Result<&'a mut [T]> {
    let got = d.dtype();
    T::cpu_slice_mut(d).ok_or(Error::DTypeMismatch {
        op,
        expected: T::DTYPE,
        got,
    })
}

fn check_like(op: &'static str, param: &Tensor, other: &Tensor) -> Result<()> {
    if other.shape() != param.shape() {
        return Err(Error::ShapeMismatch {
            op,
            lhs: param.shape().to_vec(),
            rhs: other.shape().to_vec(),
        });
    }
    if other.dtype() != param.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            expected: param.dtype(),
            got: other.dtype(),
        });
    }
    if other.device() != param.device() {
        return Err(Error::DeviceMismatch {
            op,
            lhs: param.device(),
            rhs: other.device(),
        });
    }
    if other.shares_storage_with(param) {
        return Err(Error::InvalidArgument {
            op,
            msg: "gradient or state shares storage with the parameter".into(),
        });
    }
    Ok(())
}

/// The checks of one update: the gradient and each state tensor like the
/// parameter (shape, dtype, device, no shared storage), the state whole
/// and contiguous, the parameter contiguous. Returns the parameter's
/// element range in its storage.
fn checked_range(
    op: &'static str,
    param: &Tensor,
    grad: &Tensor,
    state: &[Tensor],
) -> Result<std::ops::Range<usize>> {
    check_like(op, param, grad)?;
    for (i, s) in state.iter().enumerate() {
        check_like(op, param, s)?;
        if !s.is_contiguous() || s.numel() != s.storage().len() {
            return Err(Error::InvalidArgument {
                op,
                msg: "optimizer state must be a whole contiguous tensor".into(),
            });
        }
        // Each storage is locked once below (read for the gradient, write
        // for the rest): a shared one would deadlock.
        if s.shares_storage_with(grad) || state[..i].iter().any(|o| o.shares_storage_with(s)) {
            return Err(Error::InvalidArgument {
                op,
                msg: "optimizer state shares storage with the gradient or other state".into(),
            });
        }
    }
    contiguous_param(op, param)
}

/// The update of one parameter, in place under `no_grad` (bumping its
/// version): checks shapes, locks the storages and runs `alg` on them.
/// `state` tensors must be contiguous and the parameter's shape and dtype.
pub fn apply_update<A: Algorithm>(
    alg: &A,
    step: u64,
    param: &Tensor,
    grad: &Tensor,
    transform: GradTransform,
    state: &[Tensor],
) -> Result<()> {
    apply_update_as(alg, step, param, grad, transform, StateFormat::Full, state)
}

/// [`apply_update`] with the state kept in `format` (as
/// [`StateFormat::for_param`] gives it for this parameter): full state is
/// one tensor per slot like the parameter; bf16 one bf16 tensor per slot;
/// 8-bit per slot the u8 codes and the f32 scales of its blocks.
pub fn apply_update_as<A: Algorithm>(
    alg: &A,
    step: u64,
    param: &Tensor,
    grad: &Tensor,
    transform: GradTransform,
    format: StateFormat,
    state: &[Tensor],
) -> Result<()> {
    let range = match format {
        StateFormat::Full => checked_range(A::NAME, param, grad, state)?,
        _ => {
            check_like(A::NAME, param, grad)?;
            compact::check_state(A::NAME, param, format, state)?;
            contiguous_param(A::NAME, param)?
        }
    };
    let _ng = no_grad();
    match crate::meta::backend(A::NAME, &[param, grad])? {
        // Meta: no arithmetic; the parameter and its state change versions
        // as the CPU update's writes change them.
        crate::meta::Backend::Meta => {
            crate::meta::float(A::NAME, param.dtype())?;
            crate::meta::touch(param);
            state.iter().for_each(crate::meta::touch);
            return Ok(());
        }
        crate::meta::Backend::Cuda(n) => {
            let rule = alg.rule().ok_or(crate::meta::not_on_cuda(A::NAME, n))?;
            let u = super::cuda::Update {
                rule,
                step,
                offset: range.start,
                transform,
                format,
            };
            return super::cuda::update(u, param, grad, state);
        }
        crate::meta::Backend::Cpu => {}
    }
    let gdata = grad.storage().cpu()?;
    let mut pdata = param.storage().cpu_mut()?;
    let mut sdata = state
        .iter()
        .map(|s| s.storage().cpu_mut())
        .collect::<Result<Vec<_>>>()?;
    let host = HostUpdate {
        step,
        range,
        glayout: grad.layout(),
        transform,
        format,
    };
    let (p, g, s) = (&mut *pdata, &*gdata, &mut sdata[..]);
    match param.dtype() {
        DType::F32 => host.run::<f32, A>(alg, p, g, s),
        DType::F64 => host.run::<f64, A>(alg, p, g, s),
        DType::F16 => host.run::<f16, A>(alg, p, g, s),
        DType::BF16 => host.run::<bf16, A>(alg, p, g, s),
        dtype => Err(Error::UnsupportedDType { op: A::NAME, dtype }),
    }
}

/// The parameter's element range in its storage (it is updated in place,
/// so it must be contiguous).
fn contiguous_param(op: &'static str, param: &Tensor) -> Result<std::ops::Range<usize>> {
    param
        .layout()
        .contiguous_range()
        .ok_or(Error::InvalidArgument {
            op,
            msg: "parameters are updated in place and must be contiguous".into(),
        })
}

/// One update on the host, its storages locked.
struct HostUpdate<'a> {
    step: u64,
    range: std::ops::Range<usize>,
    glayout: &'a Layout,
    transform: GradTransform,
    format: StateFormat,
}

impl HostUpdate<'_> {
    fn run<T: FloatDType, A: Algorithm>(
        &self,
        alg: &A,
        p: &mut CpuData,
        g: &CpuData,
        s: &mut [std::sync::RwLockWriteGuard<'_, CpuData>],
    ) -> Result<()> {
        let p = &mut typed_mut::<T>(p, A::NAME)?[self.range.clone()];
        let g = typed::<T>(g, A::NAME)?;
        let (glayout, transform) = (self.glayout, self.transform);
        if self.format != StateFormat::Full {
            let slots = compact_slots(alg, self.format, s)?;
            compact::update_host(alg, self.step, p, g, glayout, transform, slots);
            return Ok(());
        }
        let mut states = s
            .iter_mut()
            .map(|guard| typed_mut::<T>(guard, A::NAME))
            .collect::<Result<Vec<_>>>()?;
        if p.len() < UPDATE_CHUNK && glayout.contiguous_range().is_some() {
            let reader = GradReader::new(g, glayout, transform)?;
            alg.update(self.step, p, &reader, &mut states);
            return Ok(());
        }
        update_in_chunks(alg, self.step, p, g, glayout, transform, states);
        Ok(())
    }
}

/// The host slices of a compact state, one [`compact::HostSlot`] per slot.
fn compact_slots<'a, A: Algorithm>(
    alg: &A,
    format: StateFormat,
    s: &'a mut [std::sync::RwLockWriteGuard<'_, CpuData>],
) -> Result<Vec<compact::HostSlot<'a>>> {
    let mut slots = Vec::new();
    let mut guards = s.iter_mut();
    while let Some(first) = guards.next() {
        let slot = slots.len();
        slots.push(match format {
            StateFormat::Blockwise8 => {
                let absmax = guards.next().ok_or(Error::InvalidArgument {
                    op: A::NAME,
                    msg: "8-bit state without its scales".into(),
                })?;
                compact::HostSlot::Quantized {
                    codes: typed_mut::<u8>(first, A::NAME)?,
                    absmax: typed_mut::<f32>(absmax, A::NAME)?,
                    map: compact::slot_map(alg, slot),
                }
            }
            _ => compact::HostSlot::Bf16(typed_mut::<bf16>(first, A::NAME)?),
        });
    }
    Ok(slots)
}

/// Whether `a` and `b` can share one multi-tensor launch: both on the
/// same CUDA device and dtype, the same step and transform, each gradient
/// contiguous (read as runs, no layout per tensor).
fn joins(a: &PendingUpdate, b: &PendingUpdate) -> bool {
    let listable = |u: &PendingUpdate| {
        matches!(u.param.device(), crate::Device::Cuda(_))
            && u.grad.layout().contiguous_range().is_some()
    };
    listable(a)
        && listable(b)
        && a.param.device() == b.param.device()
        && a.param.dtype() == b.param.dtype()
        && a.step == b.step
        && a.transform == b.transform
        && a.format == StateFormat::Full
        && b.format == StateFormat::Full
}

/// [`apply_update_as`] of one pending update.
pub(crate) fn apply_pending<A: Algorithm>(alg: &A, u: &PendingUpdate) -> Result<()> {
    apply_update_as(
        alg,
        u.step,
        &u.param,
        &u.grad,
        u.transform,
        u.format,
        &u.state,
    )
}

/// The updates of one parameter group in order, each as
/// [`apply_update`] runs it. On CUDA, consecutive updates that can share
/// a launch ([`joins`]) run as multi-tensor kernels
/// (PyTorch's `foreach`): the same per-element arithmetic, so the same
/// bits, in one launch per [`cuda::LIST`](super::cuda) tensors.
pub(crate) fn apply_updates<A: Algorithm>(alg: &A, updates: &[PendingUpdate]) -> Result<()> {
    let mut i = 0;
    while i < updates.len() {
        let mut j = i + 1;
        // A parameter whose storage another of the run shares (views of one
        // tensor) would be updated concurrently: it starts a new run.
        while j < updates.len()
            && joins(&updates[i], &updates[j])
            && !updates[i..j]
                .iter()
                .any(|u| u.param.shares_storage_with(&updates[j].param))
        {
            j += 1;
        }
        match alg.rule() {
            Some(rule) if j - i > 1 => {
                let run = &updates[i..j];
                for u in run {
                    checked_range(A::NAME, &u.param, &u.grad, &u.state)?;
                }
                let _ng = no_grad();
                super::cuda::update_list(rule, run)?;
            }
            _ => {
                apply_pending(alg, &updates[i])?;
                j = i + 1;
            }
        }
        i = j;
    }
    Ok(())
}

/// Elements of one parameter chunk that one rayon task updates.
const UPDATE_CHUNK: usize = 1 << 15;

/// One chunk of an update: its first element's index, the parameter's
/// elements and each state tensor's.
type UpdateChunk<'a, T> = (usize, &'a mut [T], Vec<&'a mut [T]>);

/// The update of a large or non-contiguously graded parameter: the same
/// per-element arithmetic over chunks of [`UPDATE_CHUNK`] elements, in
/// parallel (every algorithm's update is elementwise, so the values are
/// those of one pass). A strided gradient is read chunk by chunk into a
/// dense buffer by walking its strides from the chunk's first element, so
/// no offset vector of the whole tensor is built.
fn update_in_chunks<T: FloatDType, A: Algorithm>(
    alg: &A,
    step: u64,
    p: &mut [T],
    g: &[T],
    glayout: &Layout,
    transform: GradTransform,
    states: Vec<&mut [T]>,
) {
    use rayon::prelude::*;
    let p_len = p.len();
    let mut chunks: Vec<UpdateChunk<'_, T>> = p
        .chunks_mut(UPDATE_CHUNK)
        .enumerate()
        .map(|(i, c)| (i * UPDATE_CHUNK, c, Vec::with_capacity(states.len())))
        .collect();
    for st in states {
        for (chunk, part) in chunks.iter_mut().zip(st.chunks_mut(UPDATE_CHUNK)) {
            chunk.2.push(part);
        }
    }
    let contiguous = glayout.contiguous_range();
    let run = |(start, p, mut st): UpdateChunk<'_, T>| {
        let dense = dense_range(g, glayout, &contiguous, start, p.len());
        alg.update(step, p, &GradReader::dense(&dense, transform), &mut st);
    };
    if crate::primitives::parallel(p_len) {
        chunks.into_par_iter().for_each(run);
    } else {
        chunks.into_iter().for_each(run);
    }
}

/// The sum of squares of a gradient's elements in f64 (the building block
/// of every norm used for clipping), added in the fixed order of
/// [`NORM_LANES`] on every device, so a CUDA norm equals the CPU's bit for
/// bit. On the meta device there are no values: the sum is taken to be 0.
pub fn sum_of_squares(grad: &Tensor) -> Result<f64> {
    match crate::meta::backend("clip_grad_norm", &[grad])? {
        crate::meta::Backend::Meta => return Ok(0.0),
        crate::meta::Backend::Cuda(_) => return super::cuda::sum_of_squares(grad),
        crate::meta::Backend::Cpu => {}
    }
    let data = grad.storage().cpu()?;
    fn go<T: FloatDType>(d: &CpuData, l: &Layout) -> Result<f64> {
        let r = GradReader::new(typed::<T>(d, "clip_grad_norm")?, l, GradTransform::Identity)?;
        let n = l.numel();
        let lanes = n.clamp(1, NORM_LANES);
        let mut part = vec![0.0f64; lanes.next_power_of_two()];
        for i in 0..n {
            let v = r.raw(i).to_f64();
            part[i % lanes] += v * v;
        }
        // The pairwise tree of the kernel `sumsq_tree`.
        let mut s = part.len() / 2;
        while s >= 1 {
            let (lo, hi) = part.split_at_mut(s);
            for (a, b) in lo.iter_mut().zip(&hi[..s]) {
                *a += *b;
            }
            s /= 2;
        }
        Ok(part[0])
    }
    match grad.dtype() {
        DType::F32 => go::<f32>(&data, grad.layout()),
        DType::F64 => go::<f64>(&data, grad.layout()),
        DType::F16 => go::<f16>(&data, grad.layout()),
        DType::BF16 => go::<bf16>(&data, grad.layout()),
        dtype => Err(Error::UnsupportedDType {
            op: "clip_grad_norm",
            dtype,
        }),
    }
}

/// Whether `x` is a number ≥ 0 (false for NaN).
pub(crate) fn nonneg(x: f64) -> bool {
    x >= 0.0
}

/// `v` as a `T`.
#[inline(always)]
pub(crate) fn c<T: FloatDType>(v: f64) -> T {
    <T as WithDType>::from_f64(v)
}

#[cfg(test)]
mod tests {
    use super::super::algorithm::gather_range;
    use super::*;

    /// `gather_range` reads the same elements as the layout's full offset
    /// list, from any start, across row boundaries.
    #[test]
    fn gather_range_matches_the_offsets() {
        let data: Vec<u32> = (0..(4 * 6 * 5) as u32).collect();
        let layout = Layout::contiguous(&[4, 6, 5])
            .permute(&[2, 0, 1])
            .unwrap()
            .narrow(2, 1, 4)
            .unwrap();
        let all: Vec<u32> = layout.offsets().unwrap().iter().map(|&o| data[o]).collect();
        for start in [0, 1, 3, 4, 7, 15, 16, 50] {
            for n in [1, 2, 5, 9, all.len() - start] {
                let n = n.min(all.len() - start);
                assert_eq!(
                    gather_range(&data, &layout, start, n),
                    all[start..start + n],
                    "start {start}, n {n}"
                );
            }
        }
    }
}
