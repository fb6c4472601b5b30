//! The CUDA runtime (issue #4): devices, counted device buffers, NVRTC
//! compilation of the kernel files (the shared primitives' in `kernels/`,
//! each op family's beside its launch code), and cuBLAS GEMMs.
//!
//! Everything is loaded at run time (cudarc with dynamic loading): a binary
//! built here runs on a machine without CUDA and answers
//! [`crate::Error::DeviceUnavailable`] there, naming what is missing, instead
//! of panicking. The libraries are looked for before any cudarc call that
//! would load them (cudarc panics when a library is absent).
//!
//! - [`CudaDevice`]: one per ordinal, opened lazily and kept for the
//!   process: a context, one stream (all work is ordered on it), the loaded
//!   kernel modules and a cuBLAS handle.
//! - [`CudaBuffer`]: a typed device buffer counted in the memory ledger
//!   under `Device::Cuda(n)`, with host copies for every dtype; what a
//!   tensor storage holds as its CUDA backing (public because
//!   [`crate::tensor::Storage::cuda`] hands it out).
//! - [`nvrtc`]: the kernel sources, the CUDA include folder, compilation
//!   per compute capability (CUBIN for a GPU, PTX for the simulated one),
//!   cached in memory and on disk.
//! - [`profiler`]: profiler ranges, and the simulated GPU's own profile
//!   (counts and predicted time) read from inside the process.
//! - Settings read by the launch code: [`with_tf32`], [`with_conv_tf32`]
//!   (and `crate::nn::with_conv_workspace`, which applies on every device).
//!
//! Inside the crate: the `launch!` macro and `check` (launch-argument
//! checks) for every family's `cuda.rs`; the shared primitives' launch
//! wrappers `elementwise`, `reduce`, `index`, `random` (buffers plus
//! shapes/strides, [`Strided`]) and `gemm` (cuBLAS), all `pub(crate)`:
//! tensors reach them through their ops on `Device::Cuda(n)`. Their unit
//! tests are in `src/cuda/tests/` (run on the simulated GPU by `--lib`).

#![warn(missing_docs)]

/// Launches kernel `$name` of kernel file `$file` (a name in
/// [`nvrtc::SOURCES`]: in `kernels/` or beside its family's launch code) on
/// `$dev`'s stream with `$cfg` and the given arguments (each a reference
/// that outlives the call); maps a launch failure to [`crate::Error::Cuda`].
macro_rules! launch {
    ($dev:expr, $file:expr, $name:expr, $cfg:expr; $($arg:expr),* $(,)?) => {{
        use cudarc::driver::PushKernelArg;
        let dev: &$crate::cuda::CudaDevice = $dev;
        let name: &str = &$name;
        let func = dev.function($file, name)?;
        let stream = dev.stream().clone();
        let mut builder = stream.launch_builder(&func);
        $( builder.arg($arg); )*
        // SAFETY: the argument list matches the kernel's parameters in
        // the kernel file named in the launch, `$file` (in `kernels/` or
        // beside its family's launch code; types and order); buffers were
        // checked by the caller to hold every element the layouts address.
        unsafe { builder.launch($cfg) }
            .map(|_| ())
            .map_err(|e| dev.error(format!("launch {name}"), e))
    }};
}
/// The launch macro for the CUDA code of each op family (`<family>/cuda.rs`).
pub(crate) use launch;

mod buffer;
pub(crate) mod check;
pub(crate) mod checks;
mod context;
pub(crate) mod elementwise;
pub(crate) mod gemm;
pub(crate) mod index;
mod kernel_cache;
mod layout;
pub mod nvrtc;
pub mod profiler;
pub(crate) mod random;
pub(crate) mod reduce;
mod settings;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

pub use crate::settings::SettingGuard;
pub use buffer::CudaBuffer;
pub use context::{
    kernel_image, library_status, CudaDevice, PoolUsage, MIN_COMPUTE_CAPABILITY, SIMULATOR_NAME,
};
pub use layout::{broadcast_strides, contiguous_strides, Strided, MAX_RANK};
pub use settings::{conv_tf32_enabled, tf32_enabled, with_conv_tf32, with_tf32};
