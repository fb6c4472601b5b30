//! Graph nodes: one per recorded op, owning only its saved state.

use super::is_grad_enabled;
use crate::tensor::{Leaf, Tensor};
use crate::{DType, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

static NEXT_NODE: AtomicU64 = AtomicU64::new(0);

/// The backward of one op: a struct holding the op's typed saved state.
///
/// `backward` consumes the state, so whatever the op saved is freed at the
/// latest when it returns (and earlier if the op drops it as soon as used).
pub trait BackwardOp: Send + Sync {
    /// The op's name, for errors and reports.
    fn name(&self) -> &'static str;

    /// Given the gradient of the op's output, the gradient of each input, in
    /// the order the inputs were given to [`attach`]. An input that does not
    /// require grad gets `None`; so may one whose gradient is identically zero.
    fn backward(self: Box<Self>, grad_output: Tensor) -> Result<Vec<Option<Tensor>>>;

    /// Whether [`backward_into`](Self::backward_into) adds input `i`'s
    /// gradient into a buffer it is given, in place (so the engine hands
    /// it the gradient already pending for that input instead of holding
    /// both and adding them afterwards). Default: no input.
    fn adds_into_pending(&self, _input: usize) -> bool {
        false
    }

    /// As [`backward`](Self::backward), given `pending[i]`: a gradient that
    /// already reached input `i` (only for inputs where
    /// [`adds_into_pending`](Self::adds_into_pending) holds, as a buffer
    /// nothing else references). Returns each input's gradient with its
    /// pending one added, the same values as `pending[i] + backward's[i]`.
    /// An op that declares `adds_into_pending` implements this; the default
    /// (for ops that never get a pending buffer) is `backward`.
    fn backward_into(
        self: Box<Self>,
        grad_output: Tensor,
        pending: Vec<Option<Tensor>>,
    ) -> Result<Vec<Option<Tensor>>> {
        if pending.iter().any(Option::is_some) {
            return Err(crate::Error::Backward(format!(
                "{} declares adds_into_pending but does not implement backward_into",
                self.name()
            )));
        }
        self.backward(grad_output)
    }
}

/// Where an input's gradient goes.
#[derive(Clone)]
pub enum Edge {
    /// To the op that produced the input.
    Node(Arc<Node>),
    /// To a leaf.
    Leaf(Arc<Leaf>),
}

/// What backward checks a returned gradient against.
#[derive(Clone)]
pub struct InputEdge {
    pub(crate) edge: Edge,
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: DType,
}

/// What a node runs in backward.
pub(crate) enum Work {
    /// An op's backward: input gradients from the output's.
    Op(Box<dyn BackwardOp>),
    /// A checkpointed segment: recomputed, and its graph run in place of it.
    Segment(Box<dyn Recompute>),
}

/// A checkpointed segment's backward ([`super::checkpoint`]): it runs the
/// segment again and hands the engine the recomputed graph.
pub(crate) trait Recompute: Send + Sync {
    /// Runs the segment again as its forward ran, with grad mode on.
    fn recompute(self: Box<Self>) -> Result<Recomputed>;
}

/// A segment run again: the engine runs `root`'s graph with the gradient
/// the segment's node received, and treats a gradient reaching
/// `input_leaves[i]` as one reaching the node's input `i`.
pub(crate) struct Recomputed {
    pub root: Arc<Node>,
    pub input_leaves: Vec<Option<Arc<Leaf>>>,
}

/// One recorded op.
pub struct Node {
    seq: u64,
    name: &'static str,
    /// The layer path the op ran in (its backward is reported there).
    scope: Option<Arc<str>>,
    backward: Mutex<Option<Work>>,
    inputs: Vec<Option<InputEdge>>,
}

impl Node {
    /// Creation order: later nodes have larger numbers; backward runs the
    /// ready node with the largest first.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The op's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The layer path the op was recorded in (`None` outside any layer).
    pub fn scope(&self) -> Option<&Arc<str>> {
        self.scope.as_ref()
    }

    /// Edges to the inputs (`None` where the input does not require grad).
    pub fn inputs(&self) -> &[Option<InputEdge>] {
        &self.inputs
    }

    /// Takes the backward state out (it runs once; afterwards it is gone).
    pub(crate) fn take_backward(&self) -> Option<Work> {
        self.backward
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Whether backward has already consumed this node.
    pub fn is_consumed(&self) -> bool {
        self.backward
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    fn take_node_edges(&mut self) -> Vec<Arc<Node>> {
        std::mem::take(&mut self.inputs)
            .into_iter()
            .flatten()
            .filter_map(|e| match e.edge {
                Edge::Node(n) => Some(n),
                Edge::Leaf(_) => None,
            })
            .collect()
    }
}

impl Drop for Node {
    /// Drops the chain of predecessors iteratively, so that dropping the
    /// output of a very deep graph cannot overflow the stack.
    fn drop(&mut self) {
        let mut stack = self.take_node_edges();
        while let Some(node) = stack.pop() {
            if let Ok(mut node) = Arc::try_unwrap(node) {
                stack.extend(node.take_node_edges());
            }
        }
    }
}

/// Which of `inputs` need a gradient now (all `false` under `no_grad`).
pub fn needs_grad<const N: usize>(inputs: [&Tensor; N]) -> [bool; N] {
    let enabled = is_grad_enabled();
    inputs.map(|t| enabled && t.requires_grad())
}

/// Records `op` as the producer of `output`, with edges to those `inputs`
/// that require grad. Returns `output` unchanged when none does (or grad
/// mode is off), dropping `op` and whatever it saved.
pub fn attach(output: Tensor, inputs: &[&Tensor], op: impl BackwardOp + 'static) -> Tensor {
    if !is_grad_enabled() || !inputs.iter().any(|t| t.requires_grad()) {
        return output;
    }
    let edges = inputs.iter().map(|t| edge_to(t)).collect();
    let name = op.name();
    attach_work(output, name, edges, Work::Op(Box::new(op)))
}

/// The edge backward follows from an op to its input `t` (`None` when `t`
/// does not require grad).
pub(crate) fn edge_to(t: &Tensor) -> Option<InputEdge> {
    let edge = match (t.leaf(), node_of(t)) {
        (Some(l), _) => Edge::Leaf(l.clone()),
        (None, Some(n)) => Edge::Node(n),
        (None, None) => return None,
    };
    Some(InputEdge {
        edge,
        shape: t.shape().to_vec(),
        dtype: t.dtype(),
    })
}

/// Records `work` under `name` as the producer of `output`, with `edges`.
pub(crate) fn attach_work(
    output: Tensor,
    name: &'static str,
    edges: Vec<Option<InputEdge>>,
    work: Work,
) -> Tensor {
    let node = Node {
        seq: NEXT_NODE.fetch_add(1, Ordering::Relaxed),
        name,
        scope: crate::memory::current_scope_path(),
        backward: Mutex::new(Some(work)),
        inputs: edges,
    };
    output.with_op_node(Arc::new(node))
}

/// The `seq` the next node recorded will get (nodes recorded from now on
/// have this or more).
pub(crate) fn next_seq() -> u64 {
    NEXT_NODE.load(Ordering::Relaxed)
}

/// The node of the op that produced `t`, if one was recorded. (Only
/// [`attach`] records nodes, so the tensor's op node is always a [`Node`].)
pub(crate) fn node_of(t: &Tensor) -> Option<Arc<Node>> {
    t.op_node()?.clone().downcast::<Node>().ok()
}
