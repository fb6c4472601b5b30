//! Autocast (mixed precision): the scope, and the casts the ops insert
//! under it. The op lists and what is saved are on [`autocast`].

use crate::settings::{set, SettingGuard, AUTOCAST};
use crate::{DType, Error, Result, Tensor};
use std::cell::Cell;

/// Runs matrix products, convolutions and linear layers on this thread in
/// `dtype` (`DType::BF16` or `DType::F16`), and softmax, norms and losses
/// in f32, until the guard drops (as `with torch.autocast(device, dtype)`).
/// Scopes nest; the inner one decides. Any other dtype is an
/// `InvalidArgument` error.
///
/// Parameters stay f32 (master weights) and receive f32 gradients: every
/// cast is an ordinary differentiable [`Tensor::to_dtype`] whose backward
/// casts the gradient back.
///
/// The op lists follow PyTorch's CUDA autocast lists (the ones a GPU
/// user trains with; PyTorch's CPU lists keep norms and softmax in the low
/// dtype, leangrad uses the CUDA lists on every device so that the CPU, the
/// meta ledger and CUDA agree):
///
/// | list | leangrad ops | inputs cast to | output |
/// |---|---|---|---|
/// | low precision | `matmul`, `Linear`, `conv1d`, `conv2d`, `conv_transpose2d` (and their modules), `scaled_dot_product_attention`, the hidden states and weight of `linear_cross_entropy` | the autocast dtype (f32/f16/bf16 inputs; f64 is left alone) | the autocast dtype |
/// | f32 | `softmax`, `log_softmax`, `cross_entropy`, `mse_loss`, `layer_norm`, `group_norm`, `rms_norm`, the logits of `linear_cross_entropy` | f32 (f16/bf16 inputs) | f32 |
/// | mixed (as cuDNN's batch norm under PyTorch's CUDA autocast) | `batch_norm` (and `BatchNorm`) | f32 for the arithmetic: an f32 copy of the f16/bf16 input, f32 weights and running statistics | the input's dtype, and `x̂` (lean) or the input (`SaveAll`) kept for backward in it: half the bytes of f32 |
/// | promote | `add`, `sub`, `mul`, `div`, `cat`, `stack` (outside autocast several dtypes are an error) | the wider float dtype of the two (f16 with bf16: f32) | that dtype |
///
/// Every other op runs in the dtype it is given (ReLU, GELU, pooling,
/// dropout, views: a bf16 activation stays bf16). Backward runs with
/// autocast off: each op's backward works in the dtypes its forward used.
///
/// # Saved for backward under autocast
///
/// What an op saves is what its table says for the dtype it ran in: a
/// product saves its low-precision operands (half the bytes of f32), a cast
/// saves nothing. A cast weight lives only as long as something keeps it:
/// it is saved by its product when that product's input gradient needs it
/// (as the f32 weight would be, at half the bytes, but in addition to the
/// f32 parameter), and freed at the end of the op otherwise (a frozen
/// weight whose input needs no gradient, a weight in a checkpointed
/// segment). `linear_cross_entropy` saves the low-precision hidden states
/// and nothing of the weight: it casts the weight once in forward and once
/// in backward (workspace).
pub fn autocast(dtype: DType) -> Result<SettingGuard<Option<DType>>> {
    if !matches!(dtype, DType::BF16 | DType::F16) {
        return Err(Error::InvalidArgument {
            op: "autocast",
            msg: format!("autocast runs in bf16 or f16, not {dtype:?}"),
        });
    }
    Ok(set(&AUTOCAST, Some(dtype)))
}

/// Turns autocast off on this thread until the guard drops (as
/// `torch.autocast(..., enabled=False)` inside an autocast region).
pub fn autocast_disabled() -> SettingGuard<Option<DType>> {
    set(&AUTOCAST, None)
}

/// The dtype an [`autocast`] scope on this thread runs products in, if one
/// is open.
pub fn autocast_dtype() -> Option<DType> {
    AUTOCAST.with(Cell::get)
}

/// `t` in the autocast dtype when a scope is open and `t` is a float
/// tensor PyTorch would cast (any float but f64) of another dtype; else
/// `t` itself (a clone sharing everything). The cast is differentiable.
pub(crate) fn lower(t: &Tensor) -> Result<Tensor> {
    match autocast_dtype() {
        Some(low) if lowers(t) => t.to_dtype(low),
        _ => Ok(t.clone()),
    }
}

/// Whether [`lower`] would cast `t`.
pub(crate) fn lowers(t: &Tensor) -> bool {
    autocast_dtype()
        .is_some_and(|low| t.dtype() != low && t.dtype().is_float() && t.dtype() != DType::F64)
}

/// Whether [`widen`] would cast `t`.
pub(crate) fn widens(t: &Tensor) -> bool {
    autocast_dtype().is_some() && matches!(t.dtype(), DType::F16 | DType::BF16)
}

