//! Embedding lookup: rows of a `[num_embeddings, embedding_dim]` weight
//! gathered by an integer index tensor of any shape. The CPU reads and
//! checks the indices on the host; CUDA reads them on the device (an index
//! out of range is reported by the next read from the device, so a step
//! never waits for the host here). The weight gradient is a scatter-add in
//! index order, deterministic and bit-identical on the CPU and on CUDA
//! (`embedding.cu` sorts the positions by row instead of using float
//! atomics).
//!
//! Saved for backward, for `k` index elements of `bi` bytes (8 for I64, 4
//! for U32):
//!
//! | op | requires grad | saved for backward | why |
//! |---|---|---|---|
//! | `embedding` (both policies) | weight | the index tensor: `k·bi` bytes | names the rows the gradient goes to |
//! | `embedding` | nothing (frozen) | — (no node) | |
//!
//! The index never needs grad; the weight itself is never saved (its
//! gradient does not read it); the `padding_idx` row gets no gradient.

mod cpu;
mod cuda;
#[cfg(test)]
mod tests;

use super::init::Init;
use super::Module;
use crate::autograd::{attach, needs_grad, BackwardOp, SavedTensor};
use crate::memory::scope;
use crate::meta::{backend, Backend};
use crate::ops::expect_float;
use crate::primitives::read_indices;
use crate::{DType, Device, Error, Result, Tensor};

// The dispatch seam: one small function per kernel, the only place here
// (besides cuda.rs) that names CUDA.

/// Rows `indices[k]` of the `[num, dim]` weight (any layout), stacked
/// into a contiguous `[k, dim]` tensor of shape `shape`. The CPU reads and
/// checks the indices first; CUDA reads them in its kernel and reports one
/// out of range with its next read from the device.
fn embedding_gather(weight: &Tensor, indices: &Tensor, shape: &[usize]) -> Result<Tensor> {
    match backend("embedding", &[weight])? {
        Backend::Cpu | Backend::Meta => {
            let idx = read_indices("embedding", indices, weight.shape()[0])?;
            cpu::gather(weight, &idx, shape)
        }
        Backend::Cuda(_) => cuda::gather(weight, indices, shape),
    }
}

/// Where the weight gradient's rows come from, read from the saved
/// indices before they are dropped (so that they are gone before the
/// gradient is allocated, on every device alike): the indices on the host
/// (CPU, meta), or the positions sorted by row on the device (CUDA).
enum GradRows {
    Host(Vec<usize>),
    Device(cuda::SortedRows),
}

/// [`GradRows`] of `indices` for a gradient on `g`'s device.
fn grad_rows(g: &Tensor, indices: &Tensor, num: usize, padding: Option<usize>) -> Result<GradRows> {
    match backend("embedding", &[g])? {
        Backend::Cpu | Backend::Meta => {
            Ok(GradRows::Host(read_indices("embedding", indices, num)?))
        }
        Backend::Cuda(_) => Ok(GradRows::Device(cuda::sorted_rows(
            indices,
            g.device(),
            num,
            padding,
        )?)),
    }
}

/// The `[num, dim]` weight gradient added into `into` (the gradient
/// already pending for the weight, written in place) or into a new zero
/// buffer: row `k` of `g` goes to row `indices[k]`, except where that is
/// `padding`; each row's contributions are summed in `k` order and the sum
/// added to the row, the same values as a separate gradient added after.
fn embedding_backward(
    g: &Tensor,
    rows: &GradRows,
    (num, dim): (usize, usize),
    padding: Option<usize>,
    into: Option<Tensor>,
) -> Result<Tensor> {
    let gw = match into {
        Some(t) => t,
        None => Tensor::zeros(&[num, dim], g.dtype(), g.device())?,
    };
    match rows {
        GradRows::Host(idx) => cpu::add_rows(&gw, g, idx, padding)?,
        GradRows::Device(keys) => cuda::add_rows(&gw, g, keys)?,
    }
    Ok(gw)
}

/// Backward of embedding: saves the index tensor only (the weight's shape
/// and the padding row are plain numbers).
struct EmbeddingBackward {
    indices: SavedTensor,
    num: usize,
    dim: usize,
    padding: Option<usize>,
}

