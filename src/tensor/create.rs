//! Creating tensors: from data, constants, and seeded random numbers.

use super::{checked_numel, Tensor};
use crate::dtype::CpuData;
use crate::memory::host::try_collect;
use crate::{rng, DType, Device, Error, Result, WithDType};

/// Data can be created on the CPU and on CUDA; the meta device holds none
/// ([`Error::NoData`]).
fn check_device(op: &'static str, device: Device) -> Result<()> {
    match device {
        Device::Meta => Err(Error::NoData { op }),
        _ => Ok(()),
    }
}

fn check_len(op: &'static str, len: usize, shape: &[usize]) -> Result<()> {
    let n = checked_numel(op, shape)?;
    if n != len {
        return Err(Error::InvalidArgument {
            op,
            msg: format!("{len} elements cannot have shape {shape:?} ({n} elements)"),
        });
    }
    Ok(())
}

/// `value(i)` for `i in 0..n`, converted to a [`CpuData`] of `dtype`
/// (allocated through `memory::host`: [`Error::OutOfMemory`] when the host
/// cannot hold it).
pub(crate) fn cpu_data_from_fn<F: Fn(usize) -> f64>(
    n: usize,
    dtype: DType,
    value: F,
) -> Result<CpuData> {
    fn conv<T: WithDType, F: Fn(usize) -> f64>(n: usize, f: &F) -> Result<CpuData> {
        Ok(T::wrap(try_collect(n, (0..n).map(|i| T::from_f64(f(i))))?))
    }
    match dtype {
        DType::F32 => conv::<f32, F>(n, &value),
        DType::F16 => conv::<half::f16, F>(n, &value),
        DType::BF16 => conv::<half::bf16, F>(n, &value),
        DType::F64 => conv::<f64, F>(n, &value),
        DType::U8 => conv::<u8, F>(n, &value),
        DType::U32 => conv::<u32, F>(n, &value),
        DType::I64 => conv::<i64, F>(n, &value),
    }
}

/// Converts f64 values to a [`CpuData`] of `dtype`.
pub(crate) fn cpu_data_from_f64(values: &[f64], dtype: DType) -> Result<CpuData> {
    cpu_data_from_fn(values.len(), dtype, |i| values[i])
}

impl Tensor {
    /// A new contiguous tensor of `shape` holding host `data`, on `device`
    /// (the CPU, or CUDA as one host-to-device copy; the host copy is not
    /// counted).
    pub(crate) fn from_data_on(data: CpuData, shape: &[usize], device: Device) -> Result<Tensor> {
        match device {
            Device::Cuda(n) => crate::tensor::cuda::upload(&data, shape, n),
            _ => Tensor::from_cpu_data(data, shape),
        }
    }

    /// A contiguous meta tensor (no data), counted in the current ledger.
    pub(crate) fn new_meta(shape: &[usize], dtype: DType) -> Result<Tensor> {
        let storage = super::Storage::meta(dtype, checked_numel("new_meta", shape)?)?;
        Ok(Tensor::from_storage(
            std::sync::Arc::new(storage),
            super::Layout::contiguous(shape),
        ))
    }

    /// A kernel's small host result (statistics, parameter gradients) as a
    /// tensor on `device`: on the meta device the values are ignored and a
    /// meta tensor of `shape` and `dtype` is made instead.
    pub(crate) fn from_host_f64(
        values: &[f64],
        shape: &[usize],
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        match device {
            Device::Meta => Tensor::new_meta(shape, dtype),
            d => Tensor::from_f64_slice(values, shape, dtype, d),
        }
    }

    /// A contiguous tensor of `shape` whose element `i` is `value(i)`
    /// converted to `dtype` (no host staging beyond the tensor itself); on
    /// the meta device a data-less tensor, `value` never called.
    pub(crate) fn from_f64_fn<F: Fn(usize) -> f64>(
        shape: &[usize],
        dtype: DType,
        device: Device,
        value: F,
    ) -> Result<Tensor> {
        if device.is_meta() {
            return Tensor::new_meta(shape, dtype);
        }
        let n = checked_numel("from_f64_fn", shape)?;
        Tensor::from_data_on(cpu_data_from_fn(n, dtype, value)?, shape, device)
    }

