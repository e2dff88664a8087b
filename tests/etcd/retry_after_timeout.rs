//! A request that timed out is retried once; that retry must ride out a member that is
//! unreachable just then, as a first attempt does. This is what a leader's death does to
//! a join: a follower forwarded the join to the leader, which died, so it is never
//! answered (a timeout); its retry is balanced to the dead member's port and refused, or
//! sent on a connection that breaks, and only a later attempt reaches a live member.
//! (Seen as 3 failures in 200 runs of `leader_failover`: the waiter's `lock()` ended with
//! "tcp connect error" although a new leader had been elected seconds before.) Here the
//! retry reaches the path that kept the join and breaks there, with the other path
//! refusing until then: over tonic's channel it goes on the open connection, is kept
//! and its connection broken (a reset: the retry's fate is unknown too); over
//! fencelock's own transport, which leaves a connection a request timed out on, on a new
//! connection that hangs until it is broken (never sent). Both transports.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{TwoPaths, etcd, keys, namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_retried_after_a_timeout_rides_out_a_broken_connection() {
    rides_out_a_broken_connection(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tonic_a_join_retried_after_a_timeout_rides_out_a_broken_connection() {
    rides_out_a_broken_connection(false).await;
}

/// `own`: fencelock's own transport for the join, or tonic's channel.
async fn rides_out_a_broken_connection(own: bool) {
    let cluster = etcd().await;
    let ns = namespace("retry-after-timeout");
    let paths = TwoPaths::start(&cluster).await;
    // Long enough that the test's own steps between the timeout and the retry's end are
    // never the slow part on a loaded machine.
    let request_timeout = Duration::from_secs(2);
    let client = paths.locker_with(&ns, request_timeout, own).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    // The session's lease, so that the lock below sends nothing but its join.
    let warm = client.lock("warm", &options).await.expect("lock warm");
    crate::support::released(warm.release().await);

    // Path a keeps every request: the join gets no answer and times out, and so does
    // its one retry, unless something else happens to it.
    paths.a.hold_requests();
    let connections = paths.a.connections_accepted();
    let lock = client.lock("x", &options);
    tokio::pin!(lock);
    let retried = async {
        // The join is kept; after its timeout an attempt of its retry reaches path a
        // again (an attempt sent to path b, which refuses, fails at once and is not
        // kept): tonic's channel sends it on its open connection, where it is kept too;
        // fencelock's own transport leaves a connection a request timed out on and
        // opens a new one, which hangs (new connections do while requests are kept).
        if own {
            paths.a.requests_held(1).await;
            paths.a.accepted(connections + 1).await;
        } else {
            paths.a.requests_held(2).await;
        }
        // The retry's connection breaks (a member that died), and path b opens: the
        // next attempt that reaches a live member gets the lock.
        paths.move_to_b();
    };
    let guard = within(Duration::from_secs(20), "the lock call", async {
        tokio::select! {
            biased;
            outcome = &mut lock => panic!("answered before its retry broke: {outcome:?}"),
            () = retried => {}
        }
        lock.await
    })
    .await
    .expect("the retry after a timeout rides out a broken connection");
    assert!(guard.is_held());

    // The join kept on a is never delivered; the one that got through is the only key.
    let mut etcd_client = cluster.client().await.expect("client");
    let left = keys(&mut etcd_client, &format!("{ns}/x/")).await;
    assert_eq!(left, vec![guard.key().to_owned()]);
    crate::support::released(guard.release().await);
}
