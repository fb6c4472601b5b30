//! Device memory of the simulated GPU.
//!
//! Allocations live in their own address range, starting at
//! [`DEVICE_BASE`], above every user-space address of an x86-64 or AArch64
//! host (2^47), so a host pointer handed over as a device pointer never
//! lands in an allocation. Addresses are never reused and every allocation
//! is followed by an unmapped gap of at least [`RED_ZONE`] bytes, so an
//! access one past the end, or through a freed pointer, finds no live
//! allocation and is reported with the allocation it is nearest to.
//!
//! Each allocation keeps a shadow bit per byte saying whether the byte was
//! ever written (by a copy, a memset or a kernel store): reading a byte
//! never written is the sanitizer's *initcheck* error.

use std::collections::BTreeMap;
use std::fmt;

/// First device address handed out (above any host user-space pointer).
pub const DEVICE_BASE: u64 = 0xd000_0000_0000;
/// Alignment of every allocation, as `cuMemAlloc` guarantees.
pub const ALIGN: u64 = 256;
/// Unmapped bytes (at least) after every allocation.
pub const RED_ZONE: u64 = 256;

/// A memory error: what a driver call or a kernel access did wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemError {
    /// Not enough device memory for `requested` bytes.
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
        /// Bytes still free on the device.
        free: u64,
        /// The device's capacity.
        capacity: u64,
    },
    /// `[addr, addr + len)` is not inside one live allocation.
    OutOfBounds {
        /// First byte accessed.
        addr: u64,
        /// Bytes accessed.
        len: u64,
        /// Where the address is (see [`DeviceMemory::describe`]).
        place: String,
    },
    /// Bytes read that were never written (initcheck).
    Uninitialized {
        /// First byte read.
        addr: u64,
        /// Bytes read.
        len: u64,
        /// Where the address is.
        place: String,
    },
    /// An address not aligned to the access size.
    Misaligned {
        /// The address.
        addr: u64,
        /// The alignment required.
        align: u64,
    },
    /// A free of something that is not the start of a live allocation.
    InvalidFree {
        /// The pointer passed.
        addr: u64,
        /// Where the address is.
        place: String,
    },
}

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemError::OutOfMemory {
                requested,
                free,
                capacity,
            } => write!(
                f,
                "out of device memory: {requested} bytes requested, {free} of {capacity} free"
            ),
            MemError::OutOfBounds { addr, len, place } => {
                write!(
                    f,
                    "out-of-bounds access of {len} bytes at {addr:#x}: {place}"
                )
            }
            MemError::Uninitialized { addr, len, place } => write!(
                f,
                "read of {len} bytes at {addr:#x} never written (uninitialized): {place}"
            ),
            MemError::Misaligned { addr, align } => {
                write!(
                    f,
                    "misaligned access at {addr:#x} (needs {align}-byte alignment)"
                )
            }
            MemError::InvalidFree { addr, place } => {
                write!(
                    f,
                    "free of {addr:#x}, not the start of a live allocation: {place}"
                )
            }
        }
    }
}

impl std::error::Error for MemError {}

/// One live allocation: its bytes and which of them were ever written.
pub struct Allocation {
    /// The device address of byte 0.
    pub base: u64,
    /// The bytes.
    pub data: Box<[u8]>,
    /// One bit per byte, set once the byte was written.
    written: Box<[u64]>,
}

impl Allocation {
    fn new(base: u64, size: usize) -> Allocation {
        Allocation {
            base,
            data: vec![0u8; size].into_boxed_slice(),
            written: vec![0u64; size.div_ceil(64)].into_boxed_slice(),
        }
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.data.len() as u64
    }

