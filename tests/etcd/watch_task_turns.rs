//! Short holds one after another (most locks: taken and released within `DEFER`, before
//! any watch is asked for) must not wake the client's watch task once each: a wake-up per
//! lock cycle is a task hop, often a thread's, on the path of every cycle. The task wakes
//! about once per `DEFER` (100 ms) for them, and a hold after them still has its watch
//! asked for: its key's deletion is seen (the exact timing is `watch_state.rs`'s tests).

use std::time::{Duration, Instant};

use fencelock::etcd::EtcdLocker;
use fencelock::{LockBackend, LockGuard, LockOptions, LossReason, ReleaseOutcome};

use crate::support::{etcd, locker, namespace, within};

const CYCLES: u64 = 200;

/// A cycle this long may hold long enough for its watch to be asked for (at `DEFER`,
/// 100 ms; a hold is part of its cycle), and that watch's events then wake the task for a
/// reason of their own: such a run is measured again.
const STALLED: Duration = Duration::from_millis(90);

/// The task's turns and the time taken for `CYCLES` short holds of `name`; `None` if one
/// of them stalled.
async fn short_holds(
    locks: &EtcdLocker,
    name: &str,
    options: &LockOptions,
) -> Option<(u64, Duration)> {
    let before = locks.watch_task_turns_for_test();
    let started = Instant::now();
    for _ in 0..CYCLES {
        let cycle = Instant::now();
        let guard = locks.lock(name, options).await.expect("lock");
        assert_eq!(
            guard.release().await.expect("release"),
            ReleaseOutcome::Released
        );
        if cycle.elapsed() >= STALLED {
            return None;
        }
    }
    Some((
        locks.watch_task_turns_for_test() - before,
        started.elapsed(),
    ))
}

#[tokio::test]
async fn short_holds_do_not_wake_the_watch_task_once_each() {
    let cluster = etcd().await;
    let locks = locker(&cluster, &namespace("watch-turns")).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    locks.session(options.ttl()).await.expect("session");

    let mut measured = None;
    for attempt in 0..5 {
        measured = short_holds(&locks, &format!("short-{attempt}"), &options).await;
        if measured.is_some() {
            break;
        }
    }
    let (turns, elapsed) = measured.expect("five runs in a row had a cycle stall for 90 ms");
    // One turn for the first hold, then about one per DEFER of the run (twice that, and a
    // few, as slack for a loaded machine), and fewer than one per hold in any case; before
    // the fix: one per hold.
    let bound =
        (4 + 2 * u64::try_from(elapsed.as_millis() / 100).unwrap_or(u64::MAX)).min(CYCLES / 2);
    assert!(
        turns <= bound,
        "{turns} turns of the watch task for {CYCLES} short holds in {elapsed:?} (bound {bound})"
    );

    // A hold after all of them still gets its watch: an operator's delete is seen.
    let guard = locks.lock("short-0", &options).await.expect("lock");
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
