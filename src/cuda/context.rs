//! Opening CUDA devices: library checks, one context + stream per ordinal,
//! kernel modules and the cuBLAS handle, all created once per process.

use super::nvrtc::{self, ImageKind};
use crate::{Device, Error, Result};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// The oldest compute capability the kernels are written for (Ampere):
/// bf16 atomics and `compute_80` PTX.
pub const MIN_COMPUTE_CAPABILITY: (i32, i32) = (8, 0);

/// The name the simulated GPU (`gpusim/`) reports for its devices
/// (`cuDeviceGetName`); a device of that name is given PTX (see
/// [`kernel_image`]).
pub const SIMULATOR_NAME: &str = "leangrad gpusim";

/// What kernels are compiled to for a device named `name`: the one place
/// where the simulated GPU is told apart from a real one. A GPU gets a
/// CUBIN for its exact architecture (`sm_XY`), which loads on any driver of
/// the CUDA major version NVRTC belongs to and needs no JIT at load time.
/// The simulated GPU interprets PTX and refuses CUBIN (machine code for a
/// real chip), so it gets PTX for the virtual architecture `compute_XY` of
/// its reported compute capability — the same PTX NVRTC writes inside an
/// `sm_XY` compile. Decided by the name the driver reports, never by an
/// environment variable, so a run cannot load the wrong kind by accident.
pub fn kernel_image(name: &str) -> ImageKind {
    if name == SIMULATOR_NAME {
        ImageKind::Ptx
    } else {
        ImageKind::Cubin
    }
}

/// The driver's memory-pool counters for one device, in bytes
/// ([`CudaDevice::pool_usage`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolUsage {
    /// Bytes of live allocations from the pool.
    pub used: u64,
    /// The most bytes in use at once since the last reset.
    pub used_high: u64,
    /// Bytes the pool holds from the device (used or cached for reuse).
    pub reserved: u64,
    /// The most bytes reserved at once since the last reset.
    pub reserved_high: u64,
}

/// Which CUDA libraries can be loaded: `Ok` when libcuda, libnvrtc and
/// libcublas all are, otherwise the list of those that are missing. Checked
/// once per process.
pub fn library_status() -> std::result::Result<(), String> {
    static STATUS: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    STATUS
        .get_or_init(|| {
            // SAFETY: these only try dlopen on the library names; nothing is
            // called in the libraries.
            let present = unsafe {
                [
                    (
                        "libcuda (the NVIDIA driver)",
                        cudarc::driver::sys::is_culib_present(),
                    ),
                    ("libnvrtc", cudarc::nvrtc::sys::is_culib_present()),
                    ("libcublas", cudarc::cublas::sys::is_culib_present()),
                ]
            };
            let missing: Vec<&str> = present.iter().filter(|p| !p.1).map(|p| p.0).collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "cannot load {} (searched LD_LIBRARY_PATH and the ldconfig cache)",
                    missing.join(", ")
                ))
            }
        })
        .clone()
}

/// An open CUDA device: context, its one stream, loaded kernels, cuBLAS.
pub struct CudaDevice {
    ordinal: usize,
    stream: Arc<CudaStream>,
    compute: (i32, i32),
    image: ImageKind,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    functions: Mutex<HashMap<(&'static str, String), CudaFunction>>,
    blas: Mutex<Option<CudaBlas>>,
    pub(super) checks: super::checks::DeviceChecks,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl CudaDevice {
    /// The device `ordinal`, opened on first use and shared afterwards.
    ///
    /// Fails with [`Error::DeviceUnavailable`] (never a panic) when a CUDA
    /// library or CUDA's headers (for NVRTC) are missing, there is no such
    /// device, or its compute capability is below [`MIN_COMPUTE_CAPABILITY`].
    pub fn get(ordinal: usize) -> Result<Arc<CudaDevice>> {
        static OPEN: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
        let mut open = lock(OPEN.get_or_init(Default::default));
        if let Some(d) = open.get(&ordinal) {
            return Ok(d.clone());
        }
        let d = Arc::new(CudaDevice::open(ordinal)?);
        // The driver's pool gives freed memory back to the device at every
        // synchronize by default, so a training loop that synchronizes once
        // per step would map and unmap its activations every step; the pool
        // keeps them instead, as PyTorch's caching allocator does.
        d.set_pool_release_threshold(u64::MAX)?;
        open.insert(ordinal, d.clone());
        Ok(d)
    }

    fn open(ordinal: usize) -> Result<CudaDevice> {
        let device = Device::Cuda(ordinal);
        let unavailable = |reason: String| Error::DeviceUnavailable { device, reason };
        library_status().map_err(unavailable)?;
        // Kernels cannot be compiled without CUDA's headers: a device
        // without them is not usable either.
        nvrtc::include_dir().map_err(|e| match e {
            Error::DeviceUnavailable { reason, .. } => unavailable(reason),
            other => other,
        })?;
        let count = CudaContext::device_count()
            .map_err(|e| unavailable(format!("cuDeviceGetCount failed: {e}")))?;
        if ordinal >= count.max(0) as usize {
            return Err(unavailable(format!("{count} CUDA device(s) present")));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| unavailable(format!("cannot create a context: {e}")))?;
        let compute = ctx
            .compute_capability()
            .map_err(|e| unavailable(format!("cannot read the compute capability: {e}")))?;
        if compute < MIN_COMPUTE_CAPABILITY {
            return Err(unavailable(format!(
                "compute capability {}.{} is below the {}.{} the kernels need",
                compute.0, compute.1, MIN_COMPUTE_CAPABILITY.0, MIN_COMPUTE_CAPABILITY.1
            )));
        }
        let name = ctx
            .name()
            .map_err(|e| unavailable(format!("cannot read the device name: {e}")))?;
        let image = kernel_image(&name);
        // SAFETY: all work of this device is issued on its one stream, so
        // stream order alone orders every read after its write; per-buffer
        // events would only add overhead.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        Ok(CudaDevice {
            ordinal,
            stream,
            compute,
            image,
            modules: Mutex::default(),
            functions: Mutex::default(),
            blas: Mutex::default(),
            checks: Default::default(),
        })
    }

