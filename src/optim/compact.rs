//! Compact optimizer state: the per-parameter state tensors (Adam's
//! moments, SGD's momentum) kept in bf16 or in block-wise 8-bit instead of
//! the parameter's dtype, as bitsandbytes' 8-bit optimizers keep them.
//!
//! The update is the algorithm's own arithmetic ([`Algorithm::update`]):
//! each block of [`QUANT_BLOCK`] elements widens its state to the
//! parameter's type, runs the update, and narrows it back. Narrowing goes
//! through f32 on every device, so the CPU and CUDA agree bit for bit:
//!
//! - **bf16**: `bf16(f32(x))`, rounded to nearest even.
//! - **8-bit** (block-wise dynamic quantisation): per block of
//!   [`QUANT_BLOCK`] elements, `absmax = max |f32(x)|` (an f32 kept beside
//!   the codes; NaN ignored) and each element's code is the index of the
//!   nearest value of a 256-entry map to `f32(x) / absmax` (0 when
//!   `absmax = 0`); the nearest is found by a binary search over the
//!   midpoints `(map[i] + map[i+1]) · 0.5` (a value on a midpoint takes the
//!   lower code). Widening is `map[code] · absmax` in f32. Signed state
//!   (a first moment, a momentum) uses bitsandbytes' signed dynamic map,
//!   state that is never negative (a second moment) its unsigned map
//!   (`create_dynamic_map(signed)`: 7 decades of linearly spaced means).
//!   Parameters with fewer than [`MIN_8BIT_SIZE`] elements keep their state
//!   in their own dtype, as bitsandbytes' `min_8bit_size`.

use super::algorithm::{dense_range, Algorithm, GradReader};
use super::rule::GradTransform;
use crate::tensor::Layout;
use crate::{DType, Error, FloatDType, Result, Tensor};
use half::bf16;
use std::sync::OnceLock;

/// Elements per quantisation block (one f32 `absmax` each).
pub const QUANT_BLOCK: usize = 2048;

/// Parameters smaller than this keep full-precision state under
/// [`StateFormat::Blockwise8`] (bitsandbytes' `min_8bit_size`).
pub const MIN_8BIT_SIZE: usize = 4096;

/// How an optimizer keeps its per-parameter state tensors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StateFormat {
    /// In the parameter's dtype (f32 state for f32 parameters): the update
    /// is exactly torch.optim's.
    #[default]
    Full,
    /// In bf16: half the bytes of f32 state.
    Bf16,
    /// One byte per element plus one f32 scale per [`QUANT_BLOCK`]
    /// elements (bitsandbytes' block-wise 8-bit state): a quarter of f32
    /// state. Parameters under [`MIN_8BIT_SIZE`] elements keep full state.
    Blockwise8,
}

impl StateFormat {
    /// The name on the command line: `f32`, `bf16`, `8bit`.
    pub fn name(self) -> &'static str {
        match self {
            StateFormat::Full => "f32",
            StateFormat::Bf16 => "bf16",
            StateFormat::Blockwise8 => "8bit",
        }
    }

    /// The format called `name` (`f32`, `bf16`, `8bit`); `op` names the
    /// caller in the error.
    pub fn parse(name: &str, op: &'static str) -> Result<StateFormat> {
        match name {
            "f32" | "full" => Ok(StateFormat::Full),
            "bf16" => Ok(StateFormat::Bf16),
            "8bit" => Ok(StateFormat::Blockwise8),
            _ => Err(Error::InvalidArgument {
                op,
                msg: format!("unknown optimizer state format `{name}`; known: f32, bf16, 8bit"),
            }),
        }
    }

    /// The format a parameter of `numel` elements gets (small parameters
    /// keep full 8-bit state, see [`MIN_8BIT_SIZE`]).
    pub fn for_param(self, numel: usize) -> StateFormat {
        match self {
            StateFormat::Blockwise8 if numel < MIN_8BIT_SIZE => StateFormat::Full,
            f => f,
        }
    }

    /// State tensors per algorithm slot (8-bit: the codes and the scales).
    pub(crate) fn tensors_per_slot(self) -> usize {
        match self {
            StateFormat::Blockwise8 => 2,
            _ => 1,
        }
    }
}

