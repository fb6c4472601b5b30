//! Layers. For now the one the demo and the foundation tests need; the
//! layers issue grows this into the full set with selective saving.

mod conv;
mod conv_layers;
mod conv_options;
mod linear;
mod module;

pub use conv::{
    conv1d, conv2d, conv_transpose2d, Conv1dOptions, Conv2dOptions, ConvTranspose2dOptions,
};
pub use conv_layers::{Conv1d, Conv2d, ConvTranspose2d};
pub use linear::Linear;
pub use module::Module;
