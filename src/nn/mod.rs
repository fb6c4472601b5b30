//! Layers. For now the one the demo and the foundation tests need; the
//! layers issue grows this into the full set with selective saving.

mod batch_norm;
mod linear;
mod module;
mod norm;
mod norm_layers;

pub use batch_norm::batch_norm;
pub use linear::Linear;
pub use module::Module;
pub use norm::{group_norm, layer_norm, rms_norm};
pub use norm_layers::{BatchNorm, BatchNormOptions, GroupNorm, LayerNorm, RMSNorm};
