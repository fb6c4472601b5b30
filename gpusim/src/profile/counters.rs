//! What the interpreter counts for one launch when profiling: instructions
//! by class, floating-point operations, global-memory requests and the
//! 32-byte sectors they touch, shared-memory requests and the wavefronts
//! their bank conflicts cost.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Number of [`InstClass`]es.
pub const CLASSES: usize = 12;

/// The class of a PTX instruction, by what unit runs it and what it costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstClass {
    /// f32 arithmetic and comparisons (add, mul, fma, min, setp.f32, …).
    F32,
    /// f64 arithmetic and comparisons.
    F64,
    /// f16/bf16 (and packed x2) arithmetic and comparisons.
    F16,
    /// Integer and bit arithmetic, moves, selects, predicates.
    Int,
    /// Integer division and remainder (a long instruction sequence on the
    /// hardware, about 20 instructions for 32 bits and 70 for 64).
    IntDivRem,
    /// Correctly rounded float division and square root (sequences too).
    FloatDivSqrt,
    /// Approximate and transcendental functions (ex2, lg2, sin, cos, rcp,
    /// rsqrt, tanh: the special-function unit).
    Transcendental,
    /// Conversions between types (`cvt`).
    Convert,
    /// Tensor-core matrix instructions (`mma`, `wgmma`, `ldmatrix`).
    TensorCore,
    /// Shared-memory accesses (`ld/st/atom .shared`).
    Shared,
    /// Global-memory accesses (`ld/st/atom/red .global` and generic ones).
    Global,
    /// Branches, barriers, calls, returns, warp votes and shuffles, and
    /// kernel-parameter and local-memory accesses.
    Control,
}

impl InstClass {
    /// Every class, in index order.
    pub const ALL: [InstClass; CLASSES] = [
        InstClass::F32,
        InstClass::F64,
        InstClass::F16,
        InstClass::Int,
        InstClass::IntDivRem,
        InstClass::FloatDivSqrt,
        InstClass::Transcendental,
        InstClass::Convert,
        InstClass::TensorCore,
        InstClass::Shared,
        InstClass::Global,
        InstClass::Control,
    ];

    /// Index into per-class arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The name used in the JSON and the tables.
    pub fn name(self) -> &'static str {
        match self {
            InstClass::F32 => "f32",
            InstClass::F64 => "f64",
            InstClass::F16 => "f16",
            InstClass::Int => "int",
            InstClass::IntDivRem => "int_div_rem",
            InstClass::FloatDivSqrt => "float_div_sqrt",
            InstClass::Transcendental => "transcendental",
            InstClass::Convert => "convert",
            InstClass::TensorCore => "tensor_core",
            InstClass::Shared => "shared",
            InstClass::Global => "global",
            InstClass::Control => "control",
        }
    }
}

