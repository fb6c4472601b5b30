//! Fused attention in the FlashAttention-2 manner: the scores of a block of
//! queries against a block of keys live only in a tile (registers, shared
//! memory, a thread's scratch), the softmax is computed online (a running
//! maximum `m`, sum `l` and output accumulator per query, rescaled as each
//! key block arrives), and neither the `L×L` scores nor their
//! probabilities ever exist whole, in forward or in backward.
//!
//! The formulas (both devices; the compute type `C` is f64 for f64 inputs
//! and f32 for f32, f16 and bf16 ones, as FlashAttention accumulates):
//!
//! - logits `x_ij = scale·(q_i·k_j) + mask_ij` (a float mask is added in
//!   `C`; a U8 mask removes, `−∞`, where it is 0), `−∞` for `j > i` when
//!   causal (top-left aligned, as [`ScoreGeom`]);
//! - forward: `O_i = Σ_j P'_ij v_j` with `P_ij = exp(x_ij − lse_i)`,
//!   `lse_i = m_i + ln l_i` rounded to the saved precision (f32, f64 for
//!   f64 inputs), `P' = dropout(P)` replayed from (seed, offset) at element
//!   `row·lk + j` (`row` the score row `(b·H + h)·lq + i`); a fully masked
//!   row has `lse = −∞`, `O = 0`;
//! - backward: `P` rebuilt from the saved `lse` tile by tile,
//!   `dP_ij = dropout(dO_i·v_j)`, `D_i = Σ_j P_ij dP_ij` (a first pass:
//!   the output is not saved, so `D` is not `dO_i·O_i`),
//!   `dS_ij = P_ij (dP_ij − D_i)`, `dQ_i = scale Σ_j dS_ij k_j`,
//!   `dK_j = scale Σ_i dS_ij q_i`, `dV_j = Σ_i P'_ij dO_i`.
//!
//! Grouped-query attention ([`FlashGeom::kv_heads`] below `heads`): query
//! head `h` reads key/value head `h / group` wherever the formulas read
//! `k_j` or `v_j`, and `dK_j`, `dV_j` of a key/value head sum over the
//! `group` query heads that read it, head after head in order, inside one
//! task (CPU) or one key block (CUDA); the mask, dropout and `lse` rows are
//! the query head's. K and V are never repeated.
//!
//! Every sum runs in an order fixed by the shapes alone (no atomics), so
//! results are bit-identical from run to run and thread count to thread
//! count. Saved for backward: what the unfused path's recompute branch
//! saves (`Q`, `K`, the mask, `lse`, and `V` where `q` or `k` needs grad).
//! FlashAttention-2 also keeps the output, to form `D = rowsum(dO ⊙ O)`;
//! leangrad forms `D` from the rebuilt `P` and `dP` instead and keeps `|O|`
//! fewer bytes per layer.
//!
//! The CPU (`cpu.rs`) takes a key block as wide as the keys a band of
//! 64 queries sees, so its softmax is exact at once and its products are
//! the unfused path's five (a band of scores per task, never all of them);
//! CUDA (`cuda.rs`, `flash.cu`) tiles both ways with the online
//! softmax and, to stay deterministic without atomics, runs backward as a
//! query-block kernel (`D`, then dQ) and a key-block kernel (dK, dV), which
//! rebuild `S` and `dP` three times: nine tile products where a
//! FlashAttention-2 backward with atomics has five.

mod cpu;
mod cpu_bwd;
mod cuda;
#[cfg(test)]
mod tests;

use super::{probabilities, Geometry, RowLse, ScoreGeom, OP};
use crate::autograd::{attach, BackwardOp, SavedTensor};
use crate::memory::{uncounted, with_category, Category};
use crate::meta::{backend, Backend};
use crate::nn::dropout::{dropout_mask, DropoutDraw};
use crate::{DType, Result, Tensor};

/// The geometry of a fused attention call, shared by the CPU kernel, the
/// CUDA launches and, as a `#[repr(C)]` struct passed by value, the
/// kernels (`struct FlashGeom` in `flash.cu`: `usize` as `long long`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlashGeom {
    /// Query and key lengths, scale and causal flag of the score rows.
    pub score: ScoreGeom,
    /// Batch entries (the first dim; `B·H` for rank-3 inputs).
    pub batch: usize,
    /// Heads per batch entry (1 for rank-3 inputs).
    pub heads: usize,
    /// The query/key feature size.
    pub d: usize,
    /// The value feature size (the output's last dim).
    pub dv: usize,
    /// Key/value heads per batch entry: `heads`, or under grouped-query
    /// attention a divisor of it, query head `h` reading key/value head
    /// `h / group()` (1 for rank-3 inputs).
    pub kv_heads: usize,
}

