//! The leader of a 3-member cluster is partitioned away while a client that reaches the
//! cluster only through it holds a lock: the holder's guard reports the loss before anyone
//! else is granted the lock, the next holder's token is larger, and the fence refuses the
//! old holder's write.

use std::time::Duration;

use fencelock::postgres::Fence;
use fencelock::testkit::{ContainerEtcdCluster, PostgresServer};
use fencelock::{LockBackend, LockGuard, LockOptions};

use super::locker_via;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_takes_its_holder_down_and_the_fence_refuses_it() {
    let cluster = ContainerEtcdCluster::start(3).await.expect("cluster");
    let postgres = PostgresServer::start().await.expect("postgres");
    let leader = cluster.leader().await.expect("leader");
    let others: Vec<usize> = (0..3).filter(|i| *i != leader).collect();

    let a = locker_via(&cluster, &[leader]).await;
    let b = locker_via(&cluster, &others).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(2));
    let forever = options.clone().wait_forever();
    let held = a.lock("partition", &options).await.expect("a locks");

    cluster.partition(leader).expect("partition");
    // A waiter on a follower can lose its own session meanwhile: its keep-alives are
    // forwarded to the partitioned leader and wait there until the follower gives up.
    // It asks again, as an application would; what must never happen is a grant
    // before the holder knows it lost.
    let waiting = async {
        loop {
            match b.lock("partition", &forever).await {
                Err(err) if err.is_lost() => continue,
                outcome => return outcome,
            }
        }
    };
    tokio::pin!(waiting);
    // The holder must learn of the loss before the lock can go to anyone else.
    let reason = tokio::select! {
        biased;
        reason = held.lost() => reason,
        granted = &mut waiting => panic!("granted to b ({granted:?}) before a knew it lost"),
    };
    let next = waiting.await.expect("b locks after the lease ends");
    assert!(
        next.token() > held.token(),
        "{} then {}",
        held.token(),
        next.token()
    );
    assert!(!held.is_held(), "lost for {reason:?} yet still held");

    let mut storage = postgres.connect("postgres").await.expect("postgres client");
    let fence = Fence::new();
    fence.ensure_schema(&storage).await.expect("schema");
    fence
        .begin(&mut storage, "partition", next.token())
        .await
        .expect("the new holder writes")
        .commit()
        .await
        .expect("commit");
    let stale = fence.begin(&mut storage, "partition", held.token()).await;
    assert!(
        stale.as_ref().is_err_and(|e| e.is_stale()),
        "the old holder's write was not refused: {:?}",
        stale.map(|_| ())
    );

    cluster.heal(leader).expect("heal");
    assert_eq!(
        next.release().await.expect("release"),
        fencelock::ReleaseOutcome::Released
    );
}
