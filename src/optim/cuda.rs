//! The optimizers on CUDA: the update, gradient-norm and clamp kernels of
//! `optim.cu` (beside this file) and their glue from tensors. SGD and
//! Adam/AdamW update in place, with clipping fused into the read of the
//! gradient, and the f64 sum of squares that norm clipping needs. Each
//! computes exactly what the CPU update in `kernels.rs` computes, operation
//! by operation and in the same order, so the parameters come out
//! bit-identical.

use super::compact::StateFormat;
use super::rule::{AdamParams, GradTransform, PendingUpdate, SgdParams, UpdateRule, NORM_LANES};
use crate::cuda::check::{self, expect, float_suffix, input, invalid, RUN};
use crate::cuda::{launch, CudaBuffer, CudaDevice, Strided};
use crate::op_code::GradMapCode;
use crate::tensor::cuda::address;
use crate::{Result, Tensor};
use cudarc::driver::{DeviceRepr, LaunchConfig};
use std::sync::Arc;

/// The kernels' code of a gradient transform: (mode, value).
fn code(map: GradTransform) -> (i32, f64) {
    match map {
        GradTransform::Identity => (GradMapCode::Identity.kernel_code(), 0.0),
        GradTransform::Scale(s) => (GradMapCode::Scale.kernel_code(), s),
        GradTransform::ClampAbs(b) => (GradMapCode::ClampAbs.kernel_code(), b),
    }
}

/// The parameter and gradient of one update: `n` parameter elements,
/// contiguous from element `offset` of `param`, and the gradient read
/// through `layout` (any strides, `n` elements in row-major order).
pub(crate) struct UpdateArgs<'a> {
    /// The parameter's buffer (written in place).
    pub param: &'a mut CudaBuffer,
    /// The parameter's first element in its buffer.
    pub offset: usize,
    /// The gradient's buffer.
    pub grad: &'a CudaBuffer,
    /// The gradient's layout in its buffer.
    pub layout: Strided,
    /// The gradient transform (clipping).
    pub map: GradTransform,
}

impl UpdateArgs<'_> {
    /// Checks dtypes, devices and extents; returns the element count.
    fn check(&self, op: &'static str) -> Result<usize> {
        let n = self.layout.numel();
        input(op, self.grad, self.param.dtype(), &self.layout, self.param)?;
        if self.offset + n > self.param.len() {
            return Err(invalid(
                op,
                format!(
                    "{n} parameter elements from {} in a buffer of {}",
                    self.offset,
                    self.param.len()
                ),
            ));
        }
        Ok(n)
    }
}

/// One SGD step in place (`step` is 1 on the first update); `buf` is the
/// momentum buffer, whole and contiguous (required when momentum ≠ 0, and
/// used whenever given, as the CPU uses a state slice).
/// Allocates nothing. Bit-identical to the CPU update.
pub(crate) fn sgd_step(
    a: UpdateArgs<'_>,
    buf: Option<&mut CudaBuffer>,
    step: u64,
    hp: &SgdParams,
) -> Result<()> {
    let op = "cuda SGD";
    let sfx = float_suffix(op, a.param.dtype())?;
    let n = a.check(op)?;
    if hp.momentum != 0.0 && buf.is_none() {
        return Err(invalid(op, "momentum without a momentum buffer"));
    }
    if let Some(b) = &buf {
        expect(op, b, a.param.dtype(), n, a.param)?;
    }
    if n == 0 {
        return Ok(());
    }
    // As on the CPU, a given buffer is used (the optimizer gives one
    // exactly when momentum ≠ 0).
    let has_buf = i32::from(buf.is_some());
    let (n64, off, (gm, gp)) = (n as i64, a.offset as i64, code(a.map));
    let flags = [
        i32::from(hp.nesterov),
        i32::from(hp.maximize),
        // The CPU's test: the buffer starts as the gradient on update 1.
        i32::from(step == 1),
        has_buf,
    ];
    let gl = a.layout.coalesced();
    let dev = a.param.device().clone();
    let name = format!("sgd_{sfx}");
    let lr: f64 = hp.lr;
    let momentum: f64 = hp.momentum;
    let dampening: f64 = hp.dampening;
    let decay: f64 = hp.weight_decay;
    // Whole vectors where the parameter from `off`, a contiguous gradient
    // and the buffer all start on 16-byte boundaries.
    let vec = i32::from(
        gl.strides() == [1]
            && a.param.vector_aligned_at(a.offset)
            && a.grad.vector_aligned_at(gl.offset())
            && buf.as_ref().is_none_or(|b| b.vector_aligned()),
    );
    let grid = check::runs_grid(n);
    match buf {
        Some(b) => launch!(&dev, "optim.cu", name, grid;
            &n64, &vec, &lr, &momentum, &dampening, &decay, &flags[0], &flags[1],
            &flags[2], &flags[3], &gm, &gp, a.param.slice_mut(), &off, a.grad.slice(), &gl,
            b.slice_mut()),
        // No buffer: the kernel never touches its `buf` argument, so the
        // gradient's pointer stands in (no placeholder allocation).
        None => launch!(&dev, "optim.cu", name, grid;
            &n64, &vec, &lr, &momentum, &dampening, &decay, &flags[0], &flags[1],
            &flags[2], &flags[3], &gm, &gp, a.param.slice_mut(), &off, a.grad.slice(), &gl,
            a.grad.slice()),
    }
}

