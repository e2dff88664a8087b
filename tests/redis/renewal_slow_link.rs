//! Many locks renewed over a link too slow to carry a whole round within one attempt's
//! wait, or within a tick, are all kept; the server is not sent the round again and
//! again; and every Redlock master gets every renewal, the slowest too.
//!
//! Before, a round went to the server as one pipeline and was given up if its answer
//! took longer than the attempt's wait (a third of the renewal interval, at most 1 s),
//! however much it carried; the retry sent the whole round again, behind the first on
//! the same connection, which the server still had to run. Over a narrow link (or on a
//! server that takes long to run 100,000 renewals: a bench run lost Redlock's 100,000
//! held locks so) no attempt was ever answered in time, each one added a round's work,
//! and every lock was lost together at its deadline.

use std::time::Duration;

use fencelock::redis::{RedisConfig, RedisGuard, RedlockLocker};
use fencelock::testkit::{FaultProxy, RedisServer};
use fencelock::{LockBackend, LockGuard, LockOptions};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use crate::support::{direct, locker_through, owner_part, prefix, proxy_to, redis, within};

/// A tick every second; an attempt may go unanswered 333 ms.
const TTL: Duration = Duration::from_secs(3);
const ATTEMPT_WAIT: Duration = Duration::from_millis(333);

/// Locks per renewal call.
const CHUNK: usize = 1000;

/// Takes `count` locks of `ttl`, 64 at a time.
async fn take<B>(locks: &B, count: usize, ttl: Duration) -> Vec<RedisGuard>
where
    B: LockBackend<Guard = RedisGuard>,
{
    let options = LockOptions::new().with_ttl(ttl);
    let mut guards = Vec::with_capacity(count);
    let mut names = (0..count).map(|i| format!("item-{i}"));
    let mut taking = FuturesUnordered::new();
    loop {
        while taking.len() < 64 {
            let Some(name) = names.next() else { break };
            let options = &options;
            taking.push(async move { locks.lock(&name, options).await });
        }
        match taking.next().await {
            Some(guard) => guards.push(guard.expect("lock")),
            None => break,
        }
    }
    guards
}

/// Throttles `proxy` so that it carries one renewal round of `guards` in `round`.
fn carry_a_round_in(proxy: &FaultProxy, guards: &[RedisGuard], round: Duration) {
    // Per lock its key, its owner value and its TTL in ms (`$<len>\r\n<bytes>\r\n` each).
    let bulk = |len: usize| 1 + len.to_string().len() + 2 + len + 2;
    let round_bytes: usize = guards
        .iter()
        .map(|g| bulk(g.key().len()) + bulk(g.owner().len()) + bulk(4))
        .sum();
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    let rate = (round_bytes as f64 / round.as_secs_f64()) as u64;
    proxy.throttle(rate);
}

/// Fails if any of `guards` is reported lost within `window`.
async fn none_lost_within(guards: &[RedisGuard], window: Duration) {
    let mut losses: FuturesUnordered<_> = guards.iter().map(|g| g.lost()).collect();
    if let Ok(reason) = tokio::time::timeout(window, losses.next()).await {
        panic!(
            "a lock was lost ({reason:?}); {} of {} still held",
            guards.iter().filter(|g| g.is_held()).count(),
            guards.len()
        );
    }
}

/// 10,000 locks on one server behind a proxy carrying a round in `round`; the renewal
/// calls the server ran in the two TTLs after, in which none may be lost.
async fn hold_over_a_slow_link(test: &str, round: Duration) -> u64 {
    const LOCKS: usize = 10_000;
    let server = redis().await;
    let proxy = proxy_to(&server).await;
    let locks = locker_through(&proxy, &prefix(test), Duration::from_secs(2)).await;
    let guards = take(&locks, LOCKS, TTL).await;
    assert_eq!(locks.held_locks(), LOCKS);
    carry_a_round_in(&proxy, &guards, round);
    server.reset_stats().await.expect("reset");
    none_lost_within(&guards, 2 * TTL).await;
    let calls = server.command_calls("evalsha").await.expect("stats");
    proxy.throttle(0);
    for guard in guards.iter().step_by(997) {
        assert!(guard.is_held());
        let stored = server.get(guard.key()).await.expect("get");
        assert_eq!(owner_part(stored.as_deref()), Some(guard.owner()));
    }
    calls
}