    /// Like [`Tensor::from_host_f64`] for a typed vector (ignored on meta,
    /// where kernels return it empty).
    pub(crate) fn from_host_vec<T: WithDType>(
        data: Vec<T>,
        shape: &[usize],
        device: Device,
    ) -> Result<Tensor> {
        match device {
            Device::Meta => Tensor::new_meta(shape, T::DTYPE),
            d => Tensor::from_vec(data, shape, d),
        }
    }

    /// The values of a small host vector (statistics, per-channel
    /// parameters) as f64; on the meta device, zeros of the right length
    /// (no data is read: the callers only use them for meta outputs' shapes).
    pub(crate) fn small_values(&self) -> Result<Vec<f64>> {
        match self.device() {
            Device::Meta => crate::memory::host::try_zeroed(self.numel()),
            _ => self.to_f64_vec(),
        }
    }

    /// A tensor holding `data` with `shape` on `device` (not on the meta
    /// device, which holds no data: [`Error::NoData`]).
    pub fn from_vec<T: WithDType>(data: Vec<T>, shape: &[usize], device: Device) -> Result<Tensor> {
        check_device("from_vec", device)?;
        check_len("from_vec", data.len(), shape)?;
        Tensor::from_data_on(T::wrap(data), shape, device)
    }

    /// A tensor from f64 values converted to `dtype`.
    pub fn from_f64_slice(
        values: &[f64],
        shape: &[usize],
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        check_device("from_f64_slice", device)?;
        check_len("from_f64_slice", values.len(), shape)?;
        Tensor::from_data_on(cpu_data_from_f64(values, dtype)?, shape, device)
    }

    /// A 0-dimensional tensor holding `value`.
    pub fn scalar(value: f64, dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full(&[], value, dtype, device)
    }

    /// Zeros of `shape` (a data-less tensor on the meta device).
    pub fn zeros(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        if device.is_meta() {
            return Tensor::new_meta(shape, dtype);
        }
        check_device("zeros", device)?;
        let n = checked_numel("zeros", shape)?;
        if let Device::Cuda(ordinal) = device {
            return crate::tensor::cuda::zeros(shape, dtype, ordinal);
        }
        Tensor::from_cpu_data(CpuData::zeros(dtype, n)?, shape)
    }

    /// A new contiguous tensor of `shape` for a kernel that writes every
    /// element before reading any: on the CPU a reused host buffer keeps
    /// its old values rather than being zero-filled; elsewhere zeros. The
    /// ledger counts it as [`Tensor::zeros`].
    pub(crate) fn for_overwrite(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        if device != Device::Cpu {
            return Tensor::zeros(shape, dtype, device);
        }
        let n = checked_numel("zeros", shape)?;
        Tensor::from_cpu_data(CpuData::for_overwrite(dtype, n)?, shape)
    }