/// Adam's step constants for the kernels, exactly as `Adam::update`
/// computes them on the host, and its flags.
struct AdamConstants {
    /// `-lr / (1 - beta1^t)`.
    neg_step: f64,
    /// `sqrt(1 - beta2^t)`.
    bc2_sqrt: f64,
    eps: f64,
    /// `1 - beta1`.
    weight: f64,
    beta2: f64,
    weight_decay: f64,
    /// `1 - lr * wd` (AdamW's decay).
    shrink: f64,
    /// L2 decay (Adam).
    l2: i32,
    /// Decoupled decay (AdamW).
    decoupled: i32,
    maximize: i32,
    /// A max buffer is given (amsgrad).
    amsgrad: i32,
}

impl AdamConstants {
    fn new(hp: &AdamParams, step: u64, has_vmax: bool) -> AdamConstants {
        let t = step as f64;
        let decay = hp.weight_decay != 0.0;
        AdamConstants {
            neg_step: -(hp.lr / (1.0 - hp.beta1.powf(t))),
            bc2_sqrt: (1.0 - hp.beta2.powf(t)).sqrt(),
            eps: hp.eps,
            weight: 1.0 - hp.beta1,
            beta2: hp.beta2,
            weight_decay: hp.weight_decay,
            shrink: 1.0 - hp.lr * hp.weight_decay,
            l2: i32::from(decay && !hp.decoupled_weight_decay),
            decoupled: i32::from(decay && hp.decoupled_weight_decay),
            maximize: i32::from(hp.maximize),
            // As on the CPU, a given max buffer is used (the optimizer gives
            // one exactly with amsgrad).
            amsgrad: i32::from(has_vmax),
        }
    }
}

/// One Adam step (`step` ≥ 1, as on the CPU) in place with moments `m`,
/// `v` and, for amsgrad, `vmax` (used whenever given, as the CPU uses a
/// third state slice; whole contiguous buffers of the parameter's length
/// and dtype). Allocates nothing. Bit-identical to the CPU update.
pub(crate) fn adam_step(
    a: UpdateArgs<'_>,
    m: &mut CudaBuffer,
    v: &mut CudaBuffer,
    vmax: Option<&mut CudaBuffer>,
    step: u64,
    hp: &AdamParams,
) -> Result<()> {
    let op = "cuda Adam";
    let sfx = float_suffix(op, a.param.dtype())?;
    let n = a.check(op)?;
    for b in [&*m, &*v] {
        expect(op, b, a.param.dtype(), n, a.param)?;
    }
    if hp.amsgrad && vmax.is_none() {
        return Err(invalid(op, "amsgrad without a max buffer"));
    }
    if let Some(b) = &vmax {
        expect(op, b, a.param.dtype(), n, a.param)?;
    }
    if n == 0 {
        return Ok(());
    }
    let c = AdamConstants::new(hp, step, vmax.is_some());
    let (n64, off, (gm, gp)) = (n as i64, a.offset as i64, code(a.map));
    let gl = a.layout.coalesced();
    let dev = a.param.device().clone();
    let name = format!("adam_{sfx}");
    match vmax {
        Some(vm) => launch!(&dev, "optim.cu", name, CudaDevice::grid_for(n);
            &n64, &c.neg_step, &c.bc2_sqrt, &c.eps, &c.weight, &c.beta2, &c.weight_decay,
            &c.shrink, &c.l2, &c.decoupled, &c.maximize, &c.amsgrad, &gm, &gp,
            a.param.slice_mut(), &off,
            a.grad.slice(), &gl, m.slice_mut(), v.slice_mut(), vm.slice_mut()),
        // Without amsgrad the kernel never touches `vmax`: the gradient's
        // pointer stands in (no placeholder allocation).
        None => launch!(&dev, "optim.cu", name, CudaDevice::grid_for(n);
            &n64, &c.neg_step, &c.bc2_sqrt, &c.eps, &c.weight, &c.beta2, &c.weight_decay,
            &c.shrink, &c.l2, &c.decoupled, &c.maximize, &c.amsgrad, &gm, &gp,
            a.param.slice_mut(), &off,
            a.grad.slice(), &gl, m.slice_mut(), v.slice_mut(), a.grad.slice()),
    }
}

