//! Tensors held by a node for its backward.

use crate::memory::current_scope;
use crate::tensor::{SaveEvent, Tensor};
use crate::{Error, Result};

/// A tensor an op keeps for backward. While it lives, the ledger counts its
/// storage as saved (labelled `scope/op`); at use it must still be at the
/// version it had when saved.
pub struct SavedTensor {
    tensor: Tensor,
    version: u64,
    op: &'static str,
}

impl SavedTensor {
    /// Saves `tensor` (detached: a saved tensor never holds a graph node) for `op`.
    pub fn new(tensor: &Tensor, op: &'static str) -> SavedTensor {
        let scope = current_scope();
        let label = if scope.is_empty() {
            op.to_string()
        } else {
            format!("{scope}/{op}")
        };
        tensor.storage().allocation().mark_saved(&label);
        tensor.storage().notify(SaveEvent::Saved);
        SavedTensor {
            tensor: tensor.detach(),
            version: tensor.version(),
            op,
        }
    }

    /// The saved tensor, or an error if it was modified in place since.
    pub fn get(&self) -> Result<&Tensor> {
        let current = self.tensor.version();
        if current != self.version {
            return Err(Error::SavedTensorModified {
                op: self.op.to_string(),
                saved_version: self.version,
                current_version: current,
            });
        }
        Ok(&self.tensor)
    }

    /// Bytes of the storage this keeps alive.
    pub fn storage_bytes(&self) -> usize {
        self.tensor.storage_bytes()
    }
}

impl Drop for SavedTensor {
    fn drop(&mut self) {
        self.tensor.storage().allocation().unmark_saved();
        self.tensor.storage().notify(SaveEvent::Released);
    }
}