/// Serialised by its command-line name (`"8bit"`).
impl serde::Serialize for StateFormat {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl std::fmt::Display for StateFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A 256-entry quantisation map, sorted ascending.
#[derive(Debug)]
pub struct QuantMap {
    /// The values the codes stand for.
    pub values: [f32; 256],
    /// `mids[i]`: the midpoint between codes `i` and `i + 1` (+∞ for 255).
    mids: [f32; 256],
    /// Per bucket of `|x| <= 1` floats sharing sign, exponent and the top 8
    /// mantissa bits ([`bucket`]): the code of the bucket's least value,
    /// plus [`SEARCH`] where more than one midpoint falls inside it.
    buckets: Box<[u16]>,
}

/// Buckets of [`QuantMap`]: sign × 128 exponents (`|x| <= 1`) × 256.
const BUCKETS: usize = 1 << 16;

/// A bucket entry's flag: encode by the binary search.
const SEARCH: u16 = 1 << 8;

/// The bucket of an `|x| <= 1` float: its sign, its exponent's low 7 bits
/// (the 8th is 0 up to 1.0) and the top 8 bits of its mantissa.
#[inline]
fn bucket(x: f32) -> usize {
    let b = x.to_bits();
    (((b >> 16) & 0x8000) | ((b >> 15) & 0x7fff)) as usize
}

impl QuantMap {
    /// The map of `values` (sorted) with its midpoints and buckets.
    fn new(values: [f32; 256]) -> QuantMap {
        let mut mids = [f32::INFINITY; 256];
        for (m, w) in mids.iter_mut().zip(values.windows(2)) {
            *m = (w[0] + w[1]) * 0.5;
        }
        let mut map = QuantMap {
            values,
            mids,
            buckets: Box::new([]),
        };
        let buckets: Vec<u16> = (0..BUCKETS as u32)
            .map(|i| {
                let bits = ((i & 0x8000) << 16) | ((i & 0x7fff) << 15);
                let (a, b) = (f32::from_bits(bits), f32::from_bits(bits | 0x7fff));
                // For negative floats the larger bits are the lesser value.
                let (lo, hi) = if i & 0x8000 == 0 { (a, b) } else { (b, a) };
                let (c_lo, c_hi) = (map.search(lo), map.search(hi));
                let flag = if c_hi <= c_lo.saturating_add(1) {
                    0
                } else {
                    SEARCH
                };
                u16::from(c_lo) | flag
            })
            .collect();
        map.buckets = buckets.into_boxed_slice();
        map
    }

    /// The code nearest to `x`: the first `i` with `x <= mids[i]` (ties go
    /// to the lower code; the binary search over midpoints that the CUDA
    /// kernel runs too, NaN giving 0). For `|x| <= 1` a table of buckets
    /// answers in one comparison: codes are monotone in `x`, so within a
    /// bucket holding at most one midpoint the code is the bucket's least
    /// value's, or the next one past that midpoint.
    #[inline]
    pub fn encode(&self, x: f32) -> u8 {
        if x.abs() <= 1.0 {
            let e = self.buckets[bucket(x)];
            if e & SEARCH == 0 {
                let c = usize::from(e as u8);
                return (c + usize::from(x > self.mids[c])) as u8;
            }
        }
        self.search(x)
    }

    /// [`QuantMap::encode`] by binary search over the midpoints.
    fn search(&self, x: f32) -> u8 {
        let (mut lo, mut hi) = (0usize, 255usize);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if x > self.mids[mid] {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo as u8
    }
}

/// `torch.linspace(start, end, steps)` in f32, as torch's CPU kernel
/// computes it (from the start for the first half, from the end after).
/// Its AVX2 and AVX-512 builds contract `start + step * i` into one fused
/// multiply-add, which moves some entries by an ulp, so this does too.
fn linspace(start: f32, end: f32, steps: usize) -> Vec<f32> {
    let step = (end - start) / (steps - 1) as f32;
    let half = steps / 2;
    (0..steps)
        .map(|i| {
            if i < half {
                step.mul_add(i as f32, start)
            } else {
                (-step).mul_add((steps - i - 1) as f32, end)
            }
        })
        .collect()
}

/// bitsandbytes' `create_dynamic_map(signed, max_exponent_bits = 7,
/// total_bits = 8)`: for decade `i` of 7, the means of `2^i + 1` (signed)
/// or `2^(i+1) + 1` (unsigned) points spaced linearly over [0.1, 1], times
/// `10^(i-6)` (and negated too when signed); plus 0 and 1, sorted.
fn dynamic_map(signed: bool) -> QuantMap {
    let mut data: Vec<f32> = Vec::with_capacity(256);
    for i in 0..7i32 {
        let items = if signed {
            (1 << i) + 1
        } else {
            (1 << (i + 1)) + 1
        };
        let bounds = linspace(0.1, 1.0, items);
        let scale = 10f64.powf(f64::from(i - 6)) as f32;
        for w in bounds.windows(2) {
            let mean = (w[0] + w[1]) / 2.0;
            data.push(scale * mean);
            if signed {
                data.push(-(scale * mean));
            }
        }
    }
    data.push(0.0);
    data.push(1.0);
    data.resize(256, 0.0);
    data.sort_by(f32::total_cmp);
    let mut values = [0.0f32; 256];
    values.copy_from_slice(&data);
    QuantMap::new(values)
}

/// The map of state that can be negative (bitsandbytes' `dynamic`).
pub fn signed_map() -> &'static QuantMap {
    static MAP: OnceLock<QuantMap> = OnceLock::new();
    MAP.get_or_init(|| dynamic_map(true))
}

/// The map of state that is never negative (bitsandbytes' `udynamic`).
pub fn unsigned_map() -> &'static QuantMap {
    static MAP: OnceLock<QuantMap> = OnceLock::new();
    MAP.get_or_init(|| dynamic_map(false))
}