/// The sum of squares of the elements `layout` reads from `g`, in f64 and
/// in the CPU's order (`super::kernels::sum_of_squares`, whose order this reproduces): lane `k`
/// of `min(n, NORM_LANES)` sums the `i ≡ k` elements in increasing `i`,
/// then the lanes (zero-padded to a power of two) are added as a pairwise
/// tree. Its two small f64 buffers are scratch, outside the ledger (the
/// CPU's lanes are host memory); reading the result back synchronizes.
fn sum_of_squares_buffer(g: &CudaBuffer, layout: &Strided) -> Result<f64> {
    let op = "cuda sum_of_squares";
    let sfx = float_suffix(op, g.dtype())?;
    input(op, g, g.dtype(), layout, g)?;
    let n = layout.numel();
    if n == 0 {
        return Ok(0.0);
    }
    let lanes = n.min(NORM_LANES);
    let pow2 = lanes.next_power_of_two();
    let (n64, l64, p64) = (n as i64, lanes as i64, pow2 as i64);
    let gl = layout.coalesced();
    let dev = g.device().clone();
    crate::tensor::cuda::uncounted(|| {
        // Zeros: lanes..pow2 are the tree's padding.
        let mut part = CudaBuffer::zeros(&dev, crate::DType::F64, pow2)?;
        let mut total = CudaBuffer::alloc(&dev, crate::DType::F64, 1)?;
        launch!(&dev, "optim.cu", format!("sumsq_lanes_{sfx}"), CudaDevice::grid_for(lanes);
            &n64, &l64, g.slice(), &gl, part.slice_mut())?;
        let one_block = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(&dev, "optim.cu", "sumsq_tree", one_block;
            &p64, part.slice_mut(), total.slice_mut())?;
        let host = total.to_vec::<f64>()?;
        host.first()
            .copied()
            .ok_or_else(|| invalid(op, "no total read back"))
    })
}

/// A new contiguous buffer of the elements `layout` reads from `g`, each
/// limited to `[-bound, bound]` in the dtype (NaN passes through): what
/// `Tensor::clamp(-bound, bound)` computes, for `clip_grad_value` on CUDA.
/// The output is counted under the current category, as clamp's is.
fn clamp_abs_buffer(g: &CudaBuffer, layout: &Strided, bound: f64) -> Result<CudaBuffer> {
    let op = "cuda clamp_abs";
    let sfx = float_suffix(op, g.dtype())?;
    input(op, g, g.dtype(), layout, g)?;
    let n = layout.numel();
    let mut out = CudaBuffer::alloc(g.device(), g.dtype(), n)?;
    if n > 0 {
        let n64 = n as i64;
        let gl = layout.coalesced();
        launch!(g.device(), "optim.cu", format!("clamp_abs_{sfx}"), CudaDevice::grid_for(n);
            &n64, &bound, out.slice_mut(), g.slice(), &gl)?;
    }
    Ok(out)
}

/// One update as the CUDA glue takes it: the rule, the parameter's update
/// count, its first element in its buffer, the gradient transform and the
/// state's format.
pub(crate) struct Update {
    /// The algorithm's update as data.
    pub rule: UpdateRule,
    /// The parameter's update count, 1 on the first.
    pub step: u64,
    /// The parameter's first element in its buffer.
    pub offset: usize,
    /// The gradient transform (clipping).
    pub transform: GradTransform,
    /// How the state tensors hold the state.
    pub format: StateFormat,
}

