//! Fused attention on CUDA: the glue from tensors to the kernels of
//! `flash.cu` (formulas in `flash/mod.rs`). q, k, v and dO are read in place
//! through their layouts ([`View4`]), so no copy of an operand enters the
//! ledger; the mask is read in place too, or through an uncounted copy in
//! the compute type when its float dtype differs (a temporary, as the CPU's
//! host values). Outputs are new dense tensors, counted; the forward's lse
//! is uncounted until the caller saves it ([`DeviceLse::Uncounted`]).
//!
//! Kernels: `flash_fwd_*` (output and lse), `flash_bwd_dq_*` (`D` into
//! `delta`, then dQ) and `flash_bwd_dkv_*` (dK and dV, a block per key
//! tile of a key/value head summing its group's query heads in order); no
//! atomics, so every result is bit-identical from run to run. Under GQA k
//! and v are read at key/value head `h / group` in place, never repeated.

use super::super::cuda::DeviceLse;
use super::super::RowLse;
use super::{FlashGeom, FlashInputs, View4};
use crate::cuda::check::{float_suffix, input, invalid};
use crate::cuda::{elementwise, launch, CudaBuffer, CudaDevice};
use crate::dtype::stat_dtype;
use crate::nn::dropout::DropoutDraw;
use crate::op_code::MaskCode;
use crate::tensor::cuda as tensor;
use crate::{DType, Error, Result, Tensor};
use cudarc::driver::LaunchConfig;
use std::sync::{Arc, RwLockReadGuard};

/// The op name in this file's errors.
const OPF: &str = "cuda flash attention";

/// Threads per block (`LG_FL_THREADS` in `flash.cu`).
pub(super) const THREADS: u32 = 256;

/// Output columns one block computes (`FlCfg::OC` in `flash.cu`).
pub(super) const OUT_CHUNK: usize = 64;

/// The largest sequence length or feature size the kernels index with
/// 32-bit integers inside a (b, h) slice (room left for a tile past it).
const MAX_DIM: usize = 1 << 30;

// SAFETY: FlashGeom and View4 are #[repr(C)] plain data, laid out as
// flash.cu's `struct FlashGeom` (with `struct ScoreGeom` first) and
// `struct View4`.
unsafe impl cudarc::driver::DeviceRepr for FlashGeom {}
unsafe impl cudarc::driver::DeviceRepr for View4 {}

/// The tile edge (`FlCfg::B` in `flash.cu`) of a compute dtype: shared
/// memory holds half as many doubles.
pub(super) fn tile(compute: DType) -> usize {
    if compute == DType::F64 {
        32
    } else {
        64
    }
}

/// Blocks for `tasks` block-sized tasks (the kernels loop block-stride over
/// any more than the 65 536 launched).
fn grid(tasks: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (tasks.clamp(1, 65_536) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// How the kernels read each operand.
struct Views {
    /// Queries.
    q: View4,
    /// Keys.
    k: View4,
    /// Values.
    v: View4,
    /// The output gradient (backward only; default in forward).
    d_out: View4,
    /// The mask broadcast to the scores (default without one).
    mask: View4,
}

impl Views {
    /// The views of `x`'s q, k and v in place, with `d_out`'s and the mask's.
    fn of(x: &FlashInputs, d_out: View4, mask: &Mask) -> Self {
        Views {
            q: view(x.q),
            k: view(x.k),
            v: view(x.v),
            d_out,
            mask: mask.view,
        }
    }
}

/// The dropout arguments of a launch (`drop = 0`: none).
struct DropArgs {
    /// 1 when a draw is replayed.
    drop: i32,
    /// Philox seed.
    seed: u64,
    /// Philox offset.
    offset: u64,
    /// Drop probability.
    p: f64,
    /// The factor on kept probabilities.
    scale: f64,
}

impl DropArgs {
    /// The arguments of an optional draw.
    fn of(draw: Option<DropoutDraw>) -> DropArgs {
        match draw {
            Some(d) => DropArgs {
                drop: 1,
                seed: d.seed,
                offset: d.offset,
                p: d.p,
                scale: d.scale(),
            },
            None => DropArgs {
                drop: 0,
                seed: 0,
                offset: 0,
                p: 0.0,
                scale: 1.0,
            },
        }
    }
}

/// The device buffers a launch reads (`mask` is `q`'s buffer, never read,
/// when there is no mask; `d_out` and `lse` likewise in forward).
struct Operands<'a> {
    /// Queries.
    q: &'a CudaBuffer,
    /// Keys.
    k: &'a CudaBuffer,
    /// Values.
    v: &'a CudaBuffer,
    /// The output gradient.
    d_out: &'a CudaBuffer,
    /// The mask (compute type or U8).
    mask: &'a CudaBuffer,
    /// The saved lse (dense, offset 0).
    lse: &'a CudaBuffer,
}

/// The mask as the kernels read it: none, additive in the compute type
/// ([`MaskCode::Float`]) or U8 (0 removes).
struct Mask {
    /// The tensor read (the user's, or an uncounted converted copy).
    tensor: Option<Tensor>,
    /// What `flash.cu` reads.
    kind: MaskCode,
    /// Its view broadcast to the scores.
    view: View4,
}

impl Mask {
    /// The mask's device buffer (`None` without one), checked against
    /// `q`'s device.
    fn buffer(&self, q: &CudaBuffer) -> Result<Option<RwLockReadGuard<'_, CudaBuffer>>> {
        let Some(m) = &self.tensor else {
            return Ok(None);
        };
        let b = m.storage().cuda()?;
        check_buffer(m, &b, m.dtype(), q)?;
        Ok(Some(b))
    }
}

