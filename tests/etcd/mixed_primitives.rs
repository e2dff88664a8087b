//! One name used by two primitives never breaks either holder's promise: a lock holder is
//! alone, readers share only with readers, a semaphore has at most N holders.

use std::time::Duration;

use fencelock::etcd::{EtcdGuard, EtcdLocker};
use fencelock::{LockBackend, LockOptions};

use crate::support::{etcd, locker, namespace};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Primitive {
    Mutex,
    Semaphore,
    Reader,
    Writer,
    Election,
}

const ALL: [Primitive; 5] = [
    Primitive::Mutex,
    Primitive::Semaphore,
    Primitive::Reader,
    Primitive::Writer,
    Primitive::Election,
];

/// Takes `primitive` on `name` if it can be had now; `None` if someone is in the way.
/// An election has no `try_`: a campaign that is not elected within a short wait counts
/// as refused.
async fn try_take(locks: &EtcdLocker, primitive: Primitive, name: &str) -> Option<Holding> {
    let options = LockOptions::new();
    let taken = match primitive {
        Primitive::Mutex => locks.try_lock(name, &options).await,
        Primitive::Semaphore => {
            locks
                .semaphore(name, 2)
                .expect("semaphore")
                .try_acquire(&options)
                .await
        }
        Primitive::Reader => locks.rwlock(name).expect("rwlock").try_read(&options).await,
        Primitive::Writer => {
            locks
                .rwlock(name)
                .expect("rwlock")
                .try_write(&options)
                .await
        }
        Primitive::Election => {
            let short = options.with_wait_timeout(Duration::from_millis(300));
            match locks
                .election(name)
                .expect("election")
                .campaign("candidate", &short)
                .await
            {
                Ok(leadership) => return Some(Holding::Leader(leadership)),
                Err(err) if err.is_wait_timeout() => return None,
                Err(err) => panic!("campaign: {err}"),
            }
        }
    };
    taken
        .unwrap_or_else(|err| panic!("{primitive:?}: {err}"))
        .map(Holding::Guard)
}

#[allow(dead_code)] // held for their drop
enum Holding {
    Guard(EtcdGuard),
    Leader(fencelock::etcd::Leadership),
}

/// Which second holder may join a first one on the same name.
fn may_share(first: Primitive, second: Primitive) -> bool {
    matches!(
        (first, second),
        (Primitive::Reader, Primitive::Reader) | (Primitive::Semaphore, Primitive::Semaphore)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pair_of_primitives_on_one_name_keeps_both_promises() {
    let cluster = etcd().await;
    let ns = namespace("mixed");
    let a = locker(&cluster, &ns).await;
    let b = locker(&cluster, &ns).await;
    let mut wrong = Vec::new();
    for (i, first) in ALL.into_iter().enumerate() {
        for (j, second) in ALL.into_iter().enumerate() {
            let name = format!("shared-{i}-{j}");
            let held = try_take(&a, first, &name)
                .await
                .unwrap_or_else(|| panic!("{first:?} on a free name"));
            let joined = try_take(&b, second, &name).await;
            if joined.is_some() != may_share(first, second) {
                wrong.push(format!(
                    "{second:?} while {first:?} holds: {}",
                    if joined.is_some() { "held" } else { "refused" }
                ));
            }
            drop(joined);
            drop(held);
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[tokio::test]
async fn a_semaphore_with_another_permit_count_does_not_share() {
    let cluster = etcd().await;
    let ns = namespace("mixed-permits");
    let a = locker(&cluster, &ns).await;
    let b = locker(&cluster, &ns).await;
    let options = LockOptions::new();
    let two = a.semaphore("pool", 2).expect("semaphore");
    let three = b.semaphore("pool", 3).expect("semaphore");
    let held = two.try_acquire(&options).await.expect("try").expect("free");
    // Two holders of a 3-permit semaphore beside one of a 2-permit one would be three
    // holders where the first client allows two.
    assert!(three.try_acquire(&options).await.expect("try").is_none());
    drop(held);
}

#[tokio::test]
async fn election_values_that_look_like_markers_are_refused() {
    let cluster = etcd().await;
    let ns = namespace("mixed-values");
    let a = locker(&cluster, &ns).await;
    let err = a
        .election("leader")
        .expect("election")
        .campaign("fencelock:read", &LockOptions::new())
        .await
        .expect_err("reserved value");
    assert!(err.is_invalid_input(), "{err}");
}

#[tokio::test]
async fn a_lock_held_through_etcds_lock_rpc_excludes_every_primitive() {
    let cluster = etcd().await;
    let ns = namespace("mixed-go");
    let a = locker(&cluster, &ns).await;
    let mut client = cluster.client().await.expect("client");
    // etcd's Lock RPC runs Go's concurrency.Mutex on the server: key `<prefix>/<lease>`,
    // empty value, the same queue as ours.
    let lease = client.lease_grant(10, None).await.expect("lease").id();
    let options = etcd_client::LockOptions::new().with_lease(lease);
    client
        .lock(format!("{ns}/shared"), Some(options))
        .await
        .expect("lock through the Lock RPC");
    for primitive in ALL {
        assert!(
            try_take(&a, primitive, "shared").await.is_none(),
            "{primitive:?} taken beside a Go lock"
        );
    }
    client.lease_revoke(lease).await.expect("revoke");
}
