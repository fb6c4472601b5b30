//! Counter-based random numbers (Philox4x32-10): the same (seed, offset)
//! gives the same numbers on every device and in any order of evaluation,
//! which is what lets dropout replay its mask in backward instead of saving it.
//!
//! Element `i` of a stream at `offset` uses counter block
//! `(offset + i) / 4` (word `(offset + i) % 4`) for uniforms, and block
//! `(offset + i) / 2` (words 2k, 2k+1 through Box-Muller) for normals, with
//! the 64-bit block number in counter words 0 and 1 and the seed as the key.
//!
//! [`Generator::reserve`] is the one place a random op gets its numbers; a
//! checkpointed segment records what it handed out ([`record_draws`]) and
//! its recompute gets the same ranges back ([`replay_draws`]).

mod replay;
pub use replay::{record_draws, replay_draws, DrawLog, RecordGuard, ReplayGuard};

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Philox4x32 with 10 rounds: four random words for a counter and a key.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(W0);
            k[1] = k[1].wrapping_add(W1);
        }
        let p0 = (M0 as u64) * (c[0] as u64);
        let p1 = (M1 as u64) * (c[2] as u64);
        c = [
            ((p1 >> 32) as u32) ^ c[1] ^ k[0],
            p1 as u32,
            ((p0 >> 32) as u32) ^ c[3] ^ k[1],
            p0 as u32,
        ];
    }
    c
}

fn block(seed: u64, n: u64) -> [u32; 4] {
    philox4x32_10(
        [n as u32, (n >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// The raw 32-bit word at position `index` of the stream for `seed`.
pub fn random_u32(seed: u64, index: u64) -> u32 {
    block(seed, index / 4)[(index % 4) as usize]
}

/// A uniform f32 in [0, 1) from a random word (its top 24 bits).
pub fn u32_to_unit_f32(x: u32) -> f32 {
    (x >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// A uniform f64 in [0, 1) from a random word; the 24-bit grid matches f32's
/// so every dtype draws the same numbers.
pub fn u32_to_unit_f64(x: u32) -> f64 {
    (x >> 8) as f64 * (1.0 / 16_777_216.0)
}

/// `n` uniforms in [0, 1) starting at `offset` of the stream for `seed`.
pub fn uniform(seed: u64, offset: u64, n: usize) -> Vec<f64> {
    (0..n as u64)
        .map(|i| uniform_at(seed, offset + i))
        .collect()
}

/// Element `index` of the uniform stream for `seed` (what [`uniform`]
/// returns at `index - offset`), for callers that write the numbers
/// straight into their own buffer.
pub fn uniform_at(seed: u64, index: u64) -> f64 {
    u32_to_unit_f64(random_u32(seed, index))
}

/// `n` standard normals starting at `offset` of the normal stream for `seed`.
pub fn normal(seed: u64, offset: u64, n: usize) -> Vec<f64> {
    (0..n as u64).map(|i| normal_at(seed, offset + i)).collect()
}

/// Element `j` of the normal stream for `seed` (what [`normal`] returns at
/// `j - offset`).
pub fn normal_at(seed: u64, j: u64) -> f64 {
    let w = block(seed, j / 2);
    let (a, b) = if j.is_multiple_of(2) {
        (w[0], w[1])
    } else {
        (w[2], w[3])
    };
    // (x + 1) / 2^24 lies in (0, 1], so the log is finite.
    let u1 = ((a >> 8) as f64 + 1.0) / 16_777_216.0;
    let u2 = (b >> 8) as f64 / 16_777_216.0;
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// Whether element `index` of a dropout stream is kept (not zeroed) with
/// drop probability `p`: uniform word `offset + index` of the stream for
/// `seed`, on the same 24-bit grid as [`uniform`], compared with `p`. Any
/// device can replay the same mask from (seed, offset) alone.
pub fn dropout_keep(seed: u64, offset: u64, index: u64, p: f64) -> bool {
    u32_to_unit_f64(random_u32(seed, offset + index)) >= p
}

/// A seeded Philox stream handing out disjoint ranges of counters, so that
/// every random op (dropout, init) gets its own (seed, offset) and can be
/// replayed from those two numbers. A clone draws from the same stream (the
/// counter is shared), as the layer it belongs to shares its parameters
/// with its clones.
#[derive(Clone, Debug)]
pub struct Generator {
    seed: u64,
    offset: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Generator {
    /// A stream for `seed`, starting at offset 0.
    pub fn new(seed: u64) -> Generator {
        Generator {
            seed,
            offset: std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0)),
        }
    }

    /// Reserves `n` counters: returns (seed, offset) of the first. Offsets
    /// advance in multiples of 4 so that reservations never share a block.
    /// Inside a recompute ([`replay_draws`]) it hands back the range the
    /// forward got instead, and leaves the stream where it is.
    pub fn reserve(&self, n: u64) -> (u64, u64) {
        replay::reserve(self.seed, n, || {
            let step = n.div_ceil(4) * 4;
            self.offset
                .fetch_add(step, std::sync::atomic::Ordering::Relaxed)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropout_keeps_about_one_minus_p_and_generator_ranges_are_disjoint() {
        let kept = (0..100_000).filter(|&i| dropout_keep(3, 8, i, 0.3)).count();
        assert!((kept as f64 / 100_000.0 - 0.7).abs() < 0.01, "{kept}");
        let g = Generator::new(9);
        assert_eq!(g.reserve(5), (9, 0));
        assert_eq!(g.reserve(1), (9, 8));
        assert_eq!(g.reserve(0), (9, 12));
        assert_eq!(g.reserve(4), (9, 12));
    }

    #[test]
    fn philox_known_answer() {
        // Known-answer vectors of Random123 (kat_vectors: philox4x32_10).
        assert_eq!(
            philox4x32_10([0, 0, 0, 0], [0, 0]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }
}