/// `apply_update` on CUDA: locks the storages (the gradient for reading,
/// the parameter and state for writing, which bumps their versions) and
/// runs the rule's kernel on the buffers. Allocates nothing.
pub(crate) fn update(u: Update, param: &Tensor, grad: &Tensor, state: &[Tensor]) -> Result<()> {
    let layout = crate::tensor::cuda::strided(grad.layout())?;
    let gbuf = grad.storage().cuda()?;
    let mut pbuf = param.storage().cuda_mut()?;
    let mut sbufs = state
        .iter()
        .map(|s| s.storage().cuda_mut())
        .collect::<Result<Vec<_>>>()?;
    let mut srefs: Vec<&mut CudaBuffer> = sbufs.iter_mut().map(|b| &mut **b).collect();
    let args = UpdateArgs {
        param: &mut pbuf,
        offset: u.offset,
        grad: &gbuf,
        layout,
        map: u.transform,
    };
    match (u.rule, u.format) {
        (UpdateRule::Sgd(hp), StateFormat::Full) => {
            sgd_step(args, srefs.first_mut().map(|b| &mut **b), u.step, &hp)
        }
        (UpdateRule::Adam(hp), StateFormat::Full) => {
            let [m, v, rest @ ..] = &mut srefs[..] else {
                return Err(invalid(
                    "cuda Adam",
                    format!("{} state buffers, 2 needed", state.len()),
                ));
            };
            adam_step(args, m, v, rest.first_mut().map(|b| &mut **b), u.step, &hp)
        }
        (UpdateRule::Adam(hp), format) => adam_compact_step(args, &mut srefs, u.step, &hp, format),
        (UpdateRule::Sgd(_), format) => Err(invalid(
            "cuda SGD",
            format!("{format} momentum buffers run on the CPU only; use f32 state on CUDA"),
        )),
    }
}

/// The two 8-bit maps, passed by value as `struct LgQuantMaps` in
/// `optim.cu` (signed for first moments, unsigned for second moments).
#[doc(hidden)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct QuantMaps {
    signed: [f32; 256],
    unsigned: [f32; 256],
}

// SAFETY: a plain `repr(C)` struct of floats, laid out as
// `struct LgQuantMaps` in `optim.cu`.
unsafe impl DeviceRepr for QuantMaps {}

impl QuantMaps {
    /// The maps of [`super::compact`].
    pub fn new() -> QuantMaps {
        QuantMaps {
            signed: super::compact::signed_map().values,
            unsigned: super::compact::unsigned_map().values,
        }
    }
}

impl Default for QuantMaps {
    fn default() -> Self {
        QuantMaps::new()
    }
}

