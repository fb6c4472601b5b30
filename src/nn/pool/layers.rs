//! The pooling `Module`s: each holds its options and a name (its scope in
//! memory reports) and calls the functional op. No parameters.

use super::{adaptive_avg_pool2d, avg_pool2d, max_pool2d, AvgPool2dOptions, MaxPool2dOptions};
use crate::memory::scope;
use crate::nn::Module;
use crate::{Result, Tensor};

macro_rules! pool_module {
    ($(#[$m:meta])* $name:ident, $opts:ty, |$x:ident, $o:ident| $call:expr) => {
        $(#[$m])*
        pub struct $name {
            /// The pooling settings.
            pub options: $opts,
            name: String,
        }

        impl $name {
            /// The layer named `name` (its scope in memory reports).
            pub fn new(name: &str, options: $opts) -> Self {
                $name {
                    options,
                    name: name.to_string(),
                }
            }
        }

        impl Module for $name {
            fn forward(&self, $x: &Tensor) -> Result<Tensor> {
                let _s = scope(self.name.clone());
                let $o = &self.options;
                $call
            }

            fn named_parameters(&self) -> Vec<(String, Tensor)> {
                Vec::new()
            }
        }
    };
}

pool_module!(
    /// `torch.nn.MaxPool2d`: see [`max_pool2d`]; saves one byte per output
    /// element when the input needs grad. No parameters.
    MaxPool2d, MaxPool2dOptions, |x, o| max_pool2d(x, o)
);
pool_module!(
    /// `torch.nn.AvgPool2d`: see [`avg_pool2d`]; saves nothing. No parameters.
    AvgPool2d, AvgPool2dOptions, |x, o| avg_pool2d(x, o)
);
pool_module!(
    /// `torch.nn.AdaptiveAvgPool2d` with output size `options` (rows,
    /// columns): see [`adaptive_avg_pool2d`]; saves nothing. No parameters.
    AdaptiveAvgPool2d, [usize; 2], |x, o| adaptive_avg_pool2d(x, *o)
);
