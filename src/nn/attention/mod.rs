//! Scaled-dot-product attention as one fused op: `S = scale·Q·Kᵀ (+ mask)`,
//! `P = exp(S − lse)` with the per-row log-sum-exp `lse`, `P' = dropout(P)`
//! (mask replayed from (seed, offset), never stored), `O = P'·V`; backward
//! `dV = P'ᵀ·dO`, `dS = scale·P ⊙ (dP − Σ_j dP ⊙ P)` with `dP = dropout(dO·Vᵀ)`,
//! `dQ = dS·K`, `dK = dSᵀ·Q`.
//!
//! Two ways to compute it, chosen by the shapes alone (so both save
//! policies give the same bits):
//!
//! - **fused** (`flash/`: `mod.rs`, `cpu.rs`, `cpu_bwd.rs`, `cuda.rs`,
//!   `flash.cu`), FlashAttention-2's blocks with an online
//!   softmax: neither `S` nor `P` ever exists whole, in forward or backward.
//!   Used wherever the lean policy keeps no `P` (below), whenever no
//!   input needs grad, and always under grouped-query attention with fewer
//!   key/value heads than query heads (below);
//! - **unfused**, where keeping `P` is fewer bytes than keeping `Q` and `K`
//!   (short keys, wide heads): `S` by the shared matmul, the fused masked
//!   softmax (`cpu.rs` with `cpu_f32.rs`, `cuda.rs`, `attention.cu`), `P`
//!   saved, backward by matmuls and the softmax backward.
//!
//! **Grouped-query attention** ([`SdpaOptions::enable_gqa`], PyTorch's
//! `enable_gqa`): `k`, `v` `[B, Hkv, Lk, ·]` with `H = group·Hkv` query
//! heads; query head `h` reads key/value head `h / group` in place (the
//! fused kernels' [`FlashGeom::kv_heads`]), so the repeated K and V that
//! PyTorch's math path and Hugging Face's `repeat_kv` form never exist, not
//! even as a workspace. Backward runs one task (CPU) or one key block (CUDA)
//! per key/value head, which walks its group's query heads in order, so
//! dK and dV sum the group in one fixed order on any thread count, without
//! atomics. Grouped heads always take the fused path: the unfused path's
//! products and its choice of `P` against `Q` and `K` pair one key head
//! with each query head, and to run it the keys would have to be repeated
//! (or every product broadcast over the group) while its `P` is `group`
//! times the scores of one key head; the fused path keeps `K` and `V` at
//! their own size. With `Hkv = H` the flag changes nothing.
//!
//! `MultiheadAttention` (`multihead.rs`) is composed of matmuls, views and
//! this op.
//!
//! Saved for backward (sizes: `|Q|`, `|K|`, `|V|`, `|P|` the bytes of the
//! q, k, v storages and of the `[.., Lq, Lk]` probabilities, `|M|` of the
//! user's mask storage, `|lse|` = 4 (8 for f64 inputs) bytes per score row;
//! views of one storage count once; under GQA `|K|`, `|V|` are the
//! un-repeated `[B, Hkv, Lk, ·]` storages):
//!
//! | op | requires grad | saved for backward | why |
//! |---|---|---|---|
//! | sdpa (lean) | v only | `P`, or `Q`, `K`, mask, `lse`: `min(|Q|+|K|+|M|+|lse|, |P|)` | `dV = P'ᵀ·dO` |
//! | sdpa (lean) | q (± v) | `V`, `K`, then `P` or `Q`, mask, `lse`: `|V|+|K|+min(|Q|+|M|+|lse|, |P|)` | `dQ = dS·K`; `dS` reads `P` and `dO·Vᵀ` |
//! | sdpa (lean) | k (± v) | `V`, `Q`, then `P` or `K`, mask, `lse`: `|V|+|Q|+min(|K|+|M|+|lse|, |P|)` | `dK = dSᵀ·Q` |
//! | sdpa (lean) | q, k (± v) | `V`, `Q`, `K`, then `P` or mask, `lse`: `|V|+|Q|+|K|+min(|M|+|lse|, |P|)` | both |
//! | sdpa (`SaveAll`) | any | `q`, `k`, `v`, `P`, for `p > 0` the U8 dropout mask, and where fused also the mask and `lse` | what PyTorch's math path keeps, and what the fused backward reads |
//! | sdpa (lean), GQA (`Hkv < H`) | v only | `Q`, `K`, mask, `lse`: `|Q|+|K|+|M|+|lse|` | always fused: `dV = P'ᵀ·dO` with `P` rebuilt |
//! | sdpa (lean), GQA (`Hkv < H`) | q or k (± v) | `Q`, `K`, `V`, mask, `lse`: `|Q|+|K|+|V|+|M|+|lse|` | always fused: `dQ`, `dK` from `dS`, `dK`, `dV` summed over the group |
//! | sdpa (`SaveAll`), GQA (`Hkv < H`) | any | `q`, `k`, `v` (un-repeated), `P`, for `p > 0` the U8 dropout mask, the mask and `lse` | PyTorch's math path keeps K and V repeated (`group`× their bytes); leangrad never forms them |
//! | any | nothing | — (no node) | |
//!
//! Where `Q`, `K`, mask and `lse` are kept (the fused path), backward
//! rebuilds `P` block by block from them. Dropout masks are never kept by
//! the lean policy (replayed from (seed, offset)). Gradients are
//! bit-identical under both policies.

