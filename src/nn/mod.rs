//! Layers: each family a fused op whose backward struct keeps only what the
//! gradients of the inputs and parameters that require grad need (see the
//! saved-tensor table in docs/ARCHITECTURE.md), plus its `Module`.

mod activation;
mod conv;
mod conv_layers;
mod conv_options;
mod dropout;
mod embedding;
mod linear;
mod module;
mod pool;

pub use activation::{Flatten, LeakyReLU, ReLU, SiLU, Sigmoid, Tanh, GELU};
pub use conv::{
    conv1d, conv2d, conv_transpose2d, Conv1dOptions, Conv2dOptions, ConvTranspose2dOptions,
};
pub use conv_layers::{Conv1d, Conv2d, ConvTranspose2d};
pub use dropout::{dropout, Dropout};
pub use embedding::{embedding, Embedding};
pub use linear::Linear;
pub use module::{parameters_of_kind, LayerKind, Module};
pub use pool::{
    adaptive_avg_pool2d, avg_pool2d, max_pool2d, AdaptiveAvgPool2d, AvgPool2d, AvgPool2dOptions,
    MaxPool2d, MaxPool2dOptions, PoolGeom,
};
mod batch_norm;
mod norm;
mod norm_layers;

pub use batch_norm::batch_norm;
pub use norm::{group_norm, layer_norm, rms_norm};
pub use norm_layers::{BatchNorm, BatchNormOptions, GroupNorm, LayerNorm, RMSNorm};
mod attention;

pub use attention::{scaled_dot_product_attention, MhaOptions, MultiheadAttention, SdpaOptions};
