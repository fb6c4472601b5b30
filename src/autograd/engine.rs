//! The backward engine.
//!
//! 1. Walk the graph from the root and count, for every node and leaf, how
//!    many edges lead to it (its pending contributions).
//! 2. Run ready nodes latest-created first. Running a node takes its
//!    gradient out of the pending map (so it is freed once the node is done)
//!    and consumes its backward state (so its saved tensors are freed).
//! 3. Each returned gradient is accumulated into its target's single buffer:
//!    the first contribution is moved in, later ones are added in place.
//!    An op that can add its gradient into a buffer itself
//!    ([`BackwardOp::adds_into_pending`](super::BackwardOp::adds_into_pending),
//!    the embedding's scatter) is handed the one pending for that input, so
//!    the two never coexist.
//! 4. When a leaf's count reaches zero its gradient is final, and it goes to
//!    the [`GradientSink`] at that moment: collected as `.grad`, or handed to
//!    a callback (the hook the fused optimizer uses) which may then drop it.
//! 5. A checkpointed segment's node, when its gradient is ready, runs the
//!    segment again ([`super::checkpoint`]) and the engine counts and runs
//!    the recomputed graph in its place (its nodes are the newest, so all of
//!    them run before any older one): what reaches the recompute's input
//!    leaves goes on along the segment node's edges, and its edges to the
//!    parameters were counted in step 1 through the segment node's own.

use super::node::{node_of, InputEdge, Recomputed, Work};
use super::{no_grad, Edge, Node};
use crate::memory::{attribute_to_scope, note_op, with_category, Category};
use crate::settings::{set, AUTOCAST};
use crate::tensor::{Leaf, Tensor};
use crate::{Error, Result};
use std::collections::{BinaryHeap, HashMap, HashSet};
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
    // Each op's backward works in the dtypes its forward used: no autocast
    // casts (a checkpointed segment's recompute restores its forward's).
    let _no_autocast = set(&AUTOCAST, None);
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

    let mut run = Run {
        sink,
        node_deps: HashMap::new(),
        leaf_deps: HashMap::new(),
        node_grads: HashMap::from([(root_node.seq(), seed)]),
        leaf_grads: HashMap::new(),
        redirects: HashMap::new(),
        ready: BinaryHeap::new(),
    };
    run.count_from(&root_node, true)?;
    run.ready.push(Ready(root_node));
    while let Some(Ready(node)) = run.ready.pop() {
        run.run_node(node)?;
    }
    Ok(())
}

/// One backward in progress.
struct Run<'s> {
    sink: &'s mut dyn GradientSink,
    /// Edges not yet run into each node, by `seq`.
    node_deps: HashMap<u64, usize>,
    /// Edges not yet run into each leaf, by id.
    leaf_deps: HashMap<u64, usize>,
    node_grads: HashMap<u64, Tensor>,
    leaf_grads: HashMap<u64, Tensor>,
    /// A recomputed segment's input leaf (by id) → the segment's node and
    /// the input's index: what reaches the leaf goes on along that edge.
    redirects: HashMap<u64, (Arc<Node>, usize)>,
    ready: BinaryHeap<Ready>,
}