impl FlashGeom {
    /// Score rows: `batch·heads·lq`.
    pub fn rows(&self) -> usize {
        self.batch * self.heads * self.score.lq
    }

    /// Query heads per key/value head (`heads / kv_heads`; 1 when there are
    /// no key/value heads, hence no query heads either).
    pub fn group(&self) -> usize {
        self.heads.checked_div(self.kv_heads).unwrap_or(1).max(1)
    }
}

/// Where the elements of a rank-3 or rank-4 view lie, as
/// `[batch, heads, rows, cols]` strides (elements) and an offset into its
/// storage; a rank-3 view has one head (head stride 0). Broadcast dims of a
/// mask have stride 0. `#[repr(C)]` as `struct View4` in `flash.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct View4 {
    /// Offset of element `[0, 0, 0, 0]`.
    pub offset: i64,
    /// Stride of the batch dim.
    pub batch: i64,
    /// Stride of the head dim.
    pub head: i64,
    /// Stride of the row (sequence) dim.
    pub row: i64,
    /// Stride of the column (feature, or key for a mask) dim.
    pub col: i64,
}

impl View4 {
    /// The view of a rank-3 or rank-4 layout (`strides`, `offset`).
    pub fn of(strides: &[usize], offset: usize) -> View4 {
        let s = |i: usize| strides[i] as i64;
        match strides.len() {
            3 => View4 {
                offset: offset as i64,
                batch: s(0),
                head: 0,
                row: s(1),
                col: s(2),
            },
            _ => View4 {
                offset: offset as i64,
                batch: s(0),
                head: s(1),
                row: s(2),
                col: s(3),
            },
        }
    }

    /// The storage index of element `[b, h, r, c]`.
    #[inline(always)]
    pub fn at(&self, b: usize, h: usize, r: usize, c: usize) -> usize {
        (self.offset
            + b as i64 * self.batch
            + h as i64 * self.head
            + r as i64 * self.row
            + c as i64 * self.col) as usize
    }
}

/// The operands of one fused attention call.
pub(super) struct FlashInputs<'a> {
    /// Queries `[.., lq, d]`, any layout.
    pub q: &'a Tensor,
    /// Keys `[.., lk, d]`, any layout.
    pub k: &'a Tensor,
    /// Values `[.., lk, dv]`, any layout.
    pub v: &'a Tensor,
    /// The user's mask (float: added; U8: 0 removes), broadcastable to
    /// `scores`.
    pub mask: Option<&'a Tensor>,
    /// The geometry.
    pub geom: FlashGeom,
    /// The scores' broadcast shape `[.., lq, lk]` (the mask's target).
    pub scores: &'a [usize],
    /// Dropout on the probabilities, replayed from (seed, offset).
    pub draw: Option<DropoutDraw>,
    /// Whether `lse` is kept in f32 (else f64, for f64 inputs).
    pub lse_f32: bool,
}

// The dispatch seam: the CPU kernel also runs the meta device (shapes and
// ledger only).

/// Forward: the output `[.., lq, dv]` (a new dense tensor of q's dtype)
/// and each score row's log-sum-exp (uncounted until saved).
pub(super) fn forward(x: &FlashInputs) -> Result<(Tensor, RowLse)> {
    match backend(OP, &[x.q, x.k, x.v])? {
        Backend::Cpu | Backend::Meta => cpu::forward(x),
        Backend::Cuda(n) => cuda::forward(x, n),
    }
}

/// Backward: `[dQ, dK, dV]` where `needs` says (new dense tensors of the
/// inputs' shapes), from the output gradient `d_out` (any layout), the saved
/// `lse` (`[rows]`, f32 or f64 as `lse_f32`) and, where `q` or `k` needs
/// grad, the `[rows]` workspace `delta` (the lse's dtype) that receives `D`.
pub(super) fn backward(
    x: &FlashInputs,
    d_out: &Tensor,
    lse: &Tensor,
    delta: Option<&Tensor>,
    needs: [bool; 3],
) -> Result<[Option<Tensor>; 3]> {
    match backend(OP, &[x.q, x.k, x.v, d_out, lse])? {
        Backend::Cpu | Backend::Meta => cpu_bwd::backward(x, d_out, lse, delta, needs),
        Backend::Cuda(n) => cuda::backward(x, d_out, lse, delta, needs, n),
    }
}

