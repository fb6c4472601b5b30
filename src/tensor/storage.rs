//! Storage: the counted buffer behind one or more tensors, with its version.

use crate::cuda::CudaBuffer;
use crate::dtype::CpuData;
use crate::memory::{current_category, Allocation, Category, Ledger};
use crate::{DType, Device, Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

impl CpuData {
    /// `n` zeros of `dtype`, failing cleanly ([`Error::OutOfMemory`]) when
    /// the host cannot hold them.
    pub fn zeros(dtype: DType, n: usize) -> Result<CpuData> {
        CpuData::allocate(dtype, n, false)
    }

    /// `n` elements of `dtype` for a kernel that writes every one before
    /// reading any: a reused host buffer as its last storage left it (no
    /// zero fill), else zeros (see [`crate::memory::host::try_for_overwrite`]).
    pub(crate) fn for_overwrite(dtype: DType, n: usize) -> Result<CpuData> {
        CpuData::allocate(dtype, n, true)
    }

    /// [`CpuData::zeros`], or [`CpuData::for_overwrite`] when `overwrite`.
    fn allocate(dtype: DType, n: usize, overwrite: bool) -> Result<CpuData> {
        use crate::memory::host::{try_for_overwrite, try_zeroed};
        fn buffer<T: bytemuck::Zeroable + Send + 'static>(
            n: usize,
            overwrite: bool,
        ) -> Result<Vec<T>> {
            if overwrite {
                try_for_overwrite(n)
            } else {
                try_zeroed(n)
            }
        }
        Ok(match dtype {
            DType::F32 => CpuData::F32(buffer(n, overwrite)?),
            DType::F16 => CpuData::F16(buffer(n, overwrite)?),
            DType::BF16 => CpuData::BF16(buffer(n, overwrite)?),
            DType::F64 => CpuData::F64(buffer(n, overwrite)?),
            DType::U8 => CpuData::U8(buffer(n, overwrite)?),
            DType::U32 => CpuData::U32(buffer(n, overwrite)?),
            DType::I64 => CpuData::I64(buffer(n, overwrite)?),
        })
    }
}

/// What holds a storage's elements. Every kernel entry dispatches on this
/// once (through `crate::meta::backend`): host data is computed by the
/// CPU kernels, meta storage has no data at all (only its size is counted),
/// so kernels produce outputs of the right shape and dtype without arithmetic.
pub enum Backing {
    /// Host memory, read and written by the CPU backend.
    Host(RwLock<CpuData>),
    /// No data: a tensor of the meta device (shape, dtype, version and a
    /// ledger registration only).
    Meta,
    /// Device memory, read and written by the CUDA launch wrappers
    /// (`src/cuda/`); the lock orders host-side access to the buffer
    /// (in-place kernels take it for writing).
    Cuda(RwLock<CudaBuffer>),
}

/// A counted buffer on one device. Tensors share it through `Arc`; its
/// version counts in-place modifications so autograd can detect a saved
/// tensor that changed.
pub struct Storage {
    backing: Backing,
    device: Device,
    dtype: DType,
    len: usize,
    version: AtomicU64,
    allocation: Allocation,
    save_listeners: Mutex<Vec<Weak<dyn SaveListener>>>,
}

/// What happened to a storage, for [`SaveListener`]s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveEvent {
    /// Some op just saved it for backward.
    Saved,
    /// Some op just released it (the releasing holder still counts as one
    /// strong reference while listeners run).
    Released,
}

/// Told when a storage is saved for backward or released. A relu-like op
/// that kept a 1-bit mask of this storage uses it to drop the mask and read
/// the values while another op keeps them anyway, and to go back to the
/// mask when that op lets them go, so the mask never costs extra memory and
/// never keeps the values alive longer.
pub trait SaveListener: Send + Sync {
    /// Handles `event` on `storage`; returns whether to keep listening.
    fn on_save_event(&self, storage: &Arc<Storage>, event: SaveEvent) -> bool;
}

impl Drop for Storage {
    /// Hands a host buffer to the cache of large freed buffers
    /// (`memory::host_cache`), which keeps it for the next request of its
    /// type and about its size when it is large; the ledger's registration goes
    /// with the `allocation` field as before.
    fn drop(&mut self) {
        if let Backing::Host(lock) = &mut self.backing {
            let data = match lock.get_mut() {
                Ok(d) => std::mem::replace(d, CpuData::U8(Vec::new())),
                Err(_) => return,
            };
            use crate::memory::keep_host_buffer as keep;
            match data {
                CpuData::F32(v) => keep(v),
                CpuData::F16(v) => keep(v),
                CpuData::BF16(v) => keep(v),
                CpuData::F64(v) => keep(v),
                CpuData::U8(v) => keep(v),
                CpuData::U32(v) => keep(v),
                CpuData::I64(v) => keep(v),
            }
        }
    }
}

