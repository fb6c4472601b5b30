//! Linear layer and cross-entropy in one op, over row chunks: the logits
//! `h·Wᵀ + b` of a language-model head (`[tokens, vocabulary]`, often the
//! largest tensor of a step) never exist whole. Forward computes each
//! chunk's logits, their per-sample losses and drops them; backward
//! recomputes each chunk's logits and probabilities and writes the
//! gradients of the hidden states, the weight and the bias directly
//! (Liger Kernel's fused linear cross-entropy, Cut Cross-Entropy).
//!
//! | op | requires grad | saved for backward | why |
//! |---|---|---|---|
//! | `linear_cross_entropy` | any of hidden, weight, bias | the hidden states: `N·D·b` bytes; the weight and bias (parameters: no bytes); the targets: `8·N` bytes (the caller's tensor, not copied) | every gradient needs the chunk's probabilities, recomputed from `h`, `W` and `b`: no logits, no probabilities kept |
//! | `linear_cross_entropy` | nothing | — (no node) | |
//! | `linear_cross_entropy` under autocast | any of hidden, weight, bias | the hidden states in autocast's dtype: `N·D·2` bytes; the rest as above | the logits are recomputed from the same low-precision operands; the weight's low-precision copy is Workspace, made once in forward and once in backward |
//!
//! The same under both save policies. Each chunk's logits, probabilities
//! and their gradient are Workspace, at most [`CHUNK_ELEMENTS`] elements
//! each. Built on the cross-entropy kernels and the GEMMs of every backend,
//! so it runs wherever they do.

use super::{
    cross_entropy_backward, cross_entropy_forward, CrossEntropyOptions, Reduction, SampleCount,
    SampleLosses,
};
use crate::autograd::{attach, is_grad_enabled, no_grad, BackwardOp, SavedTensor};
use crate::memory::{with_category, Category};
use crate::ops::autocast::{autocast_dtype, lower, lowers};
use crate::primitives::{add_assign, matmul, matmul_into};
use crate::{DType, Error, Result, Tensor};

/// The most logits one chunk holds: 4 Mi elements (16 MiB in f32), so a
/// GPT-2 head (50 257 classes) takes 83 rows at a time.
pub const CHUNK_ELEMENTS: usize = 1 << 22;

/// Rows per chunk for `classes` logits per row.
fn chunk_rows(classes: usize) -> usize {
    (CHUNK_ELEMENTS / classes.max(1)).max(1)
}

/// The logits `h·Wᵀ (+ b)` of rows `rows` of `hidden`, without a graph, as
/// Workspace; in f32 when they were computed in autocast's dtype `low`.
fn chunk_logits(
    hidden: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    low: Option<DType>,
) -> Result<Tensor> {
    let _ws = with_category(Category::Workspace);
    let logits = matmul(hidden, &weight.t()?)?;
    if let Some(b) = bias {
        add_assign(&logits, b)?;
    }
    match low {
        Some(_) => logits.to_dtype_owned(DType::F32),
        None => Ok(logits),
    }
}

/// The weight and bias the logits are computed with: the tensors given, or
/// under autocast (`low`) their copies in its dtype, as Workspace.
fn run_weights(
    weight: &Tensor,
    bias: Option<&Tensor>,
    low: Option<DType>,
) -> Result<(Tensor, Option<Tensor>)> {
    let _ws = with_category(Category::Workspace);
    match low {
        Some(low) => Ok((
            weight.to_dtype(low)?,
            bias.map(|b| b.to_dtype(low)).transpose()?,
        )),
        None => Ok((weight.clone(), bias.cloned())),
    }
}

