//! A map keyed by ids this client numbers itself (the renewer's registrations: 0, 1, 2,
//! ...), hashed by one multiplication instead of std's SipHash.
//!
//! SipHash resists keys chosen to collide, which these ids cannot be: the client counts
//! them up. Its cost was on every lock cycle (an insert at the grant and a remove at the
//! release: about 300 instructions of the client's 43,000 per Redis cycle, callgrind);
//! a multiplication by an odd constant spreads consecutive ids over the table's buckets
//! (hashbrown takes the top bits for the control byte and the low bits for the bucket:
//! Fibonacci hashing mixes both).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map from this client's own ids.
pub(crate) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// Hashes one `u64` by a multiplication (see the module docs). Anything else written to
/// it is folded in the same way, a byte at a time: correct, only slower.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

/// 2^64 divided by the golden ratio, made odd: Knuth's multiplicative hashing.
const SPREAD: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = (self.0 ^ id).wrapping_mul(SPREAD);
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;

    #[test]
    fn consecutive_ids_spread_over_high_and_low_bits() {
        let build = BuildHasherDefault::<IdHasher>::default();
        let hashes: Vec<u64> = (0..1024u64).map(|id| build.hash_one(id)).collect();
        let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 1023).collect();
        let high: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(low.len() > 600, "low bits: {} of 1024 distinct", low.len());
        assert_eq!(high.len(), 128, "every control byte value is used");
    }

    #[test]
    fn a_map_keeps_what_it_is_given() {
        let mut map: IdMap<&str> = IdMap::default();
        for id in 0..10_000 {
            map.insert(id, "held");
        }
        assert_eq!(map.len(), 10_000);
        assert_eq!(map.remove(&9_999), Some("held"));
        assert_eq!(map.get(&9_999), None);
    }
}
