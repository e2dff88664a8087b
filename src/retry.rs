//! The retry timing every renewal and retried request shares: how long one attempt may go
//! unanswered, and how long to pause after failures in a row (issue 21: one lost renewal
//! must not cost a healthy holder its lock, so several attempts fit well inside a tick).

use std::time::Duration;

/// How long one attempt (a renewal, or opening a renewal stream) may go unanswered before
/// it is given up and another made: a third of the renewal `interval`, between 250 ms and
/// 1 s. A healthy server answers in milliseconds; one that does not is stalled, paused or
/// cut off, and waiting for it until the next tick spends the time before `fencelock run`
/// must SIGTERM its command.
pub(crate) fn answer_wait(interval: Duration) -> Duration {
    (interval / 3).clamp(Duration::from_millis(250), Duration::from_secs(1))
}

/// The pause before the next attempt after `failures` failed or unanswered ones in a row:
/// 100 ms, doubling, never more than `cap`.
pub(crate) fn backoff(failures: u32, cap: Duration) -> Duration {
    Duration::from_millis(100)
        .saturating_mul(1 << failures.saturating_sub(1).min(10))
        .min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unanswered_attempt_is_given_up_within_a_third_of_the_interval_bounded() {
        assert_eq!(
            answer_wait(Duration::from_secs(10) / 3),
            Duration::from_secs(1)
        );
        assert_eq!(
            answer_wait(Duration::from_secs(1)),
            Duration::from_secs(1) / 3
        );
        assert_eq!(
            answer_wait(Duration::from_millis(333)),
            Duration::from_millis(250)
        );
    }

    #[test]
    fn retries_back_off_from_100_ms_doubling_up_to_the_cap() {
        let cap = Duration::from_secs(1);
        let delays: Vec<u128> = (1..=6).map(|n| backoff(n, cap).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff(u32::MAX, cap), cap);
    }
}
