//! Activation layers and `Flatten`: thin [`Module`] wrappers over the
//! elementwise ops, saving exactly what those ops save (stated per layer).
//! None has parameters.

use super::Module;
use crate::autograd::buffer_reuse;
use crate::{Result, Tensor};

macro_rules! activation {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $field:ident : $ty:ty),* } |$s:ident, $x:ident| $call:expr
        $(, owned |$os:ident, $ox:ident| $ocall:expr)?) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub struct $name {
            $(
                $(#[$fm])*
                pub $field: $ty,
            )*
        }

        impl Module for $name {
            fn forward(&self, $x: &Tensor) -> Result<Tensor> {
                let $s = self;
                let _ = $s;
                $call
            }

            $(
                fn forward_owned(&self, $ox: Tensor) -> Result<Tensor> {
                    let $os = self;
                    let _ = $os;
                    $ocall
                }
            )?

            fn named_parameters(&self) -> Vec<(String, Tensor)> {
                Vec::new()
            }
        }
    };
}

/// `torch.nn.ReLU`. Saves a packed 1-bit mask (`⌈n/32⌉` u32 words) when
/// the input needs grad. `forward` borrows its input, which the caller
/// still holds, so it computes out of place; `forward_owned` writes over an
/// input nothing else holds ([`Tensor::relu_inplace`]) when buffer reuse is
/// on or `inplace` is set; [`ReLU::apply`] does when `inplace` is set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReLU {
    /// Write over an unshared owned input even without buffer reuse (as
    /// PyTorch's `inplace=True`).
    pub inplace: bool,
}

impl Module for ReLU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.relu()
    }

    fn forward_owned(&self, x: Tensor) -> Result<Tensor> {
        if self.inplace || buffer_reuse() {
            x.relu_inplace()
        } else {
            x.relu()
        }
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

impl ReLU {
    /// `max(x, 0)` on an owned tensor: in place when `inplace` and nothing
    /// else holds `x`'s storage (see [`Tensor::relu_inplace`]), else out of
    /// place. Saves the 1-bit mask either way.
    pub fn apply(&self, x: Tensor) -> Result<Tensor> {
        if self.inplace {
            x.relu_inplace()
        } else {
            x.relu()
        }
    }
}

activation!(
    /// `torch.nn.LeakyReLU(negative_slope)`. Saves a packed 1-bit mask.
    LeakyReLU {
        /// The slope for `x <= 0`.
        negative_slope: f64
    } |s, x| x.leaky_relu(s.negative_slope)
);

activation!(
    /// `torch.nn.GELU` (`approximate`: the tanh form). Saves its input.
    /// `forward_owned` writes over an input nothing else holds when no
    /// gradient flows through it ([`Tensor::gelu_owned`]).
    GELU {
        /// Use the tanh approximation instead of erf.
        approximate: bool
    } |s, x| x.gelu(s.approximate),
    owned |s, x| x.gelu_owned(s.approximate)
);

activation!(
    /// `torch.nn.SiLU`. Saves its input. `forward_owned` writes over an
    /// input nothing else holds when no gradient flows through it.
    SiLU {} |s, x| x.silu(),
    owned |s, x| x.silu_owned()
);

activation!(
    /// `torch.nn.Hardswish` (MobileNetV3). Saves its input; `forward_owned`
    /// writes over an input nothing else holds when no gradient flows
    /// through it.
    Hardswish {} |s, x| x.hardswish(),
    owned |s, x| x.hardswish_owned()
);

activation!(
    /// `torch.nn.Hardsigmoid` (MobileNetV3's squeeze-and-excitation gate).
    /// Saves its input; `forward_owned` as [`Hardswish`]'s.
    Hardsigmoid {} |s, x| x.hardsigmoid(),
    owned |s, x| x.hardsigmoid_owned()
);

activation!(
    /// `torch.nn.Mish`. Saves its input; `forward_owned` as
    /// [`Hardswish`]'s.
    Mish {} |s, x| x.mish(),
    owned |s, x| x.mish_owned()
);

activation!(
    /// `torch.nn.Sigmoid`. Saves its output; `forward_owned` writes it
    /// over an input nothing else holds.
    Sigmoid {} |s, x| x.sigmoid(),
    owned |s, x| x.sigmoid_owned()
);

activation!(
    /// `torch.nn.Tanh`. Saves its output; `forward_owned` writes it over
    /// an input nothing else holds.
    Tanh {} |s, x| x.tanh(),
    owned |s, x| x.tanh_owned()
);

activation!(
    /// `torch.nn.Flatten(start_dim, end_dim)` (PyTorch's defaults are 1 and
    /// -1): a view when the input is contiguous. Saves only the input shape.
    Flatten {
        /// First dim flattened (negative counts from the end).
        start_dim: isize,
        /// Last dim flattened, inclusive.
        end_dim: isize
    } |s, x| x.flatten(s.start_dim, s.end_dim)
);

impl Default for Flatten {
    /// PyTorch's defaults: dims 1 through -1.
    fn default() -> Self {
        Flatten {
            start_dim: 1,
            end_dim: -1,
        }
    }
}
