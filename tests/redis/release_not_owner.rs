//! A holder whose lock expired cannot delete the next owner's lock by releasing late
//! (the article's first bug, which the compare-and-delete script prevents).

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions, LossReason, ReleaseOutcome};

use crate::support::{locker, owner_part, prefix, redis, released, within};

#[tokio::test]
async fn a_late_release_leaves_the_next_owners_lock_alone() {
    let server = redis().await;
    let prefix = prefix("not-owner");
    let a = locker(&server, &prefix).await;
    let b = locker(&server, &prefix).await;
    // No watchdog: A's lock simply runs out, like a holder that overran its lease.
    let short = LockOptions::new()
        .with_ttl(Duration::from_millis(300))
        .with_renewal(false);

    let stale = a.lock("order-42", &short).await.expect("lock");
    let reason = within(Duration::from_secs(2), "expiry noticed", stale.lost()).await;
    assert_eq!(reason, LossReason::Expired);
    assert!(!stale.is_held());

    let next = b.lock("order-42", &LockOptions::new()).await.expect("lock");
    assert!(next.token() > stale.token());
    assert_eq!(
        stale.release().await.expect("release"),
        ReleaseOutcome::NotHeld
    );
    let stored = server.get(next.key()).await.expect("get");
    assert_eq!(
        owner_part(stored.as_deref()),
        Some(next.owner()),
        "the next owner's lock is intact"
    );
    released(next.release().await);
}
