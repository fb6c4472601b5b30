//! Tensors: a view (layout) onto counted storage, plus the tensor's place
//! in the autograd graph.
//!
//! The graph record a tensor carries is defined here, below autograd: a
//! [`Leaf`] (a tensor that requires grad and collects its gradient) or the
//! node of the op that produced it. The node's type belongs to the autograd
//! layer, which records it and reads it back; this layer only holds it (as
//! PyTorch's tensors hold an autograd-meta interface), so the two modules do
//! not import each other.

mod create;
pub(crate) mod cuda;
mod display;
mod layout;
mod storage;

pub use layout::{broadcast_shapes, checked_numel, contiguous_strides, resolve_dim, Layout};
pub use storage::{Backing, SaveEvent, SaveListener, Storage};

use crate::dtype::CpuData;
use crate::memory::host::try_vec;
use crate::memory::Category;
use crate::{DType, Device, Error, Result, WithDType};
use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// An n-dimensional array on a device. Cloning is cheap (shared storage).
///
/// A tensor that requires grad is either a leaf (a parameter or an input the
/// user marked) or the output of an op, holding the autograd node that
/// produced it; that node owns exactly what the op saved for backward.
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<TensorInner>);

/// The recorded op that produced a tensor, as this layer holds it: the
/// autograd layer's node type, opaque here.
pub(crate) type OpNode = Arc<dyn Any + Send + Sync>;

/// What a tensor knows about its place in the graph.
#[derive(Clone)]
pub(crate) enum GradMeta {
    /// Gradients do not flow to it.
    None,
    /// A leaf requiring grad (its gradient goes to a sink).
    Leaf(Arc<Leaf>),
    /// The output of a recorded op.
    Node(OpNode),
}

static NEXT_LEAF: AtomicU64 = AtomicU64::new(0);

/// The autograd identity of a leaf tensor and its collected gradient.
pub struct Leaf {
    id: u64,
    tensor: Weak<TensorInner>,
    grad: Mutex<Option<Tensor>>,
}

impl Leaf {
    fn new(tensor: Weak<TensorInner>) -> Leaf {
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

    fn slot(&self) -> MutexGuard<'_, Option<Tensor>> {
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

pub(crate) struct TensorInner {
    pub(crate) storage: Arc<Storage>,
    pub(crate) layout: Layout,
    pub(crate) grad: GradMeta,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor[{:?}, {:?}, {}{}]",
            self.shape(),
            self.dtype(),
            self.device(),
            if self.requires_grad() {
                ", requires_grad"
            } else {
                ""
            }
        )
    }
}

impl Tensor {
    /// A tensor over `storage` with `layout`, not requiring grad.
    pub(crate) fn from_storage(storage: Arc<Storage>, layout: Layout) -> Tensor {
        Tensor(Arc::new(TensorInner {
            storage,
            layout,
            grad: GradMeta::None,
        }))
    }

    /// A contiguous tensor owning freshly made host data.
    pub(crate) fn from_cpu_data(data: CpuData, shape: &[usize]) -> Result<Tensor> {
        debug_assert_eq!(data.len(), shape.iter().product::<usize>());
        Ok(Tensor::from_storage(
            Arc::new(Storage::new(data)?),
            Layout::contiguous(shape),
        ))
    }

    /// The same storage and layout with other autograd metadata.
    fn with_grad_meta(&self, grad: GradMeta) -> Tensor {
        Tensor(Arc::new(TensorInner {
            storage: self.0.storage.clone(),
            layout: self.0.layout.clone(),
            grad,
        }))
    }

    /// A view of the same storage with another layout (no autograd).
    pub(crate) fn view_with_layout(&self, layout: Layout) -> Tensor {
        Tensor::from_storage(self.0.storage.clone(), layout)
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.0.layout.shape()
    }

    /// Alias of [`Tensor::shape`].
    pub fn dims(&self) -> &[usize] {
        self.shape()
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape().len()
    }

    /// Size of dimension `dim` (negative counts from the end).
    pub fn dim(&self, dim: isize) -> Result<usize> {
        Ok(self.shape()[resolve_dim("dim", dim, self.rank())?])
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.0.layout.numel()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.storage.dtype()
    }

