//! Host buffers of tensor data that fail as a typed error instead of
//! aborting the process.
//!
//! Every host allocation of tensor data (storages, kernel outputs, host
//! staging of random numbers and copies) goes through [`try_vec`],
//! [`try_zeroed`] or [`try_filled`]. Each one:
//!
//! 1. computes the byte size with checked arithmetic (a size that does not
//!    fit in `usize` is [`Error::OutOfMemory`], never a wrapped product);
//! 2. for requests of [`CHECKED_BYTES`] or more, compares the size with
//!    what the machine can still hand out ([`host_available_bytes`]) and
//!    refuses what cannot fit;
//! 3. takes a freed buffer of exactly that type and length from the cache
//!    of large buffers (`host_cache`, which a storage's buffer joins when
//!    the storage is dropped), else allocates with
//!    `Vec::try_reserve_exact` (or a zeroed allocation), so an allocator
//!    failure is an error, not Rust's abort. A request that does not fit
//!    empties the cache and is checked again before it is refused.
//!
//! Why step 2: Linux overcommits memory. A `try_reserve` of 40 GiB on a
//! machine with 24 GiB usually *succeeds* (only address space is
//! reserved) and the process is killed by the kernel's OOM killer later,
//! when the kernels touch the pages — no error reaches the caller. Only an
//! allocation larger than RAM plus swap is refused outright. So the size
//! is checked first against `MemAvailable + SwapFree` from `/proc/meminfo`
//! (and, inside a cgroup-v2 container with a memory limit, against what is
//! left under that limit). The files are read again for every large
//! request, because what is available changes as the process allocates;
//! reading them costs microseconds, nothing next to filling 64 MiB.
//! Smaller requests are not checked: they cannot be the one that does not
//! fit unless the machine is already exhausted.

use super::host_cache::{cached_host_bytes, release_cached_host_buffers, take, take_initialized};
use super::Ledger;
use crate::{Device, Error, Result};

/// Requests of at least this many bytes are checked against what the host
/// can still hand out before they are made.
pub const CHECKED_BYTES: usize = 64 << 20;

/// Bytes the host can still hand out: `MemAvailable + SwapFree` from
/// `/proc/meminfo`, or less inside a cgroup-v2 memory limit (its
/// `memory.max` minus what the group uses, page cache not counted).
/// `None` where this is unknown (no `/proc/meminfo`: not Linux). The
/// freed buffers leangrad keeps for reuse count as available: a request
/// that needs them gets them back first.
pub fn host_available_bytes() -> Option<usize> {
    machine_available_bytes().map(|a| a.saturating_add(cached_host_bytes()))
}

/// [`host_available_bytes`] without the cache of freed buffers.
fn machine_available_bytes() -> Option<usize> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<usize> {
        let line = meminfo.lines().find(|l| l.starts_with(name))?;
        let kib: usize = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib.saturating_mul(1024))
    };
    let machine = field("MemAvailable:")?.saturating_add(field("SwapFree:").unwrap_or(0));
    Some(match cgroup_available() {
        Some(group) => machine.min(group),
        None => machine,
    })
}

/// What is left under the cgroup-v2 memory limit the process sees at the
/// root of its cgroup namespace (a container's view); `None` without one.
fn cgroup_available() -> Option<usize> {
    let read = |f: &str| std::fs::read_to_string(format!("/sys/fs/cgroup/{f}")).ok();
    let limit: usize = read("memory.max")?.trim().parse().ok()?; // "max": no limit
    let used: usize = read("memory.current")?.trim().parse().ok()?;
    // Page cache is reclaimed before the group's OOM killer runs.
    let cache: usize = read("memory.stat")
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("file "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0);
    Some(limit.saturating_sub(used.saturating_sub(cache)))
}

/// The out-of-memory error of a host request of `bytes`: `why`, then the
/// current ledger's table.
fn host_oom(bytes: usize, why: &str) -> Error {
    let ledger = Ledger::current();
    Error::OutOfMemory {
        device: Device::Cpu,
        requested: bytes,
        live: ledger.live(Device::Cpu),
        summary: format!("{why}\n{}", ledger.report().to_table()),
    }
}

/// The byte size of `n` elements of `T`, checked against overflow and,
/// when large, against what the host can hand out.
fn admit<T>(n: usize) -> Result<usize> {
    let bytes = n.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
        host_oom(
            usize::MAX,
            &format!(
                "{n} elements of {} bytes do not fit in the address space",
                std::mem::size_of::<T>()
            ),
        )
    })?;
    if bytes >= CHECKED_BYTES {
        let mut available = machine_available_bytes();
        if available.is_some_and(|a| bytes > a) && release_cached_host_buffers() > 0 {
            available = machine_available_bytes();
        }
        if let Some(available) = available {
            if bytes > available {
                return Err(host_oom(
                    bytes,
                    &format!(
                        "the host has {} available (MemAvailable + SwapFree, within any cgroup limit)",
                        super::human_bytes(available)
                    ),
                ));
            }
        }
    }
    Ok(bytes)
}

