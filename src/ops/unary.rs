//! Elementwise unary float ops.

use crate::autograd::{attach, BackwardOp};
use crate::cpu::{unary_map, UnaryKernel};
use crate::{FloatDType, Result, Tensor};

macro_rules! kernel {
    ($name:ident, $s:literal, |$x:ident| $e:expr) => {
        pub(crate) struct $name;
        impl UnaryKernel for $name {
            const NAME: &'static str = $s;
            fn f<T: FloatDType>(&self, $x: T) -> T {
                $e
            }
        }
    };
}
kernel!(NegK, "neg", |x| -x);

/// Backward of neg: saves nothing.
struct NegBackward;

impl BackwardOp for NegBackward {
    fn name(&self) -> &'static str {
        "neg"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(unary_map(&g, &NegK)?)])
    }
}

impl Tensor {
    /// `-self`. Saves nothing for backward.
    pub fn neg(&self) -> Result<Tensor> {
        Ok(attach(unary_map(self, &NegK)?, &[self], NegBackward))
    }
}
