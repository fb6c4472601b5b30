//! Reductions to a shape that the input broadcasts from (keepdim form).

use crate::tensor::{CpuData, Layout, Tensor};
use crate::{Error, FloatDType, Result};

/// How elements are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceKind {
    /// Sum (accumulated in f64).
    Sum,
    /// Maximum (NaN propagates).
    Max,
    /// Minimum (NaN propagates).
    Min,
}

/// Reduces `x` to `out_shape` (same rank, each dim equal to x's or 1):
/// every input element is combined into the output element it broadcasts from.
pub fn reduce_to(x: &Tensor, out_shape: &[usize], kind: ReduceKind) -> Result<Tensor> {
    if out_shape.len() != x.rank()
        || out_shape
            .iter()
            .zip(x.shape())
            .any(|(&o, &i)| o != i && o != 1)
    {
        return Err(Error::ShapeMismatch {
            op: "reduce",
            lhs: x.shape().to_vec(),
            rhs: out_shape.to_vec(),
        });
    }
    let out_layout = Layout::contiguous(out_shape).broadcast_to(x.shape())?;
    let data = x.storage().cpu()?;
    fn go<T: FloatDType>(s: &[T], xl: &Layout, ol: &Layout, n_out: usize, kind: ReduceKind) -> CpuData {
        let init = match kind {
            ReduceKind::Sum => 0.0,
            ReduceKind::Max => f64::NEG_INFINITY,
            ReduceKind::Min => f64::INFINITY,
        };
        let mut acc = vec![init; n_out];
        let out_offsets = ol.offsets();
        let mut i = 0;
        xl.for_each_offset(|o| {
            let v = s[o].to_f64();
            let a = &mut acc[out_offsets[i]];
            *a = match kind {
                ReduceKind::Sum => *a + v,
                ReduceKind::Max if v.is_nan() || v > *a => v,
                ReduceKind::Min if v.is_nan() || v < *a => v,
                _ => *a,
            };
            i += 1;
        });
        T::wrap(acc.into_iter().map(T::from_f64).collect())
    }
    let n_out = out_shape.iter().product();
    let out = crate::match_float_data!(&*data, "reduce", v => go(v, x.layout(), &out_layout, n_out, kind));
    drop(data);
    Tensor::from_cpu_data(out, out_shape)
}
