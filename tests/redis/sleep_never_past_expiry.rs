//! A waiter without a release message never sleeps past the expiry of the lock in its
//! way: a sleep bounded by the holder's remaining TTL is jittered downward (80-100 % of
//! it), so a holder that was forgotten (neither renewed nor released) is followed right
//! after its key expires. Before, the jitter stretched that sleep by up to 20 %: a 5 s
//! TTL let the waiter in anywhere up to 6 s.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions};
use tokio::time::Instant;

use crate::support::{direct, prefix, redis, released, sleepy_locker};

/// How long the forgotten holders' keys live.
const TTL: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_granted_right_after_a_forgotten_holder_expires() {
    let server = redis().await;
    let prefix = prefix("sleep-expiry");
    // Waiters sleep a minute between attempts without a message.
    let locks = sleepy_locker(&server, &prefix).await;
    // Four locks, each held by someone who forgot it: the key alone, with its TTL (no
    // renewal, no release, so no message).
    let names = ["job0", "job1", "job2", "job3"];
    let mut conn = direct(&server).await;
    let mut set = redis::pipe();
    for name in names {
        set.cmd("SET")
            .arg(format!("{prefix}:lock:{name}"))
            .arg("forgotten")
            .arg("PX")
            .arg(u64::try_from(TTL.as_millis()).expect("ms"))
            .ignore();
    }
    set.query_async::<()>(&mut conn).await.expect("SET");
    // The keys expire no sooner than TTL from now (they were set before this).
    let set_at = Instant::now();
    let waits = names.map(|name| {
        let locks = locks.clone();
        tokio::spawn(async move {
            let guard = locks
                .lock(name, &LockOptions::new().with_ttl(Duration::from_secs(10)))
                .await
                .expect("granted");
            let at = set_at.elapsed();
            released(guard.release().await);
            at
        })
    });
    for (name, wait) in names.iter().zip(waits) {
        let at = wait.await.expect("waiter");
        eprintln!("{name} granted {at:?} after the SET");
        assert!(
            at >= TTL - Duration::from_millis(50),
            "{name} granted at {at:?}, before the expiry"
        );
        assert!(
            at <= TTL + Duration::from_millis(300),
            "{name} granted at {at:?}: its waiter slept past the holder's expiry"
        );
    }
}