mod cpu;
mod cpu_exp;
mod cpu_f32;
mod cuda;
mod flash;
mod multihead;
#[cfg(test)]
mod tests;

pub use flash::{FlashGeom, View4};
pub use multihead::{MhaOptions, MultiheadAttention, MultiheadAttentionBuilder};

use super::dropout::{dropout_apply, dropout_apply_mask, dropout_mask, DropoutDraw};
use crate::autograd::{attach, needs_grad, save_policy, BackwardOp, SavePolicy, SavedTensor};
use crate::memory::{with_category, Category};
use crate::meta::{backend, Backend};
use crate::ops::autocast::{lower, lowers};
use crate::ops::expect_float;
use crate::primitives::matmul;
use crate::{DType, Device, Error, Result, Tensor};

const OP: &str = "scaled_dot_product_attention";

/// Options of [`scaled_dot_product_attention`] (PyTorch's `attn_mask`,
/// `dropout_p`, `is_causal`, `scale`), with the dropout draw made explicit.
#[derive(Clone, Default)]
pub struct SdpaOptions {
    /// Top-left aligned causal mask: query `i` attends to keys `j ≤ i`.
    pub causal: bool,
    /// A float mask added to the scores, or a U8 (boolean) mask where 0
    /// means "may not attend"; broadcastable to `[.., Lq, Lk]`.
    pub mask: Option<Tensor>,
    /// Dropout probability on the attention probabilities, in `[0, 1]`.
    pub dropout_p: f64,
    /// Philox seed of the dropout draw (element `i` of `[.., Lq, Lk]` kept
    /// iff `rng::dropout_keep(seed, offset, i, p)`).
    pub seed: u64,
    /// Philox offset of the dropout draw.
    pub offset: u64,
    /// Score scale; `None` means `1/√D`.
    pub scale: Option<f64>,
    /// Grouped-query attention (PyTorch's `enable_gqa`): rank-4 `k` and `v`
    /// may have `Hkv` heads where `q` has `H`, `H` a multiple of `Hkv`, and
    /// query head `h` attends with key/value head `h / (H / Hkv)` (as
    /// `repeat_interleave`, Hugging Face's `repeat_kv`). K and V are read and
    /// saved as they are, never repeated; their gradients sum the group's
    /// query heads. Off: the heads must match.
    pub enable_gqa: bool,
}

impl SdpaOptions {
    /// Sets the causal flag.
    pub fn causal(mut self, causal: bool) -> SdpaOptions {
        self.causal = causal;
        self
    }
    /// Sets the additive (float) or boolean (U8) mask.
    pub fn mask(mut self, mask: Tensor) -> SdpaOptions {
        self.mask = Some(mask);
        self
    }
    /// Sets dropout `p` drawn at (seed, offset).
    pub fn dropout(mut self, p: f64, seed: u64, offset: u64) -> SdpaOptions {
        (self.dropout_p, self.seed, self.offset) = (p, seed, offset);
        self
    }
    /// Sets the score scale.
    pub fn scale(mut self, scale: f64) -> SdpaOptions {
        self.scale = Some(scale);
        self
    }
    /// Turns grouped-query attention on or off (see
    /// [`SdpaOptions::enable_gqa`]).
    pub fn gqa(mut self, on: bool) -> SdpaOptions {
        self.enable_gqa = on;
        self
    }
}

