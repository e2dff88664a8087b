//! A cancelled advisory-lock wait must not leave a cancel in flight for the connection's
//! next statement. The holder releases right at the waiter's deadline, so the server
//! often grants the waiting query the lock just as the client gives up and sends the
//! cancel; the cancel then reaches the backend after the statement it was meant for has
//! ended. The client must wait until the server has delivered the cancel (it closes the
//! cancel connection then, which is what libpq's `PQcancel` waits for) before it reuses
//! the connection: otherwise the next lock on it fails with a spurious 57014
//! ("canceling statement due to user request").

use std::time::Duration;

use fencelock::postgres::PgAdvisoryLocker;
use fencelock::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};

use crate::support::Db;

const ROUNDS: u32 = 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_cancel_never_hits_the_next_lock() {
    let db = Db::start().await;
    let connect = || async {
        let locks = PgAdvisoryLocker::connect(&db.server.connection_string(&db.name))
            .await
            .expect("connect");
        locks.ensure_schema().await.expect("schema");
        locks
    };
    let (holder, waiter) = (connect().await, connect().await);
    let promptly = LockOptions::new().with_wait_timeout(Duration::from_secs(10));
    let wait = Duration::from_millis(40);
    let short = LockOptions::new().with_wait_timeout(wait);
    let (mut timed_out, mut granted) = (0u32, 0u32);
    let mut spurious = Vec::new();
    // The backends the next lock ran on: the cancelled connection is reused, not
    // replaced (replacing it would dodge a late cancel at the price of a connect).
    let mut backends = std::collections::HashSet::new();
    for round in 0..ROUNDS {
        let held = holder.lock("busy", &promptly).await.expect("holder lock");
        // The release lands at the waiter's deadline, give or take a millisecond.
        let deadline = tokio::time::Instant::now() + wait;
        let offset = Duration::from_micros(u64::from(round % 5) * 500);
        let release = async {
            tokio::time::sleep_until(deadline - Duration::from_millis(1) + offset).await;
            assert_eq!(
                held.release().await.expect("holder release"),
                ReleaseOutcome::Released
            );
        };
        let waiting = waiter.lock("busy", &short);
        let ((), waited) = tokio::join!(release, waiting);
        match waited {
            Ok(guard) => {
                granted += 1;
                if let Err(err) = guard.release().await {
                    spurious.push(format!("round {round}, the waiter's release: {err:?}"));
                }
            }
            Err(err) if err.is_wait_timeout() => timed_out += 1,
            // A cancel left over from the round before fails the wait at once.
            Err(err) => spurious.push(format!("round {round}, the wait: {err:?}")),
        }
        // At once, on the waiter's pooled connection: nobody holds "other". (Every
        // statement on the waiter's connections is checked: a late cancel fails whichever
        // comes first.)
        match waiter.lock("other", &promptly).await {
            Ok(guard) => {
                backends.insert(guard.backend_pid());
                if let Err(err) = guard.release().await {
                    spurious.push(format!("round {round}, the next lock's release: {err:?}"));
                }
            }
            Err(err) => spurious.push(format!("round {round}, the next lock: {err:?}")),
        }
    }
    eprintln!(
        "{ROUNDS} rounds: {timed_out} waits timed out, {granted} granted, {} spurious errors \
         ({} of them 57014)",
        spurious.len(),
        spurious.iter().filter(|e| e.contains("E57014")).count()
    );
    assert!(timed_out > 0, "no wait timed out: the race was never run");
    assert!(
        spurious.is_empty(),
        "{} statements failed after a cancelled wait in {ROUNDS} rounds; first: {}",
        spurious.len(),
        spurious.first().map_or("", String::as_str)
    );
    assert!(
        backends.len() <= 10,
        "the next lock ran on {} backends in {ROUNDS} rounds: cancelled connections were \
         closed instead of reused",
        backends.len()
    );
}

/// Over the server's Unix socket, too, a given-up wait's cancel is confirmed (the server
/// closes the cancel connection) and the waiter's connection is reused for the next lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_over_the_unix_socket_is_confirmed() {
    let db = Db::start().await;
    let connect = || async {
        let locks = PgAdvisoryLocker::connect(&db.server.socket_connection_string(&db.name))
            .await
            .expect("connect over the Unix socket");
        locks.ensure_schema().await.expect("schema");
        locks
    };
    let (holder, waiter) = (connect().await, connect().await);
    let promptly = LockOptions::new().with_wait_timeout(Duration::from_secs(10));
    let probe = waiter.lock("probe", &promptly).await.expect("probe");
    let backend = probe.backend_pid();
    assert_eq!(
        probe.release().await.expect("release"),
        ReleaseOutcome::Released
    );

    let held = holder.lock("busy", &promptly).await.expect("lock");
    let wait = Duration::from_millis(200);
    let err = waiter
        .lock("busy", &LockOptions::new().with_wait_timeout(wait))
        .await
        .expect_err("the lock is held");
    assert!(err.is_wait_timeout(), "{err}");
    let next = waiter
        .lock("after-cancel", &promptly)
        .await
        .expect("lock after the cancel");
    assert_eq!(
        next.backend_pid(),
        backend,
        "the connection of the cancelled wait was not reused: the cancel over the Unix \
         socket was not confirmed"
    );
    assert_eq!(
        next.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}
