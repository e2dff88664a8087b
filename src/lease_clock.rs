//! The local deadline of a lease, readable from any thread without locking.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

impl std::fmt::Debug for LeaseClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseClock")
            .field(
                "remaining",
                &self.deadline().saturating_duration_since(Instant::now()),
            )
            .finish()
    }
}

/// The local deadline of the lease: the moment the last *confirmed* renewal was sent, plus
/// the TTL. The server's lease cannot end before it, so trusting the lease until then is
/// safe even if this process was paused.
pub(crate) struct LeaseClock {
    base: Instant,
    deadline_nanos: AtomicU64,
}

impl LeaseClock {
    pub(crate) fn new(deadline: Instant) -> Self {
        let clock = Self {
            base: Instant::now(),
            deadline_nanos: AtomicU64::new(0),
        };
        clock.extend_to(deadline);
        clock
    }

    pub(crate) fn extend_to(&self, deadline: Instant) {
        let nanos = deadline.saturating_duration_since(self.base).as_nanos();
        let nanos = u64::try_from(nanos).unwrap_or(u64::MAX);
        self.deadline_nanos.fetch_max(nanos, Ordering::AcqRel);
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.base + Duration::from_nanos(self.deadline_nanos.load(Ordering::Acquire))
    }

    /// Whether the deadline has passed by this process's monotonic clock.
    pub(crate) fn has_passed(&self) -> bool {
        Instant::now() >= self.deadline()
    }
}