impl Run<'_> {
    /// Step 1: counts the edges into every node reachable from `root`, and
    /// into every leaf (`all_leaves`) or only into recomputed segments' inputs.
    fn count_from(&mut self, root: &Arc<Node>, all_leaves: bool) -> Result<()> {
        let mut stack = vec![root.clone()];
        let mut seen = HashSet::from([root.seq()]);
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
                        *self.node_deps.entry(n.seq()).or_default() += 1;
                        if seen.insert(n.seq()) {
                            stack.push(n.clone());
                        }
                    }
                    Edge::Leaf(l) if all_leaves || self.redirects.contains_key(&l.id()) => {
                        *self.leaf_deps.entry(l.id()).or_default() += 1
                    }
                    // A parameter edge inside a recomputed segment: counted
                    // already, by the segment node's edges.
                    Edge::Leaf(_) => {}
                }
            }
        }
        Ok(())
    }

    /// Steps 2 and 3: runs `node` and hands each input its gradient.
    fn run_node(&mut self, node: Arc<Node>) -> Result<()> {
        let grad = self.node_grads.remove(&node.seq());
        // What this node allocates is reported under the layer that recorded it.
        let _site = attribute_to_scope(node.scope().cloned());
        note_op(node.name());
        let work = node.take_backward().ok_or_else(|| {
            Error::Backward(format!(
                "{} was already run by another backward",
                node.name()
            ))
        })?;
        // A node no gradient reached contributes nothing; its state is freed.
        let input_grads = match (work, grad) {
            (Work::Op(op), Some(g)) => match self.take_pending_for(&node, op.as_ref()) {
                Some(pending) => op.backward_into(g, pending)?,
                None => op.backward(g)?,
            },
            (Work::Segment(segment), Some(g)) => {
                let recomputed = segment.recompute()?;
                return self.expand(node, recomputed, g);
            }
            (work, None) => {
                drop(work);
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
            if let Some(input) = input {
                self.deliver(node.name(), input, grad)?;
            }
        }
        Ok(())
    }

    /// The gradients pending for those of `node`'s inputs `op` adds into in
    /// place (taken out of the pending maps: `op` returns them with its own
    /// added), or `None` when there is none to hand over. A pending buffer
    /// something else references stays where it is (it is added to
    /// afterwards, as any other).
    fn take_pending_for(
        &mut self,
        node: &Node,
        op: &dyn super::BackwardOp,
    ) -> Option<Vec<Option<Tensor>>> {
        let mut pending: Vec<Option<Tensor>> = vec![None; node.inputs().len()];
        for (i, input) in node.inputs().iter().enumerate() {
            let Some(input) = input else { continue };
            if !op.adds_into_pending(i) {
                continue;
            }
            let (map, key) = match &input.edge {
                Edge::Node(n) => (&mut self.node_grads, n.seq()),
                Edge::Leaf(l) => (&mut self.leaf_grads, l.id()),
            };
            if map.get(&key).is_some_and(is_exclusive) {
                pending[i] = map.remove(&key);
            }
        }
        pending.iter().any(Option::is_some).then_some(pending)
    }

    /// Runs a recomputed segment's graph in place of its `node`, from `grad`.
    fn expand(&mut self, node: Arc<Node>, segment: Recomputed, grad: Tensor) -> Result<()> {
        for (i, leaf) in segment.input_leaves.iter().enumerate() {
            if let Some(l) = leaf {
                self.redirects.insert(l.id(), (node.clone(), i));
                self.leaf_deps.insert(l.id(), 0);
            }
        }
        self.count_from(&segment.root, false)?;
        // An input the recompute's graph never reaches gets no gradient now.
        for (i, leaf) in segment.input_leaves.iter().enumerate() {
            let Some(l) = leaf else { continue };
            if self.leaf_deps.get(&l.id()) == Some(&0) {
                self.leaf_deps.remove(&l.id());
                self.redirects.remove(&l.id());
                if let Some(input) = &node.inputs()[i] {
                    self.deliver(node.name(), input, None)?;
                }
            }
        }
        add_pending(&mut self.node_grads, segment.root.seq(), grad)?;
        self.ready.push(Ready(segment.root));
        Ok(())
    }

    /// Steps 3 and 4: adds `grad` (from the node named `from`) to what `input`'s
    /// target has pending and, once every edge into the target has run,
    /// makes it ready (a node), hands its gradient to the sink (a leaf) or
    /// passes it on along a recomputed segment's edge.
    fn deliver(&mut self, from: &str, input: &InputEdge, grad: Option<Tensor>) -> Result<()> {
        if let Some(g) = &grad {
            if g.shape() != input.shape.as_slice() || g.dtype() != input.dtype {
                return Err(Error::Backward(format!(
                    "{from} returned a gradient of shape {:?} ({:?}) for an input of shape {:?} ({:?})",
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
                    add_pending(&mut self.node_grads, n.seq(), g)?;
                }
                if count_down(&mut self.node_deps, n.seq()) {
                    self.ready.push(Ready(n.clone()));
                }
            }
            Edge::Leaf(leaf) => {
                let redirect = self.redirects.contains_key(&leaf.id());
                if let Some(g) = grad {
                    add_pending(&mut self.leaf_grads, leaf.id(), g)?;
                }
                if !redirect {
                    if let Some(g) = self.leaf_grads.get(&leaf.id()) {
                        mark_leaf_gradient(g, leaf.tensor().as_ref());
                    }
                }
                if !count_down(&mut self.leaf_deps, leaf.id()) {
                    return Ok(());
                }
                let g = self.leaf_grads.remove(&leaf.id());
                match self.redirects.remove(&leaf.id()) {
                    Some((segment, i)) => {
                        if let Some(input) = &segment.inputs()[i] {
                            self.deliver(segment.name(), input, g)?;
                        }
                    }
                    None => {
                        if let Some(g) = g {
                            let param = leaf.tensor();
                            self.sink.gradient_ready(leaf, param.as_ref(), g)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// One edge into `key` has run: whether it was the last.
fn count_down(deps: &mut HashMap<u64, usize>, key: u64) -> bool {
    let d = deps.get_mut(&key).expect("counted in the walk");
    *d -= 1;
    *d == 0
}

fn add_pending(map: &mut HashMap<u64, Tensor>, key: u64, grad: Tensor) -> Result<()> {
    let merged = match map.remove(&key) {
        None => grad,
        Some(existing) => accumulate(existing, grad)?,
    };
    map.insert(key, merged);
    Ok(())
}