    /// Whether `[addr, addr + len)` lies inside this allocation.
    #[inline]
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.base && addr - self.base + len <= self.data.len() as u64
    }

    /// Whether every byte of `[off, off + len)` was written.
    #[inline]
    pub fn is_written(&self, off: usize, len: usize) -> bool {
        // The common case, an access inside one shadow word.
        let (w, b) = (off / 64, off % 64);
        if b + len <= 64 {
            let mask = if len == 64 {
                !0
            } else {
                ((1u64 << len) - 1) << b
            };
            return self.written[w] & mask == mask;
        }
        (off..off + len).all(|i| self.written[i / 64] >> (i % 64) & 1 == 1)
    }

    /// The first byte of `[off, off + len)` never written, if any.
    pub fn first_unwritten(&self, off: usize, len: usize) -> Option<usize> {
        let end = off + len;
        let mut i = off;
        while i < end {
            // Whole shadow words at a time where the range covers them.
            if i.is_multiple_of(64) && i + 64 <= end {
                let w = self.written[i / 64];
                if w != !0 {
                    return Some(i + w.trailing_ones() as usize);
                }
                i += 64;
            } else {
                if self.written[i / 64] >> (i % 64) & 1 == 0 {
                    return Some(i);
                }
                i += 1;
            }
        }
        None
    }

    /// Marks `[off, off + len)` written.
    #[inline]
    pub fn mark_written(&mut self, off: usize, len: usize) {
        let (w, b) = (off / 64, off % 64);
        if b + len <= 64 {
            let mask = if len == 64 {
                !0
            } else {
                ((1u64 << len) - 1) << b
            };
            self.written[w] |= mask;
            return;
        }
        let end = off + len;
        let mut i = off;
        while i < end {
            if i.is_multiple_of(64) && i + 64 <= end {
                self.written[i / 64] = !0;
                i += 64;
            } else {
                self.written[i / 64] |= 1 << (i % 64);
                i += 1;
            }
        }
    }

    /// Copies the written-shadow of `[src_off, +len)` of `src` onto
    /// `[dst_off, +len)` of `self` (a device-to-device copy moves both).
    fn copy_written_from(&mut self, dst_off: usize, src: &Allocation, src_off: usize, len: usize) {
        for i in 0..len {
            let s = src.written[(src_off + i) / 64] >> ((src_off + i) % 64) & 1;
            let d = dst_off + i;
            let word = &mut self.written[d / 64];
            *word = (*word & !(1 << (d % 64))) | (s << (d % 64));
        }
    }
}

/// A freed allocation, remembered to explain a use after free.
#[derive(Clone, Copy, Debug)]
struct Freed {
    size: u64,
}

/// All allocations of one simulated device.
pub struct DeviceMemory {
    live: BTreeMap<u64, Allocation>,
    freed: BTreeMap<u64, Freed>,
    base: u64,
    next: u64,
    capacity: u64,
    used: u64,
}

impl DeviceMemory {
    /// An empty device of `capacity` bytes, addresses from [`DEVICE_BASE`].
    pub fn new(capacity: u64) -> DeviceMemory {
        DeviceMemory::with_base(DEVICE_BASE, capacity)
    }

    /// An empty device of `capacity` bytes whose addresses start at `base`
    /// (≥ [`DEVICE_BASE`], a multiple of [`ALIGN`]): each simulated device
    /// gets a range of its own, so a pointer of one device used on another
    /// is found in no allocation.
    pub fn with_base(base: u64, capacity: u64) -> DeviceMemory {
        let base = base.max(DEVICE_BASE).div_ceil(ALIGN) * ALIGN;
        DeviceMemory {
            live: BTreeMap::new(),
            freed: BTreeMap::new(),
            base,
            next: base,
            capacity,
            used: 0,
        }
    }

    /// The device's size in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes in live allocations.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Number of live allocations.
    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// A new allocation of `size` bytes (contents unwritten); its address.
    /// A zero-byte request gets a unique address of its own.
    pub fn alloc(&mut self, size: u64) -> Result<u64, MemError> {
        if size > self.capacity - self.used {
            return Err(MemError::OutOfMemory {
                requested: size,
                free: self.capacity - self.used,
                capacity: self.capacity,
            });
        }
        let base = self.next;
        self.next = (base + size + RED_ZONE).div_ceil(ALIGN) * ALIGN;
        self.live.insert(base, Allocation::new(base, size as usize));
        self.used += size;
        Ok(base)
    }

    /// Frees the allocation starting at `addr`; returns its size.
    pub fn free(&mut self, addr: u64) -> Result<u64, MemError> {
        match self.live.remove(&addr) {
            Some(a) => {
                let size = a.size();
                self.used -= size;
                self.freed.insert(addr, Freed { size });
                Ok(size)
            }
            None => Err(MemError::InvalidFree {
                addr,
                place: self.describe(addr),
            }),
        }
    }

