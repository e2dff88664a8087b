//! `lock_all` on etcd: one transaction puts a key in every lock's queue, so every lock of
//! one acquisition carries that transaction's revision as its token. Fleets taking
//! {a, b} and {b, a}, random subsets of 8 names, and single locks on the same names never
//! deadlock (every wait is bounded by a timeout that must never fire) and never overlap,
//! and each name's tokens grow; a dropped or refused acquisition leaves no key; too many
//! names is a typed error.

use std::sync::Arc;
use std::time::Duration;

use fencelock::testkit::{Holders, random_set};
use fencelock::{LockBackend, LockGuard, LockOptions, lock_all, try_lock_all};
use tokio::time::Instant;

use crate::support::{PrefixWatch, etcd, keys, locker, namespace, within};

const NAMES: [&str; 8] = ["n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_random_sets_and_single_locks_neither_deadlock_nor_overlap() {
    let cluster = etcd().await;
    let ns = namespace("lock-all");
    let held = Arc::new(Holders::new(&NAMES));
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait_timeout(Duration::from_secs(20));
    let until = Instant::now() + Duration::from_secs(6);
    let mut fleets = tokio::task::JoinSet::new();
    for client in 0..6u64 {
        let locks = locker(&cluster, &ns).await;
        let (held, options) = (held.clone(), options.clone());
        fleets.spawn(async move {
            let mut seed = client * 7 + 1;
            let mut cycles = 0u32;
            while Instant::now() < until {
                // Clients 0 and 1: {a, b} and {b, a}; 2 to 4: random sets, shuffled;
                // 5: a single lock on a random name.
                let names: Vec<&str> = match client {
                    0 => vec!["n0", "n1"],
                    1 => vec!["n1", "n0"],
                    5 => vec![random_set(&mut seed, &NAMES)[0]],
                    _ => random_set(&mut seed, &NAMES),
                };
                if client == 5 {
                    let one = locks
                        .lock(names[0], &options)
                        .await
                        .expect("no deadlock (a single lock)");
                    held.enter(names[0], one.token());
                    tokio::task::yield_now().await;
                    held.leave(names[0]);
                    crate::support::released(one.release().await);
                } else {
                    let all = lock_all(&locks, &names, &options)
                        .await
                        .expect("no deadlock");
                    let tokens = all.tokens();
                    assert_eq!(tokens.len(), names.len());
                    let shared = tokens[0].1;
                    for (name, token) in &tokens {
                        assert_eq!(*token, shared, "one transaction, one token: {tokens:?}");
                        held.enter(name, *token);
                    }
                    assert!(all.is_held());
                    tokio::task::yield_now().await;
                    for (name, _) in &tokens {
                        held.leave(name);
                    }
                    crate::support::released(all.release().await);
                }
                cycles += 1;
            }
            (client, cycles)
        });
    }
    let mut total = 0;
    while let Some(ended) = within(
        Duration::from_secs(60),
        "every fleet ends",
        fleets.join_next(),
    )
    .await
    {
        let (client, cycles) = ended.expect("a fleet");
        assert!(cycles >= 3, "client {client} ran only {cycles} cycles");
        total += cycles;
    }
    assert!(total >= 40, "only {total} cycles");
    let mut admin = cluster.client().await.expect("admin");
    assert!(keys(&mut admin, &format!("{ns}/")).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_carries_the_one_transactions_revision() {
    let cluster = etcd().await;
    let ns = namespace("lock-all-token");
    let locks = locker(&cluster, &ns).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    // The session first: the acquisition below sends its join and nothing else.
    locks.session(options.ttl()).await.expect("session");
    let before = crate::support::handled(&cluster, "Txn").await;
    let all = locks
        .lock_all(&["c", "a", "b"], &options)
        .await
        .expect("lock_all");
    assert_eq!(
        crate::support::handled(&cluster, "Txn").await,
        before + 1.0,
        "one transaction for three locks"
    );
    let names: Vec<&str> = all.tokens().iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["a", "b", "c"], "in name order");
    let mut admin = cluster.client().await.expect("admin");
    for guard in all.guards() {
        let read = admin.get(guard.key(), None).await.expect("read");
        let kv = read.kvs().first().expect("the key is there");
        assert_eq!(
            u64::try_from(kv.create_revision()).ok(),
            Some(all.token().get())
        );
        assert_eq!(guard.token(), all.token(), "{}", guard.name());
    }
    let first = all.token();
    crate::support::released(all.release().await);
    assert!(keys(&mut admin, &format!("{ns}/")).await.is_empty());

    // Through the generic entry point too (what `fencelock run` calls), later tokens.
    let again = lock_all(&locks, &["b", "a"], &options)
        .await
        .expect("again");
    assert!(again.token() > first);
    let tokens: Vec<_> = again.tokens().iter().map(|(_, t)| *t).collect();
    assert_eq!(tokens, [again.token(), again.token()]);
    crate::support::released(again.release().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_name_stays_fifo_beside_single_locks() {
    let cluster = etcd().await;
    let ns = namespace("lock-all-fifo");
    let (holder, taker, third) = (
        locker(&cluster, &ns).await,
        locker(&cluster, &ns).await,
        locker(&cluster, &ns).await,
    );
    let mut admin = cluster.client().await.expect("admin");
    let mut watch = PrefixWatch::start(&mut admin, &format!("{ns}/")).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    let b = holder.lock("b", &options).await.expect("b");
    watch.next_put().await;

    // {a, b} queues in both (a free, b held), then a single lock of a queues behind it.
    let both = {
        let (taker, options) = (taker.clone(), options.clone());
        tokio::spawn(async move { taker.lock_all(&["a", "b"], &options).await })
    };
    watch.next_put().await;
    watch.next_put().await;
    let single = {
        let (third, options) = (third.clone(), options.clone());
        tokio::spawn(async move { third.lock("a", &options).await })
    };
    watch.next_put().await;
    assert!(!both.is_finished() && !single.is_finished());

    crate::support::released(b.release().await);
    let both = within(Duration::from_secs(5), "{a, b} once b is free", both)
        .await
        .expect("task")
        .expect("lock_all");
    assert!(
        !single.is_finished(),
        "a single lock of a overtook {{a, b}}"
    );
    let token = both.token();
    crate::support::released(both.release().await);
    let single = within(Duration::from_secs(5), "a after {a, b}", single)
        .await
        .expect("task")
        .expect("lock");
    assert!(single.token() > token);
    crate::support::released(single.release().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_names_too_many_names_and_bad_names_are_typed_errors() {
    let cluster = etcd().await;
    let ns = namespace("lock-all-bounds");
    let locks = locker(&cluster, &ns).await;
    let options = LockOptions::new();
    let many: Vec<String> = (0..=fencelock::etcd::MAX_LOCK_ALL)
        .map(|i| format!("n{i}"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    for (names, what) in [
        (&[][..], "no names"),
        (&many[..], "65 names"),
        (&["a", "b/c"][..], "a bad name"),
    ] {
        let err = locks.lock_all(names, &options).await.expect_err(what);
        assert!(err.is_invalid_input(), "{what}: {err}");
        let err = locks.try_lock_all(names, &options).await.expect_err(what);
        assert!(err.is_invalid_input(), "{what}: {err}");
    }
    // The most there may be are taken, in one transaction; a name twice counts once.
    let most = &many[..fencelock::etcd::MAX_LOCK_ALL];
    let all = locks.lock_all(most, &options).await.expect("64 names");
    assert_eq!(all.guards().len(), 64);
    crate::support::released(all.release().await);
    let twice = locks
        .lock_all(&["a", "a"], &options)
        .await
        .expect("a twice");
    assert_eq!(twice.guards().len(), 1);
    crate::support::released(twice.release().await);
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
    // Its keys in a's and b's queues (one transaction), beside b's holder: three keys.
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

    // Timed out while it waits for b (holding a): the same, and a typed timeout.
    let short = LockOptions::new().with_wait_timeout(Duration::from_millis(300));
    let err = lock_all(&taker, &["b", "a"], &short)
        .await
        .map(drop)
        .expect_err("b is held");
    assert!(err.is_wait_timeout(), "{err}");
    within(
        Duration::from_secs(5),
        "only b's holder is left again",
        async {
            loop {
                if keys(&mut admin, &format!("{ns}/")).await == [b.key().to_owned()] {
                    return;
                }
                watch.next().await;
            }
        },
    )
    .await;
    crate::support::released(b.release().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_all_without_renewal_has_one_lease_of_its_own_revoked_after_its_release() {
    let cluster = etcd().await;
    let ns = namespace("lock-all-no-renewal");
    let locks = locker(&cluster, &ns).await;
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(30))
        .with_renewal(false);
    let all = locks
        .lock_all(&["a", "b"], &options)
        .await
        .expect("lock_all");
    let lease = all.guards()[0].lease_id();
    assert_eq!(all.guards()[1].lease_id(), lease, "one lease for both");
    assert!(all.is_held());
    crate::support::released(all.release().await);

    // The lease served these two locks alone: it goes once they are released.
    let mut admin = cluster.client().await.expect("admin");
    within(Duration::from_secs(5), "the lease is revoked", async {
        while admin
            .lease_time_to_live(lease, None)
            .await
            .is_ok_and(|answer| answer.ttl() >= 0)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(keys(&mut admin, &format!("{ns}/")).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_key_is_losing_the_guard() {
    let cluster = etcd().await;
    let ns = namespace("lock-all-lost");
    let locks = locker(&cluster, &ns).await;
    let all = locks
        .lock_all(&["a", "b", "c"], &LockOptions::new())
        .await
        .expect("lock_all");
    let b = all.guards()[1].key().to_owned();
    let mut admin = cluster.client().await.expect("admin");
    admin
        .delete(b.as_str(), None)
        .await
        .expect("operator delete");
    let (name, reason) = within(Duration::from_secs(5), "the loss", all.lost_which()).await;
    assert_eq!(
        (name.as_str(), reason),
        ("b", fencelock::LossReason::KeyDeleted)
    );
    assert!(!all.is_held());
    assert_eq!(
        all.release().await.expect("release"),
        fencelock::ReleaseOutcome::NotHeld
    );
    assert!(keys(&mut admin, &format!("{ns}/")).await.is_empty());
}
