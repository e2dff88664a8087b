//! An acquisition answered late (kept behind a slow link, with a request timeout longer
//! than the TTL) holds a lock whose deadline counts from when the request was sent, so
//! little of its TTL is left when the guard is handed out. The renewer must renew it at
//! once, not a whole interval (a third of the TTL) later, after the deadline; also when
//! several such locks are handed out at once (the tick each asks for must renew a
//! snapshot that has it). A lock without renewal answered late is renewed once, so that it
//! keeps its whole TTL (as etcd's does), not what was left of it.

use std::time::Duration;

use fencelock::redis::{RedisGuard, RedisLocker};
use fencelock::testkit::{FaultProxy, RedisServer};
use fencelock::{LockBackend, LockGuard, LockOptions, LossReason};

use crate::support::{locker_through, prefix, proxy_to, redis, released, within};

/// 6 s, 4.5 s of it gone before the answer: 1.5 s left (less the drift margin), less than
/// the 2 s to the usual first renewal.
const TTL: Duration = Duration::from_secs(6);
const KEPT: Duration = Duration::from_millis(4_500);

/// What [`locks_answered_late`] took, and what must outlive the guards.
struct Late {
    guards: Vec<RedisGuard>,
    _client: RedisLocker,
    _proxy: FaultProxy,
    _server: RedisServer,
}

/// Locks `names` at once through a proxy that keeps the acquisitions unanswered for
/// [`KEPT`].
async fn locks_answered_late(test: &str, names: &[&'static str], options: &LockOptions) -> Late {
    let server = redis().await;
    let proxy = proxy_to(&server).await;
    let client = locker_through(&proxy, &prefix(test), Duration::from_secs(10)).await;
    proxy.hold_requests();
    let locks = futures_util::future::join_all(names.iter().map(|name| {
        let (client, options, name) = (client.clone(), options.clone(), *name);
        tokio::spawn(async move { client.lock(name, &options).await })
    }));
    tokio::pin!(locks);
    within(Duration::from_secs(10), "the acquires are kept", async {
        tokio::select! {
            biased;
            outcome = &mut locks => panic!("answered while kept: {outcome:?}"),
            // On one multiplexed connection: at least the first chunk is kept (the
            // acquires go out together, in one chunk or several).
            () = proxy.requests_held(1) => {}
        }
    })
    .await;
    // The fault is the time itself: the acquires stay unanswered this long.
    tokio::time::sleep(KEPT).await;
    proxy.resume();
    let guards = within(Duration::from_secs(10), "the lock calls", locks)
        .await
        .into_iter()
        .map(|joined| joined.expect("task").expect("a lock answered late"))
        .collect();
    Late {
        guards,
        _client: client,
        _proxy: proxy,
        _server: server,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_answered_late_is_renewed_before_its_deadline() {
    let names = ["a", "b", "c", "d", "e", "f", "g", "h"];
    let options = LockOptions::new().with_ttl(TTL);
    let late = locks_answered_late("late-answer", &names, &options).await;
    let guards = &late.guards;

    for guard in guards {
        assert!(guard.is_held(), "{} lost at once", guard.name());
    }
    let lost = futures_util::future::select_all(guards.iter().map(|g| Box::pin(g.lost())));
    tokio::select! {
        (reason, index, _) = lost => panic!("{} was lost: {reason:?}", guards[index].name()),
        () = tokio::time::sleep(Duration::from_secs(2)) => {}
    }
    for guard in late.guards {
        assert!(guard.is_held());
        released(guard.release().await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_without_renewal_answered_late_keeps_its_whole_ttl() {
    let options = LockOptions::new().with_ttl(TTL).with_renewal(false);
    let mut late = locks_answered_late("late-no-renewal", &["solo"], &options).await;
    let guard = late.guards.pop().expect("one guard");
    assert!(guard.is_held(), "lost at once");
    // Renewed at once by the renewer (its TTL then counts from that renewal): more than
    // two thirds of it left, where the late answer left less than a quarter.
    within(
        Duration::from_secs(3),
        "the late lock renewed once",
        async {
            while guard
                .lease_remaining()
                .is_none_or(|left| left <= TTL * 2 / 3)
            {
                assert!(guard.is_held(), "lost before it was renewed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    // Renewed once: still held past the deadline the late answer left (under 1.5 s from
    // here), then lost when the renewed TTL runs out, not renewed again.
    let renewed = tokio::time::Instant::now();
    let reason = within(
        TTL + Duration::from_secs(2),
        "the renewed lock expiring",
        guard.lost(),
    )
    .await;
    assert_eq!(reason, LossReason::Expired);
    assert!(
        renewed.elapsed() > Duration::from_millis(3_500),
        "lost after only {:?}",
        renewed.elapsed()
    );
    assert!(!guard.is_held());
    // Cleanup: the server's copy may outlive the local deadline by the drift margin.
    let _cleanup = guard.release().await;
}
