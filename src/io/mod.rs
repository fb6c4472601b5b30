//! Weight files: reading and writing safetensors, reading PyTorch's own
//! `.pth`/`.pt` files (what `torch.save(model.state_dict(), …)` writes:
//! a zip archive whose pickle is read by a restricted unpickler that runs
//! nothing), PyTorch-style state dicts that load a file's tensors into a
//! module's parameters and buffers in place, and training checkpoints
//! ([`Checkpoint`]: model, optimizer and schedule together).
//!
//! [`load_weights`] reads either format, telling them apart by the file's
//! first bytes:
//!
//! ```no_run
//! use leangrad::io::{load_state_dict, load_weights, LoadOptions};
//! use leangrad::nn::Linear;
//! use leangrad::Device;
//!
//! let layer = Linear::builder(4, 3).name("fc").build(&Device::Cpu)?;
//! let tensors = load_weights("linear.pth")?; // or "linear.safetensors"
//! let report = load_state_dict(&layer, &tensors, LoadOptions::default())?;
//! assert_eq!(report.loaded, ["bias", "weight"]);
//! # Ok::<(), leangrad::Error>(())
//! ```

pub mod checkpoint;
mod pth;
mod safetensors;
mod state_dict;

pub use checkpoint::{Checkpoint, Progress};

pub use pth::{load_pth, load_pth_bytes};
pub use safetensors::{
    load_safetensors, load_safetensors_bytes, save_safetensors, serialize_safetensors,
};
pub use state_dict::{
    check_state_dict, load_into, load_state_dict, load_state_dict_of, rename_prefix, state_dict,
    state_dict_of, LoadOptions, LoadReport,
};

use crate::{Error, Result, Tensor};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// Reads every tensor of the weights file at `path`, safetensors or
/// PyTorch (`torch.save`'s zip format, usually `.pth`/`.pt`), as new CPU
/// tensors by their names in the file. The format is told by the file's
/// first bytes, not its name: a zip archive (or a legacy PyTorch pickle,
/// which is refused with how to re-save it) goes to [`load_pth`], anything
/// else to [`load_safetensors`]. The tensors' names are the same either
/// way, so a torchvision state dict loads into a model with
/// [`load_state_dict`] from either file.
pub fn load_weights(path: impl AsRef<Path>) -> Result<BTreeMap<String, Tensor>> {
    let path = path.as_ref();
    let mut head = Vec::with_capacity(16);
    std::fs::File::open(path)
        .and_then(|f| f.take(16).read_to_end(&mut head))
        .map_err(|source| Error::File {
            path: path.to_path_buf(),
            action: "read",
            source,
        })?;
    if pth::looks_like_pth(&head) {
        load_pth(path)
    } else {
        load_safetensors(path)
    }
}

/// [`load_weights`] from an in-memory buffer.
pub fn load_weights_bytes(bytes: &[u8]) -> Result<BTreeMap<String, Tensor>> {
    if pth::looks_like_pth(bytes) {
        load_pth_bytes(bytes)
    } else {
        load_safetensors_bytes(bytes)
    }
}
