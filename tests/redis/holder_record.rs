//! The holder record in a Redis lock key's value (`<owner>\n<record>`): written by every
//! acquisition that records one, returned by `inspect`, and seen through by the scripts
//! that compare the owner: release and renewal work with a record and with a bare owner
//! value (`with_holder_info(false)`, or an older fencelock), and a value that merely
//! starts with the owner's digits is not the owner's.

use std::time::Duration;

use fencelock::testkit::RedisServer;
use fencelock::{HolderInfo, LockBackend, LockGuard, LockOptions, LossReason, ReleaseOutcome};

use crate::support::{locker, prefix, redis, released, within};

/// Overwrites `key`'s value, keeping its expiry (as another writer would).
async fn overwrite(server: &RedisServer, key: &str, value: &str) {
    let mut connection = server.connection().await.expect("connection");
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("XX")
        .arg("KEEPTTL")
        .query_async(&mut connection)
        .await
        .expect("SET XX KEEPTTL");
}

/// Holds for three TTLs (the key would be gone without renewal), then releases: the
/// key must still hold `stored` and the release delete it.
async fn renewed_then_released(server: &RedisServer, guard: fencelock::redis::RedisGuard) {
    let ttl = Duration::from_millis(300);
    let stored = server.get(guard.key()).await.expect("get");
    tokio::time::sleep(ttl * 3).await;
    assert!(guard.is_held());
    assert_eq!(
        server.get(guard.key()).await.expect("get"),
        stored,
        "renewed"
    );
    let key = guard.key().to_owned();
    released(guard.release().await);
    assert_eq!(server.get(&key).await.expect("get"), None, "deleted");
}

#[tokio::test]
async fn a_record_follows_the_owner_and_release_and_renewal_see_through_it() {
    let server = redis().await;
    let prefix = prefix("record");
    let locks = locker(&server, &prefix).await;
    let options = LockOptions::new()
        .with_ttl(Duration::from_millis(300))
        .with_holder_label("nightly 2026-12-03");
    let guard = locks.lock("report", &options).await.expect("lock");

    let stored = server
        .get(guard.key())
        .await
        .expect("get")
        .expect("a value");
    let (owner, record) = stored.split_once('\n').expect("owner, line break, record");
    assert_eq!(owner, guard.owner());
    let record = HolderInfo::decode(record.as_bytes()).expect("a holder record");
    assert_eq!(record.pid, std::process::id());
    assert_eq!(record.label.as_deref(), Some("nightly 2026-12-03"));
    assert_eq!(record.ttl, Duration::from_millis(300));

    let state = locks.inspect("report").await.expect("inspect");
    let holder = &state[0].holders[0];
    assert_eq!(
        holder.owner,
        guard.owner(),
        "the owner alone, not the record"
    );
    assert_eq!(holder.holder.as_ref(), Some(&record));

    renewed_then_released(&server, guard).await;
}

#[tokio::test]
async fn a_bare_owner_value_is_renewed_and_released() {
    let server = redis().await;
    let prefix = prefix("bare");
    let locks = locker(&server, &prefix).await;
    let options = LockOptions::new()
        .with_ttl(Duration::from_millis(300))
        .with_holder_info(false);
    // What `with_holder_info(false)` writes is what fencelock wrote before records.
    let guard = locks.lock("report", &options).await.expect("lock");
    let stored = server.get(guard.key()).await.expect("get");
    assert_eq!(stored.as_deref(), Some(guard.owner()));
    let state = locks.inspect("report").await.expect("inspect");
    assert_eq!(state[0].holders[0].owner, guard.owner());
    assert_eq!(state[0].holders[0].holder, None);
    renewed_then_released(&server, guard).await;

    // A key written with a record, then read back bare (an older fencelock's value).
    let guard = locks
        .lock("report", &options.with_holder_info(true))
        .await
        .expect("lock");
    overwrite(&server, guard.key(), guard.owner()).await;
    renewed_then_released(&server, guard).await;
}

