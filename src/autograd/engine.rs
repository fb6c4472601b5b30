//! The backward engine.
//!
//! 1. Walk the graph from the root and count, for every node and leaf, how
//!    many edges lead to it (its pending contributions).
//! 2. Run ready nodes latest-created first. Running a node takes its
//!    gradient out of the pending map (so it is freed once the node is done)
//!    and consumes its backward state (so its saved tensors are freed).
//! 3. Each returned gradient is accumulated into its target's single buffer:
//!    the first contribution is moved in, later ones are added in place.
//! 4. When a leaf's count reaches zero its gradient is final, and it goes to
//!    the [`GradientSink`] at that moment: collected as `.grad`, or handed to
//!    a callback (the hook the fused optimizer uses) which may then drop it.

use super::node::node_of;
use super::{no_grad, Edge, Node};
use crate::memory::{attribute_to_scope, note_op, with_category, Category};
use crate::tensor::{Leaf, Tensor};
use crate::{Error, Result};
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

/// Receives each leaf's gradient the moment it is final.
pub trait GradientSink {
    /// `param` is the leaf (when it is still alive); `grad` its final gradient
    /// for this backward, which the sink may keep or drop.
    fn gradient_ready(
        &mut self,
        leaf: &Arc<Leaf>,
        param: Option<&Tensor>,
        grad: Tensor,
    ) -> Result<()>;
}

/// Collects gradients into each leaf's `.grad`, adding to one already there
/// (like PyTorch's `.grad` accumulation).
pub struct CollectGrads;

impl GradientSink for CollectGrads {
    fn gradient_ready(
        &mut self,
        leaf: &Arc<Leaf>,
        param: Option<&Tensor>,
        grad: Tensor,
    ) -> Result<()> {
        let merged = merge_leaf_gradient(leaf.take_grad(), grad, param)?;
        leaf.set_grad(Some(merged));
        Ok(())
    }
}

/// Calls a closure with (parameter, gradient) for each leaf as soon as its
/// gradient is final; leaves that were dropped are skipped.
pub struct CallbackSink<F>(pub F);

impl<F: FnMut(&Tensor, Tensor) -> Result<()>> GradientSink for CallbackSink<F> {
    fn gradient_ready(
        &mut self,
        _leaf: &Arc<Leaf>,
        param: Option<&Tensor>,
        grad: Tensor,
    ) -> Result<()> {
        match param {
            Some(p) => (self.0)(p, grad),
            None => Ok(()),
        }
    }
}

impl Tensor {
    /// Backpropagates from this one-element tensor (seeded with 1) and
    /// collects gradients in the leaves' `.grad`.
    pub fn backward(&self) -> Result<()> {
        backward_with(self, None, &mut CollectGrads)
    }

    /// Backpropagates and calls `on_ready(param, grad)` once per parameter,
    /// the moment its gradient is final.
    pub fn backward_with_callback(
        &self,
        on_ready: impl FnMut(&Tensor, Tensor) -> Result<()>,
    ) -> Result<()> {
        backward_with(self, None, &mut CallbackSink(on_ready))
    }
}

/// A leaf's gradient buffer after adding `grad` to what it held (if
/// anything), counted in the ledger as the gradient of `leaf` (see
/// [`mark_leaf_gradient`]).
pub fn merge_leaf_gradient(
    existing: Option<Tensor>,
    grad: Tensor,
    leaf: Option<&Tensor>,
) -> Result<Tensor> {
    let merged = match existing {
        None => grad,
        Some(existing) => accumulate(existing, grad)?,
    };
    mark_leaf_gradient(&merged, leaf);
    Ok(merged)
}

/// Counts `grad` in the ledger as a gradient that reached `leaf`: a
/// parameter gradient when the leaf's storage is a parameter, an input
/// gradient otherwise (an input image, or a leaf no longer alive).
pub fn mark_leaf_gradient(grad: &Tensor, leaf: Option<&Tensor>) {
    let is_parameter = leaf.is_some_and(|t| t.memory_category() == Some(Category::Parameter));
    grad.storage().allocation().mark_leaf_gradient(is_parameter);
}

/// Adds `incoming` to `existing`, in place when `existing` (or else
/// `incoming`) is a contiguous buffer nothing else references; otherwise
/// into a new buffer.
pub fn accumulate(existing: Tensor, incoming: Tensor) -> Result<Tensor> {
    if is_exclusive(&existing) {
        crate::primitives::add_assign(&existing, &incoming)?;
        return Ok(existing);
    }
    if is_exclusive(&incoming) {
        crate::primitives::add_assign(&incoming, &existing)?;
        return Ok(incoming);
    }
    let _ng = no_grad();
    existing.add(&incoming)
}

fn is_exclusive(t: &Tensor) -> bool {
    Arc::strong_count(&t.0) == 1
        && Arc::strong_count(t.storage()) == 1
        && t.is_contiguous()
        && t.numel() == t.storage().len()
}

/// The heap key: larger `seq` first.
struct Ready(Arc<Node>);

impl PartialEq for Ready {
    fn eq(&self, o: &Self) -> bool {
        self.0.seq() == o.0.seq()
    }
}
impl Eq for Ready {}
impl PartialOrd for Ready {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ready {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.seq().cmp(&o.0.seq())
    }
}

