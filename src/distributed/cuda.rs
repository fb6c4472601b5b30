//! NCCL through cudarc's runtime-loaded bindings: the unique id, one
//! communicator per rank on its device, and the collectives on the device
//! buffers of contiguous tensors, enqueued on the device's one stream.

use super::ReduceOp;
use crate::cuda::{CudaBuffer, CudaDevice};
use crate::tensor::cuda as tensor;
use crate::{DType, Error, Result, Tensor};
use cudarc::driver::{CudaEvent, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::{result, sys};
use std::ffi::{c_void, CStr};
use std::sync::Arc;

/// Bytes of NCCL's unique id.
const ID_BYTES: usize = 128;

fn nccl_error(rank: usize, what: &str, e: result::NcclError) -> Error {
    // SAFETY: NCCL returns a static NUL-terminated string for any code.
    let text = unsafe { CStr::from_ptr(sys::ncclGetErrorString(e.0)) };
    Error::Distributed {
        rank,
        msg: format!("{what}: {:?} ({})", e.0, text.to_string_lossy()),
    }
}

/// Whether NCCL can be loaded, as an error naming what is missing.
fn require_nccl(rank: usize) -> Result<()> {
    // SAFETY: only tries to open the library.
    if unsafe { sys::is_culib_present() } {
        return Ok(());
    }
    Err(Error::Distributed {
        rank,
        msg: "NCCL (libnccl.so.2) cannot be loaded: install it (e.g. `pip install nvidia-nccl-cu13`) and put its lib folder on LD_LIBRARY_PATH".into(),
    })
}

/// A new NCCL unique id (rank 0 makes it and the rendezvous hands it out).
pub(super) fn unique_id(rank: usize) -> Result<Vec<u8>> {
    require_nccl(rank)?;
    let id = result::get_uniqueid().map_err(|e| nccl_error(rank, "ncclGetUniqueId", e))?;
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

/// One rank's NCCL communicator, on its CUDA device.
pub(super) struct Communicator {
    comm: sys::ncclComm_t,
    device: Arc<CudaDevice>,
    /// The stream of the asynchronous collectives (data parallel's
    /// buckets), so that they overlap the kernels of the device's stream.
    comm_stream: Arc<CudaStream>,
    rank: usize,
    world_size: usize,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a
// time; every call here is made with `&self` and NCCL serialises calls on
// one communicator.
unsafe impl Send for Communicator {}
// SAFETY: as above.
unsafe impl Sync for Communicator {}

/// Collectives queued on the communication stream: the tensors they work
/// on, held until the device's stream has been told to wait for them (a
/// buffer freed earlier could be handed to a kernel while NCCL still uses
/// it).
pub(super) struct CommWork {
    done: CudaEvent,
    device: Arc<CudaDevice>,
    tensors: Vec<Tensor>,
}

impl CommWork {
    /// Makes the device's stream wait for the collectives (the host does
    /// not wait) and gives the tensors back.
    pub(super) fn wait(mut self) -> Result<Vec<Tensor>> {
        self.order_after()?;
        Ok(std::mem::take(&mut self.tensors))
    }

    /// The device's later work (a free of these tensors' buffers included)
    /// after the collectives.
    fn order_after(&self) -> Result<()> {
        self.device
            .stream()
            .wait(&self.done)
            .map_err(|e| self.device.error("cuStreamWaitEvent", e))
    }
}

impl Drop for CommWork {
    fn drop(&mut self) {
        // Work dropped unwaited (a backward that failed): its buffers are
        // freed on the device's stream, which must not hand them to a
        // kernel before NCCL is done with them.
        if !self.tensors.is_empty() {
            let _ = self.order_after();
        }
    }
}

/// What one NCCL call is given: the send and receive addresses, the
/// element count and type, and the stream.
type Call = (
    *const c_void,
    *mut c_void,
    usize,
    sys::ncclDataType_t,
    sys::cudaStream_t,
);

impl Communicator {
    /// Joins the clique of `id` as `rank` of `world_size` on CUDA device
    /// `ordinal`; returns once every rank has joined.
    pub(super) fn new(ordinal: usize, id: &[u8], rank: usize, world_size: usize) -> Result<Self> {
        require_nccl(rank)?;
        if id.len() != ID_BYTES {
            return Err(Error::Distributed {
                rank,
                msg: format!("an NCCL id of {} bytes (expected {ID_BYTES})", id.len()),
            });
        }
        let device = tensor::device(ordinal)?;
        // NCCL puts the communicator on the calling thread's current device.
        device
            .stream()
            .context()
            .bind_to_thread()
            .map_err(|e| device.error("cuCtxSetCurrent", e))?;
        let mut uid = sys::ncclUniqueId {
            internal: [0; ID_BYTES],
        };
        for (d, s) in uid.internal.iter_mut().zip(id) {
            *d = *s as _;
        }
        let mut comm = std::mem::MaybeUninit::uninit();
        let (world, r) = (world_size as i32, rank as i32);
        // SAFETY: `comm` is written by NCCL before it is read.
        let comm = unsafe {
            result::comm_init_rank(comm.as_mut_ptr(), world, uid, r)
                .map_err(|e| nccl_error(rank, "ncclCommInitRank", e))?;
            comm.assume_init()
        };
        let comm_stream = match device.stream().context().new_stream() {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: the communicator was made above and is not used again.
                let _ = unsafe { result::comm_destroy(comm) };
                return Err(device.error("cuStreamCreate", e));
            }
        };
        Ok(Communicator {
            comm,
            device,
            comm_stream,
            rank,
            world_size,
        })
    }

    fn error(&self, what: &str, e: result::NcclError) -> Error {
        nccl_error(self.rank, what, e)
    }

    /// `t`'s whole buffer, checked to be all of `t` (contiguous, no offset).
    fn whole<'t>(&self, op: &'static str, t: &'t Tensor) -> Result<&'t Tensor> {
        if !t.is_whole_storage() {
            return Err(Error::InvalidArgument {
                op,
                msg:
                    "the tensor must be contiguous and the whole of its storage (use .contiguous())"
                        .into(),
            });
        }
        Ok(t)
    }

    /// Runs `call` on `t`'s buffer as both send and receive buffer (an
    /// in-place collective named `what`), `t` being all of its storage.
    fn in_place(
        &self,
        what: &'static str,
        t: &Tensor,
        call: impl FnOnce(Call) -> std::result::Result<result::NcclStatus, result::NcclError>,
    ) -> Result<()> {
        self.in_place_on(what, t, self.device.stream(), call)
    }

    /// [`Self::in_place`] queued on `stream`.
    fn in_place_on(
        &self,
        what: &'static str,
        t: &Tensor,
        stream: &Arc<CudaStream>,
        call: impl FnOnce(Call) -> std::result::Result<result::NcclStatus, result::NcclError>,
    ) -> Result<()> {
        let t = self.whole(what, t)?;
        let mut buf = t.storage().cuda_mut()?;
        let (dtype, count) = (nccl_dtype(buf.dtype())?, buf.len());
        let p = address_mut(&mut buf, stream) as *mut c_void;
        call((p, p, count, dtype, stream.cu_stream() as _)).map_err(|e| self.error(what, e))?;
        drop(buf);
        crate::meta::touch(t);
        Ok(())
    }

    /// Runs `call` from a dense copy of `t` (`count` elements sent) into a
    /// new buffer of `out_len` elements (a collective named `what`), wrapped
    /// as a tensor of `shape`.
    fn to_new_buffer(
        &self,
        what: &'static str,
        t: &Tensor,
        (out_len, shape): (usize, &[usize]),
        call: impl FnOnce(Call) -> std::result::Result<result::NcclStatus, result::NcclError>,
    ) -> Result<Tensor> {
        let dense = tensor::dense(t)?;
        let src = dense.storage().cuda()?;
        let dtype = nccl_dtype(src.dtype())?;
        let mut out = CudaBuffer::alloc(&self.device, src.dtype(), out_len)?;
        let stream = self.device.stream().clone();
        let (sp, dp) = (address(&src, &stream), address_mut(&mut out, &stream));
        let args = (
            sp as *const c_void,
            dp as *mut c_void,
            src.len(),
            dtype,
            stream.cu_stream() as _,
        );
        call(args).map_err(|e| self.error(what, e))?;
        drop(src);
        tensor::wrap(out, shape)
    }

    /// Reduces `t` over the ranks in place.
    pub(super) fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<()> {
        // SAFETY (here and below): the addresses and counts are those of
        // live buffers of this device, used in its stream's order.
        self.in_place("ncclAllReduce", t, |(s, r, n, d, st)| unsafe {
            result::all_reduce(s, r, n, d, nccl_op(op), self.comm, st)
        })
    }

    /// Copies rank `root`'s `t` into every rank's `t`.
    pub(super) fn broadcast(&self, t: &Tensor, root: usize) -> Result<()> {
        self.in_place("ncclBroadcast", t, |(s, r, n, d, st)| unsafe {
            result::broadcast(s, r, n, d, root as i32, self.comm, st)
        })
    }

    /// Every rank's `t` in rank order, `[world_size, ...]`.
    pub(super) fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        let mut shape = vec![self.world_size];
        shape.extend_from_slice(t.shape());
        let out_len = t.numel() * self.world_size;
        self.to_new_buffer(
            "ncclAllGather",
            t,
            (out_len, &shape),
            |(s, r, n, d, st)| unsafe { result::all_gather(s, r, n, d, self.comm, st) },
        )
    }

    /// `t` (`[world_size, ...]`) reduced over ranks; this rank's block.
    pub(super) fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let count = t.numel() / self.world_size;
        self.to_new_buffer(
            "ncclReduceScatter",
            t,
            (count, &t.shape()[1..]),
            |(s, r, _, d, st)| unsafe {
                result::reduce_scatter(s, r, count, d, nccl_op(op), self.comm, st)
            },
        )
    }

    /// Reduces each of `tensors` in place on the communication stream, as
    /// one NCCL group: to every rank where its root is `None`, to that rank
    /// alone otherwise (the others' buffers are left as they were). Queued
    /// after the work already on the device's stream (which wrote them);
    /// the device's stream goes on at once.
    pub(super) fn reduce_async(
        &self,
        tensors: Vec<Tensor>,
        roots: &[Option<usize>],
        op: ReduceOp,
    ) -> Result<CommWork> {
        let stream = self.comm_stream.clone();
        stream
            .join(self.device.stream())
            .map_err(|e| self.device.error("cuStreamWaitEvent", e))?;
        self.grouped(|| {
            tensors
                .iter()
                .zip(roots)
                .try_for_each(|(t, &root)| self.queue_reduce(t, root, op, &stream))
        })?;
        let done = stream
            .record_event(None)
            .map_err(|e| self.device.error("cuEventRecord", e))?;
        Ok(CommWork {
            done,
            device: self.device.clone(),
            tensors,
        })
    }

    /// One in-place all-reduce (`root` `None`) or reduce of `t` on `stream`.
    fn queue_reduce(
        &self,
        t: &Tensor,
        root: Option<usize>,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let what = match root {
            None => "ncclAllReduce",
            Some(_) => "ncclReduce",
        };
        let op = nccl_op(op);
        // SAFETY: a live buffer of this device, kept alive by the returned
        // work until the device's stream has waited for it.
        self.in_place_on(what, t, stream, |(s, r, n, d, st)| unsafe {
            match root {
                None => result::all_reduce(s, r, n, d, op, self.comm, st),
                Some(root) => result::reduce(s, r, n, d, op, root as i32, self.comm, st),
            }
        })
    }

    /// Broadcasts each of `tensors` from its root, in place, as one NCCL
    /// group on the device's stream (after the kernels that wrote them).
    pub(super) fn broadcast_group(&self, tensors: &[Tensor], roots: &[usize]) -> Result<()> {
        self.grouped(|| {
            tensors.iter().zip(roots).try_for_each(|(t, &root)| {
                // SAFETY: a live buffer of this device, in its stream's order.
                self.in_place("ncclBroadcast", t, |(s, r, n, d, st)| unsafe {
                    result::broadcast(s, r, n, d, root as i32, self.comm, st)
                })
            })
        })
    }

    /// Runs `queue` (NCCL calls) between `ncclGroupStart` and
    /// `ncclGroupEnd`; the group is closed even when a call failed, so
    /// NCCL's state stays whole.
    fn grouped(&self, queue: impl FnOnce() -> Result<()>) -> Result<()> {
        result::group_start().map_err(|e| self.error("ncclGroupStart", e))?;
        let queued = queue();
        let ended = result::group_end().map_err(|e| self.error("ncclGroupEnd", e));
        queued?;
        ended.map(drop)
    }

    /// An all-reduce of one element, then a wait for this device's stream.
    pub(super) fn barrier(&self) -> Result<()> {
        let one = tensor::zeros(&[1], DType::F32, self.device.ordinal())?;
        self.all_reduce(&one, ReduceOp::Sum)?;
        self.device.synchronize()
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // SAFETY: the communicator is not used after this; destroy waits
        // for its queued operations.
        let _ = unsafe { result::comm_destroy(self.comm) };
    }
}

