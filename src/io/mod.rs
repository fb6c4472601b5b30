//! Weight files: reading and writing safetensors, PyTorch-style state
//! dicts that load a file's tensors into a module's parameters and buffers
//! in place, and training checkpoints ([`Checkpoint`]: model, optimizer and
//! schedule together).
//!
//! ```no_run
//! use leangrad::io::{load_safetensors, load_state_dict, LoadOptions};
//! use leangrad::nn::Linear;
//! use leangrad::Device;
//!
//! let layer = Linear::builder(4, 3).name("fc").build(&Device::Cpu)?;
//! let tensors = load_safetensors("linear.safetensors")?;
//! let report = load_state_dict(&layer, &tensors, LoadOptions::default())?;
//! assert_eq!(report.loaded, ["bias", "weight"]);
//! # Ok::<(), leangrad::Error>(())
//! ```

pub mod checkpoint;
mod safetensors;
mod state_dict;

pub use checkpoint::{Checkpoint, Progress};

pub use safetensors::{
    load_safetensors, load_safetensors_bytes, save_safetensors, serialize_safetensors,
};
pub use state_dict::{
    check_state_dict, load_into, load_state_dict, load_state_dict_of, rename_prefix, state_dict,
    state_dict_of, LoadOptions, LoadReport,
};