/// Stands for the guard's owner value in [`not_the_owners`]' values.
const PLACEHOLDER: &str = "00000000000000000000000000000000";

/// Values that start with the owner's 32 digits but are not its own: one digit more
/// (another writer's value that happens to extend it), with or without a record after
/// it. A compare of the first 32 bytes alone would take them for the owner's.
fn not_the_owners(owner: &str) -> [String; 3] {
    [
        format!("{owner}0"),
        format!("{owner}0\nfencelock-holder/1 host=b pid=2 since=0 ttl=1000"),
        format!("{owner} \n"),
    ]
}

#[tokio::test]
async fn a_value_that_only_starts_with_the_owner_is_not_released() {
    let server = redis().await;
    let prefix = prefix("prefix-release");
    let locks = locker(&server, &prefix).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    for template in not_the_owners(PLACEHOLDER) {
        let guard = locks.lock("report", &options).await.expect("lock");
        let value = template.replacen(PLACEHOLDER, guard.owner(), 1);
        overwrite(&server, guard.key(), &value).await;
        let key = guard.key().to_owned();
        assert_eq!(
            guard.release().await.expect("release"),
            ReleaseOutcome::NotHeld,
            "{value:?}"
        );
        assert_eq!(
            server.get(&key).await.expect("get").as_deref(),
            Some(value.as_str())
        );
        let _: () = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut server.connection().await.expect("connection"))
            .await
            .expect("DEL");
    }
}

#[tokio::test]
async fn a_value_that_only_starts_with_the_owner_is_not_renewed() {
    let server = redis().await;
    let prefix = prefix("prefix-renew");
    let locks = locker(&server, &prefix).await;
    let options = LockOptions::new().with_ttl(Duration::from_millis(300));
    for (i, template) in not_the_owners(PLACEHOLDER).into_iter().enumerate() {
        let guard = locks
            .lock(&format!("report-{i}"), &options)
            .await
            .expect("lock");
        let value = template.replacen(PLACEHOLDER, guard.owner(), 1);
        overwrite(&server, guard.key(), &value).await;
        // The next renewal (a third of the TTL later) finds the key not ours.
        let reason = within(Duration::from_secs(2), "loss noticed", guard.lost()).await;
        assert_eq!(reason, LossReason::Revoked, "{value:?}");
        assert!(!guard.is_held());
    }
}

/// `break` ends a holder whatever its key holds: a value another client wrote (no record
/// fencelock can parse, a line break after something that is no owner) is compared and
/// deleted whole, as `locks` showed it; before, the owner parsed out of it could never
/// match (the review of ad237fb), and the key stayed, without expiry.
#[tokio::test]
async fn break_ends_a_holder_whose_value_fencelock_does_not_recognise() {
    let server = redis().await;
    let prefix = prefix("record-foreign");
    let locks = locker(&server, &prefix).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(5));
    let key = {
        let guard = locks.lock("job", &options).await.expect("lock");
        let key = guard.key().to_owned();
        released(guard.release().await);
        key
    };
    let mut connection = server.connection().await.expect("connection");
    for foreign in [
        "worker-7\nhost=x".to_owned(),
        format!("{}0\nfencelock-holder/1 host=h", "0".repeat(32)),
    ] {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(&foreign)
            .query_async(&mut connection)
            .await
            .expect("SET");
        assert_eq!(
            locks.break_all("job").await.expect("break --all"),
            1,
            "{foreign:?}"
        );
        assert_eq!(
            server.get(&key).await.expect("get"),
            None,
            "{foreign:?} broken"
        );
    }
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("worker-7\nhost=x")
        .query_async(&mut connection)
        .await
        .expect("SET");
    assert!(
        locks
            .break_holder("job", "worker-7")
            .await
            .expect("break --owner"),
        "the owner locks showed breaks it"
    );
    assert_eq!(server.get(&key).await.expect("get"), None);
}