    /// Whether device `ordinal` can be opened (see [`CudaDevice::get`]).
    pub fn is_available(ordinal: usize) -> bool {
        CudaDevice::get(ordinal).is_ok()
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// `Device::Cuda(ordinal)`.
    pub fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    /// The compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute
    }

    /// What this device's kernels are compiled to ([`kernel_image`]):
    /// a CUBIN on a GPU, PTX on the simulated one.
    pub fn kernel_image(&self) -> ImageKind {
        self.image
    }

    /// Whether this is the simulated GPU (its name is [`SIMULATOR_NAME`]).
    pub fn is_simulated(&self) -> bool {
        self.image == ImageKind::Ptx
    }

    /// The architecture kernels are compiled for: the real one (`sm_90`)
    /// on a GPU, the virtual one (`compute_80`) on the simulated GPU.
    pub fn arch(&self) -> String {
        self.image.arch(self.compute)
    }

    /// The stream all of this device's work runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device's name as the driver reports it.
    pub fn name(&self) -> Result<String> {
        let ctx = self.stream.context();
        ctx.name().map_err(|e| self.error("cuDeviceGetName", e))
    }

    /// The driver's view of the device memory, `(free, total)` bytes: a
    /// coarse cross-check of the ledger (it also sees the context, cuBLAS
    /// workspaces, the allocator pool and other processes).
    pub fn mem_get_info(&self) -> Result<(usize, usize)> {
        let ctx = self.stream.context();
        ctx.mem_get_info()
            .map_err(|e| self.error("cuMemGetInfo", e))
    }

