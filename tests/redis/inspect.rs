//! `RedisLocker::inspect`: a lock's holder (owner value, time left, last token) and a
//! semaphore's held permits, as far as Redis can tell; an expired holder is gone.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{locker, prefix, redis, released, within};

#[tokio::test]
async fn holders_of_locks_and_semaphores() {
    let server = redis().await;
    let prefix = prefix("inspect");
    let locks = locker(&server, &prefix).await;
    assert!(locks.inspect("report").await.expect("inspect").is_empty());

    let options = LockOptions::new().with_ttl(Duration::from_secs(5));
    let held = locks.lock("report", &options).await.expect("lock");
    let semaphore = locks.semaphore("calls", 2).expect("semaphore");
    let permit = semaphore.acquire(&options).await.expect("permit");

    let report = locks.inspect("report").await.expect("inspect");
    assert_eq!(report.len(), 1, "{report:?}");
    assert!(!report[0].semaphore);
    assert_eq!(report[0].holders.len(), 1);
    let holder = &report[0].holders[0];
    assert_eq!(holder.key, held.key());
    assert_eq!(holder.owner, held.owner());
    assert!(holder.remaining.expect("a PX") <= Duration::from_secs(5));
    assert!(report[0].last_token.expect("a token") >= held.token().get());

    let all = locks.inspect_all().await.expect("inspect all");
    let names: Vec<(&str, bool, usize)> = all
        .iter()
        .map(|s| (s.name.as_str(), s.semaphore, s.holders.len()))
        .collect();
    assert_eq!(names, [("calls", true, 1), ("report", false, 1)]);
    assert_eq!(all[0].holders[0].owner, permit.owner());

    released(held.release().await);
    released(permit.release().await);
    assert!(locks.inspect_all().await.expect("inspect all").is_empty());
}

#[tokio::test]
async fn an_expired_holder_is_gone() {
    use futures_util::StreamExt;

    let server = redis().await;
    let prefix = prefix("inspect-expired");
    let locks = locker(&server, &prefix).await;
    // The server announces each expiry: the test waits for that event, not for time.
    let mut connection = server.connection().await.expect("connection");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("Ex")
        .query_async(&mut connection)
        .await
        .expect("CONFIG SET");
    let client = redis::Client::open(server.url()).expect("url");
    let mut pubsub = client.get_async_pubsub().await.expect("pubsub");
    pubsub
        .subscribe("__keyevent@0__:expired")
        .await
        .expect("subscribe");
    let mut expiries = pubsub.on_message();

    let options = LockOptions::new()
        .with_ttl(Duration::from_millis(300))
        .with_renewal(false);
    let held = locks.lock("job", &options).await.expect("lock");
    assert_eq!(locks.inspect("job").await.expect("inspect").len(), 1);
    within(Duration::from_secs(5), "the key's expiry", async {
        loop {
            let message = expiries.next().await.expect("subscription open");
            if message.get_payload::<String>().ok().as_deref() == Some(held.key()) {
                break;
            }
        }
    })
    .await;
    assert!(locks.inspect("job").await.expect("inspect").is_empty());
}
