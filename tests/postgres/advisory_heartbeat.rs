//! An advisory lock whose connection dies without a word (no RST, no FIN: a frozen
//! network, a failover that moved the address) is reported lost within its TTL of the
//! last answered heartbeat, while the server still holds it; before issue 35 the guard
//! said "held" for as long as TCP keepalive took (two hours by default). A healthy
//! connection keeps its lock for many TTLs.

use std::net::SocketAddr;
use std::time::Duration;

use fencelock::postgres::PgAdvisoryLocker;
use fencelock::testkit::FaultProxy;
use fencelock::{LockBackend, LockGuard, LockOptions, LossReason, ReleaseOutcome};
use tokio::time::Instant;

use crate::support::Db;

const TTL: Duration = Duration::from_secs(2);

async fn locker(connection: &str) -> PgAdvisoryLocker {
    let locks = PgAdvisoryLocker::connect(connection)
        .await
        .expect("connect");
    locks.ensure_schema().await.expect("schema");
    locks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_connection_is_reported_lost_within_the_ttl_while_the_server_still_holds_the_lock()
{
    let db = Db::start().await;
    let server = SocketAddr::from(([127, 0, 0, 1], db.server.port()));
    let proxy = FaultProxy::start(server).await.expect("proxy");
    let through_proxy = format!(
        "host=127.0.0.1 port={} user=postgres dbname={} connect_timeout=5",
        proxy.address().port(),
        db.name
    );
    let a = locker(&through_proxy).await;
    let b = locker(&db.server.connection_string(&db.name)).await;
    let options = LockOptions::new().with_ttl(TTL);

    let held = a.lock("job", &options).await.expect("lock");
    // Healthy, it outlives its TTL many times over: the heartbeat keeps it trusted.
    tokio::time::sleep(TTL * 2).await;
    assert!(held.is_held(), "a healthy lock is held past its TTL");
    let left = held.lease_remaining().expect("a deadline");
    assert!(left > TTL / 3 && left <= TTL, "{left:?}");

    // The network freezes: nothing flows, nothing is closed.
    proxy.pause();
    let frozen = Instant::now();
    let reason = tokio::time::timeout(TTL + Duration::from_secs(3), held.lost())
        .await
        .expect("the loss is reported within the TTL of the last heartbeat");
    let after = frozen.elapsed();
    eprintln!("lost {after:?} after the freeze");
    assert_eq!(reason, LossReason::Expired);
    assert!(!held.is_held());
    // The last answered heartbeat was sent at most a third of the TTL (plus its round
    // trip) before the freeze, its deadline is one TTL after that.
    assert!(
        after >= TTL - TTL / 3 - Duration::from_millis(100)
            && after <= TTL + Duration::from_millis(500),
        "lost {after:?} after the freeze"
    );
    // Reported before the server could give it to anyone: it still holds it for A's
    // session (the proxy keeps the server's side of the connection open and answering).
    assert!(
        b.try_lock("job", &options)
            .await
            .expect("try_lock")
            .is_none(),
        "the server still holds the lock"
    );
    let token = held.token();
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::NotHeld
    );

    // Once the network thaws, the closed connection reaches the server, which frees the
    // lock; the next grant's token is larger.
    proxy.resume();
    let next = b
        .lock(
            "job",
            &options.clone().with_wait_timeout(Duration::from_secs(10)),
        )
        .await
        .expect("freed once the server hears of the close");
    assert!(next.token() > token);
    assert_eq!(
        next.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// The heartbeat's task reports the loss and closes the connection; if it dies (a panic
/// in it), the guard's `lost()` must still resolve at the deadline, as `is_held()` turns
/// false then, rather than wait on a connection that stays open, and the connection
/// must be closed so that the server frees the lock for the next holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_heartbeat_task_still_lets_the_loss_show_at_the_deadline() {
    let db = Db::start().await;
    let locks = locker(&db.server.connection_string(&db.name)).await;
    let other = locker(&db.server.connection_string(&db.name)).await;
    let options = LockOptions::new().with_ttl(TTL);
    let held = locks.lock("job", &options).await.expect("lock");
    held.stop_heartbeat_for_test();
    let reason = tokio::time::timeout(TTL + Duration::from_secs(3), held.lost())
        .await
        .expect("the loss is reported by the deadline");
    assert_eq!(reason, LossReason::Expired);
    assert!(!held.is_held());
    // Given up for good: the next holder gets it while this guard still exists.
    let next = other
        .lock(
            "job",
            &options.clone().with_wait_timeout(Duration::from_secs(10)),
        )
        .await
        .expect("the server freed the lock");
    assert!(next.token() > held.token());
    assert_eq!(held.release().await.ok(), Some(ReleaseOutcome::NotHeld));
}
