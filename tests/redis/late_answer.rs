//! An acquisition answered late (kept behind a slow link, with a request timeout longer
//! than the TTL) holds a lock whose deadline counts from when the request was sent, so
//! little of its TTL is left when the guard is handed out. The renewer must renew it at
//! once, not a whole interval (a third of the TTL) later, after the deadline; also when
//! several such locks are handed out at once (the tick each asks for must renew a
//! snapshot that has it).

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{locker_through, prefix, proxy_to, redis, released, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_answered_late_is_renewed_before_its_deadline() {
    let server = redis().await;
    let prefix = prefix("late-answer");
    let proxy = proxy_to(&server).await;
    let client = locker_through(&proxy, &prefix, Duration::from_secs(10)).await;
    // 6 s, 4.5 s of it gone before the answer: 1.5 s left (less the drift margin), less
    // than the 2 s to the usual first renewal.
    let options = LockOptions::new().with_ttl(Duration::from_secs(6));

    proxy.hold_requests();
    let names = ["a", "b", "c", "d", "e", "f", "g", "h"];
    let locks = futures_util::future::join_all(names.into_iter().map(|name| {
        let (client, options) = (client.clone(), options.clone());
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
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    proxy.resume();
    let guards: Vec<_> = within(Duration::from_secs(10), "the lock calls", locks)
        .await
        .into_iter()
        .map(|joined| joined.expect("task").expect("a lock answered late"))
        .collect();

    for guard in &guards {
        assert!(guard.is_held(), "{} lost at once", guard.name());
    }
    let lost = futures_util::future::select_all(guards.iter().map(|g| Box::pin(g.lost())));
    tokio::select! {
        (reason, index, _) = lost => panic!("{} was lost: {reason:?}", guards[index].name()),
        () = tokio::time::sleep(Duration::from_secs(2)) => {}
    }
    for guard in guards {
        assert!(guard.is_held());
        released(guard.release().await);
    }
}
