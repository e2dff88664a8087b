//! A Redlock master reached under two names (`localhost` and `127.0.0.1`, a proxy in
//! front of it) is one server counting twice toward the quorum: it could grant a lock
//! alone. Connecting refuses it: by the `run_id` the servers report, or, where `INFO` is
//! not allowed or renamed, by a marker key one name sees the other write.

use fencelock::redis::{RedisConfig, RedlockLocker};
use fencelock::testkit::RedisServer;
use fencelock::{LockBackend, LockError, LockGuard, LockOptions};

use crate::support::{prefix, proxy_to, redis, released};

/// Connects a Redlock client to `urls`, expecting the refusal of one server named twice,
/// by `how`, and naming both (`names`) without the password.
async fn refused(urls: [String; 3], how: &str, names: [&str; 2]) {
    let config = RedisConfig::masters(urls.clone()).with_prefix(prefix("names"));
    let err = RedlockLocker::connect(config)
        .await
        .expect_err("one server under two names counts twice: refused");
    assert!(
        matches!(err, LockError::InvalidConfig { .. }),
        "{urls:?}: {err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("same server") && message.contains(how),
        "{message}"
    );
    for name in names {
        assert!(message.contains(name), "{name} not named: {message}");
    }
    assert!(!message.contains("secret"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_under_two_names_is_refused() {
    let (server, other) = (redis().await, redis().await);
    let proxy = proxy_to(&server).await;
    let port = server.port();
    // The default user takes any password while it has none (nopass).
    let localhost = format!("redis://default:secret@localhost:{port}/");
    let direct = format!("127.0.0.1:{port}");
    refused(
        [server.url(), localhost, other.url()],
        "run_id",
        [&direct, &format!("localhost:{port}")],
    )
    .await;
    let proxied = format!("redis://{}/", proxy.address());
    refused(
        [server.url(), proxied, other.url()],
        "run_id",
        [&direct, &proxy.address().to_string()],
    )
    .await;
}

/// Denies `INFO` to the default user of `server`.
async fn deny_info(server: &RedisServer) {
    let mut admin = server.connection().await.expect("connect");
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("-info")
        .query_async::<()>(&mut admin)
        .await
        .expect("ACL SETUSER");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_info_one_server_under_two_names_is_still_refused() {
    let (denied, other) = (redis().await, redis().await);
    deny_info(&denied).await;
    let renamed = RedisServer::start_with_args(&["--rename-command", "INFO", ""])
        .await
        .expect("redis without INFO");
    // The proxies outlive the checks: the marker keys written through them are removed
    // through them, after each check.
    let mut proxies = Vec::new();
    for server in [&denied, &renamed] {
        let proxy = proxy_to(server).await;
        let direct = format!("127.0.0.1:{}", server.port());
        refused(
            [
                server.url(),
                format!("redis://{}/", proxy.address()),
                other.url(),
            ],
            "marker key",
            [&direct, &proxy.address().to_string()],
        )
        .await;
        proxies.push(proxy);
    }
    // Distinct servers, some without INFO, are let through and lock.
    let urls = [denied.url(), renamed.url(), other.url()];
    let locks = RedlockLocker::connect(RedisConfig::masters(urls).with_prefix(prefix("acl")))
        .await
        .expect("three distinct servers, two of them without INFO");
    let guard = locks.lock("job", &LockOptions::new()).await.expect("lock");
    released(guard.release().await);
    // The marker keys are removed (in the background, after the check: no event tells
    // when, so each server is read until they are gone).
    for server in [&denied, &renamed, &other] {
        let mut conn = server.connection().await.expect("connect");
        let gone = async {
            loop {
                let left: Vec<String> = redis::cmd("KEYS")
                    .arg("*master-check*")
                    .query_async(&mut conn)
                    .await
                    .expect("KEYS");
                if left.is_empty() {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), gone)
            .await
            .expect("marker keys removed");
    }
}

/// One server under two names, one of them a user that may not run `INFO`: the names are
/// compared by marker keys as well as by `run_id`, so the one `run_id` told does not let
/// the other name pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_name_telling_its_run_id_and_one_not_are_still_one_server() {
    let (server, other) = (redis().await, redis().await);
    let mut admin = server.connection().await.expect("connect");
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("noinfo")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-info")
        .query_async::<()>(&mut admin)
        .await
        .expect("ACL SETUSER");
    let port = server.port();
    refused(
        [
            server.url(),
            format!("redis://noinfo:pw@localhost:{port}/"),
            other.url(),
        ],
        "marker key",
        [&format!("127.0.0.1:{port}"), &format!("localhost:{port}")],
    )
    .await;
}

/// A master that refuses writes (out of memory under `noeviction`) cannot take its marker
/// key: it still reads the others' and is compared by its `run_id`, so distinct servers
/// connect (two of three grant locks). Before, every connect failed on its refusal. Two
/// such masters are refused: nothing but their own word tells them apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_refuses_writes_is_compared_by_run_id() {
    let servers = [redis().await, redis().await, redis().await];
    let mut full = servers[2].connection().await.expect("connect");
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query_async::<()>(&mut full)
        .await
        .expect("CONFIG SET maxmemory");
    let urls: Vec<String> = servers.iter().map(|server| server.url()).collect();
    let locks =
        RedlockLocker::connect(RedisConfig::masters(urls.clone()).with_prefix(prefix("full")))
            .await
            .expect("distinct servers, one out of memory");
    let guard = locks.lock("job", &LockOptions::new()).await.expect("lock");
    released(guard.release().await);
    // Two that refuse: only their word would tell them apart.
    let mut second = servers[1].connection().await.expect("connect");
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query_async::<()>(&mut second)
        .await
        .expect("CONFIG SET maxmemory");
    let err = RedlockLocker::connect(RedisConfig::masters(urls).with_prefix(prefix("full")))
        .await
        .expect_err("two masters out of memory cannot be told apart");
    assert!(
        matches!(err, LockError::InvalidConfig { .. }) && err.to_string().contains("both refused"),
        "{err}"
    );
}