/// The number of elements of a buffer with these dimensions (their
/// product), or [`Error::OutOfMemory`] when it does not fit in `usize`: a
/// size computed from a file or an argument is checked before it drives
/// an allocation.
pub fn checked_count(dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| {
            host_oom(
                usize::MAX,
                &format!("a buffer of {dims:?} elements does not fit in the address space"),
            )
        })
}

/// An empty vector with room for exactly `n` elements (uninitialised, as
/// `Vec::with_capacity`), or [`Error::OutOfMemory`].
pub fn try_vec<T: Send + 'static>(n: usize) -> Result<Vec<T>> {
    let bytes = admit::<T>(n)?;
    if let Some(v) = take::<T>(n) {
        return Ok(v);
    }
    let mut v = Vec::new();
    if v.try_reserve_exact(n).is_err() {
        release_cached_host_buffers();
        v.try_reserve_exact(n)
            .map_err(|_| host_oom(bytes, "the allocator refused the request"))?;
    }
    Ok(v)
}

/// `n` zeros (all-zero bytes, from a zeroed allocation as `vec![0; n]`:
/// large buffers get the kernel's zero pages without a fill), or
/// [`Error::OutOfMemory`].
pub fn try_zeroed<T: bytemuck::Zeroable + Send + 'static>(n: usize) -> Result<Vec<T>> {
    let bytes = admit::<T>(n)?;
    if let Some(mut v) = take::<T>(n) {
        // SAFETY: `v` has room for `n` elements, and all-zero bytes are a
        // valid `T` (`Zeroable`).
        unsafe {
            std::ptr::write_bytes(v.as_mut_ptr(), 0, n);
            v.set_len(n);
        }
        return Ok(v);
    }
    fresh_zeroed(n, bytes)
}

/// `n` zeros in a new zeroed allocation of `bytes` (already admitted).
fn fresh_zeroed<T: bytemuck::Zeroable>(n: usize, bytes: usize) -> Result<Vec<T>> {
    bytemuck::allocation::try_zeroed_vec(n).or_else(|()| {
        release_cached_host_buffers();
        bytemuck::allocation::try_zeroed_vec(n)
            .map_err(|()| host_oom(bytes, "the allocator refused the request"))
    })
}

/// `n` elements for a kernel that writes every one of them before reading
/// any: a kept buffer of the host cache as its last storage left it (no
/// fill: the elements are overwritten anyway), else zeros as
/// [`try_zeroed`]. Never uninitialised memory: elements the kept buffer's
/// last storage did not hold are zeroed.
pub(crate) fn try_for_overwrite<T: bytemuck::Zeroable + Send + 'static>(
    n: usize,
) -> Result<Vec<T>> {
    let bytes = admit::<T>(n)?;
    if let Some((mut v, init)) = take_initialized::<T>(n) {
        let keep = init.min(n);
        // SAFETY: `v` has room for `n` elements; the first `keep` hold `T`
        // values its last storage wrote (a `Vec<T>`'s initialised prefix,
        // which `clear` does not touch), the rest are zeroed here, and
        // all-zero bytes are a valid `T` (`Zeroable`).
        unsafe {
            std::ptr::write_bytes(v.as_mut_ptr().add(keep), 0, n - keep);
            v.set_len(n);
        }
        return Ok(v);
    }
    fresh_zeroed(n, bytes)
}

/// `n` copies of `value` (as `vec![value; n]`), or [`Error::OutOfMemory`].
pub fn try_filled<T: Clone + Send + 'static>(n: usize, value: T) -> Result<Vec<T>> {
    let mut v = try_vec(n)?;
    v.resize(n, value);
    Ok(v)
}

/// The `n` items of `items` collected into a vector allocated by
/// [`try_vec`] (`items` must yield exactly `n`; fewer leave it shorter,
/// more grow it).
pub fn try_collect<T: Send + 'static>(
    n: usize,
    items: impl IntoIterator<Item = T>,
) -> Result<Vec<T>> {
    let mut v = try_vec(n)?;
    v.extend(items);
    Ok(v)
}

/// [`try_collect`] for a parallel iterator of exactly `n` items (filled in
/// place by rayon, as `collect` would).
pub fn try_par_collect<T: Send + 'static>(
    n: usize,
    items: impl rayon::iter::IndexedParallelIterator<Item = T>,
) -> Result<Vec<T>> {
    use rayon::iter::ParallelExtend;
    let mut v = try_vec(n)?;
    v.par_extend(items);
    Ok(v)
}
