//! Activation checkpointing (`torch.utils.checkpoint(..., use_reentrant=False)`).
//!
//! [`checkpoint`] runs a segment `f` in forward and keeps, for backward,
//! only its inputs: the segment's own graph (and everything it saved) is
//! dropped as soon as its output exists. In backward the node it records
//! runs `f` again on the same inputs, under the settings, layer path and
//! random draws of the forward, and the engine runs the graph of that
//! recompute in place of the node: every op in it saves what its inputs'
//! requires-grad pattern needs (the lean tables hold inside the recompute
//! too), its gradients reach the parameters directly and the segment's
//! inputs through the node's edges. Gradients are bit for bit those of the
//! same model without checkpointing.
//!
//! | op | requires grad | saved for backward | why |
//! |---|---|---|---|
//! | `checkpoint(f, inputs)` | an input, or a parameter `f` uses | the inputs (shared, not copied) and the random draws' (seed, offset) list | the recompute replays `f` from them |
//! | same | nothing | — (no node; `f` ran once) | nothing to recompute |
//!
//! The forward runs `f` with grad mode on, so the segment's graph exists
//! (and holds its saved tensors) until `f` returns: the forward's peak
//! holds one segment's activations, as backward's does. That walk also
//! finds every parameter the segment sends a gradient to, with how many
//! edges; the node keeps edges to each, so a parameter's gradient is final
//! (and a fused optimizer updates it) only after every segment that uses
//! it has run.

use super::grad_mode::recomputing;
use super::node::{
    attach_work, edge_to, next_seq, node_of, Edge, InputEdge, Recompute, Recomputed, Work,
};
use super::{buffer_reuse, enable_grad, is_grad_enabled, save_policy, SavePolicy, SavedTensor};
use super::{with_buffer_reuse, with_save_policy, Node};
use crate::memory::{
    attribute_to_scope, current_scope_path, enter_scope_path, with_category, Category,
};
use crate::rng::{record_draws, replay_draws, DrawLog};
use crate::settings::Snapshot;
use crate::tensor::Leaf;
use crate::{DType, Error, Result, Tensor};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// A segment's function: the inputs in, one output out.
type SegmentFn = dyn Fn(&[Tensor]) -> Result<Tensor> + Send + Sync;

/// Runs `f(inputs)` keeping only `inputs` for backward, which recomputes
/// the segment (see the module doc). `f` is called with the inputs' values
/// (each requiring grad exactly when the caller's does) once in forward and
/// once more in backward; it must not modify them in place
/// (`Error::InvalidArgument`), and every tensor requiring grad it reads,
/// other than a leaf (a parameter), must be one of `inputs`. Under
/// `no_grad`, or when nothing in the segment requires grad, this is
/// `f(inputs)` and nothing is recomputed. Segments nest.
pub fn checkpoint<F>(f: F, inputs: &[&Tensor]) -> Result<Tensor>
where
    F: Fn(&[Tensor]) -> Result<Tensor> + Send + Sync + 'static,
{
    let given: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
    if !is_grad_enabled() {
        return f(&given);
    }
    let context = Context::current();
    let versions: Vec<u64> = inputs.iter().map(|t| t.version()).collect();
    let start = next_seq();
    let requires: Vec<bool> = inputs.iter().map(|t| t.requires_grad()).collect();
    let leaves = segment_inputs(&given, &requires)?;
    let record = record_draws();
    let out = f(&leaves)?;
    let draws = record.finish();
    if let Some(i) = (0..inputs.len()).find(|&i| inputs[i].version() != versions[i]) {
        return Err(Error::InvalidArgument {
            op: "checkpoint",
            msg: format!(
                "the segment modified its input {i} in place; a checkpointed segment must \
                 leave its inputs as they were, since backward runs it again on them"
            ),
        });
    }
    let Some(node) = node_of(&out) else {
        // Nothing in the segment requires grad (or `f` returned an input).
        return Ok(match leaves.iter().position(|l| l.same_tensor(&out)) {
            Some(i) => given[i].clone(),
            None => out,
        });
    };
    let params = parameter_edges(&node, start, &input_leaf_ids(&leaves))?;
    let output = out.detach();
    let (shape, dtype) = (output.shape().to_vec(), output.dtype());
    // The segment's graph and all it saved go now.
    drop((out, node, leaves));
    let mut edges: Vec<Option<InputEdge>> = inputs.iter().map(|t| edge_to(t)).collect();
    edges.extend(params.iter().map(|(_, leaf)| param_edge(leaf)));
    let segment = Segment {
        f: Arc::new(f),
        inputs: inputs
            .iter()
            .map(|t| SavedTensor::new(t, "checkpoint"))
            .collect(),
        requires,
        draws,
        context,
        params: params.iter().map(|(id, _)| *id).collect(),
        output: (shape, dtype),
    };
    Ok(attach_work(
        output,
        "checkpoint",
        edges,
        Work::Segment(Box::new(segment)),
    ))
}

/// What a segment's ops read from the thread besides their inputs, as it
/// was in forward.
struct Context {
    policy: SavePolicy,
    reuse: bool,
    settings: Snapshot,
    scope: Option<Arc<str>>,
}

