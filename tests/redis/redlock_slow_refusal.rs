//! A Redlock master slower than the per-master timeout that refused is not undone: the
//! attempt no longer waits for it, but its answer is still read (within the request
//! timeout), and a refusal means it wrote nothing. Before, the per-master timeout turned
//! its answer into a timeout error, and every refused attempt sent it a compare-and-delete
//! of every lock: 64 release scripts per attempt of a `lock_all` of 64 names.

use std::time::Duration;

use fencelock::redis::{RedisConfig, RedlockLocker};
use fencelock::testkit::{FaultProxy, RedisServer};
use fencelock::{LockBackend, LockOptions};

use crate::support::prefix;

/// Sets `key` on `master` to a value of no fencelock client's (a holder elsewhere).
async fn occupy(master: &RedisServer, key: &str) {
    let mut conn = master.connection().await.expect("connect");
    redis::cmd("SET")
        .arg(key)
        .arg("someone-else")
        .arg("PX")
        .arg(60_000)
        .query_async::<()>(&mut conn)
        .await
        .expect("SET");
}

async fn calls(master: &RedisServer, command: &str) -> u64 {
    master.command_calls(command).await.expect("commandstats")
}

/// Three masters, each with one name of the set held by someone else (every master
/// refuses every attempt); the third answers ~150 ms late (75 ms each way through a
/// proxy), later than the per-master timeout of a 1 s TTL (100 ms), well within the
/// request timeout (1 s). A lock attempt reads each key of the set once (`PTTL` in the
/// script), an undo reads each key it compare-and-deletes once (`GET`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_master_that_refused_is_not_undone() {
    let mut masters = Vec::new();
    for _ in 0..3 {
        masters.push(RedisServer::start().await.expect("master"));
    }
    let third = format!("127.0.0.1:{}", masters[2].port())
        .parse()
        .expect("address");
    let proxy = FaultProxy::start(third).await.expect("proxy");
    let prefix = prefix("redlock-slow-refusal");
    let urls = vec![
        masters[0].url(),
        masters[1].url(),
        format!("redis://{}/", proxy.address()),
    ];
    let config = RedisConfig::masters(urls)
        .with_prefix(&prefix)
        .with_request_timeout(Duration::from_secs(1));
    let locks = RedlockLocker::connect(config).await.expect("connect");
    // Connected at full speed; from now on a slow link to the third master.
    proxy.delay(Duration::from_millis(75));
    let names: Vec<String> = (0..64).map(|i| format!("n{i:02}")).collect();
    for (master, name) in masters.iter().zip(&names) {
        occupy(master, &format!("{prefix}:lock:{name}")).await;
    }
    for master in &masters {
        master.reset_stats().await.expect("reset");
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(1))
        .with_wait_timeout(Duration::from_millis(1500));
    let waited = locks.lock_all(&names, &options).await;
    assert!(
        matches!(&waited, Err(err) if err.is_wait_timeout()),
        "{waited:?}"
    );
    // (Read at once: an attempt's undo, when there was one, reached the slow master
    // ~175 ms after the attempt, so the attempts of the wait show theirs by now.)
    let slow = &masters[2];
    // An attempt reads the 64 keys (PTTL); an undone key is a release, whose one GET
    // comes with one PTTL of its waiters' set.
    let undone = calls(slow, "get").await;
    let attempts = calls(slow, "pttl").await.saturating_sub(undone) / 64;
    eprintln!("slow master: {attempts} attempts, {undone} keys undone");
    assert!(attempts >= 3, "{attempts} attempts reached the slow master");
    // At most one undo of the set: the cleanup after an attempt the wait timeout cut
    // short in flight (it may have been applied after the caller gave up).
    assert!(
        undone <= 64,
        "{undone} keys compare-and-deleted on the slow master over {attempts} refused attempts"
    );
}
