//! What a layer checks of its input before it runs, so that a wrong input
//! is reported by the layer's name (its scope path, e.g. `layer1.0.conv1`,
//! which the layer has entered) and in its own terms: `conv1 expects 3
//! input channels, got 1` rather than an op's shape pair.

use crate::memory::current_scope;
use crate::{DType, Error, Result, Tensor};

/// [`Error::LayerInput`] for the layer running now.
fn layer_error(expected: String, got: String) -> Error {
    let layer = match current_scope() {
        s if s.is_empty() => "the layer".to_string(),
        s => s,
    };
    Error::LayerInput {
        layer,
        expected,
        got,
    }
}

/// `x` has the dtype of the layer's parameters.
pub(crate) fn check_dtype(x: &Tensor, dtype: DType) -> Result<()> {
    if x.dtype() == dtype {
        return Ok(());
    }
    Err(layer_error(
        format!("{dtype:?} input (its parameters' dtype)"),
        format!("{:?}", x.dtype()),
    ))
}

/// `x` has one of `ranks`; `layout` names the dims (`[N, C, H, W]`).
pub(crate) fn check_rank(x: &Tensor, ranks: &[usize], layout: &str) -> Result<()> {
    if ranks.contains(&x.rank()) {
        return Ok(());
    }
    let ranks: Vec<String> = ranks.iter().map(|r| format!("{r}-d")).collect();
    Err(layer_error(
        format!("a {} input {layout}", ranks.join(" or ")),
        format!("shape {:?}", x.shape()),
    ))
}

/// `x` has at least `min` dims; `layout` names them (`[.., features]`).
pub(crate) fn check_min_rank(x: &Tensor, min: usize, layout: &str) -> Result<()> {
    if x.rank() >= min {
        return Ok(());
    }
    Err(layer_error(
        format!("an input of at least {min} dims {layout}"),
        format!("shape {:?}", x.shape()),
    ))
}

/// `x`'s last dims are `trailing` (a norm's normalized shape).
pub(crate) fn check_trailing(x: &Tensor, trailing: &[usize]) -> Result<()> {
    if x.shape().ends_with(trailing) {
        return Ok(());
    }
    Err(layer_error(
        format!("an input whose last dims are {trailing:?} (its normalized shape)"),
        format!("shape {:?}", x.shape()),
    ))
}

/// `x` has the dtype of `param`, when the layer has one (a norm without
/// affine parameters takes any float dtype).
pub(crate) fn check_dtype_of(x: &Tensor, param: Option<&Tensor>) -> Result<()> {
    param.map_or(Ok(()), |p| check_dtype(x, p.dtype()))
}

/// Dim `dim` of `x` (which has it) is `size`; `what` names it (`input
/// channels`).
pub(crate) fn check_size(x: &Tensor, dim: usize, size: usize, what: &str) -> Result<()> {
    let got = x.shape()[dim];
    if got == size {
        return Ok(());
    }
    Err(layer_error(
        format!("{size} {what}"),
        format!("{got} (input shape {:?})", x.shape()),
    ))
}
