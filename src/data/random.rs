//! Seeded randomness for data loading: every random choice (the shuffle of
//! an epoch, a crop's position, a flip) is drawn from a Philox stream whose
//! seed is derived from (the user's seed, the epoch, the sample), so a run
//! is reproducible whatever the number of worker threads or the order in
//! which they finish.

use crate::rng::random_u32;

/// SplitMix64's finaliser: spreads a 64-bit value over all bits, so nearby
/// (seed, epoch, index) triples give unrelated Philox keys.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Domain tags keep the shuffle's stream apart from the samples' streams.
const SHUFFLE_TAG: u64 = 0x5348_5546_464C_4521;
const SAMPLE_TAG: u64 = 0x5341_4D50_4C45_2121;

/// A stream of random numbers for one purpose (one sample's transforms, one
/// epoch's shuffle): Philox4x32-10 words `0, 1, 2, …` of a derived seed.
#[derive(Debug, Clone)]
pub struct SampleRng {
    seed: u64,
    counter: u64,
}

impl SampleRng {
    /// The stream for `seed` itself, from its first word.
    pub fn new(seed: u64) -> SampleRng {
        SampleRng { seed, counter: 0 }
    }

    /// The stream a data loader gives the transforms of sample `index` in
    /// `epoch`: different for every (seed, epoch, index), the same on every
    /// run.
    pub fn for_sample(seed: u64, epoch: u64, index: u64) -> SampleRng {
        SampleRng::new(mix(mix(mix(seed ^ SAMPLE_TAG) ^ epoch) ^ index))
    }

    /// The next raw 32-bit word.
    pub fn next_u32(&mut self) -> u32 {
        let word = random_u32(self.seed, self.counter);
        self.counter += 1;
        word
    }

    /// The next 64 random bits (two words).
    pub fn next_u64(&mut self) -> u64 {
        let hi = self.next_u32() as u64;
        (hi << 32) | self.next_u32() as u64
    }

    /// A uniform f64 in [0, 1) with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform f64 in [low, high).
    pub fn uniform_in(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * self.uniform()
    }

    /// A uniform integer in `0..n` (`n > 0`), by a 64×64-bit multiply: the
    /// bias is below 2⁻⁶⁴·n, far under anything a data pipeline can see.
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }
}

/// The order in which an epoch visits `n` samples: a Fisher–Yates shuffle
/// drawn from (seed, epoch), so every epoch has its own permutation and the
/// same seed gives the same one on every run.
pub fn permutation(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut rng = SampleRng::new(mix(mix(seed ^ SHUFFLE_TAG) ^ epoch));
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i + 1);
        order.swap(i, j);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_are_permutations_and_differ_by_epoch() {
        let a = permutation(100, 7, 0);
        let b = permutation(100, 7, 1);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        assert_ne!(a, b);
        assert_eq!(a, permutation(100, 7, 0));
    }

    #[test]
    fn below_covers_its_range() {
        let mut rng = SampleRng::new(3);
        let mut seen = [0usize; 5];
        for _ in 0..1000 {
            seen[rng.below(5)] += 1;
        }
        // Each value ~200 times; 120 is more than 5 standard deviations off.
        assert!(seen.iter().all(|&c| c > 120), "{seen:?}");
        let u = rng.uniform();
        assert!((0.0..1.0).contains(&u));
    }
}
