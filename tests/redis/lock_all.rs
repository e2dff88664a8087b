//! `fencelock::lock_all` on Redis: two clients taking {a, b} and {b, a} in a loop never
//! deadlock and never overlap; each lock's tokens grow.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fencelock::{LockGuard, LockOptions, lock_all};
use tokio::time::Instant;

use crate::support::{locker, prefix, redis, released, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_neither_deadlock_nor_overlap() {
    let server = redis().await;
    let prefix = prefix("lock-all");
    let held: Arc<HashMap<&str, AtomicBool>> = Arc::new(
        ["a", "b"]
            .iter()
            .map(|n| (*n, AtomicBool::new(false)))
            .collect(),
    );
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(5))
        .with_wait_timeout(Duration::from_secs(20));
    let until = Instant::now() + Duration::from_secs(3);
    let mut clients = tokio::task::JoinSet::new();
    for order in [["a", "b"], ["b", "a"]] {
        let locks = locker(&server, &prefix).await;
        let (held, options) = (held.clone(), options.clone());
        clients.spawn(async move {
            let mut tokens: HashMap<String, u64> = HashMap::new();
            let mut cycles = 0;
            while Instant::now() < until {
                let both = lock_all(&locks, &order, &options)
                    .await
                    .expect("no deadlock");
                for (name, token) in both.tokens() {
                    let previous = tokens.insert(name.to_owned(), token.get()).unwrap_or(0);
                    assert!(token.get() > previous, "{name}: {token} after {previous}");
                    assert!(
                        !held[name].swap(true, Ordering::SeqCst),
                        "{name} held twice"
                    );
                }
                tokio::task::yield_now().await;
                for (name, _) in both.tokens() {
                    held[name].store(false, Ordering::SeqCst);
                }
                released(both.release().await);
                cycles += 1;
            }
            cycles
        });
    }
    let mut total = 0;
    while let Some(cycles) = within(
        Duration::from_secs(60),
        "both clients end",
        clients.join_next(),
    )
    .await
    {
        total += cycles.expect("a client");
    }
    assert!(total >= 10, "only {total} cycles");
}