    /// The driver's stream-ordered memory pool for this device (the pool
    /// `cuMemAllocAsync` draws from): bytes in use and reserved, now and at
    /// their high-water marks since the last
    /// [`reset_pool_high_water`](Self::reset_pool_high_water). A cross-check
    /// of the ledger's CUDA peak: `used_high` is at least the ledger's peak
    /// (it also counts cuBLAS workspaces and staging buffers the ledger
    /// leaves out); `None` when the device allocates without a pool.
    pub fn pool_usage(&self) -> Result<Option<PoolUsage>> {
        use cudarc::driver::sys::CUmemPool_attribute as Attr;
        let Some(pool) = self.mem_pool()? else {
            return Ok(None);
        };
        let get = |attr: Attr| self.pool_attribute(pool, attr);
        Ok(Some(PoolUsage {
            used: get(Attr::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            used_high: get(Attr::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
            reserved: get(Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_high: get(Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
        }))
    }

    /// Resets the pool's high-water marks to the current usage (the driver
    /// accepts only 0 for these attributes, meaning "now"); a no-op without
    /// a pool. Pair with [`crate::memory::Ledger::reset_peak`].
    pub fn reset_pool_high_water(&self) -> Result<()> {
        use cudarc::driver::sys::CUmemPool_attribute as Attr;
        let Some(pool) = self.mem_pool()? else {
            return Ok(());
        };
        for attr in [
            Attr::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
            Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
        ] {
            // 0 is the one value the driver accepts for these two.
            self.set_pool_attribute(pool, attr, 0)?;
        }
        Ok(())
    }

    /// How many freed bytes the device's memory pool keeps for reuse
    /// rather than returning them to the device at the next synchronize
    /// (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`). [`CudaDevice::get`] sets it to
    /// `u64::MAX`: freed memory stays reserved by this process, ready for
    /// the next allocation, as with PyTorch's caching allocator; 0 returns
    /// it at every synchronize (the driver's default). A no-op without a
    /// pool. The ledger counts live tensors either way.
    pub fn set_pool_release_threshold(&self, bytes: u64) -> Result<()> {
        match self.mem_pool()? {
            Some(pool) => self.set_pool_attribute(
                pool,
                cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                bytes,
            ),
            None => Ok(()),
        }
    }

    /// The pool's current release threshold (see
    /// [`set_pool_release_threshold`](Self::set_pool_release_threshold));
    /// `None` without a pool.
    pub fn pool_release_threshold(&self) -> Result<Option<u64>> {
        let Some(pool) = self.mem_pool()? else {
            return Ok(None);
        };
        self.pool_attribute(
            pool,
            cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
        )
        .map(Some)
    }

    /// Reads one `cuuint64_t` attribute of `pool`.
    fn pool_attribute(
        &self,
        pool: cudarc::driver::sys::CUmemoryPool,
        attr: cudarc::driver::sys::CUmemPool_attribute,
    ) -> Result<u64> {
        let mut v: u64 = 0;
        // SAFETY: every attribute read here is a `cuuint64_t`, and `pool` is
        // the device's current pool.
        unsafe {
            cudarc::driver::sys::cuMemPoolGetAttribute(pool, attr, (&mut v as *mut u64).cast())
        }
        .result()
        .map_err(|e| self.error("cuMemPoolGetAttribute", e))?;
        Ok(v)
    }

    /// Sets one `cuuint64_t` attribute of `pool`.
    fn set_pool_attribute(
        &self,
        pool: cudarc::driver::sys::CUmemoryPool,
        attr: cudarc::driver::sys::CUmemPool_attribute,
        mut value: u64,
    ) -> Result<()> {
        // SAFETY: every attribute passed here is a `cuuint64_t`, and `pool`
        // is the device's current pool.
        unsafe {
            cudarc::driver::sys::cuMemPoolSetAttribute(pool, attr, (&mut value as *mut u64).cast())
        }
        .result()
        .map_err(|e| self.error("cuMemPoolSetAttribute", e))
    }

    /// The device's current memory pool, when allocations go through one.
    fn mem_pool(&self) -> Result<Option<cudarc::driver::sys::CUmemoryPool>> {
        let ctx = self.stream.context();
        if !ctx.has_async_alloc() {
            return Ok(None);
        }
        ctx.bind_to_thread()
            .map_err(|e| self.error("cuCtxSetCurrent", e))?;
        let mut pool = std::mem::MaybeUninit::uninit();
        // SAFETY: `cu_device` is this context's device; the pool handle is
        // owned by the driver and only read here.
        unsafe { cudarc::driver::sys::cuDeviceGetMemPool(pool.as_mut_ptr(), ctx.cu_device()) }
            .result()
            .map_err(|e| self.error("cuDeviceGetMemPool", e))?;
        // SAFETY: written by the successful call above.
        Ok(Some(unsafe { pool.assume_init() }))
    }

    /// Makes this device's context current on the calling thread (for raw
    /// driver calls).
    pub(crate) fn bind(&self) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| self.error("cuCtxSetCurrent", e))
    }

    /// Waits until all work issued so far has finished; reports errors of
    /// earlier asynchronous launches.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| self.error("cuStreamSynchronize", e))
    }

    /// A typed [`Error::Cuda`] for this device.
    pub(crate) fn error(&self, op: impl Into<String>, e: impl std::fmt::Display) -> Error {
        Error::Cuda {
            device: self.device(),
            op: op.into(),
            msg: e.to_string(),
        }
    }

    /// The kernel `name` of kernel file `file` (a name in
    /// [`nvrtc::SOURCES`]: in `kernels/` or beside its family's launch
    /// code), compiling the file with NVRTC for this device (a CUBIN, or
    /// PTX on the simulated GPU; once per process, or read from the kernel
    /// cache) and loading it (once per device).
    pub(crate) fn function(&self, file: &'static str, name: &str) -> Result<CudaFunction> {
        if let Some(f) = lock(&self.functions).get(&(file, name.to_string())) {
            return Ok(f.clone());
        }
        let module = self.module(file)?;
        let f = module
            .load_function(name)
            .map_err(|e| self.error(format!("load kernel {name} from {file}"), e))?;
        lock(&self.functions).insert((file, name.to_string()), f.clone());
        Ok(f)
    }

    fn module(&self, file: &'static str) -> Result<Arc<CudaModule>> {
        let mut modules = lock(&self.modules);
        if let Some(m) = modules.get(file) {
            return Ok(m.clone());
        }
        let image = match self.image {
            ImageKind::Ptx => cudarc::nvrtc::Ptx::from_src(nvrtc::ptx_for(file, &self.arch())?),
            ImageKind::Cubin => {
                cudarc::nvrtc::Ptx::from_binary(nvrtc::cubin_for(file, &self.arch())?)
            }
        };
        let m = self
            .stream
            .context()
            .load_module(image)
            .map_err(|e| self.error(format!("load module {file}"), e))?;
        modules.insert(file, m.clone());
        Ok(m)
    }

    /// Runs `f` with this device's cuBLAS handle, created on first use.
    /// The device's context is made current on the calling thread first
    /// (raw cuBLAS calls do not do it themselves).
    pub(crate) fn with_blas<R>(&self, f: impl FnOnce(&CudaBlas) -> Result<R>) -> Result<R> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| self.error("cuCtxSetCurrent", e))?;
        let mut blas = lock(&self.blas);
        if blas.is_none() {
            let b =
                CudaBlas::new(self.stream.clone()).map_err(|e| self.error("cublasCreate", e))?;
            *blas = Some(b);
        }
        match blas.as_ref() {
            Some(b) => f(b),
            None => Err(self.error("cublasCreate", "no handle")),
        }
    }

    /// The launch configuration for `n` independent elements: blocks of
    /// 256 threads, at most 65 536 blocks (kernels loop over the rest).
    pub(crate) fn grid_for(n: usize) -> LaunchConfig {
        let blocks = n.div_ceil(256).clamp(1, 65_536) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// One 256-thread block per row (`rows` reductions, softmax lanes), at
    /// most 65 536 blocks (kernels loop over the rest).
    pub(crate) fn grid_per_row(rows: usize) -> LaunchConfig {
        Self::grid_for(rows.saturating_mul(256))
    }
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaDevice(cuda:{}, {})", self.ordinal, self.arch())
    }
}

