//! Short contended cells on one session, beside a CPU hog: every waiter gets its turn.
//! The benchmark's contended cell once hung for good on etcd 3.5: a waiter missed the one
//! deletion it waited for (it was dispatched between the watch's creation and the
//! waiter's subscription) and the freed key name was re-created behind it. A stall
//! detector fails the test with the queue and the lock's history when no grant happens
//! for 5 s. CI runs this suite on etcd 3.4 and 3.5.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use fencelock::{LockBackend, LockGuard, LockOptions};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::support::{etcd, locker, namespace};

/// Threads that spin until dropped: the preemption that exposed the lost wakeup.
struct CpuHog(Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>);

impl CpuHog {
    fn start(threads: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let handles = (0..threads)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Self(stop, handles)
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        for handle in self.1.drain(..) {
            let _ = handle.join();
        }
    }
}

/// The keys under `prefix` now (name, create revision) and every event since `from`.
async fn dump(client: &mut Client, prefix: &str, from: i64) -> String {
    let now = client
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .expect("read the queue");
    let current = now.header().map_or(0, |h| h.revision());
    let mut out = String::from("queue:\n");
    for kv in now.kvs() {
        out.push_str(&format!(
            "  {} created {}\n",
            String::from_utf8_lossy(kv.key()),
            kv.create_revision()
        ));
    }
    out.push_str("history:\n");
    let options = WatchOptions::new().with_prefix().with_start_revision(from);
    let mut stream = client.watch(prefix, Some(options)).await.expect("watch");
    'read: while let Ok(Some(response)) = stream.message().await {
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            let what = if event.event_type() == EventType::Put {
                "put"
            } else {
                "del"
            };
            out.push_str(&format!(
                "  {} {what} {}\n",
                kv.mod_revision(),
                String::from_utf8_lossy(kv.key())
            ));
            if kv.mod_revision() >= current {
                break 'read;
            }
        }
        if response.header().is_some_and(|h| h.revision() >= current) && !response.created() {
            break;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_contended_cells_on_one_session_never_stall() {
    let cluster = etcd().await;
    let ns = namespace("cells");
    let locks = locker(&cluster, &ns).await;
    let mut client = cluster.client().await.expect("client");
    let _hog = CpuHog::start(2);
    for cell in 0..12 {
        // A fresh name per cell: each starts with no watch open, as the benchmark's did.
        let name = format!("cell-{cell}");
        let prefix = format!("{ns}/{name}/");
        let from = client
            .get("cells-probe", None)
            .await
            .expect("revision")
            .header()
            .map_or(1, |h| h.revision() + 1);
        let (granted, mut grants) = watch::channel(0u64);
        let granted = Arc::new(granted);
        let ends = Instant::now() + Duration::from_millis(300);
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (locks, name, granted) = (locks.clone(), name.clone(), granted.clone());
                tokio::spawn(async move {
                    let options = LockOptions::new().with_wait_timeout(Duration::from_secs(60));
                    while Instant::now() < ends {
                        let guard = locks.lock(&name, &options).await?;
                        granted.send_modify(|n| *n += 1);
                        let released = guard.release().await?;
                        assert_eq!(released, fencelock::ReleaseOutcome::Released);
                    }
                    Ok::<_, fencelock::LockError>(())
                })
            })
            .collect();
        let all = futures_like_join(tasks);
        tokio::pin!(all);
        loop {
            tokio::select! {
                outcome = &mut all => {
                    outcome.expect("every waiter got its turns");
                    break;
                }
                progress = tokio::time::timeout(Duration::from_secs(5), grants.changed()) => {
                    if progress.is_err() {
                        let dump = dump(&mut client, &prefix, from).await;
                        panic!("cell {cell}: no grant for 5 s\n{dump}");
                    }
                }
            }
        }
    }
}

/// Waits for every task, failing on the first error.
async fn futures_like_join(
    tasks: Vec<tokio::task::JoinHandle<Result<(), fencelock::LockError>>>,
) -> Result<(), String> {
    for task in tasks {
        task.await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}