/// Backward of [`Tensor::linear_cross_entropy`]: saves the hidden states,
/// the weight and the bias (parameters: no bytes) and the targets, plus
/// the options and the count of samples not ignored.
struct LinearCrossEntropyBackward {
    /// The hidden states the logits were computed from (in autocast's
    /// dtype under autocast).
    hidden: SavedTensor,
    /// The dtype of the hidden states given (their gradient's).
    hidden_dtype: DType,
    /// Autocast's dtype, when the logits were computed in it.
    low: Option<DType>,
    weight: SavedTensor,
    bias: Option<SavedTensor>,
    targets: SavedTensor,
    opts: CrossEntropyOptions,
    count: SampleCount,
    rows: usize,
    needs: [bool; 3],
}

impl BackwardOp for LinearCrossEntropyBackward {
    fn name(&self) -> &'static str {
        "linear_cross_entropy"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let (h, w, targets) = (self.hidden.get()?, self.weight.get()?, self.targets.get()?);
        let bias = self.bias.as_ref().map(SavedTensor::get).transpose()?;
        let (n, classes) = (h.shape()[0], w.shape()[0]);
        let [need_h, need_w, need_b] = self.needs;
        // The hidden states' gradient by chunks ([rows, D] each, the size of
        // h in all), joined at the end.
        let mut grad_h_chunks = Vec::new();
        let grad_w = need_w
            .then(|| Tensor::zeros(w.shape(), w.dtype(), w.device()))
            .transpose()?;
        let grad_b = need_b
            .then(|| Tensor::zeros(&[classes], w.dtype(), w.device()))
            .transpose()?;
        let rows = self.rows;
        let (w_run, b_run) = run_weights(w, bias, self.low)?;
        for start in (0..n).step_by(rows) {
            let r = rows.min(n - start);
            let (h_c, t_c) = (h.narrow(0, start, r)?, targets.narrow(0, start, r)?);
            let g_c = match self.opts.reduction {
                Reduction::None => g.narrow(0, start, r)?,
                _ => g.clone(),
            };
            let grad_logits = {
                let logits = chunk_logits(&h_c, &w_run, b_run.as_ref(), self.low)?;
                let _ws = with_category(Category::Workspace);
                let probs = cross_entropy_forward(&logits, 1, &t_c, &self.opts, true)?
                    .probs
                    .ok_or_else(|| {
                        Error::Backward("linear_cross_entropy: no probabilities".into())
                    })?;
                drop(logits);
                cross_entropy_backward(g_c, &probs, &t_c, 1, &self.opts, &self.count)?
            };
            // Under autocast the gradients' products run in f32 from the
            // f32 probabilities and the f32 weight (more precise than the
            // low dtype, and no copy of the weight kept for them).
            if need_h {
                let gh = matmul(&grad_logits, w)?;
                grad_h_chunks.push(gh.to_dtype_owned(self.hidden_dtype)?);
            }
            if let Some(gw) = &grad_w {
                let h_c = h_c.to_dtype(w.dtype())?;
                matmul_into(gw, &grad_logits.t()?, &h_c, true)?;
            }
            if let Some(gb) = &grad_b {
                add_assign(gb, &grad_logits.sum(&[0], false)?)?;
            }
        }
        drop((w_run, b_run));
        let grad_h = need_h
            .then(|| Tensor::cat(&grad_h_chunks.iter().collect::<Vec<_>>(), 0))
            .transpose()?;
        drop(grad_h_chunks);
        let mut grads = vec![grad_h, grad_w];
        if self.bias.is_some() {
            grads.push(grad_b);
        }
        Ok(grads)
    }
}

impl Tensor {
    /// `cross_entropy(self · weightᵀ + bias, targets)` without ever holding
    /// the logits: `self` is `[N, D]` (hidden states, e.g. every token of a
    /// batch), `weight` `[C, D]` (a Linear layer's or a tied embedding's),
    /// `bias` `[C]`, `targets` `[N]` (I64). Same value and gradients as the
    /// two ops (within floating-point reassociation), same options, but the
    /// logits exist only in chunks of [`CHUNK_ELEMENTS`] at a time, in
    /// forward and again in backward.
    ///
    /// Saves the hidden states, the weight and bias and the targets when any
    /// of `self`, `weight`, `bias` requires grad; no logits and no
    /// probabilities.
    pub fn linear_cross_entropy(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        targets: &Tensor,
        opts: CrossEntropyOptions,
    ) -> Result<Tensor> {
        let rows = chunk_rows(weight.shape().first().copied().unwrap_or(1));
        self.linear_cross_entropy_in_chunks(weight, bias, targets, opts, rows)
    }

