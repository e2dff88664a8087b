//! One client holding 1,000 locks renews them all with one command per tick, as counted
//! by the server (`INFO commandstats`), not by reading our own code.

use std::time::Duration;

use fencelock::{LockBackend, LockOptions};

use crate::support::{locker, owner_part, prefix, redis};

#[tokio::test]
async fn a_thousand_locks_cost_one_renewal_call_per_tick() {
    let server = redis().await;
    let locks = locker(&server, &prefix("renewal")).await;
    let ttl = Duration::from_millis(900); // a tick every 300 ms
    let options = LockOptions::new().with_ttl(ttl);
    let mut guards = Vec::new();
    for i in 0..1000 {
        guards.push(
            locks
                .lock(&format!("item-{i}"), &options)
                .await
                .expect("lock"),
        );
    }
    assert_eq!(locks.held_locks(), 1000);

    server.reset_stats().await.expect("reset");
    // Four TTLs: every lock would have expired without renewal.
    let window = ttl * 4;
    tokio::time::sleep(window).await;
    let calls = server.command_calls("evalsha").await.expect("stats");

    // About one call per 300 ms tick (12 in the window); one per lock would be 12,000.
    assert!(
        (8..=14).contains(&calls),
        "{calls} renewal calls in {window:?}"
    );
    for guard in &guards {
        assert!(fencelock::LockGuard::is_held(guard));
        let stored = server.get(guard.key()).await.expect("get");
        assert_eq!(owner_part(stored.as_deref()), Some(guard.owner()));
    }
}
