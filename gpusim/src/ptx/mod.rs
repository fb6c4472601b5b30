//! The PTX interpreter: a module of PTX text is parsed once into a decoded
//! form (every opcode validated at load time), and kernels are launched
//! over grids of blocks of warps of 32 lanes, with the sanitizer's checks
//! on every access.
//!
//! This file is the interface the driver (`crate::driver`) uses.
//!
//! Design: `parse` splits statements, `decode`/`opcode` resolve every
//! name to a register slot, an address or a frame offset and pick one
//! monomorphized lane function per instruction (`alu`); `cfg` computes
//! each branch's reconvergence point (immediate post-dominator); `exec`
//! runs warps in lockstep with a SIMT stack (registers `[slot][lane]`,
//! predicates as lane bit masks), `mem` does the memory spaces and the
//! sanitizer, `launch` the grid.
//!
//! Semantics chosen where the ISA leaves freedom (visible to kernels):
//! integer division by zero gives all ones (remainder: the dividend);
//! `.rn` f32/f64 add/sub/mul/div/sqrt/fma are native IEEE operations (NaN
//! payloads as the host produces them); every other float operation goes
//! through [`crate::numeric`]; blocks run one after another and warps of a
//! block one at a time between barriers, so atomics are applied in lane
//! order. A thread whose path branches into a kernel `ret`/`exit` exits at
//! once (exited threads count as arrived at barriers); a `bar.sync` reached
//! by part of a warp's live lanes is a [`FaultKind::DivergentBarrier`], as
//! is a `vote.sync` whose member mask names live lanes that are not there
//! (and the other warp-synchronous instructions, see `exec_warp`; `mma`
//! and `ldmatrix` need all 32 lanes, see `exec_mma`, which also gives the
//! accumulation order of `mma`). A `cp.async` reads global memory when
//! issued and writes shared memory when a wait covers it (`exec_async`).
//! Kernel parameters, shared and local memory have generic-address windows
//! ([`PARAM_WIN`], [`SHARED_WIN`], [`LOCAL_WIN`]); a global address is its
//! own generic address.

// Lane loops index several per-lane arrays by the lane number: a range loop
// says that more plainly than zipped iterators.
#![allow(clippy::needless_range_loop)]

use crate::memory::DeviceMemory;
use std::fmt;

/// A PTX module failed to load: the line and what was wrong (an
/// unsupported opcode names itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadError {
    /// 1-based line in the PTX text.
    pub line: usize,
    /// What was wrong.
    pub message: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PTX line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for LoadError {}

/// The byte size and alignment of one kernel parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    /// Bytes.
    pub size: usize,
    /// Alignment in bytes.
    pub align: usize,
}

mod alu;
mod cfg;
mod decode;
mod exec;
mod exec_assert;
mod exec_async;
mod exec_half;
mod exec_mma;
mod exec_warp;
mod ir;
mod launch;
mod mem;
mod opcode;
mod opcode_async;
mod opcode_cmp;
mod opcode_half;
mod opcode_mem;
mod opcode_mma;
mod opcode_warp;
mod parse;

/// Generic-address window of the kernel's parameters (what `mov` of a
/// kernel parameter's name gives; `ld.param` through a register).
pub const PARAM_WIN: u64 = 0x0300_0000_0000_0000;
/// Generic-address window of shared memory (`cvta.shared`).
pub const SHARED_WIN: u64 = 0x0100_0000_0000_0000;
/// Generic-address window of local memory (`cvta.local`).
pub const LOCAL_WIN: u64 = 0x0200_0000_0000_0000;

/// A loaded module: its kernels, decoded, and the device addresses of its
/// `.global` variables.
pub struct Module {
    d: decode::Decoded,
    /// Function index of each kernel (by [`KernelId`]).
    kernels: Vec<usize>,
    /// Parameters of each kernel.
    specs: Vec<Vec<ParamSpec>>,
}

/// Index of a kernel (`.entry`) in its module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelId(pub usize);

impl Module {
    /// Parses and validates `text` (PTX as NVRTC writes it), allocating and
    /// initialising its module-scope `.global` variables in `mem`.
    pub fn load(text: &str, mem: &mut DeviceMemory) -> Result<Module, LoadError> {
        let raw = parse::parse(text)?;
        let d = decode::decode(raw, mem)?;
        let kernels: Vec<usize> = (0..d.funcs.len())
            .filter(|&i| d.funcs[i].is_entry)
            .collect();
        let specs = kernels
            .iter()
            .map(|&f| d.funcs[f].kparams.iter().map(|p| p.1).collect())
            .collect();
        Ok(Module { d, kernels, specs })
    }

