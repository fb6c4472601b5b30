//! Creating tensors: from data, constants, and seeded random numbers.

use super::{CpuData, Tensor};
use crate::{rng, DType, Device, Error, Result, WithDType};

fn check_device(op: &'static str, device: Device) -> Result<()> {
    match device {
        Device::Cpu => Ok(()),
        d => Err(Error::DeviceUnavailable {
            device: d,
            reason: format!("{op}: the CUDA backend is not built into this version"),
        }),
    }
}

fn check_len(op: &'static str, len: usize, shape: &[usize]) -> Result<()> {
    let n: usize = shape.iter().product();
    if n != len {
        return Err(Error::InvalidArgument {
            op,
            msg: format!("{len} elements cannot have shape {shape:?} ({n} elements)"),
        });
    }
    Ok(())
}

/// Converts f64 values to a [`CpuData`] of `dtype`.
pub(crate) fn cpu_data_from_f64(values: &[f64], dtype: DType) -> CpuData {
    fn conv<T: WithDType>(v: &[f64]) -> CpuData {
        T::wrap(v.iter().map(|&x| T::from_f64(x)).collect())
    }
    match dtype {
        DType::F32 => conv::<f32>(values),
        DType::F16 => conv::<half::f16>(values),
        DType::BF16 => conv::<half::bf16>(values),
        DType::F64 => conv::<f64>(values),
        DType::U8 => conv::<u8>(values),
        DType::U32 => conv::<u32>(values),
        DType::I64 => conv::<i64>(values),
    }
}

impl Tensor {
    /// A tensor holding `data` with `shape` on `device`.
    pub fn from_vec<T: WithDType>(data: Vec<T>, shape: &[usize], device: Device) -> Result<Tensor> {
        check_device("from_vec", device)?;
        check_len("from_vec", data.len(), shape)?;
        Tensor::from_cpu_data(T::wrap(data), shape)
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
        Tensor::from_cpu_data(cpu_data_from_f64(values, dtype), shape)
    }

    /// A 0-dimensional tensor holding `value`.
    pub fn scalar(value: f64, dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full(&[], value, dtype, device)
    }

    /// Zeros of `shape`.
    pub fn zeros(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        check_device("zeros", device)?;
        Tensor::from_cpu_data(CpuData::zeros(dtype, shape.iter().product())?, shape)
    }

    /// Ones of `shape`.
    pub fn ones(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype, device)
    }

    /// `shape` filled with `value` (converted to `dtype`).
    pub fn full(shape: &[usize], value: f64, dtype: DType, device: Device) -> Result<Tensor> {
        check_device("full", device)?;
        let mut data = CpuData::zeros(dtype, shape.iter().product())?;
        crate::match_cpu_data!(&mut data, v => {
            let x = crate::dtype::from_f64_like(v, value);
            v.iter_mut().for_each(|e| *e = x);
        });
        Tensor::from_cpu_data(data, shape)
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
        let v: Vec<f64> = (0..n).map(|i| i as f64).collect();
        Tensor::from_f64_slice(&v, &[n], dtype, device)
    }

    /// Uniform numbers in [0, 1) from Philox4x32-10 with `seed`; the same
    /// seed gives the same numbers on every device.
    pub fn rand(shape: &[usize], dtype: DType, device: Device, seed: u64) -> Result<Tensor> {
        let n = shape.iter().product();
        Tensor::from_f64_slice(&rng::uniform(seed, 0, n), shape, dtype, device)
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
        let n = shape.iter().product();
        let v: Vec<f64> = rng::uniform(seed, 0, n)
            .into_iter()
            .map(|u| low + (high - low) * u)
            .collect();
        Tensor::from_f64_slice(&v, shape, dtype, device)
    }

    /// Standard normal numbers from Philox4x32-10 with `seed` (Box-Muller).
    pub fn randn(shape: &[usize], dtype: DType, device: Device, seed: u64) -> Result<Tensor> {
        let n = shape.iter().product();
        Tensor::from_f64_slice(&rng::normal(seed, 0, n), shape, dtype, device)
    }

    /// A copy on `device`. CPU→CPU gives a new tensor sharing storage.
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        check_device("to_device", device)?;
        Ok(self.clone())
    }
}