/// A tensor's layout as a [`View4`].
fn view(t: &Tensor) -> View4 {
    View4::of(t.layout().strides(), t.layout().offset())
}

/// Checks the operands' dtypes, ranks and shapes against the geometry
/// (typed errors, before anything is allocated or launched).
fn check_inputs(x: &FlashInputs) -> Result<()> {
    let g = &x.geom;
    let dt = x.q.dtype();
    float_suffix(OPF, dt)?;
    for t in [x.k, x.v] {
        if t.dtype() != dt {
            return Err(Error::DTypeMismatch {
                op: OPF,
                expected: dt,
                got: t.dtype(),
            });
        }
    }
    let r = x.q.rank();
    // Query heads, and the key/value heads each group of them reads.
    let (lead, kv_lead) = match r {
        4 if g.kv_heads * g.group() == g.heads => {
            (vec![g.batch, g.heads], vec![g.batch, g.kv_heads])
        }
        3 if g.heads == 1 && g.kv_heads == 1 => (vec![g.batch], vec![g.batch]),
        _ => {
            return Err(invalid(
                OPF,
                format!(
                    "rank {r} with {} heads and {} key/value heads (want rank 3 or 4, \
                     the heads a multiple of the key/value heads)",
                    g.heads, g.kv_heads
                ),
            ))
        }
    };
    let (lq, lk) = (g.score.lq, g.score.lk);
    let want = |a: usize, b: usize| [lead.as_slice(), &[a, b]].concat();
    let want_kv = |a: usize, b: usize| [kv_lead.as_slice(), &[a, b]].concat();
    for (name, t, shape) in [
        ("q", x.q, want(lq, g.d)),
        ("k", x.k, want_kv(lk, g.d)),
        ("v", x.v, want_kv(lk, g.dv)),
    ] {
        if t.shape() != shape.as_slice() {
            return Err(invalid(
                OPF,
                format!(
                    "{name} has shape {:?}, the geometry says {shape:?}",
                    t.shape()
                ),
            ));
        }
    }
    if x.scores != want(lq, lk).as_slice() {
        return Err(invalid(OPF, format!("scores shape {:?}", x.scores)));
    }
    if [lq, lk, g.d, g.dv].iter().any(|&n| n >= MAX_DIM) {
        return Err(invalid(
            OPF,
            format!(
                "lengths {lq}, {lk} or features {}, {} of 2^30 or more",
                g.d, g.dv
            ),
        ));
    }
    Ok(())
}

/// The user's mask on q's device, broadcast to the scores: U8 and masks of
/// the compute dtype are read in place, other float masks through an
/// uncounted contiguous copy in the compute dtype.
fn mask_operand(x: &FlashInputs, compute: DType) -> Result<Mask> {
    let Some(m) = x.mask else {
        return Ok(Mask {
            tensor: None,
            kind: MaskCode::None,
            view: View4::default(),
        });
    };
    let (kind, target) = match m.dtype() {
        DType::U8 => (MaskCode::Bool, DType::U8),
        t if t.is_float() => (MaskCode::Float, compute),
        t => return Err(Error::UnsupportedDType { op: OPF, dtype: t }),
    };
    let m = tensor::uncounted(|| {
        let m = if m.device() == x.q.device() {
            m.detach()
        } else {
            m.detach().to_device(x.q.device())?
        };
        if m.dtype() == target {
            Ok(m)
        } else {
            tensor::map(&m, m.shape(), |b, l| elementwise::cast(b, l, target))
        }
    })?;
    let full = m.layout().broadcast_to(x.scores)?;
    Ok(Mask {
        view: View4::of(full.strides(), full.offset()),
        tensor: Some(m),
        kind,
    })
}

