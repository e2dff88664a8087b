//! Random owner values and jitter.

use std::time::Duration;

/// A random 128-bit owner value, hex encoded: unique per acquisition, so that a release
/// or renewal can only ever touch the grant it was made for.
pub(crate) fn owner_value() -> String {
    let mut bytes = [0u8; 16];
    // The OS random source does not fail on Linux once booted; if it ever did, a value
    // from the clock and a counter is still unique within this process.
    if getrandom::fill(&mut bytes).is_err() {
        use std::sync::atomic::{AtomicU64, Ordering};
        static FALLBACK: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let count = u128::from(FALLBACK.fetch_add(1, Ordering::Relaxed));
        bytes = (nanos ^ (count << 64) ^ u128::from(std::process::id())).to_le_bytes();
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(32);
    for b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    out
}

/// `base` stretched by a random 0-20 %, so that waiters woken by the same expiry do not
/// all retry at the same instant.
pub(crate) fn jittered(base: Duration) -> Duration {
    let mut byte = [0u8; 1];
    let spread = if getrandom::fill(&mut byte).is_ok() {
        f64::from(byte[0]) / 255.0 * 0.2
    } else {
        0.1
    };
    base.mul_f64(1.0 + spread)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_values_are_128_bit_and_distinct() {
        let a = owner_value();
        let b = owner_value();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn jitter_stays_within_twenty_percent() {
        for _ in 0..100 {
            let d = jittered(Duration::from_millis(100));
            assert!(d >= Duration::from_millis(100) && d <= Duration::from_millis(120));
        }
    }
}
