//! What `lock_all` on Redis takes: each name once, in any order given, 1 to
//! `MAX_LOCK_ALL` of them; anything else is a typed error that writes nothing.

use std::time::Duration;

use fencelock::redis::MAX_LOCK_ALL;
use fencelock::{LockBackend, LockError, LockGuard, LockOptions, try_lock_all};

use crate::support::{direct, locker, prefix, redis, released};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_taken_once_each_within_the_bound() {
    let server = redis().await;
    let prefix = prefix("lock-all-bounds");
    let locks = locker(&server, &prefix).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));

    // Empty, too many, an invalid name: typed errors, before anything is written.
    let none: [&str; 0] = [];
    let err = locks.lock_all(&none, &options).await.expect_err("no names");
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err}");
    let names: Vec<String> = (0..=MAX_LOCK_ALL).map(|i| format!("n{i:03}")).collect();
    let too_many: Vec<&str> = names.iter().map(String::as_str).collect();
    let err = locks
        .lock_all(&too_many, &options)
        .await
        .expect_err("too many");
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err}");
    let err = try_lock_all(&locks, &["fine", "not/fine"], &options)
        .await
        .expect_err("a bad name");
    assert!(matches!(err, LockError::InvalidName { .. }), "{err}");
    let err = locks
        .lock_all(&["a"], &options.clone().with_ttl(Duration::from_millis(10)))
        .await
        .expect_err("a tiny ttl");
    assert!(err.is_invalid_input(), "{err}");
    let mut conn = direct(&server).await;
    let written: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    assert!(written.is_empty(), "{written:?}");

    // Duplicates are taken once, in name order.
    let twice = locks
        .lock_all(&["b", "a", "b"], &options)
        .await
        .expect("duplicates");
    let names: Vec<&str> = twice.tokens().iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["a", "b"]);
    released(twice.release().await);

    // The most there may be: one script for all of them.
    let most = &too_many[..MAX_LOCK_ALL];
    let all = locks.lock_all(most, &options).await.expect("the most");
    assert_eq!(all.guards().len(), MAX_LOCK_ALL);
    assert!(all.is_held());
    released(all.release().await);
}
