//! A small seeded generator (SplitMix64): the same seed gives the same schedule of
//! choices, so a failing soak can be run again with the seed it printed.

use std::time::Duration;

/// SplitMix64 (Steele, Lea, Flood 2014): fast, and good enough for choosing faults.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A generator of its own for `stream` (a worker, the nemesis), derived from this one.
    pub(crate) fn fork(&self, stream: u64) -> Self {
        let mut forked = Self(self.0 ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        forked.next_u64();
        forked
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// True with probability `percent` / 100.
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A duration between `low` and `high` milliseconds.
    pub(crate) fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high.saturating_sub(low) + 1))
    }

    /// One of `items` (which must not be empty), by index.
    pub(crate) fn index(&mut self, len: usize) -> usize {
        usize::try_from(self.below(len as u64)).unwrap_or(0)
    }

    /// Picks by weight: returns the index of the chosen weight.
    pub(crate) fn weighted(&mut self, weights: &[u64]) -> usize {
        let total: u64 = weights.iter().sum();
        let mut roll = self.below(total);
        for (i, weight) in weights.iter().enumerate() {
            if roll < *weight {
                return i;
            }
            roll -= weight;
        }
        weights.len().saturating_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_choices() {
        let (mut a, mut b) = (Rng::new(42), Rng::new(42));
        let first: Vec<u64> = (0..5).map(|_| a.below(1000)).collect();
        let second: Vec<u64> = (0..5).map(|_| b.below(1000)).collect();
        assert_eq!(first, second);
        assert_ne!(
            Rng::new(42).fork(1).next_u64(),
            Rng::new(42).fork(2).next_u64()
        );
    }

    #[test]
    fn weights_and_ranges_stay_in_bounds() {
        let mut rng = Rng::new(7);
        for _ in 0..1000 {
            assert!(rng.weighted(&[1, 0, 3]) != 1);
            let d = rng.millis(10, 20);
            assert!(d >= Duration::from_millis(10) && d <= Duration::from_millis(20));
        }
    }
}