    /// Frees the module's `.global` variables.
    pub fn unload(&self, mem: &mut DeviceMemory) {
        for &g in &self.d.globals {
            let _ = mem.free(g);
        }
    }

    /// The kernel named `name`.
    pub fn kernel(&self, name: &str) -> Option<KernelId> {
        self.kernels
            .iter()
            .position(|&f| self.d.funcs[f].name == name)
            .map(KernelId)
    }

    /// Names of all kernels, in order of their [`KernelId`].
    pub fn kernel_names(&self) -> Vec<&str> {
        self.kernels
            .iter()
            .map(|&f| self.d.funcs[f].name.as_str())
            .collect()
    }

    /// The kernel's name.
    pub fn kernel_name(&self, k: KernelId) -> &str {
        &self.d.funcs[self.kernels[k.0]].name
    }

    /// The kernel's parameters, in order.
    pub fn params(&self, k: KernelId) -> &[ParamSpec] {
        &self.specs[k.0]
    }

    /// Bytes of static `.shared` memory the kernel declares.
    pub fn static_shared_bytes(&self, k: KernelId) -> usize {
        self.d.funcs[self.kernels[k.0]].shared_bytes as usize
    }
}

/// Grid and block shape of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDims {
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Bytes of dynamic shared memory.
    pub dynamic_shared_bytes: u32,
}

/// What a launch did, for throughput figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchStats {
    /// Instructions executed, summed over active lanes.
    pub thread_instructions: u64,
    /// Warp-instructions issued.
    pub warp_instructions: u64,
}

/// The kind of a sanitizer finding or execution fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// memcheck: outside every live allocation (or a freed one).
    OutOfBounds,
    /// memcheck: address not aligned to the access size.
    Misaligned,
    /// initcheck: a read of device bytes never written.
    Uninitialized,
    /// racecheck: a shared-memory hazard between two barriers, an access
    /// of bytes a `cp.async` has not yet written, or a copy never waited for.
    SharedRace,
    /// synccheck: a barrier reached by only part of a block, or a
    /// warp-synchronous instruction (`shfl`/`vote`/`redux`/`match.sync`)
    /// with members not converged, a shuffle reading a lane that does
    /// not take part, or an `mma`/`ldmatrix`/`stmatrix` without all 32 lanes.
    DivergentBarrier,
    /// `trap` executed, or another fault (bad parameter size, …).
    Trap,
    /// A device `assert` failed (`__assertfail` called): the detail
    /// quotes file, line, function and message.
    Assert,
    /// An instruction form the interpreter does not support at run time.
    Unsupported,
}

/// A failed launch: what, where (kernel, block, thread, instruction),
/// which address and what it is nearest to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The kind.
    pub kind: FaultKind,
    /// The kernel.
    pub kernel: String,
    /// The block index.
    pub block: [u32; 3],
    /// The thread index in its block.
    pub thread: [u32; 3],
    /// The PTX line and its text.
    pub instruction: String,
    /// The address involved, if any.
    pub address: Option<u64>,
    /// Everything else (the allocation it is nearest to, the other thread
    /// of a race, …).
    pub detail: String,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} in kernel {} block ({},{},{}) thread ({},{},{}) at `{}`",
            self.kind,
            self.kernel,
            self.block[0],
            self.block[1],
            self.block[2],
            self.thread[0],
            self.thread[1],
            self.thread[2],
            self.instruction
        )?;
        if let Some(a) = self.address {
            write!(f, " address {a:#x}")?;
        }
        write!(f, ": {}", self.detail)
    }
}

impl std::error::Error for Fault {}

/// Runs kernel `k` of `module` over `dims`, with `params[i]` the bytes of
/// parameter `i` (sizes must match [`Module::params`]), against `mem`.
pub fn launch(
    module: &Module,
    k: KernelId,
    dims: &LaunchDims,
    params: &[&[u8]],
    mem: &mut DeviceMemory,
) -> Result<LaunchStats, Fault> {
    launch::launch(module, k, dims, params, mem, false).map(|(s, _)| s)
}

/// [`launch`], also counting what the profile records of it.
pub fn launch_profiled(
    module: &Module,
    k: KernelId,
    dims: &LaunchDims,
    params: &[&[u8]],
    mem: &mut DeviceMemory,
) -> Result<(LaunchStats, crate::profile::LaunchCounters), Fault> {
    launch::launch(module, k, dims, params, mem, true).map(|(s, c)| (s, c.unwrap_or_default()))
}
