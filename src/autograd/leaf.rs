//! Leaves: tensors that require grad but were not produced by a recorded op.

use crate::tensor::{Tensor, TensorInner};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Weak};

static NEXT_LEAF: AtomicU64 = AtomicU64::new(0);

/// The autograd identity of a leaf tensor and its collected gradient.
pub struct Leaf {
    id: u64,
    tensor: Weak<TensorInner>,
    grad: Mutex<Option<Tensor>>,
}

impl Leaf {
    pub(crate) fn new(tensor: Weak<TensorInner>) -> Leaf {
        Leaf {
            id: NEXT_LEAF.fetch_add(1, Ordering::Relaxed),
            tensor,
            grad: Mutex::new(None),
        }
    }

    /// A process-unique id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The leaf tensor itself, while it is alive.
    pub fn tensor(&self) -> Option<Tensor> {
        self.tensor.upgrade().map(Tensor)
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Tensor>> {
        self.grad.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn grad(&self) -> Option<Tensor> {
        self.slot().clone()
    }

    pub(crate) fn take_grad(&self) -> Option<Tensor> {
        self.slot().take()
    }

    pub(crate) fn set_grad(&self, grad: Option<Tensor>) {
        *self.slot() = grad;
    }
}