/// The geometry of attention's score rows, the family's one geometry type:
/// each row `r` of `lk` scores belongs to query `r mod lq`, and its logits
/// are `x = scale·S + mask`, with `−∞` above the diagonal when `causal`
/// (top-left aligned: query `i` sees keys `j ≤ i`).
///
/// Shared by the CPU kernels, the CUDA launches and, as a `#[repr(C)]`
/// struct passed by value, the kernels (`struct ScoreGeom` in
/// `attention.cu`: `usize` as `long long`, `bool` as `bool`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoreGeom {
    /// Queries per (batch, head): score row `r` is query `r mod lq`.
    pub lq: usize,
    /// Keys: the length of a score row.
    pub lk: usize,
    /// The factor on `Q·Kᵀ`.
    pub scale: f64,
    /// Whether keys after the query are removed.
    pub causal: bool,
}

/// How the logits of the scores are formed: the geometry, the mask and the
/// scores' broadcast shape.
struct ScoreSpec<'a> {
    geom: ScoreGeom,
    /// The score mask, if any: a float mask is added, a U8 mask removes
    /// (`−∞`) where it is 0; broadcastable to `scores`.
    mask: Option<&'a Tensor>,
    /// The scores' (broadcast) shape `[.., lq, lk]`.
    scores: &'a [usize],
    /// Whether the saved log-sum-exp is kept in f32 (else f64).
    lse_f32: bool,
}

/// The per-row log-sum-exp of the attention probabilities: host values on
/// the CPU (a tensor only once saved), device data on CUDA.
enum RowLse {
    /// Host values (CPU).
    Host(Vec<f64>),
    /// The row count only (meta: no values, and no host buffer that grows
    /// with the batch).
    Meta(usize),
    /// On the device.
    Cuda(cuda::DeviceLse),
}

impl RowLse {
    /// As a `[rows]` tensor of `dtype` on `device` (host values converted
    /// and counted now; a device lse as it is, counted from now on).
    fn into_tensor(self, dtype: DType, device: Device) -> Result<Tensor> {
        match self {
            RowLse::Host(v) => Tensor::from_host_f64(&v, &[v.len()], dtype, device),
            RowLse::Meta(rows) => Tensor::from_host_f64(&[], &[rows], dtype, Device::Meta),
            RowLse::Cuda(l) => l.into_tensor(dtype),
        }
    }
}

// The dispatch seam: one small function per kernel, the only place here
// (besides cuda.rs) that names CUDA. The CPU functions handle the meta
// device themselves (shapes only), so meta ledgers equal CPU ledgers.

/// The probabilities `P = exp(x − lse)` for scores `s` `[.., lq, lk]` and
/// the per-row `lse`; with `lse_in` (a saved `lse` tensor), forward's `P`
/// recomputed bit for bit.
fn attention_probs(
    s: &Tensor,
    spec: &ScoreSpec,
    lse_in: Option<&Tensor>,
) -> Result<(Tensor, RowLse)> {
    match backend(OP, &[s])? {
        Backend::Cpu | Backend::Meta => cpu::attention_probs(s, spec, lse_in),
        Backend::Cuda(n) => cuda::probs_tensor(s, spec, lse_in, n),
    }
}

/// The gradient of the scaled scores `Q·Kᵀ`: `scale · P ⊙ (dP − Σ_j dP ⊙ P)`
/// per row (`p`, `dp` of one shape and dtype, any layouts).
fn attention_softmax_grad(p: &Tensor, dp: &Tensor, geom: ScoreGeom) -> Result<Tensor> {
    if p.shape() != dp.shape() || p.dtype() != dp.dtype() {
        return Err(Error::Backward(format!(
            "{OP}: probability gradient does not match"
        )));
    }
    match backend(OP, &[p, dp])? {
        Backend::Cpu | Backend::Meta => cpu::attention_softmax_grad(p, dp, geom),
        Backend::Cuda(_) => cuda::softmax_grad_tensor(p, dp, geom),
    }
}

/// What rebuilding the scores needs besides `Q`, `K`.
#[derive(Clone)]
struct Geometry {
    geom: ScoreGeom,
    /// The broadcast shape `[.., Lq, Lk]` of the scores.
    scores: Vec<usize>,
    draw: Option<DropoutDraw>,
    lse_f32: bool,
}