/// Checks that `t`'s buffer `b` has `dtype`, sits on `like`'s device and
/// holds every element `t`'s layout addresses.
fn check_buffer(t: &Tensor, b: &CudaBuffer, dtype: DType, like: &CudaBuffer) -> Result<()> {
    input(OPF, b, dtype, &tensor::strided(t.layout())?, like)
}

/// The output shape `q.shape()[..r-1] + [dv]`.
fn out_shape(x: &FlashInputs) -> Vec<usize> {
    let mut shape = x.q.shape().to_vec();
    if let Some(last) = shape.last_mut() {
        *last = x.geom.dv;
    }
    shape
}

/// Forward on device `ordinal`: see `flash::forward`.
pub(super) fn forward(x: &FlashInputs, ordinal: usize) -> Result<(Tensor, RowLse)> {
    check_inputs(x)?;
    let g = x.geom;
    let dt = x.q.dtype();
    let compute = stat_dtype(dt);
    let rows = g.rows();
    let dev = tensor::device(ordinal)?;
    // Host values on the CPU until saved: uncounted here too.
    let mut lse = tensor::uncounted(|| CudaBuffer::alloc(&dev, compute, rows))?;
    let mut out = CudaBuffer::alloc(&dev, dt, rows * g.dv)?;
    if rows > 0 {
        let mask = mask_operand(x, compute)?;
        let (qb, kb, vb) = (
            x.q.storage().cuda()?,
            x.k.storage().cuda()?,
            x.v.storage().cuda()?,
        );
        check_buffer(x.q, &qb, dt, &qb)?;
        check_buffer(x.k, &kb, dt, &qb)?;
        check_buffer(x.v, &vb, dt, &qb)?;
        let mg = mask.buffer(&qb)?;
        let ops = Operands {
            q: &qb,
            k: &kb,
            v: &vb,
            d_out: &qb,
            mask: mg.as_deref().unwrap_or(&qb),
            lse: &qb,
        };
        let vw = Views::of(x, View4::default(), &mask);
        let dr = DropArgs::of(x.draw);
        launch_forward(
            &dev,
            &g,
            &vw,
            &dr,
            mask.kind.kernel_code(),
            &mut out,
            &mut lse,
            &ops,
        )?;
    }
    let out = tensor::wrap(out, &out_shape(x))?;
    Ok((out, RowLse::Cuda(DeviceLse::Uncounted(lse))))
}

/// Launches `flash_fwd_*` over every (b·h, query tile, output chunk).
#[allow(clippy::too_many_arguments)]
fn launch_forward(
    dev: &Arc<CudaDevice>,
    g: &FlashGeom,
    vw: &Views,
    dr: &DropArgs,
    mask_kind: i32,
    out: &mut CudaBuffer,
    lse: &mut CudaBuffer,
    ops: &Operands,
) -> Result<()> {
    let sfx = float_suffix(OPF, ops.q.dtype())?;
    let b = tile(lse.dtype());
    let tasks = g.batch * g.heads * g.score.lq.div_ceil(b) * g.dv.div_ceil(OUT_CHUNK).max(1);
    // Parameters: flash.cu's forward list.
    launch!(dev, "flash.cu", format!("flash_fwd_{sfx}"), grid(tasks);
        g, &vw.q, &vw.k, &vw.v, &vw.mask, &mask_kind, &dr.drop, &dr.seed,
        &dr.offset, &dr.p, &dr.scale, out.slice_mut(), lse.slice_mut(),
        ops.q.slice(), ops.k.slice(), ops.v.slice(), ops.mask.slice())
}

