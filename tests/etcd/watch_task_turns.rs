//! Short holds one after another (most locks: taken and released within `DEFER`, before
//! any watch is asked for) must not wake the client's watch task once each: a wake-up per
//! lock cycle is a task hop, often a thread's, on the path of every cycle. Taken more often
//! than every `DEFER` (100 ms), they cost the task about one turn per `DEFER`; a hold after
//! them still has its watch asked for, and its key's deletion is seen (the exact timing is
//! in `watch_state.rs`'s tests).

use std::time::{Duration, Instant};

use fencelock::etcd::EtcdLocker;
use fencelock::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};

use crate::support::{delete_and_expect_loss, etcd, locker, namespace};

const CYCLES: u64 = 200;

/// A cycle this long (`DEFER`) may leave the task sleeping with no deadline (every time
/// queued past, and nothing live), and the next grant then wakes it: a turn of its own.
/// (No watch is opened: on this test's current-thread runtime nothing awaits between a
/// grant and its release's untracking, so the task cannot run during a hold.)
const STALLED: Duration = Duration::from_millis(100);

/// One run of `CYCLES` short holds, each of a name of its own (a stalled one's watch then
/// hears only its own release).
struct Run {
    turns: u64,
    elapsed: Duration,
    stalled: u64,
}

async fn short_holds(locks: &EtcdLocker, run: u32, options: &LockOptions) -> Run {
    let before = locks.watch_task_turns_for_test();
    let started = Instant::now();
    let mut stalled = 0;
    for i in 0..CYCLES {
        let cycle = Instant::now();
        let guard = locks
            .lock(&format!("short-{run}-{i}"), options)
            .await
            .expect("lock");
        assert_eq!(
            guard.release().await.expect("release"),
            ReleaseOutcome::Released
        );
        if cycle.elapsed() >= STALLED {
            stalled += 1;
        }
    }
    Run {
        turns: locks.watch_task_turns_for_test() - before,
        elapsed: started.elapsed(),
        stalled,
    }
}

#[tokio::test]
async fn short_holds_do_not_wake_the_watch_task_once_each() {
    let cluster = etcd().await;
    let locks = locker(&cluster, &namespace("watch-turns")).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    locks.session(options.ttl()).await.expect("session");

    // One turn for the first hold, then about one per DEFER of the run (twice that, and
    // a few, as slack for a loaded machine), and one per stalled cycle; before the fix:
    // one per hold (200 or more). A run slow enough to bring the bound to half the holds
    // cannot tell the two apart, and is measured again.
    let bound_for = |run: &Run| {
        4 + 2 * u64::try_from(run.elapsed.as_millis() / 100).unwrap_or(u64::MAX) + run.stalled
    };
    let mut slow = Vec::new();
    let (run, bound) = loop {
        let attempt = u32::try_from(slow.len()).unwrap_or(u32::MAX);
        let run = short_holds(&locks, attempt, &options).await;
        let bound = bound_for(&run);
        if bound < CYCLES / 2 {
            break (run, bound);
        }
        slow.push(run.elapsed);
        assert!(
            slow.len() < 3,
            "every run too slow to tell one turn per 100 ms from one per hold: {slow:?}"
        );
    };
    assert!(
        run.turns <= bound,
        "{} turns of the watch task for {CYCLES} short holds in {:?}, {} of them stalled \
         (bound {bound})",
        run.turns,
        run.elapsed,
        run.stalled
    );

    // A hold after all of them still gets its watch: an operator's delete is seen.
    let guard = locks.lock("after", &options).await.expect("lock");
    delete_and_expect_loss(&cluster, &guard).await;
}