fn invalid(msg: String) -> Error {
    Error::InvalidArgument { op: OP, msg }
}

/// `P` (and the rounded `lse`) from `Q`, `K` and the mask; with `lse` given,
/// the recomputation of forward's `P`, bit for bit.
fn probabilities(
    q: &Tensor,
    k: &Tensor,
    mask: Option<&Tensor>,
    g: &Geometry,
    lse: Option<&Tensor>,
) -> Result<(Tensor, RowLse)> {
    let s = {
        let _ws = with_category(Category::Workspace);
        if grouped(q, k) {
            grouped_scores(q, k)?
        } else {
            matmul(q, &k.detach().transpose(-2, -1)?)?
        }
    };
    let spec = ScoreSpec {
        geom: g.geom,
        mask,
        scores: &g.scores,
        lse_f32: g.lse_f32,
    };
    attention_probs(&s, &spec, lse)
}

/// Whether `q` has more heads than `k` (grouped-query attention, checked).
fn grouped(q: &Tensor, k: &Tensor) -> bool {
    q.rank() == 4 && k.rank() == 4 && q.shape()[1] != k.shape()[1]
}

/// `Q·Kᵀ` `[B, H, Lq, Lk]` under GQA: q seen as `[B, Hkv, group, Lq, D]`
/// (a view: the head dim split in two) against k as `[B, Hkv, 1, D, Lk]`,
/// broadcast over the group by stride 0, so the repeated keys never exist.
fn grouped_scores(q: &Tensor, k: &Tensor) -> Result<Tensor> {
    let (qs, l) = (q.shape(), q.layout());
    let (b, h, lq, d) = (qs[0], qs[1], qs[2], qs[3]);
    let hkv = k.shape()[1];
    let st = l.strides();
    let split = crate::tensor::Layout::from_parts(
        vec![b, hkv, h / hkv, lq, d],
        vec![st[0], st[1] * (h / hkv), st[1], st[2], st[3]],
        l.offset(),
    );
    let q5 = q.detach().view_with_layout(split);
    let kt = k.detach().transpose(-2, -1)?.unsqueeze(2)?;
    let lk = k.shape()[2];
    matmul(&q5, &kt)?.reshape(&[b, h, lq, lk])
}

/// Applies the dropout draw (replayed, or from a saved U8 mask).
fn drop(p: &Tensor, g: &Geometry, mask: Option<&SavedTensor>) -> Result<Tensor> {
    let Some(draw) = g.draw else {
        return Ok(p.clone());
    };
    match mask {
        None => dropout_apply(p, draw),
        Some(m) => dropout_apply_mask(p, m.get()?, draw.scale()),
    }
}

/// Backward of attention where the probabilities are kept (the lean
/// policy's choice where they are fewer bytes than `Q` and `K`). Holds
/// only the tensors chosen at forward time.
struct SdpaBackward {
    geometry: Geometry,
    needs: [bool; 3],
    q: Option<SavedTensor>,
    k: Option<SavedTensor>,
    v: Option<SavedTensor>,
    /// The probabilities (before dropout).
    probs: SavedTensor,
    /// SaveAll only: the dropout mask as U8.
    drop_mask: Option<SavedTensor>,
}

fn need(t: &Option<SavedTensor>) -> Result<&Tensor> {
    t.as_ref()
        .ok_or_else(|| Error::Backward(format!("{OP}: a needed tensor was not saved")))?
        .get()
}

impl BackwardOp for SdpaBackward {
    fn name(&self) -> &'static str {
        OP
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let geo = &self.geometry;
        let p = self.probs.get()?.clone();
        let [nq, nk, nv] = self.needs;
        let dv = if nv {
            let pd = {
                let _ws = with_category(Category::Workspace);
                drop(&p, geo, self.drop_mask.as_ref())?
            };
            Some(matmul(&pd.transpose(-2, -1)?, &g)?)
        } else {
            None
        };
        let (mut dq, mut dk) = (None, None);
        if nq || nk {
            let ds = {
                let _ws = with_category(Category::Workspace);
                let dpd = matmul(&g, &need(&self.v)?.detach().transpose(-2, -1)?)?;
                let dp = drop(&dpd, geo, self.drop_mask.as_ref())?;
                attention_softmax_grad(&p, &dp, geo.geom)?
            };
            if nq {
                dq = Some(matmul(&ds, need(&self.k)?)?);
            }
            if nk {
                dk = Some(matmul(&ds.transpose(-2, -1)?, need(&self.q)?)?);
            }
        }
        Ok(vec![dq, dk, dv])
    }
}

