//! `fencelock run --backend redis --lock a --lock b`: every lock taken together (all or
//! none, in one script), each with its own token in `FENCELOCK_TOKENS`, the smallest in
//! `FENCELOCK_TOKEN`. Runs in opposite orders at once never deadlock and never overlap,
//! each lock's tokens increase, and nothing is left held.

use std::collections::HashMap;

use fencelock::redis::RedisLocker;
use fencelock::testkit::RedisServer;
use fencelock::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};

use crate::run_redis::fencelock_on;
use crate::support::{assert_one_at_a_time, run_in_opposite_orders};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_several_locks_are_taken_together_each_with_its_token() {
    let redis = RedisServer::start().await.expect("redis");
    let ns = "cli-redis-several";
    let locks = RedisLocker::connect(redis.config(ns))
        .await
        .expect("connect");
    // `a` has been granted three times before: its tokens differ from `b`'s.
    for _ in 0..3 {
        let guard = locks.lock("a", &LockOptions::new()).await.expect("a");
        assert_eq!(
            guard.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("log");
    let sections = dir.path().join("sections");
    let script = format!(
        "echo start $FENCELOCK_TOKEN >> {sections}; \
         echo \"$FENCELOCK_LOCK $FENCELOCK_TOKEN $FENCELOCK_TOKENS $FENCELOCK_KEY\" >> {log}; \
         sleep 0.3; echo end $FENCELOCK_TOKEN >> {sections}",
        log = log.display(),
        sections = sections.display()
    );
    run_in_opposite_orders(|order| {
        let mut command = fencelock_on("redis", &[redis.url()], ns);
        command.args([
            "--lock", order[0], "--lock", order[1], "--ttl", "4s", "--", "sh", "-c", &script,
        ]);
        command
    })
    .await;

    let text = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    let mut each: HashMap<String, Vec<u64>> = HashMap::new();
    for line in &lines {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.len(), 4, "{line}");
        assert!(
            fields[0] == "a,b" || fields[0] == "b,a",
            "FENCELOCK_LOCK names both: {line}"
        );
        let tokens: HashMap<String, u64> = fields[2]
            .split(',')
            .map(|pair| {
                let (name, token) = pair.split_once('=').expect("name=token");
                (name.to_owned(), token.parse().expect("a token"))
            })
            .collect();
        assert_eq!(tokens.len(), 2, "{line}");
        assert!(tokens["a"] > tokens["b"], "each its own counter: {line}");
        let smallest: u64 = fields[1].parse().expect("FENCELOCK_TOKEN");
        assert_eq!(
            smallest, tokens["b"],
            "FENCELOCK_TOKEN is the smallest: {line}"
        );
        for (name, token) in tokens {
            each.entry(name).or_default().push(token);
        }
        let mut keys: Vec<&str> = fields[3].split(',').collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [format!("{ns}:lock:a"), format!("{ns}:lock:b")],
            "{line}"
        );
    }
    // In grant order, each lock's counter moved by one per grant: an all-or-none attempt
    // that is refused draws no token (taken one by one, a waiter's refused attempts
    // would).
    assert_eq!(each["a"], [4, 5, 6, 7], "{lines:?}");
    assert_eq!(each["b"], [1, 2, 3, 4], "{lines:?}");
    let sections = std::fs::read_to_string(&sections).expect("sections");
    assert_one_at_a_time(&sections, 4, "run --backend redis --lock a --lock b");
    // Nothing left behind: both locks are free.
    let both = locks
        .try_lock_all(&["a", "b"], &LockOptions::new())
        .await
        .expect("try")
        .expect("both free");
    assert_eq!(
        both.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}