/// Checks the backward-only operands: dO of the output's shape and q's
/// dtype, lse and delta `[rows]` of the lse dtype, delta dense from offset
/// 0 (it is written) and present when dK is needed.
fn check_backward(
    x: &FlashInputs,
    d_out: &Tensor,
    lse: &Tensor,
    delta: Option<&Tensor>,
    needs: [bool; 3],
) -> Result<()> {
    let dt = x.q.dtype();
    let stat = stat_dtype(dt);
    if d_out.dtype() != dt {
        return Err(Error::DTypeMismatch {
            op: OPF,
            expected: dt,
            got: d_out.dtype(),
        });
    }
    if d_out.shape() != out_shape(x).as_slice() {
        return Err(Error::ShapeMismatch {
            op: OPF,
            lhs: out_shape(x),
            rhs: d_out.shape().to_vec(),
        });
    }
    let rows = x.geom.rows();
    for (name, t) in [("lse", Some(lse)), ("delta", delta)] {
        let Some(t) = t else { continue };
        if t.dtype() != stat {
            return Err(Error::DTypeMismatch {
                op: OPF,
                expected: stat,
                got: t.dtype(),
            });
        }
        if t.numel() != rows {
            return Err(invalid(
                OPF,
                format!("{name} of {} rows, want {rows}", t.numel()),
            ));
        }
    }
    match delta {
        None if needs[1] => Err(invalid(OPF, "no delta workspace where dK is needed")),
        Some(d) if !(d.is_contiguous() && d.layout().offset() == 0) => {
            Err(invalid(OPF, "delta is not dense from offset 0"))
        }
        _ => Ok(()),
    }
}

/// A gradient's buffer: `len` elements, counted, where needed; else an
/// empty uncounted placeholder the kernels never write.
fn grad_buffer(dev: &Arc<CudaDevice>, dt: DType, len: usize, need: bool) -> Result<CudaBuffer> {
    if need {
        CudaBuffer::alloc(dev, dt, len)
    } else {
        tensor::uncounted(|| CudaBuffer::alloc(dev, dt, 0))
    }
}

/// Backward on device `ordinal`: see `flash::backward`.
pub(super) fn backward(
    x: &FlashInputs,
    d_out: &Tensor,
    lse: &Tensor,
    delta: Option<&Tensor>,
    needs: [bool; 3],
    ordinal: usize,
) -> Result<[Option<Tensor>; 3]> {
    check_inputs(x)?;
    check_backward(x, d_out, lse, delta, needs)?;
    if needs == [false; 3] {
        return Ok([None, None, None]);
    }
    let dev = tensor::device(ordinal)?;
    let dt = x.q.dtype();
    let mut grads = [
        grad_buffer(&dev, dt, x.q.numel(), needs[0])?,
        grad_buffer(&dev, dt, x.k.numel(), needs[1])?,
        grad_buffer(&dev, dt, x.v.numel(), needs[2])?,
    ];
    if x.q.numel() > 0 || x.k.numel() > 0 || x.v.numel() > 0 {
        backward_launches(x, d_out, lse, delta, needs, &dev, &mut grads)?;
    }
    let [dq, dk, dv] = grads;
    Ok([
        needs[0]
            .then(|| tensor::wrap(dq, x.q.shape()))
            .transpose()?,
        needs[1]
            .then(|| tensor::wrap(dk, x.k.shape()))
            .transpose()?,
        needs[2]
            .then(|| tensor::wrap(dv, x.v.shape()))
            .transpose()?,
    ])
}

/// The buffers, views and the two backward launches: `flash_bwd_dq_*`
/// (`D` into delta, dQ) where dQ or dK is needed and there are score rows,
/// then `flash_bwd_dkv_*` where dK or dV is.
fn backward_launches(
    x: &FlashInputs,
    d_out: &Tensor,
    lse: &Tensor,
    delta: Option<&Tensor>,
    needs: [bool; 3],
    dev: &Arc<CudaDevice>,
    grads: &mut [CudaBuffer; 3],
) -> Result<()> {
    let g = x.geom;
    let dt = x.q.dtype();
    let compute = stat_dtype(dt);
    let mask = mask_operand(x, compute)?;
    // A saved lse is dense already; a view of one is copied (uncounted).
    let lse = tensor::uncounted(|| tensor::dense(lse))?;
    let (qb, kb, vb, ob, lb) = (
        x.q.storage().cuda()?,
        x.k.storage().cuda()?,
        x.v.storage().cuda()?,
        d_out.storage().cuda()?,
        lse.storage().cuda()?,
    );
    check_buffer(x.q, &qb, dt, &qb)?;
    check_buffer(x.k, &kb, dt, &qb)?;
    check_buffer(x.v, &vb, dt, &qb)?;
    check_buffer(d_out, &ob, dt, &qb)?;
    check_buffer(&lse, &lb, compute, &qb)?;
    let mg = mask.buffer(&qb)?;
    let mut dg = delta.map(|d| d.storage().cuda_mut()).transpose()?;
    if let (Some(d), Some(b)) = (delta, &dg) {
        check_buffer(d, b, compute, &qb)?;
    }
    let mut spare = tensor::uncounted(|| CudaBuffer::alloc(dev, compute, 0))?;
    let delta_buf: &mut CudaBuffer = match dg.as_mut() {
        Some(b) => b,
        None => &mut spare,
    };
    let ops = Operands {
        q: &qb,
        k: &kb,
        v: &vb,
        d_out: &ob,
        mask: mg.as_deref().unwrap_or(&qb),
        lse: &lb,
    };
    let vw = Views::of(x, view(d_out), &mask);
    let dr = DropArgs::of(x.draw);
    let [dq, dk, dv] = grads;
    if (needs[0] || needs[1]) && g.rows() > 0 {
        let write_delta = delta.is_some();
        launch_dq(
            dev,
            &g,
            &vw,
            &dr,
            mask.kind.kernel_code(),
            needs[0],
            write_delta,
            dq,
            delta_buf,
            &ops,
        )?;
    }
    launch_dkv(
        dev,
        &g,
        &vw,
        &dr,
        mask.kind.kernel_code(),
        [needs[1], needs[2]],
        dk,
        dv,
        delta_buf,
        &ops,
    )
}

