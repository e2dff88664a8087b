//! The wait timeout of an advisory lock bounds the whole call: taking a connection from
//! the pool (here: opening one, which hangs) and asking for its backend pid count against
//! it, not only the wait for the lock.

use std::time::Duration;

use fencelock::postgres::PgAdvisoryLocker;
use fencelock::testkit::FaultProxy;
use fencelock::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};

use crate::support::Db;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_timeout_covers_connecting() {
    let db = Db::start().await;
    let proxy = FaultProxy::start(
        format!("127.0.0.1:{}", db.server.port())
            .parse()
            .expect("addr"),
    )
    .await
    .expect("proxy");
    // A connect timeout far above the wait timeout: the call must not wait for it.
    let connection = format!(
        "host=127.0.0.1 port={} user=postgres dbname={} connect_timeout=20",
        proxy.address().port(),
        db.name
    );
    let locks = PgAdvisoryLocker::connect(&connection)
        .await
        .expect("connect");
    locks.ensure_schema().await.expect("schema");
    // The pool's only connection is taken by a held lock: the next call opens one.
    let held = locks
        .lock("held", &LockOptions::new())
        .await
        .expect("lock held");
    proxy.hold_new_connections();

    let wait = Duration::from_millis(300);
    let slack = Duration::from_secs(2);
    let started = tokio::time::Instant::now();
    let outcome = tokio::time::timeout(
        wait + Duration::from_secs(30),
        locks.lock("other", &LockOptions::new().with_wait_timeout(wait)),
    )
    .await;
    let took = started.elapsed();
    proxy.resume();
    match outcome {
        Ok(Err(err)) if err.is_wait_timeout() => {}
        Ok(Err(err)) => panic!("expected a wait timeout after {took:?}, got: {err}"),
        Ok(Ok(guard)) => panic!(
            "took \"other\" (token {}) through a hung connect",
            guard.token()
        ),
        Err(_) => panic!("no answer within {:?}", wait + Duration::from_secs(30)),
    }
    assert!(
        took < wait + slack,
        "a {wait:?} wait timeout returned after {took:?} (connecting was not bounded by it)"
    );

    // Connections open again: the lock is there to take.
    let other = locks
        .lock(
            "other",
            &LockOptions::new().with_wait_timeout(Duration::from_secs(10)),
        )
        .await
        .expect("lock other after the proxy resumed");
    assert_eq!(
        other.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}
