//! Random owner values and jitter.

use std::time::Duration;

/// A 128-bit owner value, hex encoded: unique per acquisition, so that a release or
/// renewal can only ever touch the grant it was made for.
///
/// 64 random bits drawn once per process, then a counter: unique within the process by
/// construction, and across processes unless two draw the same 64 random bits. Drawing
/// 128 fresh random bits per acquisition cost a system call each time (measured: 1 % of
/// the client's time at 64 concurrent lock cycles) for no more uniqueness.
pub(crate) fn owner_value() -> std::sync::Arc<str> {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PROCESS: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let process = *PROCESS.get_or_init(|| {
        let mut bytes = [0u8; 8];
        // The OS random source does not fail on Linux once booted; if it ever did, the
        // clock and the process id still tell processes apart.
        if getrandom::fill(&mut bytes).is_err() {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            #[allow(clippy::cast_possible_truncation)]
            let mixed = (nanos as u64) ^ (u64::from(std::process::id()) << 32);
            bytes = mixed.to_le_bytes();
        }
        u64::from_le_bytes(bytes)
    });
    let count = NEXT.fetch_add(1, Ordering::Relaxed);
    // Formatted on the stack and shared (`Arc<str>`): the acquisition, the renewer and
    // the guard hold the same value; one allocation per acquisition.
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = [0u8; 32];
    let bytes = [process.to_be_bytes(), count.to_be_bytes()];
    for (pair, byte) in hex.chunks_exact_mut(2).zip(bytes.iter().flatten()) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0xf)];
    }
    // Every byte is an ASCII hex digit: valid UTF-8, borrowed as it is (`from_utf8`
    // checks 32 ASCII bytes in a few instructions, where the lossy decoder walked them
    // as chunks: 250 instructions a cycle).
    match std::str::from_utf8(&hex) {
        Ok(text) => std::sync::Arc::from(text),
        Err(_) => std::sync::Arc::from(&*String::from_utf8_lossy(&hex)),
    }
}

/// `base` stretched by a random 0-20 %, so that waiters woken by the same expiry do not
/// all retry at the same instant (saturating at `Duration::MAX`).
pub(crate) fn jittered(base: Duration) -> Duration {
    scaled(base, 1.0 + spread())
}

/// `base` shortened by a random 0-20 %: a jittered sleep that must not outlast `base`
/// (a lock's expiry).
pub(crate) fn jittered_down(base: Duration) -> Duration {
    scaled(base, 1.0 - spread()).min(base)
}

/// A random fraction between 0 and 0.2 (0.1 if the OS random source fails).
fn spread() -> f64 {
    let mut byte = [0u8; 1];
    if getrandom::fill(&mut byte).is_ok() {
        f64::from(byte[0]) / 255.0 * 0.2
    } else {
        0.1
    }
}

/// `base` times `factor`, saturating (a lock key without expiry is `Duration::MAX` away).
fn scaled(base: Duration, factor: f64) -> Duration {
    Duration::try_from_secs_f64(base.as_secs_f64() * factor).unwrap_or(Duration::MAX)
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
    fn owner_values_count_up_after_the_process_part() {
        let a = owner_value();
        let b = owner_value();
        assert_eq!(a[..16], b[..16], "one random part per process");
        let (a, b) = (
            u64::from_str_radix(&a[16..], 16).unwrap(),
            u64::from_str_radix(&b[16..], 16).unwrap(),
        );
        assert!(b > a);
    }

    #[test]
    fn jitter_stays_within_twenty_percent() {
        for _ in 0..100 {
            let d = jittered(Duration::from_millis(100));
            assert!(d >= Duration::from_millis(100) && d <= Duration::from_millis(120));
            let d = jittered_down(Duration::from_millis(100));
            assert!(d >= Duration::from_millis(80) && d <= Duration::from_millis(100));
        }
        assert_eq!(jittered(Duration::MAX), Duration::MAX);
        assert!(jittered_down(Duration::MAX) <= Duration::MAX);
    }
}