impl EmbeddingBackward {
    /// The weight gradient, added into `into` when given.
    fn weight_grad(self, g: Tensor, into: Option<Tensor>) -> Result<Vec<Option<Tensor>>> {
        // The rows are read first and the indices dropped before the
        // gradient is allocated (the same ledger events on every device).
        let rows = grad_rows(&g, self.indices.get()?, self.num, self.padding)?;
        drop(self.indices);
        let dw = embedding_backward(&g, &rows, (self.num, self.dim), self.padding, into)?;
        Ok(vec![Some(dw)])
    }
}

impl BackwardOp for EmbeddingBackward {
    fn name(&self) -> &'static str {
        "embedding"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        self.weight_grad(g, None)
    }
    /// A tied weight (GPT-2's `wte`, whose `lm_head` gradient arrives
    /// first) gets the rows added into that gradient: no second
    /// `[num, dim]` buffer.
    fn adds_into_pending(&self, input: usize) -> bool {
        input == 0
    }
    fn backward_into(
        self: Box<Self>,
        g: Tensor,
        mut pending: Vec<Option<Tensor>>,
    ) -> Result<Vec<Option<Tensor>>> {
        let into = pending.first_mut().and_then(Option::take);
        self.weight_grad(g, into)
    }
}

/// Resolves PyTorch's (possibly negative) `padding_idx` against `num` rows.
fn resolve_padding(padding_idx: Option<i64>, num: usize) -> Result<Option<usize>> {
    padding_idx
        .map(|p| {
            let r = if p < 0 { p + num as i64 } else { p };
            usize::try_from(r)
                .ok()
                .filter(|&r| r < num)
                .ok_or(Error::IndexOutOfRange {
                    op: "embedding (padding_idx)",
                    index: p,
                    size: num,
                })
        })
        .transpose()
}

/// `weight[indices]`: for an I64 or U32 index tensor of any shape, the
/// result has shape `indices.shape + [embedding_dim]`. An index outside
/// `0..num_embeddings` is `Error::IndexOutOfRange`: from this call on the
/// CPU, from the next read of a value from the device on CUDA (the
/// kernel checks; nothing waits for the host). The gradient of the
/// weight is accumulated sequentially (deterministic); the `padding_idx`
/// row (negative counts from the end) gets none. Saves the index tensor,
/// and only when the weight needs grad (the same under `SaveAll`).
pub fn embedding(weight: &Tensor, indices: &Tensor, padding_idx: Option<i64>) -> Result<Tensor> {
    const OP: &str = "embedding";
    expect_float(OP, weight)?;
    if weight.rank() != 2 {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: format!("weight must be [num, dim], got {:?}", weight.shape()),
        });
    }
    let (num, dim) = (weight.shape()[0], weight.shape()[1]);
    let padding = resolve_padding(padding_idx, num)?;
    let mut shape = indices.shape().to_vec();
    shape.push(dim);
    let out = embedding_gather(weight, indices, &shape)?;
    let [needs] = needs_grad([weight]);
    if !needs {
        return Ok(out);
    }
    let op = EmbeddingBackward {
        indices: SavedTensor::new(indices, OP),
        num,
        dim,
        padding,
    };
    Ok(attach(out, &[weight], op))
}

/// RoBERTa's position ids (Hugging Face's
/// `create_position_ids_from_input_ids`): for token ids `[B, L]` (I64 or
/// U32), the I64 tensor `[B, L]` whose entry is `padding_idx` where the
/// token is `padding_idx`, and `padding_idx + n` at the `n`-th token of
/// its row that is not (counting from 1), so that padding on either side
/// leaves the real tokens' positions unchanged. Computed where the ids
/// are (a kernel on CUDA: nothing waits for the host). No gradient.
pub fn position_ids_from_input_ids(ids: &Tensor, padding_idx: i64) -> Result<Tensor> {
    const OP: &str = "position_ids_from_input_ids";
    if !matches!(ids.dtype(), DType::I64 | DType::U32) {
        return Err(Error::DTypeMismatch {
            op: OP,
            expected: DType::I64,
            got: ids.dtype(),
        });
    }
    let &[rows, len] = ids.shape() else {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: format!("token ids must be [batch, length], got {:?}", ids.shape()),
        });
    };
    let last = i64::try_from(len)
        .ok()
        .and_then(|l| padding_idx.checked_add(l))
        .filter(|_| padding_idx >= 0);
    if last.is_none() {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: format!("padding_idx {padding_idx} with {len} tokens per row"),
        });
    }
    match backend(OP, &[ids])? {
        Backend::Meta => crate::meta::empty(&[rows, len], DType::I64),
        Backend::Cpu => cpu::position_ids(ids, rows, len, padding_idx),
        Backend::Cuda(_) => cuda::position_ids(ids, rows, len, padding_idx),
    }
}

