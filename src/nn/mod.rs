//! Layers. For now the one the demo and the foundation tests need; the
//! layers issue grows this into the full set with selective saving.

mod activation;
mod dropout;
mod embedding;
mod linear;
mod module;
mod pool;

pub use activation::{Flatten, LeakyReLU, ReLU, SiLU, Sigmoid, Tanh, GELU};
pub use dropout::{dropout, Dropout};
pub use embedding::{embedding, Embedding};
pub use linear::Linear;
pub use module::Module;
pub use pool::{
    adaptive_avg_pool2d, avg_pool2d, max_pool2d, AdaptiveAvgPool2d, AvgPool2d, AvgPool2dOptions,
    MaxPool2d, MaxPool2dOptions,
};