/// The class of the instruction whose opcode (with modifiers, as written,
/// e.g. `fma.rn.f32`, `ld.global.nc.v4.f32`) is `opcode`, and the
/// floating-point operations one thread of it performs (fma and mad count
/// 2, add/sub/mul/div/sqrt 1, a tensor-core m16n8kK mma 2·16·8·K/32 per
/// thread, everything else 0).
pub fn classify(opcode: &str) -> (InstClass, u32) {
    let mut parts = opcode.split('.');
    let base = parts.next().unwrap_or("");
    let mods: Vec<&str> = parts.collect();
    let has = |m: &str| mods.contains(&m);
    let float = |c: InstClass| {
        let flops = match base {
            "fma" | "mad" => 2,
            "add" | "sub" | "mul" | "div" | "sqrt" => 1,
            _ => 0,
        };
        let packed = mods.iter().any(|m| m.ends_with("x2"));
        (c, if packed { flops * 2 } else { flops })
    };
    match base {
        "ld" | "st" | "atom" | "red" | "prefetch" | "cp" => {
            if has("shared") {
                (InstClass::Shared, 0)
            } else if has("param") || has("local") {
                (InstClass::Control, 0)
            } else {
                (InstClass::Global, 0)
            }
        }
        "mma" | "wgmma" => (InstClass::TensorCore, mma_flops(&mods)),
        "ldmatrix" | "stmatrix" => (InstClass::TensorCore, 0),
        "bra" | "bar" | "barrier" | "ret" | "exit" | "call" | "vote" | "shfl" | "match"
        | "redux" | "trap" | "membar" | "fence" | "brkpt" | "nanosleep" => (InstClass::Control, 0),
        "cvt" | "cvta" => (InstClass::Convert, 0),
        "ex2" | "lg2" | "sin" | "cos" | "rcp" | "rsqrt" | "tanh" => (InstClass::Transcendental, 0),
        "div" | "rem" if !mods.iter().any(|m| is_float_type(m)) => (InstClass::IntDivRem, 0),
        "div" | "sqrt" if has("approx") || has("full") => float(InstClass::Transcendental),
        "div" | "sqrt" => float(InstClass::FloatDivSqrt),
        _ => {
            if has("f64") {
                float(InstClass::F64)
            } else if mods
                .iter()
                .any(|m| matches!(*m, "f16" | "bf16" | "f16x2" | "bf16x2"))
            {
                float(InstClass::F16)
            } else if has("f32") {
                float(InstClass::F32)
            } else {
                (InstClass::Int, 0)
            }
        }
    }
}

fn is_float_type(m: &str) -> bool {
    matches!(m, "f32" | "f64" | "f16" | "bf16" | "f16x2" | "bf16x2")
}

/// FLOPs per thread of an `mma.sync` of shape `mMnNkK` (the warp's
/// 2·M·N·K spread over 32 lanes).
fn mma_flops(mods: &[&str]) -> u32 {
    let shape = mods.iter().find(|m| m.starts_with('m') && m.contains('k'));
    let Some(shape) = shape else { return 0 };
    let num = |after: char, until: char| -> Option<u32> {
        let s = &shape[shape.find(after)? + 1..];
        s[..s.find(until).unwrap_or(s.len())].parse().ok()
    };
    match (num('m', 'n'), num('n', 'k'), num('k', '.')) {
        (Some(m), Some(n), Some(k)) => 2 * m * n * k / 32,
        _ => 0,
    }
}

/// Which float unit a FLOP count belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlopUnit {
    /// f32 on the CUDA cores.
    F32,
    /// f64.
    F64,
    /// f16/bf16 on the CUDA cores.
    F16,
    /// Tensor cores.
    TensorCore,
}

/// The unit whose FLOPs class `c` counts, if any.
pub fn flop_unit(c: InstClass) -> Option<FlopUnit> {
    match c {
        InstClass::F32 | InstClass::FloatDivSqrt => Some(FlopUnit::F32),
        InstClass::F64 => Some(FlopUnit::F64),
        InstClass::F16 => Some(FlopUnit::F16),
        InstClass::TensorCore => Some(FlopUnit::TensorCore),
        _ => None,
    }
}

/// What one launch did, counted by the interpreter.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LaunchCounters {
    /// Thread-instructions (summed over active lanes) per [`InstClass`].
    pub thread_instructions: [u64; CLASSES],
    /// Warp-instructions issued per [`InstClass`].
    pub warp_instructions: [u64; CLASSES],
    /// Floating-point operations per [`InstClass`] (f32, f64, f16 and
    /// tensor-core classes carry them).
    pub flops: [u64; CLASSES],
    /// Warp-level global load requests (one per warp-instruction).
    pub global_load_requests: u64,
    /// Warp-level global store and atomic requests.
    pub global_store_requests: u64,
    /// 32-byte sectors those requests touched, summed over requests
    /// (sectors per request = this / requests; 4 is ideal for 4-byte
    /// accesses by 32 lanes).
    pub global_sectors: u64,
    /// Distinct 32-byte sectors the launch touched: a lower bound on its
    /// DRAM traffic (`× 32` bytes).
    pub unique_sectors: u64,
    /// Warp-level shared-memory requests.
    pub shared_requests: u64,
    /// Shared-memory wavefronts those requests took (= requests without
    /// bank conflicts).
    pub shared_wavefronts: u64,
}

