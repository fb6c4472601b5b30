//! Layers. For now the one the demo and the foundation tests need; the
//! layers issue grows this into the full set with selective saving.

mod linear;
mod module;

pub use linear::Linear;
pub use module::Module;