/// A round takes twice an attempt's wait to carry: sent as one request, it was never
/// answered in time (before: "a lock was lost (Some(Expired)); 9926 of 10000 still
/// held").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_renewed_over_a_link_slower_than_an_attempts_wait_are_all_kept() {
    let round = Duration::from_millis(600);
    assert!(round > ATTEMPT_WAIT);
    let calls = hold_over_a_slow_link("renewal-slow-link", round).await;
    // One call per chunk of 1,000 per round: a round a tick (a second) after the last
    // one's start, at most 6 in the two TTLs and one under way at their start, and two
    // more for attempts a busy machine may fail. Each attempt sent again in full, as
    // before, would be twice that.
    let chunks = 10_000 / CHUNK as u64;
    assert!(
        calls <= chunks * 9,
        "{calls} renewal calls in {:?}: rounds were sent again",
        2 * TTL
    );
}

/// A round takes longer than a tick to carry, more than half the TTL: the next one must
/// start a tick after its start, not after its end, its calls stop once the next round
/// is due and the next starts with the locks it left, and each renewal must count from
/// when its call was sent, not from the round's start (which would leave the locks of
/// its last calls too little time: before, "a lock was lost (Some(Expired))").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_renewed_over_a_link_slower_than_a_tick_are_all_kept() {
    hold_over_a_slow_link("renewal-slower-than-tick", Duration::from_millis(1700)).await;
}

/// A lock with a shorter TTL, taken while a long round is under way, is renewed in
/// time: the round stops sending once the next is due (a tick of the new lock, a second),
/// and the next starts with the soonest deadlines. Before, the round went on to its end
/// (2 s here) and the new lock waited for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_lock_taken_during_a_long_round_is_renewed_in_time() {
    let server = redis().await;
    let proxy = proxy_to(&server).await;
    let locks = locker_through(
        &proxy,
        &prefix("renewal-long-round"),
        Duration::from_secs(2),
    )
    .await;
    // 10,000 locks of 12 s: a round every 4 s, each taking 2 s to carry.
    let guards = take(&locks, 10_000, Duration::from_secs(12)).await;
    carry_a_round_in(&proxy, &guards, Duration::from_secs(2));
    // Once a round is under way (its first call run: the server's count moves).
    server.reset_stats().await.expect("reset");
    within(Duration::from_secs(10), "a round under way", async {
        while server.command_calls("evalsha").await.expect("stats") == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let short = locks
        .lock("short", &LockOptions::new().with_ttl(TTL))
        .await
        .expect("lock");
    let lost = tokio::time::timeout(2 * TTL, short.lost()).await;
    assert!(lost.is_err(), "the shorter lock was lost: {lost:?}");
    assert!(guards.iter().all(|g| g.is_held()));
}

/// Redlock: the two fast masters decide each round long before the third, throttled,
/// has answered it; it must still get all of it, or its copies of the rest expire and
/// one more master's fault costs those locks their quorum (or gives them to another
/// client). Before: the third master's round was dropped once the other two had
/// decided, and only the locks in its first calls stayed on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_redlock_master_gets_every_renewal_the_slowest_too() {
    const LOCKS: usize = 8_000;
    let mut masters = Vec::new();
    for _ in 0..3 {
        masters.push(RedisServer::start().await.expect("master"));
    }
    let proxy = proxy_to(&masters[2]).await;
    let urls = vec![
        masters[0].url(),
        masters[1].url(),
        format!("redis://{}/", proxy.address()),
    ];
    let locks = RedlockLocker::connect(RedisConfig::masters(urls).with_prefix(prefix("rl-slow")))
        .await
        .expect("connect");
    let guards = take(&locks, LOCKS, TTL).await;
    // The locks the slow master has: an acquisition is granted by two masters, and one
    // whose attempt on the third was late is undone there.
    let on_slow = ours_on(&masters[2], &guards).await;
    assert!(
        on_slow.len() > LOCKS * 9 / 10,
        "{} on the slow master",
        on_slow.len()
    );
    // Within a tick, each call within an attempt's wait; far longer than the fast
    // masters take.
    carry_a_round_in(&proxy, &guards, Duration::from_millis(600));
    none_lost_within(&guards, 2 * TTL).await;
    proxy.throttle(0);
    // Two TTLs on, every one of them is still on the slow master: it was renewed there.
    let still = ours_on(&masters[2], &guards).await;
    assert_eq!(
        still.len(),
        on_slow.len(),
        "locks still on the slowest master, of those it had"
    );
}

/// The indexes of `guards` whose key `server` holds with the guard's owner value.
async fn ours_on(server: &RedisServer, guards: &[RedisGuard]) -> Vec<usize> {
    let keys: Vec<&str> = guards.iter().map(|g| g.key()).collect();
    let stored: Vec<Option<String>> = redis::cmd("MGET")
        .arg(&keys)
        .query_async(&mut direct(server).await)
        .await
        .expect("MGET");
    guards
        .iter()
        .zip(&stored)
        .enumerate()
        .filter(|(_, (g, stored))| owner_part(stored.as_deref()) == Some(g.owner()))
        .map(|(i, _)| i)
        .collect()
}
