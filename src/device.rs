//! Devices a tensor can live on, and the choice of one.

use std::fmt;

/// Where a tensor's storage lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Device {
    /// Host memory, computed with the CPU backend.
    Cpu,
    /// The CUDA device with this ordinal.
    Cuda(usize),
    /// No data at all: tensors with shapes, dtypes, strides, versions and
    /// ledger registrations, whose kernels compute output shapes only. A
    /// training step on meta predicts the CPU ledger byte for byte.
    Meta,
}

impl Device {
    /// Whether the device can be used (see [`Device::check_available`]).
    pub fn is_available(self) -> bool {
        self.check_available().is_ok()
    }

    /// Whether this is the meta device (no data).
    pub fn is_meta(self) -> bool {
        matches!(self, Device::Meta)
    }

    /// Whether this is the CPU.
    pub fn is_cpu(self) -> bool {
        matches!(self, Device::Cpu)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
            Device::Meta => write!(f, "meta"),
        }
    }
}