/// The map of one algorithm slot.
pub(crate) fn slot_map<A: Algorithm>(alg: &A, slot: usize) -> &'static QuantMap {
    if alg.slot_is_nonnegative(slot) {
        unsigned_map()
    } else {
        signed_map()
    }
}

/// Quantises `x` into `codes` with one scale: returns the block's absmax.
pub fn quantize_block<T: FloatDType>(x: &[T], codes: &mut [u8], map: &QuantMap) -> f32 {
    let absmax = x
        .iter()
        .fold(0.0f32, |a, v| a.max(FloatDType::to_f32(*v).abs()));
    for (c, v) in codes.iter_mut().zip(x) {
        *c = if absmax > 0.0 {
            map.encode(FloatDType::to_f32(*v) / absmax)
        } else {
            map.encode(0.0)
        };
    }
    absmax
}

/// The values `codes` stand for under scale `absmax`, into `x`.
pub fn dequantize_block<T: FloatDType>(codes: &[u8], absmax: f32, map: &QuantMap, x: &mut [T]) {
    for (v, &c) in x.iter_mut().zip(codes) {
        *v = T::from_f32(map.values[c as usize] * absmax);
    }
}

/// The state tensors a parameter gets in format `format` (already
/// [`StateFormat::for_param`]): per slot one tensor of the parameter's
/// shape (its dtype, bf16, or u8 codes) and, in 8-bit, its scales.
pub(crate) fn new_state(param: &Tensor, slots: usize, format: StateFormat) -> Result<Vec<Tensor>> {
    let mut tensors = Vec::with_capacity(slots * format.tensors_per_slot());
    for _ in 0..slots {
        match format {
            StateFormat::Full => {
                tensors.push(Tensor::zeros(param.shape(), param.dtype(), param.device())?)
            }
            StateFormat::Bf16 => {
                tensors.push(Tensor::zeros(param.shape(), DType::BF16, param.device())?)
            }
            StateFormat::Blockwise8 => {
                // Zero scales make every code stand for 0.
                tensors.push(Tensor::zeros(param.shape(), DType::U8, param.device())?);
                let blocks = param.numel().div_ceil(QUANT_BLOCK);
                tensors.push(Tensor::zeros(&[blocks], DType::F32, param.device())?);
            }
        }
    }
    Ok(tensors)
}

/// The dtype and element count tensor `i` of a parameter's compact state
/// must have (`numel`: the parameter's elements).
pub(crate) fn expected_tensor(format: StateFormat, i: usize, numel: usize) -> (DType, usize) {
    match format {
        StateFormat::Bf16 => (DType::BF16, numel),
        StateFormat::Blockwise8 if i.is_multiple_of(2) => (DType::U8, numel),
        StateFormat::Blockwise8 => (DType::F32, numel.div_ceil(QUANT_BLOCK)),
        StateFormat::Full => unreachable!("full state is checked as the parameter's"),
    }
}