    /// The live allocation holding all of `[addr, addr + len)`.
    #[inline]
    pub fn find(&self, addr: u64, len: u64) -> Result<&Allocation, MemError> {
        match self.live.range(..=addr).next_back() {
            Some((_, a)) if a.contains(addr, len) => Ok(a),
            _ => Err(self.out_of_bounds(addr, len)),
        }
    }

    /// [`DeviceMemory::find`], mutably.
    #[inline]
    pub fn find_mut(&mut self, addr: u64, len: u64) -> Result<&mut Allocation, MemError> {
        let hit =
            matches!(self.live.range(..=addr).next_back(), Some((_, a)) if a.contains(addr, len));
        if !hit {
            return Err(self.out_of_bounds(addr, len));
        }
        Ok(self
            .live
            .range_mut(..=addr)
            .next_back()
            .map(|(_, a)| a)
            .expect("found above"))
    }

    /// Whether all of `[addr, addr + len)` lies inside one allocation that
    /// has been freed (addresses are never reused, so this stays true).
    pub fn inside_freed(&self, addr: u64, len: u64) -> bool {
        matches!(
            self.freed.range(..=addr).next_back(),
            Some((&b, f)) if addr + len <= b + f.size
        )
    }

    fn out_of_bounds(&self, addr: u64, len: u64) -> MemError {
        MemError::OutOfBounds {
            addr,
            len,
            place: self.describe(addr),
        }
    }

    /// Reads `out.len()` bytes at `addr`. With `check_written`, bytes never
    /// written are an [`MemError::Uninitialized`] error.
    pub fn read(&self, addr: u64, out: &mut [u8], check_written: bool) -> Result<(), MemError> {
        let a = self.find(addr, out.len() as u64)?;
        let off = (addr - a.base) as usize;
        if check_written {
            if let Some(i) = a.first_unwritten(off, out.len()) {
                return Err(MemError::Uninitialized {
                    addr: a.base + i as u64,
                    len: out.len() as u64,
                    place: self.describe(a.base + i as u64),
                });
            }
        }
        out.copy_from_slice(&a.data[off..off + out.len()]);
        Ok(())
    }

    /// Writes `src` at `addr` and marks the bytes written.
    pub fn write(&mut self, addr: u64, src: &[u8]) -> Result<(), MemError> {
        let a = self.find_mut(addr, src.len() as u64)?;
        let off = (addr - a.base) as usize;
        a.data[off..off + src.len()].copy_from_slice(src);
        a.mark_written(off, src.len());
        Ok(())
    }

    /// Sets `len` bytes at `addr` to `byte` (memset) and marks them written.
    pub fn fill(&mut self, addr: u64, len: u64, byte: u8) -> Result<(), MemError> {
        let a = self.find_mut(addr, len)?;
        let off = (addr - a.base) as usize;
        a.data[off..off + len as usize].fill(byte);
        a.mark_written(off, len as usize);
        Ok(())
    }

    /// Copies `len` bytes from `src` to `dst` (both device addresses; the
    /// ranges may overlap or lie in different allocations). The written-
    /// shadow travels with the bytes: copying unwritten bytes is not an
    /// error, reading them later is.
    pub fn copy(&mut self, dst: u64, src: u64, len: u64) -> Result<(), MemError> {
        let s = self.find(src, len)?;
        let (s_base, s_off) = (s.base, (src - s.base) as usize);
        let d = self.find(dst, len)?;
        let d_base = d.base;
        let d_off = (dst - d_base) as usize;
        let n = len as usize;
        if s_base == d_base {
            let a = self.live.get_mut(&s_base).expect("live");
            a.data.copy_within(s_off..s_off + n, d_off);
            let shadow: Vec<bool> = (0..n).map(|i| a.is_written(s_off + i, 1)).collect();
            for (i, w) in shadow.into_iter().enumerate() {
                if w {
                    a.mark_written(d_off + i, 1);
                } else {
                    let j = d_off + i;
                    a.written[j / 64] &= !(1 << (j % 64));
                }
            }
            return Ok(());
        }
        let s = self.live.remove(&s_base).expect("live");
        let d = self.live.get_mut(&d_base).expect("live");
        d.data[d_off..d_off + n].copy_from_slice(&s.data[s_off..s_off + n]);
        d.copy_written_from(d_off, &s, s_off, n);
        self.live.insert(s_base, s);
        Ok(())
    }

