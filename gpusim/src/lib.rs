//! leangrad-gpusim: a CUDA GPU simulated on the CPU.
//!
//! Built as a shared library that stands in for the NVIDIA driver
//! (`libcuda.so`), cuBLAS (`libcublas.so`) and NCCL (`libnccl.so`, ranks
//! as threads of one process), so that unchanged programs
//! using the driver API (through `cudarc`) open a device, load the PTX that
//! the real NVRTC wrote, and run it on an interpreter with a sanitizer that
//! is always on. `gpusim/run <command…>` runs any command with it in place.

pub mod cublas;
pub mod driver;
pub mod memory;
pub mod nccl;
pub mod numeric;
pub mod profile;
pub mod ptx;