/// One Adam step with compact state (`state`: per slot a bf16 buffer, or
/// in 8-bit the u8 codes then the f32 block scales; slots m, v and, with
/// amsgrad, vmax): per element the arithmetic of [`adam_step`] on the
/// widened state, narrowed back as `super::compact` describes. bf16 runs
/// one thread per element; 8-bit one block of 256 threads per
/// quantisation block. Allocates nothing. Bit-identical to the CPU.
fn adam_compact_step(
    a: UpdateArgs<'_>,
    state: &mut [&mut CudaBuffer],
    step: u64,
    hp: &AdamParams,
    format: StateFormat,
) -> Result<()> {
    let op = "cuda Adam (compact state)";
    let sfx = float_suffix(op, a.param.dtype())?;
    let n = a.check(op)?;
    let per = format.tensors_per_slot();
    let slots = 2 + usize::from(hp.amsgrad);
    if state.len() != slots * per {
        return Err(invalid(
            op,
            format!("{} state buffers, {} needed", state.len(), slots * per),
        ));
    }
    for (i, b) in state.iter().enumerate() {
        let (dtype, len) = super::compact::expected_tensor(format, i, n);
        expect(op, b, dtype, len, a.param)?;
    }
    if n == 0 {
        return Ok(());
    }
    let c = AdamConstants::new(hp, step, hp.amsgrad);
    let (n64, off, (gm, gp)) = (n as i64, a.offset as i64, code(a.map));
    let gl = a.layout.coalesced();
    let dev = a.param.device().clone();
    let (s0, s1, s2, s3, s4, s5) = state_addresses(state, a.grad.address());
    match format {
        StateFormat::Bf16 => launch!(&dev, "optim.cu", format!("adam_bf16_state_{sfx}"),
            CudaDevice::grid_for(n);
            &n64, &c.neg_step, &c.bc2_sqrt, &c.eps, &c.weight, &c.beta2, &c.weight_decay,
            &c.shrink, &c.l2, &c.decoupled, &c.maximize, &c.amsgrad, &gm, &gp,
            a.param.slice_mut(), &off, a.grad.slice(), &gl, &s0, &s1, &s2),
        _ => {
            let blocks = n.div_ceil(super::compact::QUANT_BLOCK) as u32;
            let grid = LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (Q8_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let maps: QuantMaps = QuantMaps::new();
            launch!(&dev, "optim.cu", format!("adam_q8_state_{sfx}"), grid;
                &n64, &c.neg_step, &c.bc2_sqrt, &c.eps, &c.weight, &c.beta2, &c.weight_decay,
                &c.shrink, &c.l2, &c.decoupled, &c.maximize, &c.amsgrad, &gm, &gp,
                a.param.slice_mut(), &off, a.grad.slice(), &gl, &maps,
                &s0, &s1, &s2, &s3, &s4, &s5)
        }
    }
}

/// The addresses of a compact state's buffers, in order, padded to six
/// with `stand_in`: without amsgrad (or in bf16) the kernels never touch
/// the missing buffers, so the gradient's address stands in for them (no
/// placeholder allocation).
fn state_addresses(state: &[&mut CudaBuffer], stand_in: u64) -> (u64, u64, u64, u64, u64, u64) {
    let mut out = [stand_in; 6];
    for (o, b) in out.iter_mut().zip(state) {
        *o = b.address();
    }
    let [a, b, c, d, e, f] = out;
    (a, b, c, d, e, f)
}

/// Threads per block of the 8-bit update (`LG_Q8_THREADS` in `optim.cu`):
/// each handles `QUANT_BLOCK / Q8_THREADS` elements of its block.
const Q8_THREADS: u32 = 256;

/// Tensors per multi-tensor launch: `LG_LIST` in `optim.cu`.
pub(crate) const LIST: usize = 32;

/// The tensors of one multi-tensor update, as `struct LgTensorList` in
/// `optim.cu` (passed by value): tensor `k` has `n[k]` elements at device
/// address `p[k]`, its contiguous gradient at `g[k]`, its state buffers at
/// `s[j][k]` (0 where absent); its runs of 4 elements are the list's runs
/// `start[k] .. start[k + 1]`; `vec[k]` says every address of tensor `k` is
/// 16-byte aligned.
#[doc(hidden)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TensorList {
    start: [i64; LIST + 1],
    n: [i64; LIST],
    p: [u64; LIST],
    g: [u64; LIST],
    s: [[u64; LIST]; 3],
    vec: [i32; LIST],
    count: i32,
}

// The C struct: 8-byte fields, then 33 ints, padded to a multiple of 8.
const _: () = assert!(std::mem::size_of::<TensorList>() == (LIST + 1 + 6 * LIST) * 8 + 33 * 4 + 4);

// SAFETY: a plain `repr(C)` struct of integers, laid out as
// `struct LgTensorList` in `optim.cu` (size asserted above).
unsafe impl DeviceRepr for TensorList {}

impl TensorList {
    fn new() -> TensorList {
        TensorList {
            start: [0; LIST + 1],
            n: [0; LIST],
            p: [0; LIST],
            g: [0; LIST],
            s: [[0; LIST]; 3],
            vec: [0; LIST],
            count: 0,
        }
    }

    /// All runs of the list (the launch's work).
    fn runs(&self) -> usize {
        self.start[self.count as usize] as usize
    }

    /// Appends a tensor of `n` elements at the given addresses.
    fn push(&mut self, n: usize, p: u64, g: u64, state: &[u64]) {
        let k = self.count as usize;
        self.n[k] = n as i64;
        self.p[k] = p;
        self.g[k] = g;
        for (j, &a) in state.iter().enumerate() {
            self.s[j][k] = a;
        }
        let mut addresses = [p, g].into_iter().chain(state.iter().copied());
        self.vec[k] = i32::from(addresses.all(|a| a % 16 == 0));
        self.start[k + 1] = self.start[k] + n.div_ceil(RUN) as i64;
        self.count += 1;
    }
}

