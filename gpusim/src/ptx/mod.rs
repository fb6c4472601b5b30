//! The PTX interpreter: a module of PTX text is parsed once into a decoded
//! form (every opcode validated at load time), and kernels are launched
//! over grids of blocks of warps of 32 lanes, with the sanitizer's checks
//! on every access.
//!
//! This file is the interface the driver (`crate::driver`) uses.

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

/// A loaded module: its kernels, decoded.
pub struct Module {
    _private: (),
}

/// Index of a kernel (`.entry`) in its module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelId(pub usize);

impl Module {
    /// Parses and validates `text` (PTX as NVRTC writes it), allocating
    /// the module's `.global` data in `mem`.
    pub fn load(text: &str, mem: &mut DeviceMemory) -> Result<Module, LoadError> {
        let _ = (text, mem);
        todo!("ptx::Module::load")
    }

    /// Frees the module's `.global` data in `mem`.
    pub fn unload(&self, mem: &mut DeviceMemory) {
        let _ = mem;
        todo!("ptx::Module::unload")
    }

    /// The kernel named `name`.
    pub fn kernel(&self, name: &str) -> Option<KernelId> {
        let _ = name;
        todo!("ptx::Module::kernel")
    }

    /// The kernel's name.
    pub fn kernel_name(&self, k: KernelId) -> &str {
        let _ = k;
        todo!("ptx::Module::kernel_name")
    }

    /// The kernel's parameters, in order.
    pub fn params(&self, k: KernelId) -> &[ParamSpec] {
        let _ = k;
        todo!("ptx::Module::params")
    }

    /// Bytes of static `.shared` memory the kernel declares.
    pub fn static_shared_bytes(&self, k: KernelId) -> usize {
        let _ = k;
        todo!("ptx::Module::static_shared_bytes")
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
    /// racecheck: a shared-memory hazard between two barriers.
    SharedRace,
    /// synccheck: a barrier reached by only part of a block.
    DivergentBarrier,
    /// `trap` executed, or another fault (bad parameter size, …).
    Trap,
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
    let _ = (module, k, dims, params, mem);
    todo!("ptx::launch")
}