/// Whether a device can be used: asked of the CUDA backend, which is what
/// knows (the device enum itself stays plain data).
impl Device {
    /// The CUDA device `ordinal` when it really opens (the CUDA libraries
    /// load, the device exists and is supported), the CPU otherwise. Never
    /// panics; [`Device::check_available`] says why a device cannot be used.
    pub fn cuda_if_available(ordinal: usize) -> Device {
        if CudaDevice::is_available(ordinal) {
            Device::Cuda(ordinal)
        } else {
            Device::Cpu
        }
    }

    /// `Ok` when the device can be used, else
    /// [`crate::Error::DeviceUnavailable`] naming what is missing (a CUDA
    /// library, the device, a recent enough compute capability).
    pub fn check_available(self) -> crate::Result<()> {
        match self {
            Device::Cpu | Device::Meta => Ok(()),
            Device::Cuda(n) => CudaDevice::get(n).map(|_| ()),
        }
    }

    /// Bytes the device can still take now: on the CPU what the host can
    /// hand out (`crate::memory::host_available_bytes`), on CUDA the
    /// driver's free memory; `None` for the meta device (no data) or where
    /// unknown. A CUDA device that cannot be opened is its typed error.
    pub fn free_bytes(self) -> crate::Result<Option<usize>> {
        match self {
            Device::Cpu => Ok(crate::memory::host_available_bytes()),
            Device::Meta => Ok(None),
            Device::Cuda(n) => Ok(Some(CudaDevice::get(n)?.mem_get_info()?.0)),
        }
    }

    /// Refuses a run (`what`, e.g. `the demo`) whose peak, predicted on the
    /// meta device, is `needed` bytes, when the device has less free:
    /// [`crate::Error::WillNotFit`], saying by how much. `Ok` when it fits
    /// or when the free memory is unknown.
    pub fn check_fits(self, what: &str, needed: usize) -> crate::Result<()> {
        match self.free_bytes()? {
            Some(available) if needed > available => Err(crate::Error::WillNotFit {
                what: what.to_string(),
                device: self,
                needed,
                available,
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_simulator_gets_ptx() {
        assert_eq!(kernel_image(SIMULATOR_NAME), ImageKind::Ptx);
        for gpu in [
            "NVIDIA H100 80GB HBM3",
            "NVIDIA A100-SXM4-40GB",
            "leangrad gpusim 2",
            "",
        ] {
            assert_eq!(kernel_image(gpu), ImageKind::Cubin, "{gpu}");
        }
        assert_eq!(ImageKind::Ptx.arch((8, 0)), "compute_80");
        assert_eq!(ImageKind::Cubin.arch((9, 0)), "sm_90");
    }
}