/// Backward of fused attention: holds `Q`, `K`, the mask, `lse` and, where
/// q or k needs grad, `V` (the unfused path's recompute branch, without
/// the `L×L` workspace).
struct FlashBackward {
    geometry: Geometry,
    geom: FlashGeom,
    needs: [bool; 3],
    q: SavedTensor,
    k: SavedTensor,
    v: Option<SavedTensor>,
    mask: Option<SavedTensor>,
    lse: SavedTensor,
    /// SaveAll only: the probabilities and the dropout mask, held (never
    /// read) so that the policy keeps what PyTorch's math path keeps while
    /// the gradients come from the same fused arithmetic as the lean ones.
    held: Vec<SavedTensor>,
}

impl BackwardOp for FlashBackward {
    fn name(&self) -> &'static str {
        OP
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        // Released with the rest when backward is done.
        let _held = self.held;
        let (q, k) = (self.q.get()?, self.k.get()?);
        // dV alone reads no value: an uncounted one-element stand-in keeps
        // the operands' shapes without keeping V.
        let stand_in;
        let v = match &self.v {
            Some(v) => v.get()?,
            None => {
                let mut shape = k.shape().to_vec();
                if let Some(last) = shape.last_mut() {
                    *last = self.geom.dv;
                }
                stand_in = uncounted(|| Tensor::zeros(&[1], q.dtype(), q.device()))?
                    .broadcast_to(&shape)?;
                &stand_in
            }
        };
        let x = FlashInputs {
            q,
            k,
            v,
            mask: self.mask.as_ref().map(|m| m.get()).transpose()?,
            geom: self.geom,
            scores: &self.geometry.scores,
            draw: self.geometry.draw,
            lse_f32: self.geometry.lse_f32,
        };
        let [nq, nk, _] = self.needs;
        let lse = self.lse.get()?;
        // Backward writes every row of `D` before reading it.
        let delta = if nq || nk {
            let _ws = with_category(Category::Workspace);
            Some(Tensor::for_overwrite(
                &[self.geom.rows()],
                lse.dtype(),
                q.device(),
            )?)
        } else {
            None
        };
        Ok(backward(&x, &g, lse, delta.as_ref(), self.needs)?.into())
    }
}

/// Fused attention (wherever the lean policy keeps no probabilities): the
/// output, and a node saving `Q`, `K`, the mask, `lse` and (for q or k)
/// `V` when any input needs grad. `save_all` (the SaveAll policy)
/// also keeps `V`, the probabilities and a U8 dropout mask, as PyTorch's
/// math path does.
pub(super) fn attention(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    mask: Option<&Tensor>,
    geometry: &Geometry,
    (needs, save_all): ([bool; 3], bool),
) -> Result<Tensor> {
    let r = q.rank();
    let geom = FlashGeom {
        score: geometry.geom,
        batch: q.shape()[0],
        heads: if r == 4 { q.shape()[1] } else { 1 },
        d: q.shape()[r - 1],
        dv: v.shape()[r - 1],
        kv_heads: if r == 4 { k.shape()[1] } else { 1 },
    };
    let x = FlashInputs {
        q,
        k,
        v,
        mask,
        geom,
        scores: &geometry.scores,
        draw: geometry.draw,
        lse_f32: geometry.lse_f32,
    };
    let (out, lse) = forward(&x)?;
    let [nq, nk, nv] = needs;
    if !(nq || nk || nv) {
        return Ok(out);
    }
    let dt = if geometry.lse_f32 {
        DType::F32
    } else {
        DType::F64
    };
    let save = |t: &Tensor| SavedTensor::new(t, OP);
    let lse = lse.into_tensor(dt, q.device())?;
    let held = if save_all {
        held_by_math_path((q, k, mask), geometry, &lse)?
    } else {
        Vec::new()
    };
    let op = FlashBackward {
        geometry: geometry.clone(),
        geom,
        needs,
        q: save(q),
        k: save(k),
        v: (save_all || nq || nk).then(|| save(v)),
        mask: mask.map(save),
        lse: save(&lse),
        held,
    };
    Ok(attach(out, &[q, k, v], op))
}

/// What PyTorch's math path keeps beyond q, k, v: the probabilities
/// (rebuilt from `lse`; the scores a Workspace temporary) and, with
/// dropout, the U8 keep mask.
fn held_by_math_path(
    (q, k, mask): (&Tensor, &Tensor, Option<&Tensor>),
    geometry: &Geometry,
    lse: &Tensor,
) -> Result<Vec<SavedTensor>> {
    let (p, _) = probabilities(q, k, mask, geometry, Some(lse))?;
    let mut held = vec![SavedTensor::new(&p, OP)];
    if let Some(draw) = geometry.draw {
        let m = dropout_mask(&geometry.scores, draw, q.device())?;
        held.push(SavedTensor::new(&m, OP));
    }
    Ok(held)
}
