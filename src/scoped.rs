//! A critical section scoped to its lock: [`LockGuard::run`], the in-process twin of
//! `fencelock run`.

use std::future::Future;
use std::time::Duration;

use crate::{LockError, LockGuard, LossReason};

/// The longest the section runs without a look at the lease's time left (renewals move
/// it; a machine resumed from suspend wakes no timer on time).
const LOOK: Duration = Duration::from_millis(100);

/// How long before the lease's local deadline the section is dropped: this process's own
/// timer and scheduling delay, as `fencelock run`'s kill margin (20 ms and a hundredth of
/// the time left when the section starts).
fn margin(left: Duration) -> Duration {
    Duration::from_millis(20) + left / 100
}

/// Runs `work` under `guard`; see [`LockGuard::run`].
pub(crate) async fn run<G, F>(guard: &G, work: F) -> Result<F::Output, LockError>
where
    G: LockGuard + ?Sized,
    F: Future,
{
    let lost = |reason| LockError::LeaseLost {
        lock: Some(guard.name().to_owned()),
        reason,
    };
    let margin = guard.lease_remaining().map_or(Duration::ZERO, margin);
    let mut work = std::pin::pin!(work);
    loop {
        // Before the lease's deadline by the margin, on the boot-time clock the guard
        // keeps it by; `None`: a lock without a lease ends only by a reported loss.
        let left = guard.lease_remaining();
        if left.is_some_and(|left| left <= margin) {
            return Err(lost(LossReason::Expired));
        }
        let look = left.map_or(LOOK, |left| (left - margin).min(LOOK));
        tokio::select! {
            biased;
            reason = guard.lost() => return Err(lost(reason)),
            out = &mut work => return Ok(out),
            () = tokio::time::sleep(look) => {}
        }
    }
}