impl Storage {
    /// Counts `data` in the current ledger under the current category and wraps it.
    pub fn new(data: CpuData) -> Result<Storage> {
        Storage::with_category(data, current_category())
    }

    /// Like [`Storage::new`] with an explicit category.
    pub fn with_category(data: CpuData, category: Category) -> Result<Storage> {
        let dtype = data.dtype();
        let len = data.len();
        let allocation =
            Ledger::current().register(Device::Cpu, len * dtype.size_in_bytes(), category)?;
        Ok(Storage {
            backing: Backing::Host(RwLock::new(data)),
            device: Device::Cpu,
            dtype,
            len,
            version: AtomicU64::new(0),
            allocation,
            save_listeners: Mutex::new(Vec::new()),
        })
    }

    /// A meta storage of `len` elements of `dtype` (no data), counted in the
    /// current ledger under [`Device::Meta`] and the current category exactly
    /// as the same host storage would be counted under [`Device::Cpu`].
    pub fn meta(dtype: DType, len: usize) -> Result<Storage> {
        let category = current_category();
        let ledger = Ledger::current();
        // No buffer is made, so nothing else would notice a size past usize.
        let bytes = len.checked_mul(dtype.size_in_bytes()).ok_or_else(|| {
            ledger.out_of_memory(Device::Meta, usize::MAX, ledger.live(Device::Meta))
        })?;
        let allocation = ledger.register(Device::Meta, bytes, category)?;
        Ok(Storage {
            backing: Backing::Meta,
            device: Device::Meta,
            dtype,
            len,
            version: AtomicU64::new(0),
            allocation,
            save_listeners: Mutex::new(Vec::new()),
        })
    }

    /// Wraps a CUDA buffer made by a launch wrapper or a host copy; the
    /// buffer's ledger registration (under `Device::Cuda(n)`, made when it
    /// was allocated) becomes the storage's.
    pub fn from_cuda(mut buffer: CudaBuffer) -> Result<Storage> {
        let device = buffer.device().device();
        let (dtype, len) = (buffer.dtype(), buffer.len());
        let allocation = match buffer.take_allocation() {
            Some(a) => a,
            None => {
                Ledger::current().register(device, buffer.size_in_bytes(), current_category())?
            }
        };
        Ok(Storage {
            backing: Backing::Cuda(RwLock::new(buffer)),
            device,
            dtype,
            len,
            version: AtomicU64::new(0),
            allocation,
            save_listeners: Mutex::new(Vec::new()),
        })
    }