/// Bytes of the distinct storages of `ts` (a storage shared by several
/// saved tensors is counted once, as the ledger does).
fn distinct_bytes(ts: &[&Tensor]) -> usize {
    let mut seen: Vec<&Tensor> = Vec::new();
    for t in ts {
        if !seen.iter().any(|s| s.shares_storage_with(t)) {
            seen.push(t);
        }
    }
    seen.iter().map(|t| t.storage_bytes()).sum()
}

/// Whether the lean policy recomputes the probabilities (keeping `Q`, `K`,
/// the mask and `lse`) rather than saving them: iff that keeps no more
/// bytes, with `V`, `Q` and `K` counted once where the gradients keep them
/// anyway.
fn recomputes(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    geometry: &Geometry,
    [nq, nk, _]: [bool; 3],
) -> bool {
    let mut base: Vec<&Tensor> = Vec::new();
    if nq || nk {
        base.push(v);
    }
    if nk {
        base.push(q);
    }
    if nq {
        base.push(k);
    }
    let scores: usize = geometry.scores.iter().product();
    let rows = scores.checked_div(geometry.geom.lk).unwrap_or(0);
    let lse_bytes = rows * if geometry.lse_f32 { 4 } else { 8 };
    let mut with_qk = base.clone();
    with_qk.extend([q, k]);
    with_qk.extend(mask);
    distinct_bytes(&with_qk) + lse_bytes
        <= distinct_bytes(&base) + scores * q.dtype().size_in_bytes()
}

/// Checks the leading dims: batch dims equal (rank 3 has no head dim, so
/// there GQA groups nothing and they must match too); on rank 4, k's and
/// v's heads equal and q's the same, or under GQA a multiple of them.
fn check_lead(qs: &[usize], ks: &[usize], vs: &[usize], gqa: bool) -> Result<()> {
    if qs[0] != ks[0] || qs[0] != vs[0] {
        let why = if gqa && qs.len() == 3 {
            " (rank-3 inputs have no head dim for enable_gqa to group)"
        } else {
            ""
        };
        return Err(invalid(format!(
            "batch dims differ: q {qs:?}, k {ks:?}, v {vs:?}{why}"
        )));
    }
    if qs.len() == 3 {
        return Ok(());
    }
    let (h, hk, hv) = (qs[1], ks[1], vs[1]);
    if hk != hv {
        return Err(invalid(format!(
            "k has {hk} heads and v {hv}: they must match"
        )));
    }
    if h == hk {
        return Ok(());
    }
    if !gqa {
        return Err(invalid(format!(
            "q has {h} heads, k and v {hk}: heads must match (enable_gqa groups them)"
        )));
    }
    if hk == 0 || h % hk != 0 {
        return Err(invalid(format!(
            "enable_gqa: q's {h} heads are not a multiple of k's and v's {hk}"
        )));
    }
    Ok(())
}

/// Checks shapes and dtypes; returns the scores' shape `[.., Lq, Lk]`.
fn check(q: &Tensor, k: &Tensor, v: &Tensor, o: &SdpaOptions) -> Result<Vec<usize>> {
    for t in [q, k, v] {
        expect_float(OP, t)?;
    }
    if k.dtype() != q.dtype() || v.dtype() != q.dtype() {
        return Err(invalid("q, k and v must share a dtype".into()));
    }
    let r = q.rank();
    if !(r == 3 || r == 4) || k.rank() != r || v.rank() != r {
        return Err(invalid("q, k, v must all be rank 3 or all rank 4".into()));
    }
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    check_lead(qs, ks, vs, o.enable_gqa)?;
    if qs[r - 1] != ks[r - 1] {
        return Err(invalid(format!("head dims differ: q {qs:?}, k {ks:?}")));
    }
    if ks[r - 2] != vs[r - 2] {
        return Err(invalid(format!("k and v lengths differ: {ks:?} {vs:?}")));
    }
    if !(0.0..=1.0).contains(&o.dropout_p) {
        return Err(invalid(format!("dropout_p {} not in [0, 1]", o.dropout_p)));
    }
    let mut scores = qs[..r - 1].to_vec();
    scores.push(ks[r - 2]);
    if let Some(m) = &o.mask {
        if !(m.dtype().is_float() || m.dtype() == DType::U8) {
            return Err(invalid(format!(
                "mask dtype {:?} is not float or U8",
                m.dtype()
            )));
        }
        m.layout().broadcast_to(&scores)?;
    }
    Ok(scores)
}

