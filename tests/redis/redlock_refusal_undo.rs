//! A refused Redlock attempt undoes only where something of it may be: on the masters
//! that granted, failed or had not answered, never on those that refused. Before, nearly
//! every refused attempt sent a compare-and-delete of every name to every master (the
//! attempt stopped reading at a majority of refusals, and the master it had not read yet
//! counted as unanswered): a waiting `lock_all` of 64 names cost each master 64 release
//! scripts per attempt, ten attempts a second. The undo of a minority's grants is awaited,
//! so a `try_lock_all` that answers `None` has left nothing of its own behind.

use std::time::Duration;

use fencelock::redis::{RedisConfig, RedlockLocker};
use fencelock::testkit::RedisServer;
use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{prefix, released};

/// Three masters and a locker on them (request timeout 1 s).
async fn masters_and_locker(test: &str) -> (Vec<RedisServer>, RedlockLocker, String) {
    let mut masters = Vec::new();
    for _ in 0..3 {
        masters.push(RedisServer::start().await.expect("master"));
    }
    let prefix = prefix(test);
    let config = RedisConfig::masters(masters.iter().map(RedisServer::url))
        .with_prefix(&prefix)
        .with_request_timeout(Duration::from_secs(1));
    let locks = RedlockLocker::connect(config).await.expect("connect");
    (masters, locks, prefix)
}

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

/// Every master has one name of the set held by someone else, so every master refuses
/// every attempt. A lock attempt reads each key of the set once (`PTTL` in the script),
/// an undo reads each key it compare-and-deletes once (`GET` in the release script):
/// the counts tell attempts and undone keys apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_all_refused_by_every_master_undoes_nothing() {
    let (masters, locks, prefix) = masters_and_locker("redlock-refusal-all").await;
    let names: Vec<String> = (0..64).map(|i| format!("n{i:02}")).collect();
    for (master, name) in masters.iter().zip(&names) {
        occupy(master, &format!("{prefix}:lock:{name}")).await;
    }
    for master in &masters {
        master.reset_stats().await.expect("reset");
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait_timeout(Duration::from_secs(1));
    let waited = locks.lock_all(&names, &options).await;
    assert!(
        matches!(&waited, Err(err) if err.is_wait_timeout()),
        "{waited:?}"
    );
    for (i, master) in masters.iter().enumerate() {
        // An attempt reads the 64 keys (PTTL); an undone key is a release, whose one GET
        // comes with one PTTL of its waiters' set.
        let undone = calls(master, "get").await;
        let attempts = calls(master, "pttl").await.saturating_sub(undone) / 64;
        let scripts = calls(master, "evalsha").await;
        eprintln!("master {i}: {attempts} attempts, {undone} keys undone, {scripts} script calls");
        assert!(attempts >= 3, "master {i}: {attempts} attempts in 1 s");
        // At most one undo of the set: the cleanup after an attempt the wait timeout cut
        // short in flight (it may have been applied after the caller gave up).
        assert!(
            undone <= 64,
            "master {i}: {undone} keys compare-and-deleted over {attempts} refused attempts"
        );
        assert!(
            scripts <= attempts + 64,
            "master {i}: {scripts} script calls"
        );
    }
}

/// The same for one lock: no undo on a master that refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_refused_by_every_master_undoes_nothing() {
    let (masters, locks, prefix) = masters_and_locker("redlock-refusal-one").await;
    for master in &masters {
        occupy(master, &format!("{prefix}:lock:job")).await;
        master.reset_stats().await.expect("reset");
    }
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait_timeout(Duration::from_secs(1));
    let waited = locks.lock("job", &options).await;
    assert!(
        matches!(&waited, Err(err) if err.is_wait_timeout()),
        "{waited:?}"
    );
    for (i, master) in masters.iter().enumerate() {
        // A lock attempt is `SET NX` (refused: then `PTTL`); an undo, the release script.
        let attempts = calls(master, "set").await;
        let undone = calls(master, "get").await;
        eprintln!("master {i}: {attempts} attempts, {undone} undone");
        assert!(attempts >= 3, "master {i}: {attempts} attempts in 1 s");
        assert!(
            undone <= 1,
            "master {i}: {undone} compare-and-deletes over {attempts} refused attempts"
        );
    }
}

/// A minority's grants are undone before `try_lock_all` answers: nothing of the caller's
/// is left on the master that granted, so a retry at once is not refused by the caller's
/// own leftovers. (Before, the undo ran in the background: often not yet done when the
/// caller looked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_try_lock_all_has_undone_its_grants_when_it_answers() {
    let (masters, locks, prefix) = masters_and_locker("redlock-refusal-try").await;
    let key = |name: &str| format!("{prefix}:lock:{name}");
    occupy(&masters[0], &key("b")).await;
    occupy(&masters[1], &key("b")).await;
    let mut third = masters[2].connection().await.expect("connect");
    let options = LockOptions::new().with_ttl(Duration::from_secs(10));
    for round in 0..50 {
        let none = locks
            .try_lock_all(&["a", "b"], &options)
            .await
            .expect("try");
        assert!(none.is_none(), "round {round}: b is held on a majority");
        // The third master granted both; by now, undone.
        let left: u64 = redis::cmd("EXISTS")
            .arg(key("a"))
            .arg(key("b"))
            .query_async(&mut third)
            .await
            .expect("EXISTS");
        assert_eq!(left, 0, "round {round}: left on the master that granted");
    }
    // And nothing was undone where nothing was granted: the second master refused.
    assert_eq!(calls(&masters[1], "get").await, 0);
    let mut second = masters[1].connection().await.expect("connect");
    redis::cmd("DEL")
        .arg(key("b"))
        .query_async::<()>(&mut second)
        .await
        .expect("DEL");
    let both = locks
        .try_lock_all(&["a", "b"], &options)
        .await
        .expect("try")
        .expect("b free on a majority");
    released(both.release().await);
}
