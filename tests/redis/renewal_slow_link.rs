//! Many locks renewed over a link too slow to carry a whole round within one attempt's
//! wait are all kept, and the server is not sent the round again and again.
//!
//! Before, a round went to the server as one pipeline and was given up if its answer
//! took longer than the attempt's wait (a third of the renewal interval, at most 1 s),
//! however much it carried; the retry sent the whole round again, behind the first on
//! the same connection, which the server still had to run. Over a narrow link (or on a
//! server that takes long to run 100,000 renewals: a bench run lost Redlock's 100,000
//! held locks so) no attempt was ever answered in time, each one added a round's work,
//! and every lock was lost together at its deadline.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use crate::support::{locker_through, owner_part, prefix, proxy_to, redis};

/// The bytes of one bulk string in a command: `$<len>\r\n<bytes>\r\n`.
fn bulk(len: usize) -> usize {
    1 + len.to_string().len() + 2 + len + 2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_renewed_over_a_link_slower_than_an_attempts_wait_are_all_kept() {
    const LOCKS: usize = 10_000;
    const CHUNK: usize = 1000;
    let server = redis().await;
    let proxy = proxy_to(&server).await;
    let locks = locker_through(&proxy, &prefix("renewal-slow-link"), Duration::from_secs(2)).await;
    // A tick every second; an attempt may go unanswered 333 ms.
    let ttl = Duration::from_secs(3);
    let attempt_wait = ttl / 9;
    let options = LockOptions::new().with_ttl(ttl);
    let mut guards = Vec::with_capacity(LOCKS);
    let mut names = (0..LOCKS).map(|i| format!("item-{i}"));
    let mut taking = FuturesUnordered::new();
    loop {
        while taking.len() < 64 {
            let Some(name) = names.next() else { break };
            let (locks, options) = (&locks, &options);
            taking.push(async move { locks.lock(&name, options).await });
        }
        match taking.next().await {
            Some(guard) => guards.push(guard.expect("lock")),
            None => break,
        }
    }
    assert_eq!(locks.held_locks(), LOCKS);

    // What one round sends: per lock its key, its owner value and its TTL in ms.
    let round_bytes: usize = guards
        .iter()
        .map(|g| bulk(g.key().len()) + bulk(g.owner().len()) + bulk(4))
        .sum();
    // The link carries a round in 600 ms: well within the tick, and twice the attempt's
    // wait, so a round sent as one request is never answered in time.
    let rate = u64::try_from(round_bytes * 10 / 6).expect("rate");
    let round = Duration::from_secs_f64(round_bytes as f64 / rate as f64);
    assert!(round > attempt_wait, "{round:?} to carry a round");
    proxy.throttle(rate);
    server.reset_stats().await.expect("reset");

    // Two TTLs: a lock not renewed in time would be reported lost.
    let window = ttl * 2;
    let mut losses: FuturesUnordered<_> = guards.iter().map(|g| g.lost()).collect();
    if let Ok(reason) = tokio::time::timeout(window, losses.next()).await {
        panic!(
            "a lock was lost ({reason:?}); {} of {LOCKS} still held",
            guards.iter().filter(|g| g.is_held()).count()
        );
    }
    let calls = server.command_calls("evalsha").await.expect("stats");
    // One call per chunk of 1,000 per round: a round a tick (a second) after the last
    // one's start (each takes 600 ms to carry), at most 6 in the window and one under way
    // at its start. Each attempt sent again in full would be a round more.
    let chunks = u64::try_from(LOCKS / CHUNK).expect("chunks");
    assert!(
        calls <= chunks * 7,
        "{calls} renewal calls in {window:?}: rounds were sent again"
    );
    drop(losses);
    proxy.throttle(0);
    for guard in guards.iter().step_by(997) {
        assert!(guard.is_held());
        let stored = server.get(guard.key()).await.expect("get");
        assert_eq!(owner_part(stored.as_deref()), Some(guard.owner()));
    }
}