/// Scaled-dot-product attention (`torch.nn.functional.scaled_dot_product_attention`):
/// `q` `[B, H, Lq, D]`, `k` `[B, H, Lk, D]`, `v` `[B, H, Lk, Dv]` (or rank 3,
/// `[B·H, L, D]`) → `[.., Lq, Dv]`. With [`SdpaOptions::enable_gqa`], rank-4
/// `k` and `v` may have `Hkv` heads, `H` a multiple of `Hkv` (query head `h`
/// reads key/value head `h / (H / Hkv)`). Rows whose scores are all masked
/// give zero probabilities. The mask never receives a gradient.
///
/// Saves (lean): `V` if `q` or `k` needs grad; `K` if `q` does; `Q` if `k`
/// does; then either `P` (`B·H·Lq·Lk` elements) or — when not more bytes —
/// `Q`, `K`, the mask and `lse` (`B·H·Lq` f32, f64 for f64 inputs) to
/// recompute `P` bit for bit. Under GQA with `Hkv < H` always the latter,
/// with `K` and `V` un-repeated. Dropout masks are replayed, never saved.
/// `SaveAll`: `q`, `k`, `v`, `P` and, for `p > 0`, the U8 dropout mask.
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &SdpaOptions,
) -> Result<Tensor> {
    if lowers(q) || lowers(k) || lowers(v) {
        let (q, k, v) = (lower(q)?, lower(k)?, lower(v)?);
        return scaled_dot_product_attention(&q, &k, &v, opts);
    }
    let scores = check(q, k, v, opts)?;
    let r = q.rank();
    let geometry = Geometry {
        geom: ScoreGeom {
            lq: scores[r - 2],
            lk: scores[r - 1],
            scale: opts.scale.unwrap_or(1.0 / (q.shape()[r - 1] as f64).sqrt()),
            causal: opts.causal,
        },
        scores: scores.clone(),
        draw: (opts.dropout_p > 0.0).then_some(DropoutDraw {
            seed: opts.seed,
            offset: opts.offset,
            p: opts.dropout_p,
        }),
        lse_f32: q.dtype() != DType::F64,
    };
    let needs = needs_grad([q, k, v]);
    // The arithmetic depends on the shapes alone, never on the policy, so
    // that both policies give the same bits: fused wherever the lean
    // policy keeps no probabilities, and always for grouped heads (the
    // module doc says why).
    if needs == [false; 3]
        || grouped(q, k)
        || recomputes(q, k, v, opts.mask.as_ref(), &geometry, needs)
    {
        let save_all = save_policy() == SavePolicy::SaveAll;
        return flash::attention((q, k, v), opts.mask.as_ref(), &geometry, (needs, save_all));
    }
    let (p, _) = probabilities(q, k, opts.mask.as_ref(), &geometry, None)?;
    let out = {
        let pd = {
            let _ws = with_category(Category::Workspace);
            drop(&p, &geometry, None)?
        };
        matmul(&pd, v)?
    };
    let [nq, nk, nv] = needs;
    if !(nq || nk || nv) {
        return Ok(out);
    }
    let save_all = save_policy() == SavePolicy::SaveAll;
    let keep = |c: bool, t: &Tensor| (save_all || c).then(|| SavedTensor::new(t, OP));
    let op = SdpaBackward {
        geometry: geometry.clone(),
        needs,
        q: keep(nk, q),
        k: keep(nq, k),
        v: keep(nq || nk, v),
        probs: SavedTensor::new(&p, OP),
        drop_mask: match geometry.draw {
            Some(draw) if save_all => Some(SavedTensor::new(
                &dropout_mask(&scores, draw, q.device())?,
                OP,
            )),
            _ => None,
        },
    };
    Ok(attach(out, &[q, k, v], op))
}
