//! Group commit: joins and releases of different locks that queue up behind those in
//! flight go out as one transaction (`src/etcd/batch.rs`). Tests of what queues use one
//! request in flight (`with_max_in_flight(1)`), so that which request goes alone and which
//! queue is decided by the order the tasks start in. Each member keeps its own outcome, two
//! requests about one lock are never in one transaction, a member etcd refuses does not
//! fail the others, and a batch whose answer is lost leaves nothing that blocks a lock.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use etcd_client::{GetOptions, Permission};
use fencelock::etcd::{EtcdGuard, EtcdLocker};
use fencelock::{LockBackend, LockError, LockGuard, LockOptions};
use tokio::task::JoinHandle;

use crate::support::{PrefixWatch, TwoPaths, etcd, handled, locker, namespace, within};

fn options() -> LockOptions {
    LockOptions::new()
        .with_ttl(Duration::from_secs(30))
        .with_wait_timeout(Duration::from_secs(10))
}

/// Starts `lock(name)` on `locks` in a task of its own, for each name, in order: the
/// first finds nothing in flight and goes alone, the others queue behind it.
fn lock_all(locks: &EtcdLocker, names: &[String]) -> Vec<JoinHandle<Result<EtcdGuard, LockError>>> {
    names
        .iter()
        .map(|name| {
            let (locks, name) = (locks.clone(), name.clone());
            tokio::spawn(async move { locks.lock(&name, &options()).await })
        })
        .collect()
}

/// The client's session for 30 s locks (one lease per client and TTL: opened before a test
/// counts requests or compares lease ids).
async fn session_of(locks: &EtcdLocker) -> fencelock::etcd::Session {
    locks
        .session(Duration::from_secs(30))
        .await
        .expect("session")
}

/// Every key under `prefix` with its create revision.
async fn create_revisions(client: &mut etcd_client::Client, prefix: &str) -> HashMap<String, i64> {
    client
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .expect("range read")
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.create_revision(),
            )
        })
        .collect()
}

#[tokio::test]
async fn distinct_locks_taken_and_released_together_share_transactions() {
    let cluster = etcd().await;
    let ns = namespace("group-commit");
    let locks = locker(&cluster, &ns).await;
    // The lease is granted once per client: open it before counting.
    session_of(&locks).await;
    let mut admin = cluster.client().await.expect("client");
    let names: Vec<String> = (0..32).map(|i| format!("item-{i}")).collect();

    let writes_before = handled(&cluster, "Txn").await + handled(&cluster, "DeleteRange").await;
    let mut guards = Vec::new();
    for taking in lock_all(&locks, &names) {
        guards.push(taking.await.expect("task").expect("granted"));
    }
    // Each guard's token is its own key's create revision, batched or not.
    let revisions = create_revisions(&mut admin, &format!("{ns}/")).await;
    assert_eq!(revisions.len(), names.len(), "one key per lock");
    for guard in &guards {
        let held: Vec<_> = revisions
            .values()
            .filter(|revision| **revision == guard.token().get() as i64)
            .collect();
        assert!(
            !held.is_empty(),
            "a key with the guard's token as create revision"
        );
    }
    let releasing: Vec<_> = guards
        .into_iter()
        .map(|guard| tokio::spawn(guard.release()))
        .collect();
    for release in releasing {
        crate::support::released(release.await.expect("task"));
    }
    let writes =
        handled(&cluster, "Txn").await + handled(&cluster, "DeleteRange").await - writes_before;

    assert!(
        create_revisions(&mut admin, &format!("{ns}/"))
            .await
            .is_empty(),
        "every key released"
    );
    // One at a time this is 64 writes (a join and a release per lock); batched, the first
    // join and the first release go alone and the rest ride in a few transactions.
    assert!(
        writes <= 16.0,
        "{writes} write requests for 32 locks taken and released together"
    );
}

