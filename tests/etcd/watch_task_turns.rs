//! Short holds one after another (most locks: taken and released within `DEFER`, before
//! any watch is asked for) must not wake the client's watch task once each: a wake-up per
//! lock cycle is a task hop, often a thread's, on the path of every cycle. The task wakes
//! at most about once per `DEFER` (100 ms) for them, and a hold that outlives them still
//! has its watch asked for on time (its key's deletion is seen).

use std::time::{Duration, Instant};

use fencelock::{LockBackend, LockGuard, LockOptions, LossReason, ReleaseOutcome};

use crate::support::{etcd, locker, namespace, within};

const CYCLES: u64 = 200;

#[tokio::test]
async fn short_holds_do_not_wake_the_watch_task_once_each() {
    let cluster = etcd().await;
    let locks = locker(&cluster, &namespace("watch-turns")).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    locks.session(options.ttl()).await.expect("session");

    let before = locks.watch_task_turns_for_test();
    let started = Instant::now();
    for _ in 0..CYCLES {
        let guard = locks.lock("short", &options).await.expect("lock");
        assert_eq!(
            guard.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
    let elapsed = started.elapsed();
    let turns = locks.watch_task_turns_for_test() - before;
    // One turn for the first hold, then one per DEFER of the run at most (twice that,
    // and a few, as slack for a loaded machine); before the fix: one per cycle.
    let bound = 4 + 2 * u64::try_from(elapsed.as_millis() / 100).unwrap_or(u64::MAX);
    assert!(
        turns <= bound.min(CYCLES / 4),
        "{turns} turns of the watch task for {CYCLES} short holds in {elapsed:?} (bound {bound})"
    );

    // A hold after all of them still gets its watch: an operator's delete is seen.
    let guard = locks.lock("short", &options).await.expect("lock");
    let mut client = cluster.client().await.expect("client");
    client.delete(guard.key(), None).await.expect("delete");
    let reason = within(
        Duration::from_secs(5),
        "the holder learns its key is gone",
        guard.lost(),
    )
    .await;
    assert_eq!(reason, LossReason::KeyDeleted);
}