impl Context {
    fn current() -> Context {
        Context {
            policy: save_policy(),
            reuse: buffer_reuse(),
            settings: Snapshot::current(),
            scope: current_scope_path(),
        }
    }
}

/// A recorded checkpoint: what backward needs to run the segment again.
struct Segment {
    f: Arc<SegmentFn>,
    inputs: Vec<SavedTensor>,
    requires: Vec<bool>,
    draws: DrawLog,
    context: Context,
    /// The leaf id at the end of each parameter edge, in the node's order
    /// (after the inputs' edges).
    params: Vec<u64>,
    output: (Vec<usize>, DType),
}

impl Recompute for Segment {
    fn recompute(self: Box<Self>) -> Result<Recomputed> {
        let Segment {
            f,
            inputs,
            requires,
            draws,
            context,
            params,
            output,
        } = *self;
        let _grad = enable_grad();
        let _category = with_category(Category::Activation);
        let _site = attribute_to_scope(None);
        let _scope = enter_scope_path(context.scope.clone());
        let _policy = with_save_policy(context.policy);
        let _reuse = with_buffer_reuse(context.reuse);
        let _settings = context.settings.enter();
        let _recomputing = recomputing();
        let values = inputs
            .iter()
            .map(|s| s.get().cloned())
            .collect::<Result<Vec<_>>>()?;
        // The leaves hold the inputs' storage from here on.
        drop(inputs);
        let leaves = segment_inputs(&values, &requires)?;
        drop(values);
        let start = next_seq();
        let replay = replay_draws(&draws);
        let out = f(&leaves)?;
        replay
            .finish()
            .map_err(|m| Error::Backward(format!("checkpoint: the recompute made {m}")))?;
        if (out.shape(), out.dtype()) != (output.0.as_slice(), output.1) {
            return Err(Error::Backward(format!(
                "checkpoint: the recompute returned {:?} ({:?}) where the forward returned {:?} ({:?})",
                out.shape(),
                out.dtype(),
                output.0,
                output.1
            )));
        }
        let root = node_of(&out).ok_or_else(|| {
            Error::Backward("checkpoint: the recompute's output does not require grad".into())
        })?;
        let ids = input_leaf_ids(&leaves);
        let again: Vec<u64> = parameter_edges(&root, start, &ids)?
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        if again != params {
            return Err(Error::Backward(format!(
                "checkpoint: the recompute sends gradients to {} parameter edges where the forward sent {}",
                again.len(),
                params.len()
            )));
        }
        let input_leaves = leaves
            .iter()
            .zip(&requires)
            .map(|(l, &r)| l.leaf().filter(|_| r).cloned())
            .collect();
        Ok(Recomputed { root, input_leaves })
    }
}

/// The values `f` is given: leaves sharing each input's storage, requiring
/// grad where the input does (so the segment's graph ends at them).
fn segment_inputs(values: &[Tensor], requires: &[bool]) -> Result<Vec<Tensor>> {
    values
        .iter()
        .zip(requires)
        .map(|(t, &r)| t.detach().set_requires_grad(r))
        .collect()
}

fn input_leaf_ids(leaves: &[Tensor]) -> HashSet<u64> {
    leaves
        .iter()
        .filter(|l| l.requires_grad())
        .filter_map(|l| l.leaf().map(|l| l.id()))
        .collect()
}

/// Every edge of the segment's graph (from `root`, nodes recorded at or
/// after `start`) to a leaf other than the segment's inputs, as (leaf id,
/// leaf) in a fixed order (by id, then as met), one entry per edge.
fn parameter_edges(
    root: &Arc<Node>,
    start: u64,
    inputs: &HashSet<u64>,
) -> Result<Vec<(u64, Arc<Leaf>)>> {
    let mut found: BTreeMap<u64, Vec<Arc<Leaf>>> = BTreeMap::new();
    let mut seen = HashSet::from([root.seq()]);
    let mut stack = vec![root.clone()];
    while let Some(node) = stack.pop() {
        for input in node.inputs().iter().flatten() {
            match &input.edge {
                Edge::Node(n) if n.seq() < start => {
                    return Err(Error::InvalidArgument {
                        op: "checkpoint",
                        msg: format!(
                            "the segment reads a tensor that requires grad (made by {}) without \
                             taking it as an input: pass it in `inputs`",
                            n.name()
                        ),
                    })
                }
                Edge::Node(n) => {
                    if seen.insert(n.seq()) {
                        stack.push(n.clone());
                    }
                }
                Edge::Leaf(l) if inputs.contains(&l.id()) => {}
                Edge::Leaf(l) => found.entry(l.id()).or_default().push(l.clone()),
            }
        }
    }
    Ok(found
        .into_iter()
        .flat_map(|(id, ls)| ls.into_iter().map(move |l| (id, l)))
        .collect())
}

/// The segment node's edge to a parameter `leaf` (never given a gradient:
/// it counts the segment's edges to the leaf until they run).
fn param_edge(leaf: &Arc<Leaf>) -> Option<InputEdge> {
    let (shape, dtype) = leaf.tensor().map_or((Vec::new(), DType::F32), |t| {
        (t.shape().to_vec(), t.dtype())
    });
    Some(InputEdge {
        edge: Edge::Leaf(leaf.clone()),
        shape,
        dtype,
    })
}