#[tokio::test]
async fn two_requests_about_one_lock_never_share_a_transaction() {
    let cluster = etcd().await;
    let ns = namespace("group-commit-same");
    let locks = locker(&cluster, &ns).await;
    session_of(&locks).await;
    let mut admin = cluster.client().await.expect("client");
    let mut watch = PrefixWatch::start(&mut admin, &format!("{ns}/x/")).await;
    let holder = locks.lock("x", &options()).await.expect("lock x");
    watch.next_put().await;

    // Eight waiters on "x" and eight other locks, all started at once: they queue behind
    // one another and go out in batches.
    let mut names: Vec<String> = Vec::new();
    for i in 0..8 {
        names.push("x".to_owned());
        names.push(format!("y{i}"));
    }
    let taking = lock_all(&locks, &names);
    for _ in 0..8 {
        within(
            Duration::from_secs(10),
            "the waiters' keys",
            watch.next_put(),
        )
        .await;
    }

    let x = create_revisions(&mut admin, &format!("{ns}/x/")).await;
    let distinct: HashSet<i64> = x.values().copied().collect();
    assert_eq!(x.len(), 9, "the holder and eight waiters: {x:?}");
    assert_eq!(
        distinct.len(),
        9,
        "no two keys of one lock share a revision: {x:?}"
    );
    // The test batched at all: some waiter on "x" shares its revision with another lock.
    let all = create_revisions(&mut admin, &format!("{ns}/")).await;
    let shared = all
        .iter()
        .filter(|(key, _)| !key.starts_with(&format!("{ns}/x/")))
        .any(|(_, revision)| distinct.contains(revision));
    assert!(
        shared,
        "no join of another lock rode with a join of x: {all:?}"
    );

    // Every waiter is granted in turn: a task whose lock is granted releases it at once,
    // whichever order the grants come in.
    crate::support::released(holder.release().await);
    let mut releasing = tokio::task::JoinSet::new();
    for taking in taking {
        releasing.spawn(async move {
            let guard = taking.await.expect("task").expect("granted");
            crate::support::released(guard.release().await);
        });
    }
    while let Some(done) = releasing.join_next().await {
        done.expect("granted and released");
    }
}

#[tokio::test]
async fn a_member_etcd_refuses_does_not_fail_the_others() {
    let cluster = etcd().await;
    let ns = namespace("group-commit-refused");
    let mut admin = cluster.client().await.expect("client");
    admin.user_add("root", "rootpw", None).await.expect("root");
    admin
        .user_grant_role("root", "root")
        .await
        .expect("root role");
    admin.role_add("ok-only").await.expect("role");
    // Reads the whole namespace; writes locks whose names start with "ok", nothing else.
    admin
        .role_grant_permission("ok-only", Permission::read(format!("{ns}/")).with_prefix())
        .await
        .expect("grant read");
    admin
        .role_grant_permission(
            "ok-only",
            Permission::read_write(format!("{ns}/ok")).with_prefix(),
        )
        .await
        .expect("grant");
    admin.user_add("worker", "pw", None).await.expect("user");
    admin
        .user_grant_role("worker", "ok-only")
        .await
        .expect("user role");
    admin.auth_enable().await.expect("auth on");
    let locks = EtcdLocker::connect(
        cluster
            .config(&ns)
            .with_credentials("worker", "pw")
            .with_max_in_flight(1),
    )
    .await
    .expect("connect");
    session_of(&locks).await;

    // "ok-0" goes alone; "no" queues with the rest, so that its refusal is a batch's.
    let mut names = vec!["ok-0".to_owned(), "no".to_owned()];
    names.extend((1..8).map(|i| format!("ok-{i}")));
    let mut guards = Vec::new();
    for (name, taking) in names.iter().zip(lock_all(&locks, &names)) {
        let outcome = taking.await.expect("task");
        if name == "no" {
            match outcome {
                Ok(_) => panic!("\"no\" taken without the right to write it"),
                Err(err) => assert!(err.is_permission_denied(), "{err}"),
            }
        } else {
            guards.push(outcome.unwrap_or_else(|err| panic!("{name}: {err}")));
        }
    }
    assert_eq!(guards.len(), 8);
    for guard in guards {
        crate::support::released(guard.release().await);
    }
}

// One thread: the tasks run in the order they were started, so "lead" goes first.
#[tokio::test]
async fn a_batch_whose_answer_is_lost_leaves_no_key_that_blocks_a_lock() {
    let cluster = etcd().await;
    let ns = namespace("group-commit-lost");
    let paths = TwoPaths::start(&cluster).await;
    let client = EtcdLocker::connect(
        fencelock::etcd::EtcdConfig::new([paths.a.http_url(), paths.b.http_url()])
            .with_namespace(&ns)
            .with_request_timeout(Duration::from_millis(800))
            .with_max_in_flight(1),
    )
    .await
    .expect("connect through path a");
    let first = session_of(&client).await;
    let other = locker(&cluster, &ns).await;
    let mut admin = cluster.client().await.expect("client");
    let mut puts = PrefixWatch::start(&mut admin, &format!("{ns}/m")).await;

    // A slow path: the lone join below is in flight long enough for eight more to queue.
    paths.a.delay(Duration::from_millis(100));
    let names: Vec<String> = std::iter::once("lead".to_owned())
        .chain((0..8).map(|i| format!("m{i}")))
        .collect();
    let mut taking = lock_all(&client, &names).into_iter();
    let lead = taking.next().expect("lead");
    let lead = within(Duration::from_secs(5), "the lone join", lead)
        .await
        .expect("task")
        .expect("lead granted");
    // The batch of eight has just gone out on the slow path: it is applied, and its
    // answer (and every later one on that path) is lost.
    paths.a.hold_answers();
    for (name, member) in names[1..].iter().zip(taking) {
        let outcome = within(Duration::from_secs(10), "a member's answer", member)
            .await
            .expect("task");
        match outcome {
            Ok(_) => panic!("{name} granted on a batch whose answer was lost"),
            Err(err) => assert!(err.is_timeout() || err.is_unavailable(), "{name}: {err}"),
        }
    }
    // The batch was applied: every member's key was put, although no member heard so.
    for _ in 1..names.len() {
        within(Duration::from_secs(5), "the batch's puts", puts.next_put()).await;
    }

    // The path heals: what the batch put is removed, and every lock is free.
    paths.move_to_b();
    // Every member's join may still land: the session that sent them is retired.
    let second = session_of(&client).await;
    assert_ne!(
        first.lease_id(),
        second.lease_id(),
        "the session is retired"
    );
    let wait = options().with_wait_timeout(Duration::from_secs(5));
    for name in &names[1..] {
        let guard = other
            .lock(name, &wait)
            .await
            .unwrap_or_else(|err| panic!("{name} stays blocked: {err}"));
        let left = create_revisions(&mut admin, &format!("{ns}/{name}/")).await;
        assert_eq!(
            left.len(),
            1,
            "only the new holder's key under {name}: {left:?}"
        );
        crate::support::released(guard.release().await);
    }
    crate::support::released(lead.release().await);
}

