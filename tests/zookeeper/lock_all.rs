//! Several locks at once (`lock_all`): one transaction joins every queue, so the locks
//! share one token, two fleets taking overlapping sets in opposite orders never
//! deadlock and never overlap, and a dropped or refused acquisition leaves no node.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::zookeeper::ZooKeeperLocker;
use fencelock::{FencingToken, LockBackend, LockGuard, LockOptions, ReleaseOutcome};

use crate::support::{admin, await_children, children, locker, namespace, shared, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_locks_share_one_token_and_each_is_held() {
    let cluster = shared();
    let ns = namespace("lock-all");
    let (a, b) = (locker(cluster, &ns).await, locker(cluster, &ns).await);
    let before = a.lock("y", &LockOptions::new()).await.expect("lock y");
    let before_token = before.token();
    let _ = before.release().await;
    let all = a
        .lock_all(&["z", "x", "y", "x"], &LockOptions::new())
        .await
        .expect("lock_all");
    let tokens = all.tokens();
    assert_eq!(
        tokens.iter().map(|(name, _)| *name).collect::<Vec<_>>(),
        ["x", "y", "z"],
        "each name once, in order"
    );
    assert!(
        tokens.iter().all(|(_, token)| *token == all.token()),
        "{tokens:?}"
    );
    assert!(all.token() > before_token);
    for name in ["x", "y", "z"] {
        assert!(
            b.try_lock(name, &LockOptions::new())
                .await
                .expect("try_lock")
                .is_none(),
            "{name} is held"
        );
    }
    let all_token = all.token();
    assert_eq!(
        all.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let after = b.lock("z", &LockOptions::new()).await.expect("lock z");
    assert!(after.token() > all_token);
    let _ = after.release().await;

    // The generic entry point (what `fencelock run` calls) is the one-`multi` kind here
    // too: one token for both (one by one, each would have its own).
    let generic = fencelock::lock_all(&a, &["y", "x"], &LockOptions::new())
        .await
        .expect("fencelock::lock_all");
    let tokens: Vec<FencingToken> = generic.tokens().iter().map(|(_, t)| *t).collect();
    assert_eq!(tokens, [generic.token(), generic.token()]);
    assert!(generic.token() > all_token);
    let _ = generic.release().await;
}

/// Four clients take random sets of eight names (single names among them) in a loop:
/// every wait ends (no deadlock), no two hold one name at once, and each name's tokens
/// grow with its grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_sets_never_deadlock_nor_overlap() {
    const NAMES: [&str; 8] = ["n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7"];
    const RUN: Duration = Duration::from_secs(30);
    let cluster = shared();
    let ns = namespace("lock-all-fleet");
    let held: Arc<HashMap<&str, AtomicBool>> =
        Arc::new(NAMES.iter().map(|n| (*n, AtomicBool::new(false))).collect());
    let last: Arc<Mutex<HashMap<String, FencingToken>>> = Arc::default();
    let grants = Arc::new(AtomicUsize::new(0));
    let mut fleet = Vec::new();
    for client in 0..4u64 {
        let locks = locker(cluster, &ns).await;
        let (held, last, grants) = (held.clone(), last.clone(), grants.clone());
        fleet.push(tokio::spawn(async move {
            let mut seed = client * 7919 + 17;
            let until = tokio::time::Instant::now() + RUN;
            while tokio::time::Instant::now() < until {
                // A small xorshift: reproducible sets, different per client.
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let size = 1 + (seed % 4) as usize;
                let mut set: Vec<&str> = (0..size)
                    .map(|i| NAMES[((seed >> (8 * i)) % 8) as usize])
                    .collect();
                // Opposite orders from odd and even clients (the order must not matter).
                if client % 2 == 1 {
                    set.reverse();
                }
                let options = LockOptions::new().with_wait_timeout(Duration::from_secs(15));
                let guard = locks
                    .lock_all(&set, &options)
                    .await
                    .unwrap_or_else(|err| panic!("client {client} waiting for {set:?}: {err}"));
                for (name, token) in guard.tokens() {
                    assert!(
                        !held[name].swap(true, Ordering::SeqCst),
                        "{name} held twice at once"
                    );
                    let mut last = last.lock().expect("tokens");
                    if let Some(previous) = last.insert(name.to_owned(), token) {
                        assert!(token > previous, "{name}: token {token} after {previous}");
                    }
                }
                tokio::task::yield_now().await;
                for (name, _) in guard.tokens() {
                    held[name].store(false, Ordering::SeqCst);
                }
                grants.fetch_add(1, Ordering::Relaxed);
                let _ = guard.release().await;
            }
        }));
    }
    for client in fleet {
        within(RUN + Duration::from_secs(30), "the fleet", client)
            .await
            .expect("a client failed");
    }
    assert!(
        grants.load(Ordering::Relaxed) > 40,
        "too few grants to prove much"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_or_refused_acquisition_leaves_no_node() {
    let cluster = shared();
    let ns = namespace("lock-all-cancel");
    let admin = admin(cluster).await;
    let (a, b) = (locker(cluster, &ns).await, locker(cluster, &ns).await);
    let holder = a
        .lock("busy", &LockOptions::new())
        .await
        .expect("lock busy");
    assert!(
        b.try_lock_all(&["free", "busy"], &LockOptions::new())
            .await
            .expect("try_lock_all")
            .is_none()
    );
    assert_eq!(
        await_children(&admin, &format!("{ns}/free"), 0).await.len(),
        0
    );
    assert_eq!(
        await_children(&admin, &format!("{ns}/busy"), 1).await.len(),
        1
    );

    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.lock_all(&["free", "busy"], &LockOptions::new()).await }
    });
    // Waiting: its node is in both queues.
    await_children(&admin, &format!("{ns}/busy"), 2).await;
    waiting.abort();
    assert!(waiting.await.is_err_and(|err| err.is_cancelled()));
    assert_eq!(
        await_children(&admin, &format!("{ns}/free"), 0).await.len(),
        0
    );
    assert_eq!(
        await_children(&admin, &format!("{ns}/busy"), 1).await.len(),
        1
    );
    assert_eq!(children(&admin, &format!("{ns}/busy")).await.len(), 1);
    let _ = holder.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_lock_is_losing_the_guard() {
    let cluster = shared();
    let ns = namespace("lock-all-lost");
    let admin = admin(cluster).await;
    let locks: ZooKeeperLocker = locker(cluster, &ns).await;
    let all = locks
        .lock_all(&["p", "q"], &LockOptions::new())
        .await
        .expect("lock_all");
    let q = all.guards()[1].path().to_owned();
    admin
        .delete(&q, None)
        .await
        .expect("an operator deletes q's node");
    let (name, reason) = within(Duration::from_secs(10), "the loss", all.lost_which()).await;
    assert_eq!(
        (name.as_str(), reason),
        ("q", fencelock::LossReason::KeyDeleted)
    );
    assert!(!all.is_held());
    assert_eq!(
        all.release().await.expect("release"),
        ReleaseOutcome::NotHeld
    );
}