/// `torch.nn.Embedding`: a `weight` of `[num_embeddings, embedding_dim]`
/// initialised N(0, 1) (the `padding_idx` row zeroed); `forward` takes the
/// index tensor. Saves the indices only when the weight needs grad (a
/// frozen embedding saves nothing).
#[derive(Clone)]
pub struct Embedding {
    /// `[num_embeddings, embedding_dim]`.
    pub weight: Tensor,
    padding_idx: Option<i64>,
    name: String,
}

/// Builds an [`Embedding`]: [`Embedding::builder`], then the settings that
/// differ from the defaults, then [`build`](EmbeddingBuilder::build).
#[derive(Clone, Debug)]
pub struct EmbeddingBuilder {
    num_embeddings: usize,
    embedding_dim: usize,
    padding_idx: Option<i64>,
    dtype: DType,
    seed: u64,
    name: String,
    weight_init: Option<Init>,
}

impl EmbeddingBuilder {
    /// The layer's name in scopes and reports (default: `embedding`).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// A row kept at zero that gets no gradient (negative counts from the
    /// end; default: none).
    pub fn padding_idx(mut self, padding_idx: Option<i64>) -> Self {
        self.padding_idx = padding_idx;
        self
    }

    /// The weight's dtype (default: f32).
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    /// The seed of the Philox normal stream the weight is drawn from
    /// (default: 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// How the weight is drawn (default: PyTorch's, N(0, 1)), e.g.
    /// `Init::normal(0.02)` as Hugging Face's models; the padding row is
    /// zeroed whatever the init.
    pub fn weight_init(mut self, init: Init) -> Self {
        self.weight_init = Some(init);
        self
    }

    /// The table on `device`, drawn from the seeded stream as the init
    /// says (by default N(0, 1)) with the padding row zeroed (on the meta
    /// device: a data-less weight, nothing drawn); an error if
    /// `padding_idx` is outside the table.
    pub fn build(&self, device: &Device) -> Result<Embedding> {
        let (num, dim) = (self.num_embeddings, self.embedding_dim);
        let padding = resolve_padding(self.padding_idx, num)?;
        let init = self.weight_init.unwrap_or(Init::normal(1.0));
        let ctx = (self.dtype, *device);
        let weight = init
            .tensor_for("Embedding", &[num, dim], padding, ctx, self.seed)?
            .into_parameter()?;
        Ok(Embedding {
            weight,
            padding_idx: self.padding_idx,
            name: self.name.clone(),
        })
    }
}

impl Embedding {
    /// A builder of a table of `num_embeddings` rows of `embedding_dim`,
    /// with no padding row, f32, seed 0, named `embedding`.
    pub fn builder(num_embeddings: usize, embedding_dim: usize) -> EmbeddingBuilder {
        EmbeddingBuilder {
            num_embeddings,
            embedding_dim,
            padding_idx: None,
            dtype: DType::F32,
            seed: 0,
            name: "embedding".into(),
            weight_init: None,
        }
    }

    /// The padding row, as given.
    pub fn padding_idx(&self) -> Option<i64> {
        self.padding_idx
    }
}

impl Module for Embedding {
    /// Looks up the rows named by `indices` (I64 or U32, any shape).
    fn forward(&self, indices: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        embedding(&self.weight, indices, self.padding_idx)
    }

    fn parameter_kinds(&self) -> Vec<(String, crate::nn::LayerKind)> {
        crate::nn::parameters_of_kind(self, crate::nn::LayerKind::Embedding)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
}