/// A lone join slowed to `delay` each way, with `name` started behind it: `name` queues.
async fn behind_a_slow_lead(
    test: &str,
    delay: Duration,
) -> (
    fencelock::testkit::EtcdCluster,
    fencelock::testkit::FaultProxy,
    EtcdLocker,
    String,
) {
    let cluster = etcd().await;
    let ns = namespace(test);
    let proxy =
        fencelock::testkit::FaultProxy::start(crate::support::address(&cluster.endpoint(0)))
            .await
            .expect("proxy");
    let client = EtcdLocker::connect(
        fencelock::etcd::EtcdConfig::new([proxy.http_url()])
            .with_namespace(&ns)
            .with_request_timeout(Duration::from_secs(5))
            .with_max_in_flight(1),
    )
    .await
    .expect("connect through the proxy");
    session_of(&client).await;
    proxy.delay(delay);
    (cluster, proxy, client, ns)
}

// One thread: the tasks run in the order they were started, so "lead" goes first.
#[tokio::test]
async fn a_join_dropped_while_queued_was_never_sent_and_retires_nothing() {
    let (cluster, _proxy, client, ns) =
        behind_a_slow_lead("group-commit-withdrawn", Duration::from_millis(150)).await;
    let first = session_of(&client).await;
    let lead = lock_all(&client, &["lead".to_owned()]).remove(0);
    let queued = {
        let client = client.clone();
        tokio::spawn(async move {
            tokio::time::timeout(Duration::from_millis(100), client.lock("q", &options())).await
        })
    };
    assert!(
        queued.await.expect("task").is_err(),
        "the queued call is dropped at 100 ms"
    );
    let lead = lead.await.expect("task").expect("lead granted");

    // Withdrawn unsent: the session is not retired, and no key of "q" was ever written.
    let still = session_of(&client).await;
    assert_eq!(
        first.lease_id(),
        still.lease_id(),
        "a join that was never sent retired the session"
    );
    let mut admin = cluster.client().await.expect("client");
    let end = format!("{ns}/q/~end");
    admin.put(end.as_str(), "", None).await.expect("marker");
    let mut history = admin
        .watch(
            format!("{ns}/q/"),
            Some(
                etcd_client::WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(1),
            ),
        )
        .await
        .expect("watch");
    let mut written = Vec::new();
    'history: while let Some(response) = history.message().await.expect("watch") {
        for event in response.events() {
            let key = event
                .kv()
                .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
                .unwrap_or_default();
            if key == end {
                break 'history;
            }
            written.push(key);
        }
    }
    assert!(written.is_empty(), "keys of q written: {written:?}");
    crate::support::released(lead.release().await);
}

#[tokio::test]
async fn a_request_queued_behind_a_slow_one_goes_alone_after_a_while() {
    // The lone join takes 1.2 s; one queued behind it and batched after it would take
    // 2.4 s, where alone after the queue's patience (250 ms) it takes about 1.45 s.
    let (_cluster, _proxy, client, _ns) =
        behind_a_slow_lead("group-commit-patience", Duration::from_millis(600)).await;
    let mut taking = lock_all(&client, &["lead".to_owned(), "q".to_owned()]).into_iter();
    let (lead, queued) = (taking.next().expect("lead"), taking.next().expect("queued"));
    let started = tokio::time::Instant::now();
    let queued = queued.await.expect("task").expect("q granted");
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(2000),
        "q waited {took:?} behind the slow request"
    );
    let lead = lead.await.expect("task").expect("lead granted");
    crate::support::released(queued.release().await);
    crate::support::released(lead.release().await);
}
