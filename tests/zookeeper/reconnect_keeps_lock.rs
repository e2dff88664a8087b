//! A holder whose connection drops and comes back within the session timeout keeps its
//! lock: session state events (disconnected, reconnected) do not restart the heartbeat's
//! schedule, a heartbeat goes out as soon as the session is reconnected, and its answer
//! moves the local deadline on from a heartbeat answered on the *old* connection (a
//! reconnection revalidates the session on the leader: `src/zookeeper/heartbeat.rs`).
//! (With heartbeats every third of the timeout, restarting the schedule on every state
//! event pushed the first heartbeat after the reconnection past the local deadline: a
//! false loss this test caught. Heartbeats now go every sixth of the timeout, which leaves
//! that mistake room enough; the test keeps the lock's survival of a reconnection.)

use std::time::Duration;

use fencelock::testkit::FaultProxy;
use fencelock::zookeeper::ZooKeeperLocker;
use fencelock::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};
use tokio::time::{Instant, sleep_until};

use crate::support::{namespace, shared};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_and_regained_within_the_timeout_keeps_the_lock() {
    let cluster = shared();
    let ns = namespace("reconnect");
    let proxy = FaultProxy::start(cluster.address(0).parse().expect("address"))
        .await
        .expect("proxy");
    let config = cluster.config(&ns).with_hosts(proxy.address().to_string());
    let locker = ZooKeeperLocker::connect(config).await.expect("connect");
    // The session timeout T: heartbeats every T/6 from the session's opening, an answer
    // proving the heartbeat answered 0.3 T or more before it was sent (deadline: that
    // one's send time + T).
    let t = Duration::from_secs(9);
    let options = LockOptions::new().with_ttl(t);
    let before = Instant::now();
    let guard = locker.lock("res", &options).await.expect("lock");
    // The session opened just after `before`: heartbeats go out at about 0, T/6, T/3 and
    // T/2 after it.
    let beat = before + t / 3;

    // The connection breaks at 0.63 T (the deadline then: about T/6 + T) ...
    sleep_until(beat + t * 3 / 10).await;
    proxy.sever();
    // ... and the client's reconnection hangs (its connect requests held) until about
    // 0.88 T after the session opened, the session still alive on the server: 0.25 T
    // (2.25 s) after the cut and 0.28 T before the deadline, so that a loaded machine's
    // scheduling delays do not move it past the deadline. (The client library gives up
    // on a connection that does not answer within 0.4 T and connects again; the attempt
    // in flight then goes through.) The heartbeat sent on reconnection proves the one of
    // T/2 (answered on the old connection), and moves the deadline to about 1.5 T.
    proxy.hold_new_connections();
    sleep_until(beat + t * 55 / 100).await;
    proxy.resume();

    // Without that heartbeat's answer, the guard would report the lock lost at about
    // 1.17 T.
    let lost = tokio::time::timeout(t, guard.lost()).await;
    assert!(
        lost.is_err(),
        "the guard reported a loss ({:?}) although the session survived",
        lost.ok()
    );
    assert!(guard.is_held(), "the guard no longer holds the lock");
    assert_eq!(
        guard.release().await.expect("release answers"),
        ReleaseOutcome::Released,
        "the session and its lock node survived the reconnection"
    );
}