/// Checks a compact state against its parameter: the count of tensors,
/// each one's dtype, size and device, whole and contiguous, and no two
/// sharing storage (each is locked for writing once).
pub(crate) fn check_state(
    op: &'static str,
    param: &Tensor,
    format: StateFormat,
    state: &[Tensor],
) -> Result<()> {
    let bad = |msg: String| Error::InvalidArgument { op, msg };
    if !state.len().is_multiple_of(format.tensors_per_slot()) {
        return Err(bad(format!(
            "{} state tensors for {format} state",
            state.len()
        )));
    }
    for (i, s) in state.iter().enumerate() {
        let (dtype, numel) = expected_tensor(format, i, param.numel());
        if s.dtype() != dtype || s.numel() != numel {
            return Err(bad(format!(
                "{format} state tensor {i} is {:?} × {}, expected {dtype:?} × {numel}",
                s.dtype(),
                s.numel()
            )));
        }
        if s.device() != param.device() {
            return Err(Error::DeviceMismatch {
                op,
                lhs: param.device(),
                rhs: s.device(),
            });
        }
        if !s.is_contiguous() || s.numel() != s.storage().len() {
            return Err(bad(
                "optimizer state must be a whole contiguous tensor".into()
            ));
        }
        if s.shares_storage_with(param) || state[..i].iter().any(|o| o.shares_storage_with(s)) {
            return Err(bad(
                "optimizer state shares storage with other tensors".into()
            ));
        }
    }
    Ok(())
}

/// One slot's compact state on the host.
pub(crate) enum HostSlot<'a> {
    /// bf16 values.
    Bf16(&'a mut [bf16]),
    /// 8-bit codes, one scale per block, and the slot's map.
    Quantized {
        codes: &'a mut [u8],
        absmax: &'a mut [f32],
        map: &'static QuantMap,
    },
}

/// One block's part of a [`HostSlot`].
enum BlockSlot<'a> {
    Bf16(&'a mut [bf16]),
    Quantized {
        codes: &'a mut [u8],
        absmax: &'a mut f32,
        map: &'static QuantMap,
    },
}

impl BlockSlot<'_> {
    fn widen<T: FloatDType>(&self, out: &mut [T]) {
        match self {
            BlockSlot::Bf16(s) => {
                for (o, v) in out.iter_mut().zip(s.iter()) {
                    *o = T::from_f32(v.to_f32());
                }
            }
            BlockSlot::Quantized { codes, absmax, map } => {
                dequantize_block(codes, **absmax, map, out)
            }
        }
    }

    fn narrow<T: FloatDType>(&mut self, x: &[T]) {
        match self {
            BlockSlot::Bf16(s) => {
                for (o, v) in s.iter_mut().zip(x) {
                    *o = bf16::from_f32(FloatDType::to_f32(*v));
                }
            }
            BlockSlot::Quantized { codes, absmax, map } => {
                **absmax = quantize_block(x, codes, map);
            }
        }
    }
}

/// One task's blocks: the first element's index, the parameter's elements
/// and each slot's part.
type Task<'a, T> = (usize, &'a mut [T], Vec<Vec<BlockSlot<'a>>>);

