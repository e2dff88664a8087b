//! A renewal task that stops renews nothing and marks nothing expired. Its locks must be
//! reported lost at once (`Unrenewed`), not left to guards that wait on a loss nobody
//! reports while the keys expire on the server; and the client must not be left
//! granting locks that nobody renews: the next lock starts a new task.
//!
//! The task stops by a panic (a metrics recorder that panics when a renewal is counted:
//! a recorder's bug, or any bug of the task's own), or because the runtime it was
//! spawned on went away before it was first polled.

use std::time::Duration;

use fencelock::metrics::names::RENEWALS;
use fencelock::testkit::{PanicsOnCounter, lost_at_first_renewal};
use fencelock::{LockBackend, LockGuard, LockOptions};
use tokio::runtime::{Builder, Runtime};

use crate::support::{locker, owner_part, prefix, redis};

fn current_thread() -> Runtime {
    Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Holds a 1 s lock for three of its TTLs and checks it was renewed all along.
async fn renewed_past_its_ttl(
    locks: &fencelock::redis::RedisLocker,
    server: &fencelock::testkit::RedisServer,
) {
    let ttl = Duration::from_secs(1);
    let guard = locks
        .lock("renewed", &LockOptions::new().with_ttl(ttl))
        .await
        .expect("lock");
    tokio::time::sleep(ttl * 3).await;
    assert!(
        guard.is_held(),
        "not renewed: {:?}",
        guard.lease_remaining()
    );
    let stored = server.get(guard.key()).await.expect("get");
    assert_eq!(owner_part(stored.as_deref()), Some(guard.owner()));
}

#[test]
fn a_renewal_task_that_panics_reports_its_locks_lost_and_is_replaced() {
    // One thread: the renewal task runs where the recorder is installed (a local
    // recorder is the thread's, and a current-thread runtime polls every task on the
    // thread that blocks on it).
    let runtime = current_thread();
    let (server, locks) = runtime.block_on(async {
        let server = redis().await;
        let locks = locker(&server, &prefix("renewer-panics")).await;
        (server, locks)
    });
    metrics::with_local_recorder(&PanicsOnCounter(RENEWALS), || {
        runtime.block_on(async {
            // The first renewal kills the task, well before the lock's time runs out by
            // the client's clock (then `lost()` would say `Expired`).
            lost_at_first_renewal(&locks, "job").await;
        });
    });
    // The recorder is gone: the next lock's new task renews it.
    runtime.block_on(renewed_past_its_ttl(&locks, &server));
}

#[test]
fn a_renewal_task_never_polled_is_replaced() {
    let runtime = current_thread();
    let server = runtime.block_on(redis());
    // Connected on a runtime that is gone as soon as `connect` returns: the renewal task
    // it spawned was never polled.
    let locks = {
        let first = current_thread();
        first.block_on(locker(&server, &prefix("renewer-never-polled")))
    };
    runtime.block_on(renewed_past_its_ttl(&locks, &server));
}