    /// [`Tensor::linear_cross_entropy`] with `rows` rows of logits per chunk
    /// (at least 1) instead of as many as fit in [`CHUNK_ELEMENTS`].
    pub fn linear_cross_entropy_in_chunks(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        targets: &Tensor,
        opts: CrossEntropyOptions,
        rows: usize,
    ) -> Result<Tensor> {
        let op = "linear_cross_entropy";
        if rows == 0 {
            return Err(Error::InvalidArgument {
                op,
                msg: "chunks need at least 1 row".into(),
            });
        }
        let (&[n, d], &[classes, wd]) = (self.shape(), weight.shape()) else {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "expected hidden states [N, D] and a weight [C, D], got {:?} and {:?}",
                    self.shape(),
                    weight.shape()
                ),
            });
        };
        if d != wd || bias.is_some_and(|b| b.shape() != [classes]) || targets.shape() != [n] {
            return Err(Error::ShapeMismatch {
                op,
                lhs: vec![n, d, classes],
                rhs: [
                    weight.shape(),
                    bias.map_or(&[][..], Tensor::shape),
                    targets.shape(),
                ]
                .concat(),
            });
        }
        if targets.dtype() != DType::I64 {
            return Err(Error::DTypeMismatch {
                op,
                expected: DType::I64,
                got: targets.dtype(),
            });
        }
        if !(0.0..=1.0).contains(&opts.label_smoothing) {
            return Err(Error::InvalidArgument {
                op,
                msg: format!("label_smoothing {} is outside [0, 1]", opts.label_smoothing),
            });
        }
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        let needs: Vec<bool> = inputs
            .iter()
            .map(|t| is_grad_enabled() && t.requires_grad())
            .collect();
        let low =
            autocast_dtype().filter(|_| lowers(self) || lowers(weight) || bias.is_some_and(lowers));
        // Under autocast the logits come from the hidden states and weight
        // in its dtype (the hidden states are what backward keeps, the
        // weight's copy lives for this forward only) and the loss from
        // their f32 copy; the graph's edges stay the tensors given.
        let hidden = {
            let _g = no_grad();
            lower(self)?
        };
        let mut parts = Vec::new();
        {
            let _g = no_grad();
            let (w_run, b_run) = run_weights(weight, bias, low)?;
            for start in (0..n).step_by(rows) {
                let r = rows.min(n - start);
                let logits =
                    chunk_logits(&hidden.narrow(0, start, r)?, &w_run, b_run.as_ref(), low)?;
                let t_c = targets.narrow(0, start, r)?;
                let _ws = with_category(Category::Workspace);
                // Each chunk's losses and count stay where they were made
                // (on the device for CUDA: nothing waits for the host).
                parts.push(cross_entropy_forward(&logits, 1, &t_c, &opts, false)?.stats);
            }
        }
        let stats = SampleLosses::join(parts)?;
        let out = stats.reduce(opts.reduction, &[n], self)?;
        let count = stats.count();
        drop(stats);
        if !needs.iter().any(|&b| b) {
            return Ok(out);
        }
        let backward = LinearCrossEntropyBackward {
            hidden: SavedTensor::new(&hidden, op),
            hidden_dtype: self.dtype(),
            low,
            weight: SavedTensor::new(weight, op),
            bias: bias.map(|b| SavedTensor::new(b, op)),
            targets: SavedTensor::new(targets, op),
            opts,
            count,
            rows,
            needs: [needs[0], needs[1], needs.get(2).copied().unwrap_or(false)],
        };
        Ok(attach(out, &inputs, backward))
    }
}
