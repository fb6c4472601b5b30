//! `CudaBuffer`: a typed, ledger-counted device buffer.

use super::CudaDevice;
use crate::dtype::CpuData;
use crate::memory::{current_category, Allocation, Category, Ledger};
use crate::{DType, Error, Result, WithDType};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr};
use std::sync::Arc;

/// `len` elements of `dtype` in device memory, counted in the ledger under
/// `Device::Cuda(n)` for exactly `len × dtype size` bytes (the same count a
/// CPU storage of that dtype and length gets) until it is dropped.
///
/// The bytes are kept untyped (`CudaSlice<u8>`); the dtype travels beside
/// them, so one type serves as the CUDA backing of a tensor storage.
pub struct CudaBuffer {
    device: Arc<CudaDevice>,
    data: CudaSlice<u8>,
    dtype: DType,
    len: usize,
    /// `None` once a tensor storage took the registration over
    /// ([`CudaBuffer::take_allocation`]): the storage then counts the bytes.
    allocation: Option<Allocation>,
}

/// The bytes of a slice of elements.
fn as_bytes<T: WithDType>(v: &[T]) -> &[u8] {
    // SAFETY: every `WithDType` (f32, f64, f16, bf16, u8, u32, i64) is plain
    // data without padding, so its memory is `size_of_val(v)` valid bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// The bytes of a mutable slice of elements.
fn as_bytes_mut<T: WithDType>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; in addition every bit pattern is a valid
    // value of these types, so writing arbitrary bytes is sound.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

impl CudaBuffer {
    /// `len` elements of `dtype` with unspecified contents, counted under
    /// the current allocation category. For kernel outputs that write every
    /// element.
    ///
    /// Errors: [`Error::OutOfMemory`] with the ledger's summary when a
    /// ledger limit or the device itself cannot take the bytes.
    pub fn alloc(device: &Arc<CudaDevice>, dtype: DType, len: usize) -> Result<CudaBuffer> {
        CudaBuffer::alloc_in(device, dtype, len, current_category())
    }

    /// [`CudaBuffer::alloc`] under an explicit category.
    pub fn alloc_in(
        device: &Arc<CudaDevice>,
        dtype: DType,
        len: usize,
        category: Category,
    ) -> Result<CudaBuffer> {
        let ledger = Ledger::current();
        let bytes = len.checked_mul(dtype.size_in_bytes()).ok_or_else(|| {
            ledger.out_of_memory(device.device(), usize::MAX, ledger.live(device.device()))
        })?;
        // Counted first, so a ledger limit refuses before the driver is asked.
        let allocation = ledger.register(device.device(), bytes, category)?;
        // SAFETY: the contents are unspecified until written; callers of
        // `alloc` write every element (kernel outputs, host copies). One
        // byte at least, so that every buffer has a distinct valid pointer.
        let data = match unsafe { device.stream().alloc::<u8>(bytes.max(1)) } {
            Ok(d) => d,
            Err(e) => {
                drop(allocation);
                let live = ledger.live(device.device());
                if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                    return Err(ledger.out_of_memory(device.device(), bytes, live));
                }
                return Err(device.error("cuMemAllocAsync", e));
            }
        };
        Ok(CudaBuffer {
            device: device.clone(),
            data,
            dtype,
            len,
            allocation: Some(allocation),
        })
    }

    /// `len` zeros of `dtype`, counted under the current category.
    pub fn zeros(device: &Arc<CudaDevice>, dtype: DType, len: usize) -> Result<CudaBuffer> {
        CudaBuffer::zeros_in(device, dtype, len, current_category())
    }

    /// `len` zeros of `dtype` under an explicit category.
    pub fn zeros_in(
        device: &Arc<CudaDevice>,
        dtype: DType,
        len: usize,
        category: Category,
    ) -> Result<CudaBuffer> {
        let mut b = CudaBuffer::alloc_in(device, dtype, len, category)?;
        let stream = device.stream().clone();
        stream
            .memset_zeros(&mut b.data)
            .map_err(|e| device.error("cuMemsetD8Async", e))?;
        Ok(b)
    }

    /// A device copy of host elements.
    pub fn from_slice<T: WithDType>(device: &Arc<CudaDevice>, host: &[T]) -> Result<CudaBuffer> {
        let mut b = CudaBuffer::alloc(device, T::DTYPE, host.len())?;
        b.copy_from_slice(host)?;
        Ok(b)
    }

    /// A device copy of host data of any dtype.
    pub fn from_cpu_data(device: &Arc<CudaDevice>, data: &CpuData) -> Result<CudaBuffer> {
        crate::match_cpu_data!(data, v => CudaBuffer::from_slice(device, v))
    }

    /// Overwrites the buffer with host elements (same dtype and length).
    pub fn copy_from_slice<T: WithDType>(&mut self, host: &[T]) -> Result<()> {
        self.check::<T>("copy_from_slice", host.len())?;
        let bytes = as_bytes(host);
        if bytes.is_empty() {
            return Ok(());
        }
        let stream = self.device.stream().clone();
        let mut dst = self.data.slice_mut(0..bytes.len());
        stream
            .memcpy_htod(bytes, &mut dst)
            .map_err(|e| self.device.error("cuMemcpyHtoDAsync", e))
    }

    /// The elements copied to the host (waits for pending work). A problem
    /// a kernel recorded since the last read (`cuda::checks`: a class
    /// index out of range) is read under the same synchronisation and
    /// returned as its typed error instead.
    pub fn to_vec<T: WithDType>(&self) -> Result<Vec<T>> {
        self.check::<T>("to_vec", self.len)?;
        let mut out = crate::memory::host::try_zeroed::<T>(self.len)?;
        let mut record = [0i64; super::checks::CHECK_WORDS];
        let armed = self.device.queue_check_read(&mut record)?;
        if self.len == 0 && armed.is_empty() {
            return Ok(out);
        }
        if self.len > 0 {
            let stream = self.device.stream().clone();
            stream
                .memcpy_dtoh(
                    &self.data.slice(0..self.size_in_bytes()),
                    as_bytes_mut(&mut out),
                )
                .map_err(|e| self.device.error("cuMemcpyDtoHAsync", e))?;
        }
        self.device.synchronize()?;
        self.device.report(&record, &armed)?;
        Ok(out)
    }

    /// The elements copied to the host as [`CpuData`] of the buffer's dtype.
    pub fn to_cpu_data(&self) -> Result<CpuData> {
        Ok(match self.dtype {
            DType::F32 => CpuData::F32(self.to_vec()?),
            DType::F16 => CpuData::F16(self.to_vec()?),
            DType::BF16 => CpuData::BF16(self.to_vec()?),
            DType::F64 => CpuData::F64(self.to_vec()?),
            DType::U8 => CpuData::U8(self.to_vec()?),
            DType::U32 => CpuData::U32(self.to_vec()?),
            DType::I64 => CpuData::I64(self.to_vec()?),
        })
    }

    /// A new buffer with the same contents (device-to-device copy), counted
    /// under the current category.
    pub fn try_clone(&self) -> Result<CudaBuffer> {
        let mut b = CudaBuffer::alloc(&self.device, self.dtype, self.len)?;
        let stream = self.device.stream().clone();
        stream
            .memcpy_dtod(&self.data, &mut b.data)
            .map_err(|e| self.device.error("cuMemcpyDtoDAsync", e))?;
        Ok(b)
    }

    /// Copies `len` elements of `src` from element `from` into this buffer
    /// at element `at` (device to device, same dtype and device; `src` is
    /// another buffer).
    pub fn copy_range_from(
        &mut self,
        at: usize,
        src: &CudaBuffer,
        from: usize,
        len: usize,
    ) -> Result<()> {
        let op = "cuda copy_range_from";
        super::check::same_device(op, src, self)?;
        if src.dtype != self.dtype {
            return Err(Error::DTypeMismatch {
                op,
                expected: self.dtype,
                got: src.dtype,
            });
        }
        if at + len > self.len || from + len > src.len {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "{len} elements from {from} of {} into {at} of {}",
                    src.len, self.len
                ),
            });
        }
        if len == 0 {
            return Ok(());
        }
        let size = self.dtype.size_in_bytes();
        let device = self.device.clone();
        let stream = device.stream().clone();
        let from_view = src.data.slice(from * size..(from + len) * size);
        let mut to_view = self.data.slice_mut(at * size..(at + len) * size);
        stream
            .memcpy_dtod(&from_view, &mut to_view)
            .map_err(|e| device.error("cuMemcpyDtoDAsync", e))
    }

    fn check<T: WithDType>(&self, op: &'static str, len: usize) -> Result<()> {
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch {
                op,
                expected: self.dtype,
                got: T::DTYPE,
            });
        }
        if len != self.len {
            return Err(Error::ShapeMismatch {
                op,
                lhs: vec![self.len],
                rhs: vec![len],
            });
        }
        Ok(())
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Declares the elements to be of `dtype`, of the same element size,
    /// once a kernel rewrote them as such in place (the same bytes, the
    /// same ledger registration).
    pub(crate) fn retype(&mut self, dtype: DType) -> Result<()> {
        if dtype.size_in_bytes() != self.dtype.size_in_bytes() {
            return Err(Error::InvalidArgument {
                op: "cuda retype",
                msg: format!("{:?} elements are not {dtype:?} elements", self.dtype),
            });
        }
        self.dtype = dtype;
        Ok(())
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of element data (what the ledger counts).
    pub fn size_in_bytes(&self) -> usize {
        self.len * self.dtype.size_in_bytes()
    }

    /// The device the buffer lives on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// The ledger registration (to mark the buffer saved, change its
    /// category…); `None` inside a tensor storage, which holds it instead.
    pub fn allocation(&self) -> Option<&Allocation> {
        self.allocation.as_ref()
    }

    /// Hands the ledger registration to a tensor storage, which keeps it
    /// beside the buffer for as long as the buffer lives.
    pub(crate) fn take_allocation(&mut self) -> Option<Allocation> {
        self.allocation.take()
    }

    /// Whether element 0 starts on a 16-byte boundary, so that a kernel
    /// may move runs of its elements as whole 16-byte (or 8-byte) vectors.
    pub(crate) fn vector_aligned(&self) -> bool {
        self.vector_aligned_at(0)
    }

    /// Whether element `elem` starts on a 16-byte boundary (a run kernel's
    /// vectors from an offset into the buffer).
    pub(crate) fn vector_aligned_at(&self, elem: usize) -> bool {
        (self.address() as usize + elem * self.dtype.size_in_bytes()).is_multiple_of(16)
    }

    /// The device address of element 0, for a kernel parameter that may
    /// also be null (an absent operand the kernel tests for). Valid while
    /// the buffer lives; the one stream orders a launch after every
    /// earlier use of it.
    pub(crate) fn address(&self) -> u64 {
        let stream = self.device.stream().clone();
        let (base, _record) = self.data.device_ptr(&stream);
        base
    }

    /// The raw bytes, for kernel launches (at least one byte long).
    pub fn slice(&self) -> &CudaSlice<u8> {
        &self.data
    }

    /// The raw bytes, mutably, for kernel launches that write the buffer.
    pub fn slice_mut(&mut self) -> &mut CudaSlice<u8> {
        &mut self.data
    }

    /// Zeroes the bytes `range` of the buffer (on its device's stream).
    pub(crate) fn zero_bytes(&mut self, range: std::ops::Range<usize>) -> Result<()> {
        let stream = self.device.stream().clone();
        let mut view = self.data.slice_mut(range);
        stream
            .memset_zeros(&mut view)
            .map_err(|e| self.device.error("cuMemsetD8Async", e))
    }

    /// A view of the element bytes (exactly [`CudaBuffer::size_in_bytes`]).
    pub fn bytes(&self) -> CudaView<'_, u8> {
        self.data.slice(0..self.size_in_bytes())
    }

    /// A mutable view of the element bytes.
    pub fn bytes_mut(&mut self) -> CudaViewMut<'_, u8> {
        let n = self.size_in_bytes();
        self.data.slice_mut(0..n)
    }
}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaBuffer({:?} x {} on cuda:{})",
            self.dtype,
            self.len,
            self.device.ordinal()
        )
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn buffers_and_devices_can_be_shared_across_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<super::CudaBuffer>();
        shareable::<super::CudaDevice>();
    }
}
