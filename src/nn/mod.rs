//! Layers: each family a fused op whose backward struct keeps only what the
//! gradients of the inputs and parameters that require grad need (see the
//! saved-tensor table in docs/ARCHITECTURE.md), plus its `Module`.

mod activation;
mod conv;
mod dropout;
mod embedding;
pub mod init;
mod input;
mod linear;
mod module;
mod pool;
mod rotary;
mod sequential;
mod stats_sync;
mod upsample;

pub use activation::{
    Flatten, Hardsigmoid, Hardswish, LeakyReLU, Mish, ReLU, SiLU, Sigmoid, Tanh, GELU,
};
pub use conv::{
    conv1d, conv2d, conv_transpose2d, conv_workspace_bytes, with_conv_workspace, Conv1d,
    Conv1dBuilder, Conv1dOptions, Conv2d, Conv2dBuilder, Conv2dOptions, ConvGeom, ConvTranspose2d,
    ConvTranspose2dBuilder, ConvTranspose2dOptions, Size2, DEFAULT_CONV_WORKSPACE_BYTES,
    LARGE_WORKSPACE_BYTES,
};
pub use dropout::{
    dropout, dropout_owned, stochastic_depth, Dropout, StochasticDepth, StochasticDepthMode,
};
pub use embedding::{embedding, position_ids_from_input_ids, Embedding, EmbeddingBuilder};
pub use init::{FanMode, Init};
pub use linear::{Linear, LinearBuilder};
pub use module::{parameters_of_kind, LayerKind, Module};
pub use pool::{
    adaptive_avg_pool2d, avg_pool2d, max_pool2d, AdaptiveAvgPool2d, AvgPool2d, AvgPool2dOptions,
    MaxPool2d, MaxPool2dOptions, PoolGeom,
};
pub use rotary::{rotary_embedding, RotaryGeom, RotaryOptions};
pub use sequential::Sequential;
pub use stats_sync::BatchStatsSync;
pub use upsample::{
    interpolate_bilinear, interpolate_bilinear_scale, InterpCode, InterpGeom, Upsample,
    UpsampleSize,
};
mod norm;

pub use norm::{
    batch_norm, group_norm, layer_norm, rms_norm, BatchNorm, BatchNormBuilder, BatchNormOptions,
    GroupNorm, GroupNormBuilder, LayerNorm, LayerNormBuilder, NormGeom, RMSNorm, RMSNormBuilder,
};
mod attention;

pub use attention::{
    scaled_dot_product_attention, FlashGeom, MhaOptions, MultiheadAttention,
    MultiheadAttentionBuilder, ScoreGeom, SdpaOptions, View4,
};