/// A layer's input, weight and bias, each [`lower`]ed.
pub(crate) fn lower3(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    Ok((lower(x)?, lower(w)?, lower_opt(b)?))
}

/// [`lower`] of an optional tensor (a bias).
pub(crate) fn lower_opt(t: Option<&Tensor>) -> Result<Option<Tensor>> {
    t.map(lower).transpose()
}

/// `t` in f32 when a scope is open and `t` is f16 or bf16 (an op of the
/// f32 list); else `t` itself. The cast is differentiable.
pub(crate) fn widen(t: &Tensor) -> Result<Tensor> {
    widen_owned(t.clone())
}

/// [`widen`] of a tensor handed over (the low-precision one is dropped
/// once cast).
pub(crate) fn widen_owned(t: Tensor) -> Result<Tensor> {
    if widens(&t) {
        t.to_dtype(DType::F32)
    } else {
        Ok(t)
    }
}

/// [`widen`] of an optional tensor.
pub(crate) fn widen_opt(t: Option<&Tensor>) -> Result<Option<Tensor>> {
    t.map(widen).transpose()
}

/// The float dtype two operands of an elementwise op compute in under an
/// autocast scope (PyTorch's type promotion among floats): the wider one;
/// f16 with bf16 is f32. `None` outside autocast (mixed dtypes are then a
/// `DTypeMismatch`, as they always were), when either is not a float, or
/// when they are equal.
pub(crate) fn promoted(a: DType, b: DType) -> Option<DType> {
    if autocast_dtype().is_none() || a == b || !a.is_float() || !b.is_float() {
        return None;
    }
    let rank = |d: DType| match d {
        DType::F16 | DType::BF16 => 0,
        DType::F32 => 1,
        _ => 2,
    };
    Some(match rank(a).cmp(&rank(b)) {
        std::cmp::Ordering::Less => b,
        std::cmp::Ordering::Greater => a,
        std::cmp::Ordering::Equal => DType::F32,
    })
}

/// Under autocast, `tensors` cast to the dtype all of them promote to,
/// when they are floats of several dtypes (autocast's promote list: `cat`,
/// `stack`); `None` otherwise.
pub(crate) fn promote_all(tensors: &[&Tensor]) -> Result<Option<Vec<Tensor>>> {
    let Some(first) = tensors.first() else {
        return Ok(None);
    };
    if autocast_dtype().is_none() || !tensors.iter().all(|t| t.dtype().is_float()) {
        return Ok(None);
    }
    let mut to = first.dtype();
    for t in &tensors[1..] {
        if let Some(d) = promoted(to, t.dtype()) {
            to = d;
        }
    }
    if tensors.iter().all(|t| t.dtype() == to) {
        return Ok(None);
    }
    tensors
        .iter()
        .map(|t| t.to_dtype(to))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_takes_the_wider_float_and_f32_for_the_two_halves() {
        assert_eq!(promoted(DType::BF16, DType::F32), None);
        let _a = autocast(DType::BF16).unwrap();
        assert_eq!(promoted(DType::BF16, DType::F32), Some(DType::F32));
        assert_eq!(promoted(DType::F64, DType::F16), Some(DType::F64));
        assert_eq!(promoted(DType::F16, DType::BF16), Some(DType::F32));
        assert_eq!(promoted(DType::F32, DType::F32), None);
        assert_eq!(promoted(DType::F32, DType::I64), None);
    }

    #[test]
    fn cat_promotes_floats_only_and_only_under_autocast() {
        let dev = crate::Device::Cpu;
        let a = Tensor::zeros(&[2], DType::F32, dev).unwrap();
        let h = Tensor::zeros(&[2], DType::BF16, dev).unwrap();
        let i = Tensor::zeros(&[2], DType::I64, dev).unwrap();
        assert!(promote_all(&[&a, &h]).unwrap().is_none());
        let _g = autocast(DType::BF16).unwrap();
        assert!(promote_all(&[&a, &i]).unwrap().is_none());
        let both = promote_all(&[&a, &h]).unwrap().unwrap();
        assert!(both.iter().all(|t| t.dtype() == DType::F32));
    }

    #[test]
    fn only_bf16_and_f16_open_a_scope_and_the_guard_restores() {
        assert!(autocast(DType::F32).is_err());
        assert_eq!(autocast_dtype(), None);
        {
            let _a = autocast(DType::BF16).unwrap();
            assert_eq!(autocast_dtype(), Some(DType::BF16));
            {
                let _off = autocast_disabled();
                assert_eq!(autocast_dtype(), None);
            }
            assert_eq!(autocast_dtype(), Some(DType::BF16));
        }
        assert_eq!(autocast_dtype(), None);
    }
}