    /// The device holding the storage.
    pub fn device(&self) -> Device {
        self.0.storage.device()
    }

    /// The layout (shape, strides, offset).
    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }

    /// The storage shared with other views.
    pub fn storage(&self) -> &Arc<Storage> {
        &self.0.storage
    }

    /// The storage, mutably, when this handle is all that references it:
    /// the tensor and its storage are each held once and no weak handle
    /// points at either (what an op needs to change the storage's dtype).
    pub(crate) fn storage_mut(&mut self) -> Option<&mut Storage> {
        Arc::get_mut(&mut self.0).and_then(|inner| Arc::get_mut(&mut inner.storage))
    }

    /// Whether the elements are dense and row-major.
    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }

    /// Bytes of the underlying storage (what the ledger counts for it).
    pub fn storage_bytes(&self) -> usize {
        self.0.storage.size_in_bytes()
    }

    /// Version of the storage: how many in-place modifications it has seen.
    pub fn version(&self) -> u64 {
        self.0.storage.version()
    }

    /// Whether this tensor and `other` share storage.
    pub fn shares_storage_with(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
    }

    /// Moves the storage to another ledger category (e.g. a parameter).
    pub fn set_memory_category(&self, category: Category) {
        self.0.storage.allocation().set_category(category);
    }

    /// The ledger category of the storage (its own, not "saved").
    pub fn memory_category(&self) -> Option<Category> {
        self.0.storage.allocation().category()
    }

    /// Whether keeping this tensor for backward costs no memory of its own:
    /// it is model state (a parameter or buffer) or optimizer state, alive
    /// regardless of the graph.
    pub fn is_model_state(&self) -> bool {
        matches!(
            self.memory_category(),
            Some(Category::Parameter | Category::OptimizerState)
        )
    }

    /// The elements in row-major order, as `T` (which must be the dtype).
    pub fn to_vec<T: WithDType>(&self) -> Result<Vec<T>> {
        if self.device().is_meta() {
            return Err(Error::NoData { op: "to_vec" });
        }
        if self.dtype() != T::DTYPE {
            return Err(Error::DTypeMismatch {
                op: "to_vec",
                expected: T::DTYPE,
                got: self.dtype(),
            });
        }
        if let Device::Cuda(_) = self.device() {
            let data = crate::tensor::cuda::download(self)?;
            return Ok(T::cpu_slice(&data).map(<[T]>::to_vec).unwrap_or_default());
        }
        let data = self.0.storage.cpu()?;
        let s = T::cpu_slice(&data).ok_or(Error::DTypeMismatch {
            op: "to_vec",
            expected: T::DTYPE,
            got: data.dtype(),
        })?;
        let mut out = try_vec(self.numel())?;
        match self.0.layout.contiguous_range() {
            Some(r) => out.extend_from_slice(&s[r]),
            None => self.0.layout.for_each_offset(|o| out.push(s[o])),
        }
        Ok(out)
    }

    /// The elements in row-major order converted to f64, whatever the dtype.
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        if self.device().is_meta() {
            return Err(Error::NoData { op: "to_f64_vec" });
        }
        if let Device::Cuda(_) = self.device() {
            return Ok(crate::tensor::cuda::download(self)?.to_vec_as());
        }
        let data = self.0.storage.cpu()?;
        let mut out = try_vec(self.numel())?;
        crate::match_cpu_data!(&*data, v => self.0.layout.for_each_offset(|o| out.push(v[o].to_f64())));
        Ok(out)
    }

    /// The single element of a one-element tensor, as f64.
    pub fn to_scalar(&self) -> Result<f64> {
        if self.numel() != 1 {
            return Err(Error::InvalidArgument {
                op: "to_scalar",
                msg: format!(
                    "tensor of shape {:?} has {} elements",
                    self.shape(),
                    self.numel()
                ),
            });
        }
        Ok(self.to_f64_vec()?[0])
    }

    /// Whether gradients flow to this tensor.
    pub fn requires_grad(&self) -> bool {
        !matches!(self.0.grad, GradMeta::None)
    }

    /// Whether nothing but this handle can see the tensor's elements: the
    /// tensor and its storage are each held once (no clone, view or saved
    /// tensor shares them), it covers its whole storage contiguously, and
    /// it is not a leaf requiring grad. Only then may an op write its output
    /// over the storage (in-place ops that take `self` by value).
    pub fn is_exclusive(&self) -> bool {
        Arc::strong_count(&self.0) == 1
            && Arc::strong_count(&self.0.storage) == 1
            && self.is_contiguous()
            && self.numel() == self.0.storage.len()
            && !(self.is_leaf() && self.requires_grad())
    }

    /// Whether the tensor is all of its storage, contiguous from its start
    /// (a kernel may then take the buffer for the tensor).
    pub(crate) fn is_whole_storage(&self) -> bool {
        self.is_contiguous() && self.layout().offset() == 0 && self.numel() == self.0.storage.len()
    }

    /// Whether `other` is this very tensor (not a view or a clone of its
    /// storage under another handle).
    pub(crate) fn same_tensor(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Whether this is a leaf of the graph (not produced by a recorded op).
    pub fn is_leaf(&self) -> bool {
        !matches!(self.0.grad, GradMeta::Node(_))
    }

    /// A leaf sharing this storage that requires grad (`true`), or a plain
    /// tensor (`false`). Only float tensors can require grad.
    pub fn set_requires_grad(self, requires: bool) -> Result<Tensor> {
        if !requires {
            return Ok(self.detach());
        }
        if !self.dtype().is_float() {
            return Err(Error::UnsupportedDType {
                op: "requires_grad",
                dtype: self.dtype(),
            });
        }
        let storage = self.0.storage.clone();
        let layout = self.0.layout.clone();
        Ok(Tensor(Arc::new_cyclic(|weak| TensorInner {
            storage,
            layout,
            grad: GradMeta::Leaf(Arc::new(Leaf::new(weak.clone()))),
        })))
    }

    /// A trainable parameter: a leaf requiring grad whose storage is counted
    /// as [`Category::Parameter`].
    pub fn into_parameter(self) -> Result<Tensor> {
        self.set_memory_category(Category::Parameter);
        self.set_requires_grad(true)
    }

    /// The same data, cut off from the graph.
    pub fn detach(&self) -> Tensor {
        Tensor::from_storage(self.0.storage.clone(), self.0.layout.clone())
    }

    /// The gradient collected for this leaf by backward, if any.
    pub fn grad(&self) -> Option<Tensor> {
        match &self.0.grad {
            GradMeta::Leaf(l) => l.grad(),
            _ => None,
        }
    }

    /// Removes and returns the collected gradient (frees it when dropped).
    pub fn take_grad(&self) -> Option<Tensor> {
        match &self.0.grad {
            GradMeta::Leaf(l) => l.take_grad(),
            _ => None,
        }
    }

    /// Frees the collected gradient.
    pub fn zero_grad(&self) {
        drop(self.take_grad());
    }

    /// A stable identity of this leaf (`None` for non-leaves and plain tensors).
    pub fn leaf_id(&self) -> Option<u64> {
        match &self.0.grad {
            GradMeta::Leaf(l) => Some(l.id()),
            _ => None,
        }
    }

    /// This tensor's leaf record, if it is a leaf requiring grad.
    pub(crate) fn leaf(&self) -> Option<&Arc<Leaf>> {
        match &self.0.grad {
            GradMeta::Leaf(l) => Some(l),
            _ => None,
        }
    }

    /// The node of the op that produced this tensor, if one was recorded.
    pub(crate) fn op_node(&self) -> Option<&OpNode> {
        match &self.0.grad {
            GradMeta::Node(n) => Some(n),
            _ => None,
        }
    }

    /// The same storage and layout as the output of the recorded op `node`.
    pub(crate) fn with_op_node(&self, node: OpNode) -> Tensor {
        self.with_grad_meta(GradMeta::Node(node))
    }
}
