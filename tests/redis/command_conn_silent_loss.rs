//! A command connection that dies without closing (no FIN, no reset: its host crashed
//! behind the same address, a partition, a load balancer that forgot the flow) is
//! replaced once a request on it and then a `PING` go unanswered within the request
//! timeout: locks are granted again, and held ones renewed, over a new connection.
//!
//! Before, redis-rs's `ConnectionManager` reconnected only on a closed connection, never
//! on a timeout: every request (attempts, renewals, releases) timed out until the
//! kernel's retransmission timeout (about 15 minutes), and no new connection was opened.

use std::time::Duration;

use fencelock::redis::RedisLocker;
use fencelock::testkit::FaultProxy;
use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{locker_through, prefix, proxy_to, redis, released, within};

/// A locker through `proxy` with `request_timeout`, that took and released a lock once,
/// so its command connection (the proxy's first: `try_lock` never waits, so no pub/sub
/// connection is opened) is known to be open.
async fn connected(proxy: &FaultProxy, test: &str, request_timeout: Duration) -> RedisLocker {
    let locks = locker_through(proxy, &prefix(test), request_timeout).await;
    let guard = locks
        .try_lock("before", &LockOptions::new())
        .await
        .expect("no error")
        .expect("free");
    released(guard.release().await);
    assert_eq!(
        proxy.connections_accepted(),
        1,
        "the command connection alone"
    );
    locks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_connection_that_goes_silent_is_replaced() {
    let server = redis().await;
    let proxy = proxy_to(&server).await;
    // Short, so that the loss is found quickly (a request and a ping, each unanswered
    // within it), but not so short that a request slowed by a loaded machine opens a
    // third connection.
    let locks = connected(&proxy, "command-silent", Duration::from_secs(1)).await;
    proxy.blackhole(1);
    // Attempts on the silent connection time out (the first one and whatever is sent
    // before its ping is found unanswered too); then one is granted on a new connection,
    // found 2-3 request timeouts after the loss (measured with 400 ms: 0.8-1.2 s). A fresh name each time: a
    // timed-out attempt may have been applied (on the new connection, slow under load)
    // and is undone in the background, so its name may be refused for a moment.
    let guard = within(
        Duration::from_secs(8),
        "a lock granted after the command connection went silent",
        async {
            let mut attempts = 0;
            loop {
                attempts += 1;
                let name = format!("after-{attempts}");
                match locks.try_lock(&name, &LockOptions::new()).await {
                    Ok(Some(guard)) => break guard,
                    Ok(None) => panic!("{name} refused: nobody ever held it"),
                    Err(err) => assert!(err.is_timeout(), "not a timeout: {err}"),
                }
            }
        },
    )
    .await;
    assert_eq!(
        proxy.connections_accepted(),
        2,
        "one new command connection, opened once"
    );
    released(guard.release().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_is_renewed_over_a_new_connection_after_its_own_goes_silent() {
    let server = redis().await;
    let proxy = proxy_to(&server).await;
    let locks = connected(&proxy, "command-silent-renew", Duration::from_secs(1)).await;
    // Renewed every 2 s; each renewal attempt given up after 666 ms (a third of that),
    // before the connection's own 1 s response timeout could fire: only the renewer
    // itself can tell that the connection stopped answering.
    let guard = locks
        .try_lock("held", &LockOptions::new().with_ttl(Duration::from_secs(6)))
        .await
        .expect("no error")
        .expect("free");
    proxy.blackhole(1);
    // Nothing but the renewer uses the connection: the next renewal (within 2 s)
    // finds it silent, then a ping does (within 1 s), and the next request opens the new
    // connection. The lock lasts 6 s from its last renewal on the old connection.
    within(
        Duration::from_secs(8),
        "a new command connection after the renewals went unanswered",
        proxy.accepted(2),
    )
    .await;
    // Renewed over the new connection: the lease grows again, where without a renewal
    // it only shrinks (and runs out 6 s after the last renewal on the old connection).
    let before = guard.lease_remaining().expect("a lease");
    within(
        Duration::from_secs(4),
        "a renewal over the new connection",
        async {
            while guard
                .lease_remaining()
                .is_none_or(|left| left <= before + Duration::from_millis(200))
            {
                assert!(guard.is_held(), "lost before it was renewed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    assert!(guard.is_held());
    released(guard.release().await);
    assert_eq!(
        proxy.connections_accepted(),
        2,
        "one new command connection"
    );
}