/// Launches `flash_bwd_dq_*` over every (b·h, query tile, dQ chunk):
/// `D` written to `delta` when `write_delta`, dQ when `need_dq`.
#[allow(clippy::too_many_arguments)]
fn launch_dq(
    dev: &Arc<CudaDevice>,
    g: &FlashGeom,
    vw: &Views,
    dr: &DropArgs,
    mask_kind: i32,
    need: bool,
    write: bool,
    dq: &mut CudaBuffer,
    delta: &mut CudaBuffer,
    ops: &Operands,
) -> Result<()> {
    let sfx = float_suffix(OPF, ops.q.dtype())?;
    let b = tile(ops.lse.dtype());
    let chunks = if need {
        g.d.div_ceil(OUT_CHUNK).max(1)
    } else {
        1
    };
    let tasks = g.batch * g.heads * g.score.lq.div_ceil(b) * chunks;
    let need_dq = i32::from(need);
    let write_delta = i32::from(write);
    // Parameters: flash.cu's dq list.
    launch!(dev, "flash.cu", format!("flash_bwd_dq_{sfx}"), grid(tasks);
        g, &vw.q, &vw.k, &vw.v, &vw.d_out, &vw.mask, &mask_kind, &dr.drop,
        &dr.seed, &dr.offset, &dr.p, &dr.scale, &need_dq, &write_delta,
        dq.slice_mut(), delta.slice_mut(), ops.lse.slice(), ops.q.slice(),
        ops.k.slice(), ops.v.slice(), ops.d_out.slice(), ops.mask.slice())
}

/// Launches `flash_bwd_dkv_*` over every (b·key/value head, key tile,
/// column chunk) for dK (`needs[0]`) and dV (`needs[1]`), each block
/// walking its group's query heads; nothing when no block has work.
#[allow(clippy::too_many_arguments)]
fn launch_dkv(
    dev: &Arc<CudaDevice>,
    g: &FlashGeom,
    vw: &Views,
    dr: &DropArgs,
    mask_kind: i32,
    needs: [bool; 2],
    dk: &mut CudaBuffer,
    dv: &mut CudaBuffer,
    delta: &CudaBuffer,
    ops: &Operands,
) -> Result<()> {
    let sfx = float_suffix(OPF, ops.q.dtype())?;
    let b = tile(ops.lse.dtype());
    let kc = if needs[0] { g.d.div_ceil(OUT_CHUNK) } else { 0 };
    let vc = if needs[1] {
        g.dv.div_ceil(OUT_CHUNK)
    } else {
        0
    };
    let tasks = g.batch * g.kv_heads * g.score.lk.div_ceil(b) * kc.max(vc);
    if tasks == 0 {
        return Ok(());
    }
    let need_dk = i32::from(needs[0]);
    let need_dv = i32::from(needs[1]);
    // Parameters: flash.cu's dkv list.
    launch!(dev, "flash.cu", format!("flash_bwd_dkv_{sfx}"), grid(tasks);
        g, &vw.q, &vw.k, &vw.v, &vw.d_out, &vw.mask, &mask_kind, &dr.drop,
        &dr.seed, &dr.offset, &dr.p, &dr.scale, &need_dk, &need_dv,
        dk.slice_mut(), dv.slice_mut(), ops.lse.slice(), delta.slice(),
        ops.q.slice(), ops.k.slice(), ops.v.slice(), ops.d_out.slice(),
        ops.mask.slice())
}