    /// Ones of `shape`.
    pub fn ones(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype, device)
    }

    /// `shape` filled with `value` (converted to `dtype`).
    pub fn full(shape: &[usize], value: f64, dtype: DType, device: Device) -> Result<Tensor> {
        if device.is_meta() {
            return Tensor::new_meta(shape, dtype);
        }
        check_device("full", device)?;
        let n = checked_numel("full", shape)?;
        if let Device::Cuda(ordinal) = device {
            return crate::tensor::cuda::full(shape, value, dtype, ordinal);
        }
        let mut data = CpuData::for_overwrite(dtype, n)?;
        crate::match_cpu_data!(&mut data, v => {
            let x = crate::dtype::from_f64_like(v, value);
            v.iter_mut().for_each(|e| *e = x);
        });
        Tensor::from_data_on(data, shape, device)
    }

    /// Zeros with this tensor's shape, dtype and device.
    pub fn zeros_like(&self) -> Result<Tensor> {
        Tensor::zeros(self.shape(), self.dtype(), self.device())
    }

    /// Ones with this tensor's shape, dtype and device.
    pub fn ones_like(&self) -> Result<Tensor> {
        Tensor::ones(self.shape(), self.dtype(), self.device())
    }

    /// `0, 1, …, n-1` as a 1-d tensor.
    pub fn arange(n: usize, dtype: DType, device: Device) -> Result<Tensor> {
        if device.is_meta() {
            return Tensor::new_meta(&[n], dtype);
        }
        check_device("arange", device)?;
        Tensor::from_data_on(cpu_data_from_fn(n, dtype, |i| i as f64)?, &[n], device)
    }

    /// Uniform numbers in [0, 1) from Philox4x32-10 with `seed`; the same
    /// seed gives the same numbers on every device.
    pub fn rand(shape: &[usize], dtype: DType, device: Device, seed: u64) -> Result<Tensor> {
        if device.is_meta() {
            return Tensor::new_meta(shape, dtype);
        }
        check_device("rand", device)?;
        let n = checked_numel("rand", shape)?;
        if let (Device::Cuda(d), true) = (device, dtype.is_float()) {
            return super::cuda::rand(d, shape, dtype, seed, n, false);
        }
        let data = cpu_data_from_fn(n, dtype, |i| rng::uniform_at(seed, i as u64))?;
        Tensor::from_data_on(data, shape, device)
    }

    /// Uniform numbers in [low, high) (see [`Tensor::rand`]).
    pub fn rand_range(
        shape: &[usize],
        low: f64,
        high: f64,
        dtype: DType,
        device: Device,
        seed: u64,
    ) -> Result<Tensor> {
        if device.is_meta() {
            return Tensor::new_meta(shape, dtype);
        }
        check_device("rand_range", device)?;
        let n = checked_numel("rand_range", shape)?;
        let data = cpu_data_from_fn(n, dtype, |i| {
            low + (high - low) * rng::uniform_at(seed, i as u64)
        })?;
        Tensor::from_data_on(data, shape, device)
    }

    /// Standard normal numbers from Philox4x32-10 with `seed` (Box-Muller).
    pub fn randn(shape: &[usize], dtype: DType, device: Device, seed: u64) -> Result<Tensor> {
        if device.is_meta() {
            return Tensor::new_meta(shape, dtype);
        }
        check_device("randn", device)?;
        let n = checked_numel("randn", shape)?;
        if let (Device::Cuda(d), true) = (device, dtype.is_float()) {
            return super::cuda::rand(d, shape, dtype, seed, n, true);
        }
        let data = cpu_data_from_fn(n, dtype, |i| rng::normal_at(seed, i as u64))?;
        Tensor::from_data_on(data, shape, device)
    }

    /// A copy on `device`. On the same device, a new tensor sharing storage;
    /// to the meta device, a new contiguous meta tensor of the same shape and
    /// dtype; CPU↔CUDA (and between CUDA devices), a contiguous copy of the
    /// elements counted under the destination device; from meta to a device
    /// with data is [`Error::NoData`].
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        if device.is_meta() {
            return Tensor::new_meta(self.shape(), self.dtype());
        }
        if self.device().is_meta() {
            return Err(Error::NoData { op: "to_device" });
        }
        let data = match self.device() {
            Device::Cuda(_) => crate::tensor::cuda::download(self)?,
            _ => {
                // The elements in row-major order, whatever the strides.
                let data = self.storage().cpu()?;
                let layout = self.layout();
                crate::match_cpu_data!(&*data, v => {
                    let mut out = crate::memory::host::try_vec(layout.numel())?;
                    layout.for_each_offset(|o| out.push(v[o]));
                    crate::dtype::CpuElement::wrap(out)
                })
            }
        };
        Tensor::from_data_on(data, self.shape(), device)
    }
}
