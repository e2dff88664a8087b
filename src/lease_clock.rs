//! The local deadline of a lease, on a clock that keeps counting while the machine sleeps.
//!
//! A lease runs out on the *server's* clock, which does not stop when this machine is
//! suspended. `std::time::Instant` and tokio's `Instant` read `CLOCK_MONOTONIC` on Linux,
//! which does stop during suspend: a deadline kept on it would still lie ahead after the
//! machine woke up from a long sleep, and `is_held()` would say yes while the server has
//! long since handed the lock to someone else. Deadlines are therefore kept on
//! [`Clock::BOOT`] (`CLOCK_BOOTTIME`, which counts suspended time), and every wait that
//! reports a deadline on time wakes at least every [`RECHECK`] to compare against it,
//! because tokio's timers run on the monotonic clock (`passed_eventually`, a fallback
//! beside such a wait, sleeps to the deadline instead).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The longest a wait for a deadline sleeps on tokio's (monotonic) timer before it reads
/// the suspend-aware clock again: after a suspend, a loss is reported at most this late.
pub(crate) const RECHECK: Duration = Duration::from_millis(250);

/// A point in time on a [`Clock`]: the time elapsed since the clock's origin (the boot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ClockInstant(Duration);

impl ClockInstant {
    /// The time from `earlier` to `self`, zero if `earlier` is later.
    pub(crate) fn saturating_duration_since(self, earlier: ClockInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    fn nanos(self) -> u64 {
        u64::try_from(self.0.as_nanos()).unwrap_or(u64::MAX)
    }

    /// The instant `since_origin` after the clock's origin (tests).
    #[cfg(test)]
    pub(crate) const fn from_duration(since_origin: Duration) -> Self {
        Self(since_origin)
    }
}

impl std::ops::Add<Duration> for ClockInstant {
    type Output = ClockInstant;

    fn add(self, rhs: Duration) -> ClockInstant {
        ClockInstant(self.0.saturating_add(rhs))
    }
}

/// Where the time comes from. Production code uses [`Clock::BOOT`]; tests substitute a
/// clock they can move, to play a suspend (the clock jumps while tokio's timers do not).
#[derive(Clone, Copy)]
pub(crate) struct Clock(fn() -> Duration);

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Clock")
    }
}

impl Clock {
    /// Time since boot, including time spent suspended.
    pub(crate) const BOOT: Clock = Clock(since_boot);

    /// A clock reading the given source (tests).
    #[cfg(test)]
    pub(crate) const fn from_source(source: fn() -> Duration) -> Clock {
        Clock(source)
    }

    /// The current time.
    pub(crate) fn now(self) -> ClockInstant {
        ClockInstant((self.0)())
    }
}

/// `CLOCK_BOOTTIME` where the OS has it (Linux, Android); elsewhere `CLOCK_MONOTONIC`.
fn since_boot() -> Duration {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    const ID: libc::clockid_t = libc::CLOCK_BOOTTIME;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    const ID: libc::clockid_t = libc::CLOCK_MONOTONIC;
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let status = unsafe { libc::clock_gettime(ID, &mut now) };
    if status != 0 {
        // Cannot happen with a clock id the OS supports. If it did, fail safe: a time
        // far in the future makes every deadline pass, so no lock is trusted.
        return Duration::from_secs(u64::from(u32::MAX));
    }
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

/// The local deadline of the lease: the moment the last *confirmed* renewal was sent, plus
/// the TTL. The server's lease cannot end before it, so trusting the lease until then is
/// safe even if this process was paused. Readable from any thread without locking.
pub(crate) struct LeaseClock {
    clock: Clock,
    deadline_nanos: AtomicU64,
}

impl std::fmt::Debug for LeaseClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseClock")
            .field("remaining", &self.remaining())
            .finish()
    }
}