/// Runs backward from `root` with `grad_output` as its gradient (ones for a
/// one-element root when `None`), sending each leaf's final gradient to `sink`.
pub fn backward_with(
    root: &Tensor,
    grad_output: Option<Tensor>,
    sink: &mut dyn GradientSink,
) -> Result<()> {
    let _grad_category = with_category(Category::IntermediateGradient);
    let _no_grad = no_grad();
    // Allocations before the first node (the seed) are the backward's own.
    note_op("backward");
    let seed = match grad_output {
        Some(g) => {
            if g.shape() != root.shape() || g.dtype() != root.dtype() {
                return Err(Error::ShapeMismatch {
                    op: "backward (grad_output)",
                    lhs: root.shape().to_vec(),
                    rhs: g.shape().to_vec(),
                });
            }
            g
        }
        None if root.numel() == 1 => Tensor::ones(root.shape(), root.dtype(), root.device())?,
        None => {
            return Err(Error::Backward(format!(
                "the root has shape {:?}: give grad_output for a tensor with more than one element",
                root.shape()
            )))
        }
    };
    if let Some(leaf) = root.leaf() {
        mark_leaf_gradient(&seed, Some(root));
        return sink.gradient_ready(leaf, Some(root), seed);
    }
    let Some(root_node) = node_of(root) else {
        return Err(Error::Backward(
            "the root does not require grad (no input of it requires grad, or it was computed under no_grad)".into(),
        ));
    };

    // 1. Dependency counts.
    let mut node_deps: HashMap<u64, usize> = HashMap::new();
    let mut leaf_deps: HashMap<u64, usize> = HashMap::new();
    let mut stack = vec![root_node.clone()];
    let mut seen = std::collections::HashSet::from([root_node.seq()]);
    while let Some(node) = stack.pop() {
        if node.is_consumed() {
            return Err(Error::Backward(format!(
                "the graph through {} was already freed by an earlier backward",
                node.name()
            )));
        }
        for input in node.inputs().iter().flatten() {
            match &input.edge {
                Edge::Node(n) => {
                    *node_deps.entry(n.seq()).or_default() += 1;
                    if seen.insert(n.seq()) {
                        stack.push(n.clone());
                    }
                }
                Edge::Leaf(l) => *leaf_deps.entry(l.id()).or_default() += 1,
            }
        }
    }
    drop(seen);

    // 2-4. Run the nodes.
    let mut node_grads: HashMap<u64, Tensor> = HashMap::from([(root_node.seq(), seed)]);
    let mut leaf_grads: HashMap<u64, Tensor> = HashMap::new();
    let mut ready = BinaryHeap::from([Ready(root_node)]);
    while let Some(Ready(node)) = ready.pop() {
        let grad = node_grads.remove(&node.seq());
        // What this node allocates is reported under the layer that recorded it.
        let _site = attribute_to_scope(node.scope().cloned());
        note_op(node.name());
        let op = node.take_backward().ok_or_else(|| {
            Error::Backward(format!(
                "{} was already run by another backward",
                node.name()
            ))
        })?;
        // A node no gradient reached contributes nothing; its state is freed.
        let input_grads = match grad {
            Some(g) => op.backward(g)?,
            None => {
                drop(op);
                vec![None; node.inputs().len()]
            }
        };
        if input_grads.len() != node.inputs().len() {
            return Err(Error::Backward(format!(
                "{} returned {} gradients for {} inputs",
                node.name(),
                input_grads.len(),
                node.inputs().len()
            )));
        }
        for (input, grad) in node.inputs().iter().zip(input_grads) {
            let Some(input) = input else { continue };
            if let Some(g) = &grad {
                if g.shape() != input.shape.as_slice() || g.dtype() != input.dtype {
                    return Err(Error::Backward(format!(
                        "{} returned a gradient of shape {:?} ({:?}) for an input of shape {:?} ({:?})",
                        node.name(),
                        g.shape(),
                        g.dtype(),
                        input.shape,
                        input.dtype
                    )));
                }
            }
            match &input.edge {
                Edge::Node(n) => {
                    if let Some(g) = grad {
                        add_pending(&mut node_grads, n.seq(), g)?;
                    }
                    let d = node_deps.get_mut(&n.seq()).expect("counted in the walk");
                    *d -= 1;
                    if *d == 0 {
                        ready.push(Ready(n.clone()));
                    }
                }
                Edge::Leaf(leaf) => {
                    if let Some(g) = grad {
                        add_pending(&mut leaf_grads, leaf.id(), g)?;
                    }
                    if let Some(g) = leaf_grads.get(&leaf.id()) {
                        mark_leaf_gradient(g, leaf.tensor().as_ref());
                    }
                    let d = leaf_deps.get_mut(&leaf.id()).expect("counted in the walk");
                    *d -= 1;
                    if *d == 0 {
                        if let Some(g) = leaf_grads.remove(&leaf.id()) {
                            let param = leaf.tensor();
                            sink.gradient_ready(leaf, param.as_ref(), g)?;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn add_pending(map: &mut HashMap<u64, Tensor>, key: u64, grad: Tensor) -> Result<()> {
    let merged = match map.remove(&key) {
        None => grad,
        Some(existing) => accumulate(existing, grad)?,
    };
    map.insert(key, merged);
    Ok(())
}
