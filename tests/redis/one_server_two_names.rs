//! A Redlock master reached under two names (`localhost` and `127.0.0.1`, a proxy in
//! front of it) is one server counting twice toward the quorum: it could grant a lock
//! alone. Connecting refuses it by the `run_id` the servers report; a master whose ACL
//! hides `INFO` cannot be told apart and is let through.

use fencelock::redis::{RedisConfig, RedlockLocker};
use fencelock::{LockBackend, LockError, LockGuard, LockOptions};

use crate::support::{prefix, proxy_to, redis, released};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_under_two_names_is_refused() {
    let (server, other) = (redis().await, redis().await);
    let proxy = proxy_to(&server).await;
    let port = server.port();
    for second_name in [
        format!("redis://localhost:{port}/"),
        format!("redis://{}/", proxy.address()),
    ] {
        let urls = [server.url(), second_name.clone(), other.url()];
        let err = RedlockLocker::connect(RedisConfig::masters(urls).with_prefix(prefix("names")))
            .await
            .expect_err("one server under two names counts twice: refused");
        assert!(
            matches!(err, LockError::InvalidConfig { .. }),
            "{second_name}: {err:?}"
        );
        let message = err.to_string();
        assert!(
            message.contains("same server") && message.contains("run_id"),
            "{message}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_hides_its_run_id_is_let_through() {
    let servers = [redis().await, redis().await, redis().await];
    let mut admin = servers[1].connection().await.expect("connect");
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("-info")
        .query_async::<()>(&mut admin)
        .await
        .expect("ACL SETUSER");
    let urls: Vec<String> = servers.iter().map(|server| server.url()).collect();
    let locks = RedlockLocker::connect(RedisConfig::masters(urls).with_prefix(prefix("acl")))
        .await
        .expect("three distinct servers, one of them without INFO");
    let guard = locks.lock("job", &LockOptions::new()).await.expect("lock");
    released(guard.release().await);
}
