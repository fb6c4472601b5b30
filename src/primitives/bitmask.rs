//! 1-bit packing: bit `i % 32` of u32 word `i / 32` is element `i`. Shared:
//! the masks relu-like ops keep for backward (`ops::mask`) are packed and
//! read with these, and dropout's tests pack the CPU's keep rule with them.

use super::parallel;
use crate::memory::host::{try_collect, try_par_collect};
use crate::Result;
use rayon::prelude::*;

/// Number of u32 words holding `n` bits.
pub fn mask_words(n: usize) -> usize {
    n.div_ceil(32)
}

/// Packs `n` bits, bit `i` being `bit(i)` ([`crate::Error::OutOfMemory`]
/// when the host cannot hold the words).
pub fn pack_bits(n: usize, bit: impl Fn(usize) -> bool + Sync) -> Result<Vec<u32>> {
    let word = |w: usize| {
        let start = w * 32;
        (start..n.min(start + 32)).fold(0u32, |acc, i| acc | (u32::from(bit(i)) << (i - start)))
    };
    let words = mask_words(n);
    if parallel(n) {
        try_par_collect(words, (0..words).into_par_iter().map(word))
    } else {
        try_collect(words, (0..words).map(word))
    }
}

/// Bit `i` of a packed mask.
#[inline(always)]
pub fn get_bit(words: &[u32], i: usize) -> bool {
    (words[i / 32] >> (i % 32)) & 1 == 1
}

/// All `n` bits of a packed mask, unpacked.
pub fn unpack_bits(words: &[u32], n: usize) -> Vec<bool> {
    (0..n).map(|i| get_bit(words, i)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_counts() {
        for (n, w) in [
            (0, 0),
            (1, 1),
            (31, 1),
            (32, 1),
            (33, 2),
            (64, 2),
            (1000, 32),
        ] {
            assert_eq!(mask_words(n), w, "n = {n}");
            assert_eq!(pack_bits(n, |_| true).unwrap().len(), w);
        }
    }

    #[test]
    fn pack_layout_and_round_trip() {
        assert_eq!(pack_bits(3, |i| i != 1).unwrap(), vec![0b101]);
        assert_eq!(pack_bits(32, |_| true).unwrap(), vec![u32::MAX]);
        assert_eq!(pack_bits(33, |i| i == 32).unwrap(), vec![0, 1]);
        for n in [
            1,
            31,
            32,
            33,
            1000,
            crate::primitives::PARALLEL_THRESHOLD + 7,
        ] {
            let bits: Vec<bool> = (0..n).map(|i| (i * 7 + i / 3) % 5 < 2).collect();
            let words = pack_bits(n, |i| bits[i]).unwrap();
            assert_eq!(unpack_bits(&words, n), bits, "n = {n}");
            // Unused high bits of the last word stay clear.
            if n % 32 != 0 {
                assert_eq!(words[words.len() - 1] >> (n % 32), 0);
            }
        }
    }
}