impl LeaseClock {
    /// A deadline on `clock`.
    pub(crate) fn new(clock: Clock, deadline: ClockInstant) -> Self {
        Self {
            clock,
            deadline_nanos: AtomicU64::new(deadline.nanos()),
        }
    }

    /// The clock the deadline is kept on; read send times from it.
    pub(crate) fn now(&self) -> ClockInstant {
        self.clock.now()
    }

    /// Moves the deadline forward (never back), unless it has already passed: a lease
    /// reported gone (`has_passed`) is never revived by a renewal answered late. Returns
    /// whether the deadline had not passed (the caller marks the loss otherwise).
    pub(crate) fn extend_to(&self, deadline: ClockInstant) -> bool {
        self.deadline_nanos
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
                (self.now().nanos() < current).then_some(current.max(deadline.nanos()))
            })
            .is_ok()
    }

    /// The deadline.
    pub(crate) fn deadline(&self) -> ClockInstant {
        ClockInstant(Duration::from_nanos(
            self.deadline_nanos.load(Ordering::Acquire),
        ))
    }

    /// How long until the deadline; zero once it has passed.
    pub(crate) fn remaining(&self) -> Duration {
        self.deadline().saturating_duration_since(self.now())
    }

    /// Whether the deadline has passed, counting time the machine spent suspended.
    pub(crate) fn has_passed(&self) -> bool {
        self.now() >= self.deadline()
    }

    /// Resolves once the deadline has passed, following it if it moves forward meanwhile.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads the clock.
    #[cfg(any(feature = "etcd", feature = "zookeeper", feature = "postgres"))]
    pub(crate) async fn passed(&self) {
        self.passed_looking_every(RECHECK).await;
    }

    /// Resolves once the deadline has passed, as [`passed`](Self::passed) does, but
    /// sleeping to the deadline rather than looking every [`RECHECK`]: a suspend is
    /// noticed only when the sleep ends (tokio's timers stop while the machine sleeps).
    /// For a fallback beside a task that watches closely (a guard's `lost()`, beside the
    /// renewal or heartbeat task that reports the loss on time): many guards waiting on
    /// it cost about one wake-up per TTL each (a renewal moves the deadline on before the
    /// sleep ends), not four a second.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads the clock.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    pub(crate) async fn passed_eventually(&self) {
        self.passed_looking_every(Duration::MAX).await;
    }

    #[cfg(any(
        feature = "etcd",
        feature = "zookeeper",
        feature = "postgres",
        feature = "redis"
    ))]
    async fn passed_looking_every(&self, recheck: Duration) {
        loop {
            let left = self.remaining();
            if left.is_zero() {
                return;
            }
            tokio::time::sleep(left.min(recheck)).await;
        }
    }
}

