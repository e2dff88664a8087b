//! A workload the pub/sub tests share: three tasks of one client take turns on one name,
//! each grant counted, so that a test can wait for every task to be granted again after
//! the fault it injects.

use std::sync::Arc;
use std::time::Duration;

use fencelock::redis::RedisLocker;
use fencelock::{LockBackend, LockGuard, LockOptions};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::support::within;

/// Three tasks of one client take turns on one name.
pub const TASKS: usize = 3;

/// Each task locks `job`, holds it 50 ms, releases it and pauses 50 ms (so that a woken
/// waiter can take it), again and again; `grants` counts each task's grants.
pub fn take_turns(locks: &RedisLocker, grants: &Arc<watch::Sender<[u64; TASKS]>>) -> JoinSet<()> {
    let mut tasks = JoinSet::new();
    for task in 0..TASKS {
        let (locks, grants) = (locks.clone(), grants.clone());
        tasks.spawn(async move {
            let options = LockOptions::new().with_ttl(Duration::from_secs(30));
            loop {
                // A restart makes a wait retry, a release fail: neither ends the loop.
                let Ok(guard) = locks.lock("job", &options).await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                grants.send_modify(|grants| grants[task] += 1);
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _ = guard.release().await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
    }
    tasks
}

/// Waits until every task has been granted `more` times after `since`.
pub async fn until_every_task_is_granted(
    grants: &watch::Sender<[u64; TASKS]>,
    since: [u64; TASKS],
    more: u64,
    limit: Duration,
    what: &str,
) {
    let mut seen = grants.subscribe();
    within(limit, what, async {
        seen.wait_for(|now| {
            now.iter()
                .zip(&since)
                .all(|(now, then)| *now >= then + more)
        })
        .await
        .expect("the counts live");
    })
    .await;
}
