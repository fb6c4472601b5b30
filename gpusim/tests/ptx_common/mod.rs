//! Shared helpers of the PTX interpreter tests: fixtures, uploads, launches.
#![allow(dead_code)]

use leangrad_gpusim::memory::DeviceMemory;
use leangrad_gpusim::ptx::{self, Fault, LaunchDims, LaunchStats, Module};
use std::path::PathBuf;

/// Path of a committed fixture.
pub fn fixture(name: &str) -> PathBuf {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    PathBuf::from(dir).join("tests/fixtures").join(name)
}

/// A device with one module loaded.
pub struct Dev {
    pub mem: DeviceMemory,
    pub module: Module,
}

impl Dev {
    /// Loads fixture `name`.
    pub fn fixture(name: &str) -> Dev {
        let text = std::fs::read_to_string(fixture(name)).expect("fixture");
        Dev::text(&text)
    }

    /// Loads PTX text.
    pub fn text(text: &str) -> Dev {
        let mut mem = DeviceMemory::new(1 << 30);
        let module = Module::load(text, &mut mem).unwrap_or_else(|e| panic!("load: {e}"));
        Dev { mem, module }
    }

    /// Allocates and fills a buffer.
    pub fn upload(&mut self, bytes: &[u8]) -> u64 {
        let a = self.mem.alloc(bytes.len() as u64).expect("alloc");
        if !bytes.is_empty() {
            self.mem.write(a, bytes).expect("write");
        }
        a
    }

    /// Allocates a zero-filled buffer (written).
    pub fn zeros(&mut self, n: usize) -> u64 {
        self.upload(&vec![0u8; n])
    }

    /// Reads `n` bytes.
    pub fn download(&self, a: u64, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.mem.read(a, &mut v, false).expect("read");
        v
    }

    /// Launches kernel `name` on a 3-D grid.
    pub fn launch3(
        &mut self,
        name: &str,
        grid: [u32; 3],
        block: [u32; 3],
        params: &[Vec<u8>],
    ) -> Result<LaunchStats, Fault> {
        let k = self
            .module
            .kernel(name)
            .unwrap_or_else(|| panic!("no kernel {name}"));
        let refs: Vec<&[u8]> = params.iter().map(|p| p.as_slice()).collect();
        let dims = LaunchDims {
            grid,
            block,
            dynamic_shared_bytes: 0,
        };
        ptx::launch(&self.module, k, &dims, &refs, &mut self.mem)
    }

    /// Launches kernel `name` on a 1-D grid with `dynamic` bytes of
    /// dynamic shared memory.
    pub fn launch_dyn(
        &mut self,
        name: &str,
        grid: u32,
        block: u32,
        dynamic: u32,
        params: &[Vec<u8>],
    ) -> Result<LaunchStats, Fault> {
        let k = self
            .module
            .kernel(name)
            .unwrap_or_else(|| panic!("no kernel {name}"));
        let refs: Vec<&[u8]> = params.iter().map(|p| p.as_slice()).collect();
        let dims = LaunchDims {
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            dynamic_shared_bytes: dynamic,
        };
        ptx::launch(&self.module, k, &dims, &refs, &mut self.mem)
    }

    /// Launches kernel `name` on a 1-D grid.
    pub fn launch(
        &mut self,
        name: &str,
        grid: u32,
        block: u32,
        params: &[Vec<u8>],
    ) -> Result<LaunchStats, Fault> {
        let k = self
            .module
            .kernel(name)
            .unwrap_or_else(|| panic!("no kernel {name}"));
        let refs: Vec<&[u8]> = params.iter().map(|p| p.as_slice()).collect();
        ptx::launch(
            &self.module,
            k,
            &LaunchDims {
                grid: [grid, 1, 1],
                block: [block, 1, 1],
                dynamic_shared_bytes: 0,
            },
            &refs,
            &mut self.mem,
        )
    }
}

/// Parameter bytes of a 64-bit value (pointer, long long).
pub fn p64(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}
/// Parameter bytes of a 32-bit value.
pub fn p32(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// Bytes of f32s.
pub fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
/// Bytes of f64s.
pub fn f64s(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
/// Bytes of i32s.
pub fn i32s(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
/// Bytes of i64s.
pub fn i64s(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
/// f32s from bytes.
pub fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
/// f64s from bytes.
pub fn to_f64(b: &[u8]) -> Vec<f64> {
    b.chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
/// u32s from bytes.
pub fn to_u32(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
/// u16s from bytes.
pub fn to_u16(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
/// i64s from bytes.
pub fn to_i64(b: &[u8]) -> Vec<i64> {
    b.chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// A deterministic pseudo-random sequence (xorshift).
pub struct Rng(pub u64);
impl Rng {
    /// Next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// A float in [-1, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}
