//! The fuzz suites' seeded mutator and runner.
//!
//! Why our own and not a crate: the inputs are small valid files made in
//! the test (a PNG, a checkpoint folder, a `config.json`) mutated
//! byte-wise and by their structure (a PNG's width field set huge with its
//! CRC fixed, a JPEG's frame height, a JSON number); `proptest` generates
//! values from strategies and shrinks them, which fits neither mutating a
//! seed file nor runs of a whole binary; `bolero` and `cargo fuzz` need
//! extra tooling or nightly for coverage guidance. A seeded mutator needs
//! no dependency, runs on stable in CI, and every failure is replayed
//! exactly by its target name and iteration (the seed).
//!
//! `LEANGRAD_FUZZ_ITERS` sets the inputs per target (default: a CI-sized
//! count); `LEANGRAD_FUZZ_SEED` shifts every seed, for deep local runs
//! that cover other inputs.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Inputs per target: `LEANGRAD_FUZZ_ITERS`, else `default`.
pub fn iterations(default: usize) -> usize {
    std::env::var("LEANGRAD_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The base of every seed: `LEANGRAD_FUZZ_SEED`, else 0.
pub fn base_seed() -> u64 {
    std::env::var("LEANGRAD_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// SplitMix64: a tiny seeded generator, the same numbers everywhere.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x6A09_E667_F3BC_C908)
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// True with probability `1 / n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// One element of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Values that break size arithmetic and parsers, as 32-bit words.
pub const INTERESTING_U32: [u32; 12] = [
    0,
    1,
    2,
    0x7F,
    0xFF,
    0xFFFF,
    0x1_0000,
    0x7FFF_FFFF,
    0x8000_0000,
    0xFFFF_FFFE,
    0xFFFF_FFFF,
    100_000,
];

/// One byte-level mutation of `data`: a bit flip, an interesting byte or
/// word (either endianness), a cut, a deleted, duplicated or random range,
/// or a splice of `other`.
pub fn mutate_bytes(data: &mut Vec<u8>, rng: &mut Rng, other: &[u8]) {
    let len = data.len();
    match rng.below(9) {
        0 if len > 0 => {
            let i = rng.below(len);
            data[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            data[i] = *rng.pick(&[0u8, 1, 0x7F, 0x80, 0xFE, 0xFF]);
        }
        2 if len >= 4 => {
            let i = rng.below(len - 3);
            let v = *rng.pick(&INTERESTING_U32);
            let bytes = if rng.one_in(2) {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            };
            data[i..i + 4].copy_from_slice(&bytes);
        }
        3 => data.truncate(rng.below(len + 1)),
        4 if len > 0 => {
            let start = rng.below(len);
            let end = (start + 1 + rng.below(64)).min(len);
            data.drain(start..end);
        }
        5 if len > 0 => {
            let start = rng.below(len);
            let end = (start + 1 + rng.below(64)).min(len);
            let copy: Vec<u8> = data[start..end].to_vec();
            let at = rng.below(len + 1);
            data.splice(at..at, copy);
        }
        6 => {
            let at = rng.below(len + 1);
            let n = 1 + rng.below(16);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            data.splice(at..at, bytes);
        }
        7 if !other.is_empty() => {
            let at = rng.below(len + 1);
            let from = rng.below(other.len());
            data.truncate(at);
            data.extend_from_slice(&other[from..]);
        }
        _ if len > 0 => {
            let i = rng.below(len);
            data[i] = rng.next_u64() as u8;
        }
        _ => data.push(rng.next_u64() as u8),
    }
}

/// `base` with one to four byte-level mutations.
pub fn mutated(base: &[u8], rng: &mut Rng, other: &[u8]) -> Vec<u8> {
    let mut data = base.to_vec();
    for _ in 0..1 + rng.below(4) {
        mutate_bytes(&mut data, rng, other);
    }
    data
}

/// The CRC-32 of PNG chunks (ISO 3309).
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A PNG whose IHDR width and height are replaced (CRC fixed, so the
/// decoder believes them): the header of a huge image over small data.
pub fn png_with_size(png: &[u8], width: u32, height: u32) -> Vec<u8> {
    let mut out = png.to_vec();
    // Signature (8), length (4), "IHDR" (4), then width and height.
    if out.len() >= 33 && &out[12..16] == b"IHDR" {
        out[16..20].copy_from_slice(&width.to_be_bytes());
        out[20..24].copy_from_slice(&height.to_be_bytes());
        let crc = crc32(&out[12..29]);
        out[29..33].copy_from_slice(&crc.to_be_bytes());
    }
    out
}

/// A BMP whose width and height fields (little-endian i32 at 18 and 22)
/// are replaced.
pub fn bmp_with_size(bmp: &[u8], width: i32, height: i32) -> Vec<u8> {
    let mut out = bmp.to_vec();
    if out.len() >= 26 {
        out[18..22].copy_from_slice(&width.to_le_bytes());
        out[22..26].copy_from_slice(&height.to_le_bytes());
    }
    out
}

/// A JPEG whose first frame header (SOF0/SOF2) gives another height and
/// width.
pub fn jpeg_with_size(jpeg: &[u8], width: u16, height: u16) -> Vec<u8> {
    let mut out = jpeg.to_vec();
    if let Some(at) = out
        .windows(2)
        .position(|w| w[0] == 0xFF && (w[1] == 0xC0 || w[1] == 0xC2))
    {
        // Marker (2), length (2), precision (1), height (2), width (2).
        if out.len() >= at + 9 {
            out[at + 5..at + 7].copy_from_slice(&height.to_be_bytes());
            out[at + 7..at + 9].copy_from_slice(&width.to_be_bytes());
        }
    }
    out
}

/// What one target saw.
#[derive(Default, Debug)]
pub struct Tally {
    /// Inputs run.
    pub inputs: usize,
    /// Inputs accepted (`Ok`).
    pub accepted: usize,
    /// Inputs refused with a typed error.
    pub refused: usize,
    /// Failures: `(iteration, what happened)`.
    pub failures: Vec<(usize, String)>,
    /// The longest input's time.
    pub slowest: Duration,
    /// Which input that was.
    pub slowest_at: usize,
}

impl Tally {
    /// Notes how long input `iteration` took.
    pub fn time(&mut self, iteration: usize, took: Duration) {
        if took > self.slowest {
            self.slowest = took;
            self.slowest_at = iteration;
        }
    }

    /// One line for the log: counts per outcome.
    pub fn line(&self, target: &str) -> String {
        format!(
            "fuzz {target}: {} inputs, {} accepted, {} refused with a typed error, {} failures, slowest {:.2} s (#{})",
            self.inputs,
            self.accepted,
            self.refused,
            self.failures.len(),
            self.slowest.as_secs_f64(),
            self.slowest_at
        )
    }
}

/// Runs `f` on a thread of its own, at most `limit`: a panic or a run past
/// the limit (a hang) is a failure, `Ok`/`Err` are counted. The input is
/// written to `keep/<target>-<iteration>` on failure, to replay it.
pub fn run_bounded<E: std::fmt::Debug>(
    tally: &mut Tally,
    target: &str,
    iteration: usize,
    input: &[u8],
    keep: &Path,
    limit: Duration,
    f: impl FnOnce() -> Result<(), E> + Send + 'static,
) {
    tally.inputs += 1;
    let (send, receive) = mpsc::channel();
    let start = Instant::now();
    let worker = std::thread::Builder::new()
        .name(format!("fuzz-{target}-{iteration}"))
        .spawn(move || {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = send.send(outcome.map(|r| r.map_err(|e| format!("{e:?}"))));
        })
        .expect("a fuzz thread");
    let failure = match receive.recv_timeout(limit) {
        Ok(Ok(Ok(()))) => {
            tally.accepted += 1;
            None
        }
        Ok(Ok(Err(_))) => {
            tally.refused += 1;
            None
        }
        Ok(Err(panic)) => {
            let text = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Some(format!("panicked: {text}"))
        }
        Err(_) => Some(format!("no answer within {limit:?} (a hang?)")),
    };
    let took = start.elapsed();
    tally.time(iteration, took);
    if failure.is_none() && took > limit / 4 {
        // Slow but within the bound: kept to look at.
        let _ = std::fs::create_dir_all(keep);
        let _ = std::fs::write(keep.join(format!("{target}-{iteration}.slow")), input);
    }
    match failure {
        Some(what) => {
            let _ = std::fs::create_dir_all(keep);
            let file = keep.join(format!("{target}-{iteration}"));
            let _ = std::fs::write(&file, input);
            tally.failures.push((
                iteration,
                format!("{what} (input kept in {})", file.display()),
            ));
        }
        None => {
            let _ = worker.join();
        }
    }
}

/// A fresh scratch folder.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leangrad-fuzz-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Where failing inputs are kept: `leangrad-fuzz-failures` in the build's
/// scratch folder for integration tests.
pub fn keep_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("leangrad-fuzz-failures")
}

/// Panics with every failure of every target, after printing the tallies.
pub fn report(tallies: &[(&str, Tally)]) {
    let mut failed = Vec::new();
    for (target, tally) in tallies {
        println!("{}", tally.line(target));
        for (i, what) in &tally.failures {
            failed.push(format!("{target} #{i}: {what}"));
        }
    }
    assert!(failed.is_empty(), "fuzz failures:\n{}", failed.join("\n"));
}