impl LaunchCounters {
    /// Thread-instructions of every class.
    pub fn total_thread_instructions(&self) -> u64 {
        self.thread_instructions.iter().sum()
    }

    /// Warp-instructions of every class.
    pub fn total_warp_instructions(&self) -> u64 {
        self.warp_instructions.iter().sum()
    }

    /// FLOPs counted for `unit`.
    pub fn flops_of(&self, unit: FlopUnit) -> u64 {
        InstClass::ALL
            .iter()
            .filter(|c| flop_unit(**c) == Some(unit))
            .map(|c| self.flops[c.index()])
            .sum()
    }
}

/// Sectors of 2^16 × 32 bytes (2 MiB) per chunk of the sparse bitmap.
const CHUNK_SECTORS: u64 = 1 << 16;

/// The interpreter's counting state for one launch: the counters and the
/// set of sectors touched (a sparse bitmap, 2 MiB of address space per
/// chunk).
#[derive(Default)]
pub struct Counting {
    /// The counters.
    pub c: LaunchCounters,
    touched: HashMap<u64, Box<[u64]>>,
}

impl Counting {
    /// Counts one global request by the lanes of `mask`, lane `l` touching
    /// `bytes` bytes from `addrs[l]`.
    pub fn global_request(&mut self, mask: u32, addrs: &[u64; 32], bytes: u64, store: bool) {
        if store {
            self.c.global_store_requests += 1;
        } else {
            self.c.global_load_requests += 1;
        }
        let mut sectors = [0u64; 128];
        let mut n = 0;
        for (l, &a) in addrs.iter().enumerate() {
            if mask >> l & 1 == 0 {
                continue;
            }
            let (first, last) = (a >> 5, (a + bytes.max(1) - 1) >> 5);
            for s in first..=last.min(first + 3) {
                sectors[n] = s;
                n += 1;
            }
        }
        let sectors = &mut sectors[..n];
        sectors.sort_unstable();
        let mut distinct = 0;
        let mut prev = u64::MAX;
        for &s in sectors.iter() {
            if s != prev {
                distinct += 1;
                prev = s;
                self.touch(s);
            }
        }
        self.c.global_sectors += distinct;
    }

    fn touch(&mut self, sector: u64) {
        let chunk = self
            .touched
            .entry(sector / CHUNK_SECTORS)
            .or_insert_with(|| vec![0u64; (CHUNK_SECTORS / 64) as usize].into_boxed_slice());
        let i = (sector % CHUNK_SECTORS) as usize;
        chunk[i / 64] |= 1 << (i % 64);
    }

    /// Counts one shared request by the lanes of `mask` at shared offsets
    /// `addrs` of `bytes` each: the wavefronts are the most distinct 4-byte
    /// words any of the 32 banks must serve (lanes reading one word share
    /// it), at least one per 128 bytes of distinct words.
    pub fn shared_request(&mut self, mask: u32, addrs: &[u64; 32], bytes: u64) {
        self.c.shared_requests += 1;
        let words_per_lane = bytes.div_ceil(4).clamp(1, 4);
        let mut words = [0u64; 128];
        let mut n = 0;
        for (l, &a) in addrs.iter().enumerate() {
            if mask >> l & 1 == 0 {
                continue;
            }
            for w in 0..words_per_lane {
                words[n] = (a >> 2) + w;
                n += 1;
            }
        }
        let words = &mut words[..n];
        words.sort_unstable();
        let mut per_bank = [0u32; 32];
        let mut distinct = 0u64;
        let mut prev = u64::MAX;
        for &w in words.iter() {
            if w != prev {
                per_bank[(w % 32) as usize] += 1;
                distinct += 1;
                prev = w;
            }
        }
        let worst = per_bank.iter().copied().max().unwrap_or(0) as u64;
        self.c.shared_wavefronts += worst.max(distinct.div_ceil(32)).max(1);
    }

