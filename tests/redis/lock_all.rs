//! `lock_all` on Redis (all or none, in one script): clients taking {a, b} and {b, a},
//! random subsets of 8 names, single locks and nested single locks in name order on the
//! same names never deadlock (every wait is bounded by a timeout that must never fire),
//! never hold a name twice at once, and each name's tokens strictly increase; nothing is
//! left behind, not even a waiter's registration.

use std::sync::Arc;
use std::time::Duration;

use fencelock::testkit::{Holders, random_set};
use fencelock::{LockBackend, LockGuard, LockOptions, lock_all};
use tokio::time::Instant;

use crate::support::{direct, locker, prefix, redis, released, within};

const NAMES: [&str; 8] = ["n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7"];

/// What one client does in a loop.
#[derive(Clone, Copy, Debug)]
enum Client {
    /// `lock_all` of these two names, in this order.
    Pair(&'static str, &'static str),
    /// `lock_all` of a random subset of the 8 names.
    Subset,
    /// `lock` of one random name.
    Single,
    /// `lock` of two random names one after the other in name order, the first held while
    /// the second is waited for (the trait's ordered default does this).
    Nested,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_random_sets_and_single_locks_neither_deadlock_nor_overlap() {
    let server = redis().await;
    let prefix = prefix("lock-all");
    let held = Arc::new(Holders::new(&NAMES));
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait_timeout(Duration::from_secs(30));
    let until = Instant::now() + Duration::from_secs(6);
    let clients = [
        Client::Pair("n0", "n1"),
        Client::Pair("n1", "n0"),
        Client::Subset,
        Client::Subset,
        Client::Subset,
        Client::Subset,
        Client::Single,
        Client::Nested,
    ];
    let mut running = tokio::task::JoinSet::new();
    for (number, client) in clients.into_iter().enumerate() {
        let locks = locker(&server, &prefix).await;
        let (held, options) = (held.clone(), options.clone());
        running.spawn(async move {
            let mut seed = number as u64 * 7 + 1;
            let mut cycles = 0u32;
            while Instant::now() < until {
                let names: Vec<&str> = match client {
                    Client::Pair(a, b) => vec![a, b],
                    Client::Subset => random_set(&mut seed, &NAMES),
                    Client::Single => vec![random_set(&mut seed, &NAMES)[0]],
                    Client::Nested => {
                        let mut two = random_set(&mut seed, &NAMES);
                        two.extend(NAMES);
                        two.truncate(2);
                        two.sort_unstable();
                        two.dedup();
                        two
                    }
                };
                match client {
                    Client::Pair(..) | Client::Subset => {
                        let all = lock_all(&locks, &names, &options)
                            .await
                            .unwrap_or_else(|err| panic!("{client:?} {names:?}: {err}"));
                        let tokens = all.tokens();
                        assert_eq!(tokens.len(), names.len());
                        for (name, token) in &tokens {
                            held.enter(name, *token);
                        }
                        assert!(all.is_held());
                        tokio::task::yield_now().await;
                        for (name, _) in &tokens {
                            held.leave(name);
                        }
                        released(all.release().await);
                    }
                    Client::Single | Client::Nested => {
                        let mut guards = Vec::new();
                        for name in &names {
                            let guard = locks
                                .lock(name, &options)
                                .await
                                .unwrap_or_else(|err| panic!("{client:?} {name}: {err}"));
                            held.enter(name, guard.token());
                            guards.push(guard);
                        }
                        tokio::task::yield_now().await;
                        for guard in guards {
                            held.leave(guard.name());
                            released(guard.release().await);
                        }
                    }
                }
                cycles += 1;
            }
            (client, cycles)
        });
    }
    let mut total = 0;
    while let Some(ended) = within(
        Duration::from_secs(60),
        "every client ends",
        running.join_next(),
    )
    .await
    {
        let (client, cycles) = ended.expect("a client");
        assert!(cycles >= 3, "{client:?} ran only {cycles} cycles");
        total += cycles;
    }
    assert!(total >= 40, "only {total} cycles");
    // Nothing left: no lock key, no waiter's registration.
    let mut conn = direct(&server).await;
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    let left: Vec<&String> = left.iter().filter(|k| !k.contains(":token:")).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