    /// Where `addr` is, in words: inside which allocation, how far past the
    /// end of the nearest one, inside a freed one, or outside device memory
    /// altogether (e.g. a host pointer).
    pub fn describe(&self, addr: u64) -> String {
        if addr < self.base || addr >= self.next + (1 << 32) {
            let base = self.base;
            return format!(
                "{addr:#x} is not a device address of this device (its memory starts at {base:#x}; \
                 a host pointer, another device's pointer or a corrupted one?)"
            );
        }
        if let Some((&b, a)) = self.live.range(..=addr).next_back() {
            if addr < b + a.size() {
                return format!(
                    "inside live allocation {b:#x} ({} bytes) at offset {}",
                    a.size(),
                    addr - b
                );
            }
        }
        if let Some((&b, f)) = self.freed.range(..=addr).next_back() {
            if addr < b + f.size.max(1) {
                return format!(
                    "inside freed allocation {b:#x} ({} bytes) at offset {} (use after free)",
                    f.size,
                    addr - b
                );
            }
        }
        let before = self
            .live
            .range(..=addr)
            .next_back()
            .map(|(&b, a)| (b, a.size()));
        let after = self.live.range(addr..).next().map(|(&b, a)| (b, a.size()));
        match (before, after) {
            (Some((b, s)), Some((nb, _))) if addr - (b + s) <= nb - addr => format!(
                "{} bytes past the end of allocation {b:#x} ({s} bytes)",
                addr - (b + s)
            ),
            (_, Some((nb, ns))) => format!(
                "{} bytes before the start of allocation {nb:#x} ({ns} bytes)",
                nb - addr
            ),
            (Some((b, s)), None) => format!(
                "{} bytes past the end of allocation {b:#x} ({s} bytes)",
                addr - (b + s)
            ),
            (None, None) => "no allocation is live".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_bounds_and_use_after_free_are_named() {
        let mut m = DeviceMemory::new(1 << 20);
        let a = m.alloc(100).unwrap();
        let b = m.alloc(10).unwrap();
        assert!(b >= a + 100 + RED_ZONE && b.is_multiple_of(ALIGN));
        m.write(a, &[1; 100]).unwrap();
        let e = m.write(a + 97, &[0; 4]).unwrap_err();
        assert!(matches!(e, MemError::OutOfBounds { .. }), "{e}");
        assert!(
            m.describe(a + 100).contains("0 bytes past the end"),
            "{}",
            m.describe(a + 100)
        );
        m.free(a).unwrap();
        let mut buf = [0u8; 4];
        let e = m.read(a, &mut buf, true).unwrap_err();
        assert!(e.to_string().contains("use after free"), "{e}");
        assert!(m
            .describe(0x7fff_0000_1000)
            .contains("not a device address"));
        assert!(matches!(m.free(a), Err(MemError::InvalidFree { .. })));
    }

    #[test]
    fn unwritten_bytes_are_reported_and_shadow_follows_copies() {
        let mut m = DeviceMemory::new(1 << 20);
        let a = m.alloc(200).unwrap();
        let b = m.alloc(200).unwrap();
        m.write(a, &[7; 100]).unwrap();
        let mut buf = [0u8; 8];
        m.read(a + 92, &mut buf, true).unwrap();
        let e = m.read(a + 96, &mut buf, true).unwrap_err();
        assert_eq!(
            e,
            MemError::Uninitialized {
                addr: a + 100,
                len: 8,
                place: m.describe(a + 100)
            }
        );
        m.copy(b, a + 50, 100).unwrap();
        m.read(b, &mut [0u8; 50], true).unwrap();
        assert!(m.read(b + 50, &mut [0u8; 1], true).is_err());
        m.fill(b + 50, 150, 0).unwrap();
        m.read(b, &mut [0u8; 200], true).unwrap();
    }

    #[test]
    fn capacity_is_enforced() {
        let mut m = DeviceMemory::new(1000);
        let a = m.alloc(600).unwrap();
        assert!(matches!(
            m.alloc(600),
            Err(MemError::OutOfMemory { free: 400, .. })
        ));
        m.free(a).unwrap();
        m.alloc(600).unwrap();
        assert_eq!(m.used(), 600);
    }
}