/// The update of a parameter with compact state: per block of
/// [`QUANT_BLOCK`] elements, the state widened to `T`, `alg`'s update, the
/// state narrowed back; blocks in parallel (the update is elementwise, so
/// the values are those of one pass). A strided gradient is gathered block
/// by block.
pub(crate) fn update_host<T: FloatDType, A: Algorithm>(
    alg: &A,
    step: u64,
    p: &mut [T],
    g: &[T],
    glayout: &Layout,
    transform: GradTransform,
    slots: Vec<HostSlot<'_>>,
) {
    use rayon::prelude::*;
    // Blocks per rayon task: 16 × 2048 elements.
    const TASK_BLOCKS: usize = 16;
    let n = p.len();
    let mut tasks: Vec<Task<'_, T>> = p
        .chunks_mut(QUANT_BLOCK * TASK_BLOCKS)
        .enumerate()
        .map(|(i, c)| (i * QUANT_BLOCK * TASK_BLOCKS, c, Vec::new()))
        .collect();
    for slot in slots {
        let parts: Vec<Vec<BlockSlot<'_>>> = match slot {
            HostSlot::Bf16(s) => s
                .chunks_mut(QUANT_BLOCK * TASK_BLOCKS)
                .map(|c| c.chunks_mut(QUANT_BLOCK).map(BlockSlot::Bf16).collect())
                .collect(),
            HostSlot::Quantized { codes, absmax, map } => codes
                .chunks_mut(QUANT_BLOCK * TASK_BLOCKS)
                .zip(absmax.chunks_mut(TASK_BLOCKS))
                .map(|(c, a)| {
                    c.chunks_mut(QUANT_BLOCK)
                        .zip(a.iter_mut())
                        .map(|(codes, absmax)| BlockSlot::Quantized { codes, absmax, map })
                        .collect()
                })
                .collect(),
        };
        for (task, part) in tasks.iter_mut().zip(parts) {
            task.2.push(part);
        }
    }
    let contiguous = glayout.contiguous_range();
    let run = |(start, p, mut slots): Task<'_, T>| {
        let mut wide: Vec<Vec<T>> = slots.iter().map(|_| vec![T::zero(); QUANT_BLOCK]).collect();
        for (b, pb) in p.chunks_mut(QUANT_BLOCK).enumerate() {
            let len = pb.len();
            let dense = dense_range(g, glayout, &contiguous, start + b * QUANT_BLOCK, len);
            for (w, s) in wide.iter_mut().zip(&slots) {
                s[b].widen(&mut w[..len]);
            }
            let mut views: Vec<&mut [T]> = wide.iter_mut().map(|w| &mut w[..len]).collect();
            alg.update(step, pb, &GradReader::dense(&dense, transform), &mut views);
            for (w, s) in wide.iter().zip(slots.iter_mut()) {
                s[b].narrow(&w[..len]);
            }
        }
    };
    if crate::primitives::parallel(n) {
        tasks.into_par_iter().for_each(run);
    } else {
        tasks.into_iter().for_each(run);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The maps have 256 sorted entries with 0 and ±1 where bitsandbytes
    /// puts them, and every value encodes to its own code.
    #[test]
    fn maps_are_sorted_and_encode_their_own_values() {
        for (map, low) in [(signed_map(), -1.0f32), (unsigned_map(), 0.0)] {
            assert!(map.values.windows(2).all(|w| w[0] <= w[1]));
            assert_eq!(map.values[255], 1.0);
            assert!(map.values[0] >= low && map.values[0] < low + 0.01);
            for (i, &v) in map.values.iter().enumerate() {
                let c = map.encode(v) as usize;
                assert_eq!(map.values[c], v, "code {i}");
            }
        }
        // The unsigned map's low end is padding zeros and 0 itself.
        assert_eq!(unsigned_map().encode(0.0), 0);
        assert_eq!(signed_map().values[signed_map().encode(0.0) as usize], 0.0);
    }

    /// A block round-trips within half the map's local spacing, and its
    /// largest element exactly.
    #[test]
    fn buckets_encode_as_the_binary_search_does() {
        for map in [signed_map(), unsigned_map()] {
            let flagged = map.buckets.iter().filter(|&&e| e & SEARCH != 0).count();
            assert!(flagged < 64, "{flagged} buckets need the search");
            let mut xs: Vec<f32> = Vec::new();
            for &m in &map.mids[..255] {
                xs.extend([
                    m,
                    f32::from_bits(m.to_bits() + 1),
                    f32::from_bits(m.to_bits() - 1),
                ]);
            }
            xs.extend(map.values);
            xs.extend((0..200_000).map(|i| ((i as f32) * 0.618_034).fract() * 2.0 - 1.0));
            xs.extend((0..2000).map(|i| 1e-9 * i as f32));
            xs.extend([0.0, -0.0, 1.0, -1.0, f32::NAN, 2.0, -3.0, f32::INFINITY]);
            for x in xs {
                assert_eq!(map.encode(x), map.search(x), "{x:e}");
            }
        }
    }

    #[test]
    fn quantize_then_dequantize_is_close() {
        let mut x: Vec<f32> = (0..QUANT_BLOCK)
            .map(|i| ((i as f32) * 0.37).sin() * 3.0)
            .collect();
        // The signed map holds +1 but not -1 (bitsandbytes' map is
        // asymmetric), so only a positive absmax element comes back exactly.
        x[7] = 3.5;
        let mut codes = vec![0u8; QUANT_BLOCK];
        let absmax = quantize_block(&x, &mut codes, signed_map());
        let mut back = vec![0f32; QUANT_BLOCK];
        dequantize_block(&codes, absmax, signed_map(), &mut back);
        let (i_max, _) =
            x.iter().enumerate().fold(
                (0, 0.0f32),
                |(j, m), (i, v)| if v.abs() > m { (i, v.abs()) } else { (j, m) },
            );
        assert_eq!(back[i_max], x[i_max]);
        for (a, b) in x.iter().zip(&back) {
            // Half the map's largest gap (where one decade meets the
            // next, 0.0084 of the scale at 0.1) bounds the error.
            assert!((a - b).abs() <= 0.0075 * absmax, "{a} vs {b}");
        }
    }
}
