//! Weight files: reading and writing safetensors, and PyTorch-style state
//! dicts that load a file's tensors into a module's parameters and buffers
//! in place.
//!
//! ```no_run
//! use leangrad::io::{load_safetensors, load_state_dict, LoadOptions};
//! use leangrad::nn::Linear;
//! use leangrad::{DType, Device};
//!
//! let layer = Linear::new("fc", 4, 3, true, DType::F32, Device::Cpu, 0)?;
//! let tensors = load_safetensors("linear.safetensors")?;
//! let report = load_state_dict(&layer, &tensors, LoadOptions::default())?;
//! assert_eq!(report.loaded, ["bias", "weight"]);
//! # Ok::<(), leangrad::Error>(())
//! ```

mod safetensors;
mod state_dict;

pub use safetensors::{
    load_safetensors, load_safetensors_bytes, save_safetensors, serialize_safetensors,
};
pub use state_dict::{
    load_into, load_state_dict, load_state_dict_of, state_dict, state_dict_of, LoadOptions,
    LoadReport,
};

use crate::DType;

/// The readable text of [`crate::Error::StateDictMismatch`]: one line per
/// kind of problem, each listing every name.
pub(crate) fn describe_mismatch(
    missing: &[String],
    unexpected: &[String],
    mismatched: &[(String, Vec<usize>, Vec<usize>)],
    wrong_dtype: &[(String, DType, DType)],
) -> String {
    let mut lines = vec!["state dict does not match the module:".to_string()];
    if !missing.is_empty() {
        lines.push(format!("  missing keys: {}", missing.join(", ")));
    }
    if !unexpected.is_empty() {
        lines.push(format!("  unexpected keys: {}", unexpected.join(", ")));
    }
    for (name, want, got) in mismatched {
        lines.push(format!(
            "  shape mismatch for {name}: module has {want:?}, state dict has {got:?}"
        ));
    }
    for (name, want, got) in wrong_dtype {
        lines.push(format!(
            "  dtype mismatch for {name}: module has {want:?}, state dict has {got:?}"
        ));
    }
    lines.join("\n")
}
