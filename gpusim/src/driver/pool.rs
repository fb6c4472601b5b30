//! The device's default memory pool (`cuMemAllocAsync` / `cuMemFreeAsync`),
//! as a counter model:
//!
//! - *used*: bytes of live pool allocations (a `cuMemFreeAsync` counts when
//!   the stream reaches it, i.e. when the queue runs it);
//! - *reserved*: used plus freed bytes the pool keeps cached for reuse. A
//!   new allocation takes what it can from the cache, the rest is newly
//!   reserved; a free moves its bytes from used to the cache;
//! - at each synchronisation (every time a queue is drained) the cache is
//!   released down to the release threshold: reserved becomes
//!   `max(used, threshold)`, as the real driver trims a pool at a
//!   synchronisation. The threshold is 0 by default, as in the driver;
//! - the high-water marks follow both; setting either to 0 resets it to the
//!   current value.
//!
//! Cached bytes count as taken in `cuMemGetInfo`; an allocation that would
//! not fit releases the cache first.

/// Counters of one pool, in bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pool {
    /// Bytes of live pool allocations.
    pub used: u64,
    /// The most bytes used at once since the last reset.
    pub used_high: u64,
    /// Bytes held from the device (used + cached).
    pub reserved: u64,
    /// The most bytes reserved at once since the last reset.
    pub reserved_high: u64,
    /// Cached bytes beyond this are released at a synchronisation.
    pub release_threshold: u64,
    /// The three `REUSE_*` flags (stored and reported; reuse is not
    /// observable here since addresses are never reused).
    pub reuse: [i32; 3],
}

impl Pool {
    /// A pool with nothing reserved and the driver's default settings.
    pub fn new() -> Pool {
        Pool {
            reuse: [1, 1, 1],
            ..Pool::default()
        }
    }

    /// Freed bytes kept for reuse.
    pub fn cached(&self) -> u64 {
        self.reserved - self.used
    }

    /// An allocation of `size` bytes from the pool.
    pub fn alloc(&mut self, size: u64) {
        let from_cache = size.min(self.cached());
        self.used += size;
        self.reserved += size - from_cache;
        self.used_high = self.used_high.max(self.used);
        self.reserved_high = self.reserved_high.max(self.reserved);
    }

    /// A free of a pool allocation of `size` bytes: they stay reserved.
    pub fn free(&mut self, size: u64) {
        self.used -= size.min(self.used);
    }

    /// The trim at a synchronisation: cache beyond the threshold released.
    pub fn trim(&mut self) {
        self.reserved = self.reserved.min(self.used.max(self.release_threshold));
    }

    /// Releases the whole cache (an allocation needs the room).
    pub fn release_cache(&mut self) {
        self.reserved = self.used;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_is_reused_and_trimmed_to_the_threshold() {
        let mut p = Pool::new();
        p.alloc(100);
        p.alloc(50);
        p.free(100);
        assert_eq!((p.used, p.reserved, p.cached()), (50, 150, 100));
        p.alloc(30); // from the cache
        assert_eq!((p.used, p.reserved), (80, 150));
        p.alloc(100); // 70 from the cache, 30 new
        assert_eq!(
            (p.used, p.reserved, p.used_high, p.reserved_high),
            (180, 180, 180, 180)
        );
        p.free(180);
        p.release_threshold = 60;
        p.trim();
        assert_eq!((p.used, p.reserved), (0, 60));
        p.release_threshold = 0;
        p.trim();
        assert_eq!((p.reserved, p.reserved_high), (0, 180));
    }
}