/// Runs `updates` (all on one device, one dtype, one step and transform,
/// parameters and gradients contiguous, checked by the caller) as
/// multi-tensor kernels, [`LIST`] tensors per launch. Per element the
/// arithmetic of [`sgd_step`] / [`adam_step`], so the same bits.
/// Allocates nothing.
pub(crate) fn update_list(rule: UpdateRule, updates: &[PendingUpdate]) -> Result<()> {
    let Some(first) = updates.first() else {
        return Ok(());
    };
    let op = "cuda multi-tensor update";
    let sfx = float_suffix(op, first.param.dtype())?;
    let slots = match rule {
        UpdateRule::Sgd(hp) if hp.momentum != 0.0 => 1,
        UpdateRule::Sgd(_) => 0,
        UpdateRule::Adam(hp) => 2 + usize::from(hp.amsgrad),
    };
    if updates.iter().any(|u| u.state.len() < slots) {
        return Err(invalid(op, format!("fewer than {slots} state buffers")));
    }
    let dev = first.param.storage().cuda()?.device().clone();
    for chunk in updates.chunks(LIST) {
        let mut list = TensorList::new();
        for u in chunk {
            let p = address(op, &u.param, true)?;
            let g = address(op, &u.grad, false)?;
            let mut state = [0u64; 3];
            for (a, s) in state.iter_mut().zip(&u.state) {
                *a = address(op, s, true)?;
            }
            list.push(u.param.numel(), p, g, &state);
        }
        launch_list(&dev, rule, sfx, &list, first)?;
    }
    Ok(())
}

/// One launch of a list's kernel (`sgd_list_*` / `adam_list_*`).
fn launch_list(
    dev: &Arc<CudaDevice>,
    rule: UpdateRule,
    sfx: &'static str,
    list: &TensorList,
    first: &PendingUpdate,
) -> Result<()> {
    let grid = CudaDevice::grid_for(list.runs());
    let (gm, gp) = code(first.transform);
    let has_state = !first.state.is_empty();
    match rule {
        UpdateRule::Sgd(hp) => {
            let name = format!("sgd_list_{sfx}");
            let lr: f64 = hp.lr;
            let momentum: f64 = hp.momentum;
            let dampening: f64 = hp.dampening;
            let decay: f64 = hp.weight_decay;
            let flags = [
                i32::from(hp.nesterov),
                i32::from(hp.maximize),
                // The CPU's test: the buffer starts as the gradient on update 1.
                i32::from(first.step == 1),
                // As on the CPU, a given buffer is used.
                i32::from(has_state),
            ];
            launch!(dev, "optim.cu", name, grid;
                list, &lr, &momentum, &dampening, &decay, &flags[0], &flags[1], &flags[2],
                &flags[3], &gm, &gp)
        }
        UpdateRule::Adam(hp) => {
            let name = format!("adam_list_{sfx}");
            let c = AdamConstants::new(&hp, first.step, first.state.len() > 2);
            launch!(dev, "optim.cu", name, grid;
                list, &c.neg_step, &c.bc2_sqrt, &c.eps, &c.weight, &c.beta2, &c.weight_decay,
                &c.shrink, &c.l2, &c.decoupled, &c.maximize, &c.amsgrad, &gm, &gp)
        }
    }
}

/// `sum_of_squares` of a CUDA gradient (any layout), bit-identical to the
/// CPU's.
pub(crate) fn sum_of_squares(grad: &Tensor) -> Result<f64> {
    let layout = crate::tensor::cuda::strided(grad.layout())?;
    sum_of_squares_buffer(&*grad.storage().cuda()?, &layout)
}

/// `g.clamp(-bound, bound)` of a CUDA gradient (where `clamp` has no kernel
/// yet): the same values and the same one new contiguous buffer.
pub(crate) fn clamp_abs(g: &Tensor, bound: f64) -> Result<Tensor> {
    let layout = crate::tensor::cuda::strided(g.layout())?;
    let out = clamp_abs_buffer(&*g.storage().cuda()?, &layout, bound)?;
    crate::tensor::cuda::wrap(out, g.shape())
}