    /// Read access to the device buffer of a CUDA storage (a typed error on
    /// other devices).
    pub fn cuda(&self) -> Result<RwLockReadGuard<'_, CudaBuffer>> {
        Ok(self
            .device_buffer("device read")?
            .read()
            .unwrap_or_else(|e| e.into_inner()))
    }

    /// Write access to the device buffer; bumps the version (an in-place
    /// modification).
    pub fn cuda_mut(&self) -> Result<RwLockWriteGuard<'_, CudaBuffer>> {
        let b = self.device_buffer("device write")?;
        self.version.fetch_add(1, Ordering::SeqCst);
        Ok(b.write().unwrap_or_else(|e| e.into_inner()))
    }

    fn device_buffer(&self, op: &'static str) -> Result<&RwLock<CudaBuffer>> {
        match &self.backing {
            Backing::Cuda(b) => Ok(b),
            Backing::Meta => Err(Error::NoData { op }),
            Backing::Host(_) => Err(Error::InvalidArgument {
                op,
                msg: format!("the storage is on {}, not on CUDA", self.device),
            }),
        }
    }

    /// What holds the elements (host data, device memory, or nothing on the
    /// meta device).
    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    /// Records an in-place modification without touching data: what an
    /// in-place kernel does on the meta device.
    pub(crate) fn bump_version(&self) {
        self.version.fetch_add(1, Ordering::SeqCst);
    }

    /// Converts the elements to `dtype`, an element type of the same size,
    /// in the buffer that holds them: `convert` rewrites the host data or
    /// the device buffer as `dtype` (there is nothing to rewrite on the meta
    /// device), then the storage takes that dtype. The ledger registration
    /// stays the same (the same bytes, allocated once); the version moves
    /// on, as for any in-place write. Takes `&mut`: only a storage that
    /// nothing else references can change its element type.
    pub(crate) fn convert_in_place(
        &mut self,
        op: &'static str,
        dtype: DType,
        convert: impl FnOnce(&mut Backing) -> Result<()>,
    ) -> Result<()> {
        if dtype.size_in_bytes() != self.dtype.size_in_bytes() {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "{:?} elements cannot be rewritten as {dtype:?} in place (element sizes {} and {} bytes)",
                    self.dtype,
                    self.dtype.size_in_bytes(),
                    dtype.size_in_bytes()
                ),
            });
        }
        convert(&mut self.backing)?;
        let now = match &mut self.backing {
            Backing::Host(data) => data.get_mut().unwrap_or_else(|e| e.into_inner()).dtype(),
            Backing::Cuda(buffer) => buffer.get_mut().unwrap_or_else(|e| e.into_inner()).dtype(),
            Backing::Meta => dtype,
        };
        if now != dtype {
            return Err(Error::DTypeMismatch {
                op,
                expected: dtype,
                got: now,
            });
        }
        self.dtype = dtype;
        *self.version.get_mut() += 1;
        Ok(())
    }

    /// The device holding the data.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The element dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the storage holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes, as counted in the ledger.
    pub fn size_in_bytes(&self) -> usize {
        self.len * self.dtype.size_in_bytes()
    }

    /// The ledger registration.
    pub fn allocation(&self) -> &Allocation {
        &self.allocation
    }

    /// Asks to be told when this storage is saved for backward or released.
    pub fn add_save_listener(&self, listener: Weak<dyn SaveListener>) {
        let mut ls = self
            .save_listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        ls.retain(|l| l.strong_count() > 0);
        ls.push(listener);
    }

    /// Tells every live listener about `event`, keeping those that ask to.
    pub(crate) fn notify(self: &Arc<Self>, event: SaveEvent) {
        let lock = || {
            self.save_listeners
                .lock()
                .unwrap_or_else(|e| e.into_inner())
        };
        let listeners = std::mem::take(&mut *lock());
        if listeners.is_empty() {
            return;
        }
        // Called without the lock held: a listener may save or release this
        // storage itself.
        let kept: Vec<_> = listeners
            .into_iter()
            .filter(|l| l.upgrade().is_some_and(|l| l.on_save_event(self, event)))
            .collect();
        lock().extend(kept);
    }

    /// How many times the data has been modified in place.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    /// Read access to host data ([`Error::NoData`] on the meta device).
    pub fn cpu(&self) -> Result<RwLockReadGuard<'_, CpuData>> {
        Ok(self
            .host("host read")?
            .read()
            .unwrap_or_else(|e| e.into_inner()))
    }

    /// Write access to host data; bumps the version (an in-place modification).
    pub fn cpu_mut(&self) -> Result<RwLockWriteGuard<'_, CpuData>> {
        let data = self.host("host write")?;
        self.version.fetch_add(1, Ordering::SeqCst);
        Ok(data.write().unwrap_or_else(|e| e.into_inner()))
    }

    fn host(&self, op: &'static str) -> Result<&RwLock<CpuData>> {
        match (&self.backing, self.device) {
            (Backing::Host(data), Device::Cpu) => Ok(data),
            (Backing::Meta, _) => Err(Error::NoData { op }),
            (_, d) => Err(Error::DeviceUnavailable {
                device: d,
                reason: format!("{op}: host access to device memory (copy with to_device(Cpu))"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CpuData;

    #[test]
    fn a_dropped_storage_lends_its_buffer_to_the_next_tensor_which_starts_as_asked() {
        use crate::{DType, Device, Tensor};
        // An unusual length, so no other test's buffer can be taken.
        let shape = [3, 87_421];
        let ones = Tensor::ones(&shape, DType::F32, Device::Cpu).unwrap();
        let ptr = |t: &Tensor| match &*t.storage().cpu().unwrap() {
            CpuData::F32(v) => v.as_ptr() as usize,
            _ => unreachable!(),
        };
        let first = ptr(&ones);
        drop(ones);
        let zeros = Tensor::zeros(&shape, DType::F32, Device::Cpu).unwrap();
        assert_eq!(ptr(&zeros), first, "the freed buffer is reused");
        assert!(zeros.to_vec::<f32>().unwrap().iter().all(|&x| x == 0.0));
    }
}
