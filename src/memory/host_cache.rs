//! Large freed host buffers kept for the next request of the same size.
//!
//! A training step allocates and frees the same sequence of buffers every
//! step. The system allocator returns large freed buffers to the kernel
//! (glibc unmaps chunks above its mmap threshold and trims the heap top),
//! so the next step gets fresh pages and pays a page fault and the
//! kernel's zeroing of every 4 KiB page it touches: 5–8% of a CPU
//! ResNet-18 step. Keeping buffers of at least [`CACHED_MIN_BYTES`] here,
//! up to [`CACHE_CAP_BYTES`] in all, and handing one back to a request of
//! its element type that it holds with at most an eighth to spare, removes
//! that cost (a larger cap kept more of BERT-base's Adam step, 12% more
//! resident memory for a few percent of time).
//!
//! The cache is below the ledger: a cached buffer belongs to no storage,
//! so the ledger neither counts it nor sees any change (it counts what
//! tensors hold, like PyTorch's "allocated", not what the process keeps,
//! its "reserved"). A request the host cannot satisfy empties the cache
//! and tries again before it is refused, and [`release_cached_host_buffers`]
//! empties it on demand.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::Mutex;

/// Freed buffers of at least this many bytes (256 KiB) are kept. Smaller
/// ones stay in the allocator's own heap, where reuse costs no page fault
/// but a zeroed request still costs a fill: at 1 MiB, each of BERT-base's
/// 256 × 768 f32 activations (768 KiB) was zero-filled before its product
/// overwrote it, about 1% of the frozen-backbone step.
pub const CACHED_MIN_BYTES: usize = 1 << 18;

/// At most this many bytes are kept; the oldest buffer goes first.
pub const CACHE_CAP_BYTES: usize = 256 << 20;

/// A kept buffer: a `Vec<T>` of `capacity` elements (length 0), whose
/// first `init` elements still hold the values its storage last wrote.
struct Kept {
    bytes: usize,
    capacity: usize,
    init: usize,
    buffer: Box<dyn Any + Send>,
}

struct Cache {
    kept: VecDeque<Kept>,
    bytes: usize,
}

static CACHE: Mutex<Cache> = Mutex::new(Cache {
    kept: VecDeque::new(),
    bytes: 0,
});

fn cache() -> std::sync::MutexGuard<'static, Cache> {
    // A panic while holding the lock leaves the queue consistent (every
    // change is one push or pop with its byte count), so go on.
    CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Offers a freed buffer to the cache: kept when it is large enough, else
/// (and for whatever the cap pushes out) freed now.
pub(crate) fn keep<T: Send + 'static>(mut v: Vec<T>) {
    let bytes = v.capacity() * std::mem::size_of::<T>();
    if !(CACHED_MIN_BYTES..=CACHE_CAP_BYTES).contains(&bytes) {
        return;
    }
    let init = v.len();
    v.clear();
    let capacity = v.capacity();
    let mut evicted = Vec::new();
    {
        let mut c = cache();
        c.kept.push_back(Kept {
            bytes,
            capacity,
            init,
            buffer: Box::new(v),
        });
        c.bytes += bytes;
        while c.bytes > CACHE_CAP_BYTES {
            let Some(old) = c.kept.pop_front() else { break };
            c.bytes -= old.bytes;
            evicted.push(old);
        }
    }
    // Freed outside the lock.
    drop(evicted);
}

/// A kept `Vec<T>` with room for `n` elements and at most an eighth more
/// (length 0), or `None`.
pub(crate) fn take<T: 'static>(n: usize) -> Option<Vec<T>> {
    take_initialized(n).map(|(v, _)| v)
}

/// [`take`], with how many leading elements of the buffer hold values its
/// last storage wrote (its length when it was freed): a `Vec`'s
/// initialised prefix, which `clear` left as it was.
pub(crate) fn take_initialized<T: 'static>(n: usize) -> Option<(Vec<T>, usize)> {
    let bytes = n.checked_mul(std::mem::size_of::<T>())?;
    if !(CACHED_MIN_BYTES..=CACHE_CAP_BYTES).contains(&bytes) {
        return None;
    }
    let mut c = cache();
    // The smallest kept buffer with room for `n` and at most an eighth
    // more (the most recent of equals): a step's sizes repeat exactly,
    // and a near size may use a buffer that would otherwise wait.
    let most = n + n / 8;
    let (at, _) = c
        .kept
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, k)| (n..=most).contains(&k.capacity) && k.buffer.is::<Vec<T>>())
        .min_by_key(|(_, k)| k.capacity)?;
    let kept = c.kept.remove(at)?;
    c.bytes -= kept.bytes;
    drop(c);
    let init = kept.init;
    kept.buffer.downcast::<Vec<T>>().ok().map(|b| (*b, init))
}

/// Frees every kept buffer; returns how many bytes that gave back.
pub fn release_cached_host_buffers() -> usize {
    let kept = {
        let mut c = cache();
        c.bytes = 0;
        std::mem::take(&mut c.kept)
    };
    kept.iter().map(|k| k.bytes).sum()
}

/// Bytes of freed host buffers kept for reuse now.
pub fn cached_host_bytes() -> usize {
    cache().bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_buffer_comes_back_only_for_its_own_type_and_length() {
        let n = (CACHED_MIN_BYTES / 4) + 7;
        let mut v: Vec<f32> = Vec::with_capacity(n);
        v.resize(n, 1.5);
        let ptr = v.as_ptr() as usize;
        keep(v);
        assert!(take::<u32>(n).is_none(), "another type of one size");
        assert!(take::<f32>(n + 1).is_none(), "another length");
        // Other tests share the cache; a buffer of this length and type is
        // only ever kept by this test.
        let back = take::<f32>(n).expect("kept");
        assert_eq!(
            (back.len(), back.capacity(), back.as_ptr() as usize),
            (0, n, ptr)
        );
        // A request an eighth smaller at most takes it; a quarter, not.
        let m = CACHED_MIN_BYTES + 3;
        let wide: Vec<u16> = Vec::with_capacity(m + m / 10);
        let ptr = wide.as_ptr() as usize;
        keep(wide);
        assert!(take::<u16>(m - m / 4).is_none());
        let back = take::<u16>(m).expect("within an eighth");
        assert_eq!((back.capacity(), back.as_ptr() as usize), (m + m / 10, ptr));
        // Small buffers are not kept.
        keep(vec![0u8; 1000]);
        assert!(take::<u8>(1000).is_none());
    }
}