/// The device address of `buf` for work on `stream` (the device keeps no
/// per-buffer events: its one stream orders everything).
fn address(buf: &CudaBuffer, stream: &Arc<CudaStream>) -> u64 {
    let (p, _record) = buf.slice().device_ptr(stream);
    p
}

/// [`address`] of a buffer the work writes.
fn address_mut(buf: &mut CudaBuffer, stream: &Arc<CudaStream>) -> u64 {
    let (p, _record) = buf.slice_mut().device_ptr_mut(stream);
    p
}

fn nccl_dtype(dtype: DType) -> Result<sys::ncclDataType_t> {
    use sys::ncclDataType_t as N;
    Ok(match dtype {
        DType::F32 => N::ncclFloat32,
        DType::F64 => N::ncclFloat64,
        DType::F16 => N::ncclFloat16,
        DType::BF16 => N::ncclBfloat16,
        DType::U8 => N::ncclUint8,
        DType::U32 => N::ncclUint32,
        DType::I64 => N::ncclInt64,
    })
}

fn nccl_op(op: ReduceOp) -> sys::ncclRedOp_t {
    use sys::ncclRedOp_t as N;
    match op {
        ReduceOp::Sum => N::ncclSum,
        ReduceOp::Avg => N::ncclAvg,
        ReduceOp::Product => N::ncclProd,
        ReduceOp::Max => N::ncclMax,
        ReduceOp::Min => N::ncclMin,
    }
}