impl Clock {
    /// The tokio instant at which this clock will read `at`, if the machine does not
    /// sleep in between (tokio's timers stop while it does: wake up no later than
    /// [`RECHECK`] from now to look again).
    #[cfg(feature = "redis")]
    pub(crate) fn tokio_instant(self, at: ClockInstant) -> tokio::time::Instant {
        let now = tokio::time::Instant::now();
        let left = at.saturating_duration_since(self.now());
        now.checked_add(left)
            .unwrap_or(now + Duration::from_secs(86_400 * 365))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    // A clock the test moves by hand; one per test, since tests run in parallel.
    static SUSPEND_CLOCK: AtomicU64 = AtomicU64::new(1_000_000_000);
    fn suspend_clock() -> Duration {
        Duration::from_nanos(SUSPEND_CLOCK.load(Ordering::SeqCst))
    }

    #[test]
    fn a_suspend_makes_the_deadline_pass_although_the_monotonic_clock_stood_still() {
        let clock = Clock::from_source(suspend_clock);
        let lease = LeaseClock::new(clock, clock.now() + Duration::from_secs(10));
        let monotonic = std::time::Instant::now();
        assert!(!lease.has_passed());
        assert_eq!(lease.remaining(), Duration::from_secs(10));
        // The machine sleeps for a minute: the boot clock jumps, the process saw nothing.
        SUSPEND_CLOCK.fetch_add(60_000_000_000, Ordering::SeqCst);
        assert!(monotonic.elapsed() < Duration::from_secs(1));
        assert!(lease.has_passed());
        assert_eq!(lease.remaining(), Duration::ZERO);
    }

    static MOVING_CLOCK: AtomicU64 = AtomicU64::new(5_000_000_000);
    fn moving_clock() -> Duration {
        Duration::from_nanos(MOVING_CLOCK.load(Ordering::SeqCst))
    }

    #[test]
    fn the_deadline_only_moves_forward() {
        let clock = Clock::from_source(moving_clock);
        let start = clock.now();
        let lease = LeaseClock::new(clock, start + Duration::from_secs(3));
        lease.extend_to(start + Duration::from_secs(1));
        assert_eq!(lease.deadline(), start + Duration::from_secs(3));
        lease.extend_to(start + Duration::from_secs(7));
        assert_eq!(lease.deadline(), start + Duration::from_secs(7));
    }

    static LATE_CLOCK: AtomicU64 = AtomicU64::new(7_000_000_000);
    fn late_clock() -> Duration {
        Duration::from_nanos(LATE_CLOCK.load(Ordering::SeqCst))
    }

    #[test]
    fn a_passed_deadline_is_not_revived_by_a_late_answer() {
        let clock = Clock::from_source(late_clock);
        let start = clock.now();
        let lease = LeaseClock::new(clock, start + Duration::from_secs(3));
        // A renewal sent at start + 2 s is answered at start + 4 s, after the deadline.
        LATE_CLOCK.fetch_add(4_000_000_000, Ordering::SeqCst);
        assert!(lease.has_passed());
        assert!(!lease.extend_to(start + Duration::from_secs(2) + Duration::from_secs(3)));
        assert!(lease.has_passed(), "the lease was revived");
        assert_eq!(lease.deadline(), start + Duration::from_secs(3));
        // Before the deadline an extension still works.
        let fresh = LeaseClock::new(clock, clock.now() + Duration::from_secs(3));
        assert!(fresh.extend_to(clock.now() + Duration::from_secs(5)));
        assert_eq!(fresh.remaining(), Duration::from_secs(5));
    }

    static WAKING_CLOCK: AtomicU64 = AtomicU64::new(9_000_000_000);
    fn waking_clock() -> Duration {
        Duration::from_nanos(WAKING_CLOCK.load(Ordering::SeqCst))
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_for_the_deadline_notices_a_suspend_within_one_recheck() {
        let clock = Clock::from_source(waking_clock);
        let lease = LeaseClock::new(clock, clock.now() + Duration::from_secs(3600));
        let waiting = tokio::spawn(async move {
            lease.passed().await;
            tokio::time::Instant::now()
        });
        tokio::task::yield_now().await;
        let before = tokio::time::Instant::now();
        // An hour of suspend: tokio's timer (paused here) has not moved at all.
        WAKING_CLOCK.fetch_add(3_600_000_000_000, Ordering::SeqCst);
        let woke = waiting.await.expect("task");
        assert!(
            woke.duration_since(before) <= RECHECK,
            "{:?}",
            woke - before
        );
    }

    #[test]
    fn the_boot_clock_counts_at_least_what_the_monotonic_clock_counts() {
        let monotonic = std::time::Instant::now();
        let boot = Clock::BOOT.now();
        std::thread::sleep(Duration::from_millis(20));
        let boot_elapsed = Clock::BOOT.now().saturating_duration_since(boot);
        let monotonic_elapsed = monotonic.elapsed();
        assert!(
            boot_elapsed >= Duration::from_millis(20),
            "{boot_elapsed:?}"
        );
        // Both count the same running time (a suspend in between would only add to boot).
        assert!(boot_elapsed + Duration::from_millis(5) >= monotonic_elapsed);
    }
}
