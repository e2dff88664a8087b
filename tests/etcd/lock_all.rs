//! `fencelock::lock_all` on etcd: several locks taken in name order, whatever order they
//! are asked in. Two fleets taking {a, b} and {b, a} (and random subsets of 8 names)
//! never deadlock and never overlap, each lock's tokens grow; a dropped or refused
//! acquisition leaves no key.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions, lock_all, try_lock_all};
use tokio::time::Instant;

use crate::support::{PrefixWatch, etcd, keys, locker, namespace, within};

const NAMES: [&str; 8] = ["n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_and_random_sets_neither_deadlock_nor_overlap() {
    let cluster = etcd().await;
    let ns = namespace("lock-all");
    let held: Arc<HashMap<&str, AtomicBool>> =
        Arc::new(NAMES.iter().map(|n| (*n, AtomicBool::new(false))).collect());
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait_timeout(Duration::from_secs(20));
    let until = Instant::now() + Duration::from_secs(5);
    let mut fleets = tokio::task::JoinSet::new();
    for client in 0..4u64 {
        let locks = locker(&cluster, &ns).await;
        let (held, options) = (held.clone(), options.clone());
        fleets.spawn(async move {
            let mut seed = client * 7 + 1;
            let mut tokens: HashMap<String, u64> = HashMap::new();
            let mut cycles = 0;
            while Instant::now() < until {
                // Clients 0 and 1: {a, b} and {b, a}; 2 and 3: random sets, shuffled.
                let names: Vec<&str> = match client {
                    0 => vec!["n0", "n1"],
                    1 => vec!["n1", "n0"],
                    _ => {
                        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                        let mut set: Vec<&str> = NAMES
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| (seed >> (i + 20)) & 1 == 1)
                            .map(|(_, n)| *n)
                            .collect();
                        if set.is_empty() {
                            set.push("n3");
                        }
                        if seed & 1 == 1 {
                            set.reverse();
                        }
                        set
                    }
                };
                let both = lock_all(&locks, &names, &options)
                    .await
                    .expect("no deadlock");
                for (name, token) in both.tokens() {
                    let previous = tokens.insert(name.to_owned(), token.get()).unwrap_or(0);
                    assert!(token.get() > previous, "{name}: {token} after {previous}");
                    assert!(
                        !held[name].swap(true, Ordering::SeqCst),
                        "{name} held twice at once"
                    );
                }
                tokio::task::yield_now().await;
                for (name, _) in both.tokens() {
                    held[name].store(false, Ordering::SeqCst);
                }
                crate::support::released(both.release().await);
                cycles += 1;
            }
            cycles
        });
    }
    let mut total = 0;
    while let Some(cycles) = within(
        Duration::from_secs(60),
        "every fleet ends",
        fleets.join_next(),
    )
    .await
    {
        total += cycles.expect("a fleet");
    }
    assert!(total >= 20, "only {total} cycles");
    let mut admin = cluster.client().await.expect("admin");
    assert!(keys(&mut admin, &format!("{ns}/")).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_or_refused_lock_all_leaves_no_key() {
    let cluster = etcd().await;
    let ns = namespace("lock-all-cancel");
    let holder = locker(&cluster, &ns).await;
    let taker = locker(&cluster, &ns).await;
    let mut admin = cluster.client().await.expect("admin");
    let mut watch = PrefixWatch::start(&mut admin, &format!("{ns}/")).await;
    let options = LockOptions::new();
    let b = holder.lock("b", &options).await.expect("b");
    watch.next_put().await;

    // Refused: a is taken, b is not free, a is given back.
    let tried = try_lock_all(&taker, &["b", "a"], &options)
        .await
        .expect("try");
    assert!(tried.is_none());

    // Dropped while it waits for b (holding a): a is released, its wait left.
    let waiting = {
        let taker = taker.clone();
        tokio::spawn(async move {
            lock_all(&taker, &["a", "b"], &LockOptions::new())
                .await
                .map(drop)
        })
    };
    // a's key, then its key in b's queue: three keys in all.
    within(
        Duration::from_secs(5),
        "the wait holds a and queues for b",
        async {
            while keys(&mut admin, &format!("{ns}/")).await.len() < 3 {
                watch.next().await;
            }
        },
    )
    .await;
    waiting.abort();
    let _ = waiting.await;
    within(Duration::from_secs(5), "only b's holder is left", async {
        loop {
            if keys(&mut admin, &format!("{ns}/")).await == [b.key().to_owned()] {
                return;
            }
            watch.next().await;
        }
    })
    .await;
    crate::support::released(b.release().await);
}
