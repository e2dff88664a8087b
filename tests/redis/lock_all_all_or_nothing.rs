//! `lock_all` on Redis takes every lock or none: with one lock of the set held by another
//! client, the others are left exactly as they were (no key, no counter drawn); granted,
//! every lock holds the one owner value (and holder record), a TTL and a token of its own
//! counter, and each is an ordinary guard (renewed, released by compare-and-delete).

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions, try_lock_all};
use redis::aio::MultiplexedConnection;

use crate::support::{direct, exists, locker, owner_part, prefix, redis, released};

async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .expect("GET")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_leaves_the_others_untouched() {
    let server = redis().await;
    let prefix = prefix("all-or-nothing");
    let holder = locker(&server, &prefix).await;
    let taker = locker(&server, &prefix).await;
    let mut conn = direct(&server).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    // `a` has been taken once before: its counter stands at 1.
    released(taker.lock("a", &options).await.expect("a").release().await);
    let b = holder.lock("b", &options).await.expect("b");

    for order in [["a", "b"], ["b", "a"]] {
        let refused = try_lock_all(&taker, &order, &options).await.expect("try");
        assert!(refused.is_none(), "b is held");
        assert!(!exists(&mut conn, &format!("{prefix}:lock:a")).await);
        assert_eq!(
            get(&mut conn, &format!("{prefix}:token:a"))
                .await
                .as_deref(),
            Some("1"),
            "no token drawn for a"
        );
    }
    // A wait that runs out takes nothing either.
    let timed_out = taker
        .lock_all(
            &["a", "b"],
            &options
                .clone()
                .with_wait_timeout(Duration::from_millis(300)),
        )
        .await;
    assert!(
        matches!(&timed_out, Err(err) if err.is_wait_timeout()),
        "{timed_out:?}"
    );
    assert!(!exists(&mut conn, &format!("{prefix}:lock:a")).await);
    assert_eq!(
        get(&mut conn, &format!("{prefix}:token:a"))
            .await
            .as_deref(),
        Some("1")
    );
    assert_eq!(
        owner_part(get(&mut conn, &format!("{prefix}:lock:b")).await.as_deref()),
        Some(b.owner()),
        "b is still its holder's"
    );
    released(b.release().await);

    // Free now: all of them, at once, each with its own counter's next token.
    let both = try_lock_all(&taker, &["b", "a"], &options)
        .await
        .expect("try")
        .expect("both free");
    let tokens: Vec<(String, u64)> = both
        .tokens()
        .into_iter()
        .map(|(name, token)| (name.to_owned(), token.get()))
        .collect();
    assert_eq!(tokens, [("a".to_owned(), 2), ("b".to_owned(), 2)]);
    assert_eq!(both.token().get(), 2, "the smallest");
    assert_eq!(both.name(), "a,b");
    let owner = both.guards()[0].owner().to_owned();
    for guard in both.guards() {
        assert_eq!(guard.owner(), owner, "one owner value for every lock");
        let stored = get(&mut conn, guard.key()).await;
        assert_eq!(owner_part(stored.as_deref()), Some(owner.as_str()));
        assert!(
            stored
                .as_deref()
                .is_some_and(|v| v.contains("fencelock-holder/1")),
            "the holder record: {stored:?}"
        );
        let pttl: i64 = redis::cmd("PTTL")
            .arg(guard.key())
            .query_async(&mut conn)
            .await
            .expect("PTTL");
        assert!(pttl > 20_000 && pttl <= 30_000, "PTTL {pttl}");
    }
    assert_eq!(
        taker.held_locks(),
        2,
        "each lock renewed by the renewal task"
    );

    // A single-name taker finds each held; the guard releases every lock.
    assert!(holder.try_lock("a", &options).await.expect("try").is_none());
    released(both.release().await);
    assert_eq!(taker.held_locks(), 0);
    for name in ["a", "b"] {
        assert!(!exists(&mut conn, &format!("{prefix}:lock:{name}")).await);
        let guard = holder.try_lock(name, &options).await.expect("try");
        assert!(guard.expect("free").token().get() > 2, "{name}");
    }
}