    /// The counters, with the distinct sectors counted.
    pub fn finish(mut self) -> LaunchCounters {
        self.c.unique_sectors = self
            .touched
            .values()
            .flat_map(|c| c.iter())
            .map(|w| w.count_ones() as u64)
            .sum();
        self.c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_fall_in_their_classes() {
        assert_eq!(classify("fma.rn.f32"), (InstClass::F32, 2));
        assert_eq!(classify("add.f32"), (InstClass::F32, 1));
        assert_eq!(classify("setp.lt.f32"), (InstClass::F32, 0));
        assert_eq!(classify("add.rn.f64"), (InstClass::F64, 1));
        assert_eq!(classify("fma.rn.f16x2"), (InstClass::F16, 4));
        assert_eq!(classify("add.s64"), (InstClass::Int, 0));
        assert_eq!(classify("div.s64"), (InstClass::IntDivRem, 0));
        assert_eq!(classify("rem.u32"), (InstClass::IntDivRem, 0));
        assert_eq!(classify("div.rn.f32"), (InstClass::FloatDivSqrt, 1));
        assert_eq!(classify("div.approx.f32"), (InstClass::Transcendental, 1));
        assert_eq!(
            classify("ex2.approx.ftz.f32"),
            (InstClass::Transcendental, 0)
        );
        assert_eq!(classify("cvt.rn.f32.s32"), (InstClass::Convert, 0));
        assert_eq!(classify("ld.global.nc.v4.f32"), (InstClass::Global, 0));
        assert_eq!(classify("ld.shared.f32"), (InstClass::Shared, 0));
        assert_eq!(classify("ld.param.u64"), (InstClass::Control, 0));
        assert_eq!(classify("st.local.u32"), (InstClass::Control, 0));
        assert_eq!(classify("ld.f32"), (InstClass::Global, 0));
        assert_eq!(classify("bra.uni"), (InstClass::Control, 0));
        assert_eq!(
            classify("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
            (InstClass::TensorCore, 64)
        );
    }

    #[test]
    fn sectors_per_request_follow_coalescing() {
        let mut c = Counting::default();
        // 32 lanes reading consecutive f32s from an aligned base: 4 sectors.
        let addrs: [u64; 32] = std::array::from_fn(|l| 0x1000 + 4 * l as u64);
        c.global_request(!0, &addrs, 4, false);
        // The same words again: no new unique sector.
        c.global_request(!0, &addrs, 4, false);
        // A stride of 128 bytes: one sector per lane.
        let strided: [u64; 32] = std::array::from_fn(|l| 0x10000 + 128 * l as u64);
        c.global_request(!0, &strided, 4, true);
        let r = c.finish();
        assert_eq!(r.global_load_requests, 2);
        assert_eq!(r.global_store_requests, 1);
        assert_eq!(r.global_sectors, 4 + 4 + 32);
        assert_eq!(r.unique_sectors, 4 + 32);
    }

    #[test]
    fn bank_conflicts_cost_wavefronts() {
        let mut c = Counting::default();
        let linear: [u64; 32] = std::array::from_fn(|l| 4 * l as u64);
        c.shared_request(!0, &linear, 4);
        assert_eq!(c.c.shared_wavefronts, 1);
        // Stride of 32 words: every lane in bank 0, 32 different words.
        let column: [u64; 32] = std::array::from_fn(|l| 128 * l as u64);
        c.shared_request(!0, &column, 4);
        assert_eq!(c.c.shared_wavefronts, 1 + 32);
        // All lanes reading one word: a broadcast.
        c.shared_request(!0, &[64; 32], 4);
        assert_eq!(c.c.shared_wavefronts, 1 + 32 + 1);
        // 16-byte accesses by 32 lanes: 512 bytes, 4 wavefronts at best.
        let wide: [u64; 32] = std::array::from_fn(|l| 16 * l as u64);
        c.shared_request(!0, &wide, 16);
        assert_eq!(c.c.shared_wavefronts, 1 + 32 + 1 + 4);
        assert_eq!(c.c.shared_requests, 4);
    }
}
