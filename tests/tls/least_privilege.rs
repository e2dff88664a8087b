//! Least privilege: a user that may only read and write `<namespace>/` can use every
//! primitive, and is refused anything else with a permission-denied error. For etcd (a
//! password user, and a certificate identity: the client certificate's common name), for
//! Redis (an ACL user with the minimal rules of docs/security.md, the default user disabled),
//! and for PostgreSQL (a role with the fence table's privileges only).

use std::time::Duration;

use etcd_client::{Client, Permission, UserAddOptions};
use fencelock::etcd::{EtcdConfig, EtcdLocker};
use fencelock::redis::{RedisConfig, RedisLocker, RedlockLocker};
use fencelock::testkit::{EtcdCluster, PostgresServer, RedisServer, TestPki};
use fencelock::{FencingToken, LockBackend, LockGuard, LockOptions};

/// What docs/security.md tells an operator to run, through the API: a role that may read and
/// write `<namespace>/` only, a user with it, a root user, and auth on.
async fn scoped_user(admin: &mut Client, namespace: &str, user: &str, password: Option<&str>) {
    admin.role_add("fencelock-locker").await.expect("role add");
    admin
        .role_grant_permission(
            "fencelock-locker",
            Permission::read_write(format!("{namespace}/")).with_prefix(),
        )
        .await
        .expect("grant");
    let options = match password {
        Some(_) => None,
        None => Some(UserAddOptions::new().with_no_pwd()),
    };
    admin
        .user_add(user, password.unwrap_or(""), options)
        .await
        .expect("user add");
    admin
        .user_grant_role(user, "fencelock-locker")
        .await
        .expect("grant role");
    admin.user_add("root", "rootpw", None).await.expect("root");
    admin
        .user_grant_role("root", "root")
        .await
        .expect("root role");
    admin.auth_enable().await.expect("auth enable");
}

/// Takes every primitive once, then shows that a key outside the namespace is refused.
async fn every_primitive_and_nothing_else(locks: &EtcdLocker) {
    let options = LockOptions::new().with_wait_timeout(Duration::from_secs(5));
    let guard = locks.lock("job", &options).await.expect("lock");
    let outside = guard
        .put_if_held("elsewhere/secret", "x")
        .await
        .expect_err("a key outside the namespace");
    assert!(outside.is_permission_denied(), "{outside}");
    drop(guard);
    let permit = locks
        .semaphore("pool", 2)
        .expect("semaphore")
        .acquire(&options)
        .await
        .expect("permit");
    drop(permit);
    let rw = locks.rwlock("catalog").expect("rwlock");
    drop(rw.read(&options).await.expect("read"));
    drop(rw.write(&options).await.expect("write"));
    let election = locks.election("leader").expect("election");
    let leadership = election.campaign("me", &options).await.expect("campaign");
    assert_eq!(
        election.leader().await.expect("leader").map(|l| l.value),
        Some(b"me".to_vec())
    );
    leadership.proclaim("still me").await.expect("proclaim");
    drop(leadership);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_user_scoped_to_its_namespace_can_use_every_primitive() {
    let cluster = EtcdCluster::single().await.expect("etcd");
    let mut admin = cluster.client().await.expect("admin");
    scoped_user(&mut admin, "jobs", "locker", Some("lockerpw")).await;
    let locks = EtcdLocker::connect(
        cluster
            .config("jobs")
            .with_credentials("locker", "lockerpw"),
    )
    .await
    .expect("connect as the scoped user");
    every_primitive_and_nothing_else(&locks).await;
    locks.close().await.expect("close");
    let err = EtcdLocker::connect(
        cluster
            .config("other")
            .with_credentials("locker", "lockerpw"),
    )
    .await
    .expect_err("another namespace");
    assert!(err.is_permission_denied(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_client_certificate_is_its_user() {
    let pki = TestPki::generate().expect("pki");
    let cluster = EtcdCluster::builder()
        .tls(
            pki.server_tls(true),
            pki.client_tls("root").expect("root cert"),
        )
        .start()
        .await
        .expect("mTLS etcd");
    let mut admin = cluster.client().await.expect("admin");
    // A user without a password: only its certificate identifies it.
    scoped_user(&mut admin, "jobs", "locker", None).await;
    let config = EtcdConfig::new(cluster.endpoints())
        .with_namespace("jobs")
        .with_tls(pki.client_tls("locker").expect("locker cert"));
    let locks = EtcdLocker::connect(config)
        .await
        .expect("connect by certificate");
    every_primitive_and_nothing_else(&locks).await;
    locks.close().await.expect("close");
}

/// docs/security.md's minimal ACL for a lock user: the commands the lock sends (its scripts'
/// commands included, as Redis checks those too), its keys and its channels only.
const REDIS_ACL: &[&str] = &[
    "on",
    ">lockerpw",
    "resetkeys",
    "~jobs:*",
    "resetchannels",
    "&jobs:*",
    "-@all",
    "+evalsha",
    "+script|load",
    "+set",
    "+get",
    "+del",
    "+incr",
    "+pttl",
    "+pexpire",
    "+publish",
    "+subscribe",
    "+unsubscribe",
    "+ping",
    "+type",
    "+time",
    "+zadd",
    "+zrem",
    "+zremrangebyscore",
    "+zcard",
];

/// Creates the lock user on `server` and disables the default user.
async fn redis_acl(server: &RedisServer) {
    let mut admin = server.connection().await.expect("admin");
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locker")
        .arg(REDIS_ACL)
        .query_async::<()>(&mut admin)
        .await
        .expect("acl setuser");
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("off")
        .query_async::<()>(&mut admin)
        .await
        .expect("default off");
}

fn as_locker(server: &RedisServer) -> String {
    server.url().replace("redis://", "redis://locker:lockerpw@")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_acl_user_with_the_minimal_rules_can_lock_wait_renew_and_use_redlock() {
    let mut masters = Vec::new();
    for _ in 0..3 {
        let server = RedisServer::start().await.expect("redis");
        redis_acl(&server).await;
        masters.push(server);
    }
    let config = RedisConfig::new(as_locker(&masters[0]))
        .with_prefix("jobs")
        .with_request_timeout(Duration::from_secs(1));
    let locks = RedisLocker::connect(config)
        .await
        .expect("connect as locker");
    let ttl = Duration::from_millis(300);
    let held = locks
        .lock("job", &LockOptions::new().with_ttl(ttl))
        .await
        .expect("lock");
    // A waiter subscribes and waits; the holder outlives its TTL (renewed), then releases.
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.lock("job", &LockOptions::new()).await })
    };
    tokio::time::sleep(ttl * 3).await;
    assert!(held.is_held(), "renewed under the ACL user");
    assert!(!waiter.is_finished());
    assert_eq!(
        held.release().await.expect("release"),
        fencelock::ReleaseOutcome::Released
    );
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter is woken")
        .expect("task")
        .expect("lock");
    assert_eq!(
        next.release().await.expect("release"),
        fencelock::ReleaseOutcome::Released
    );
    let permit = locks
        .semaphore("pool", 2)
        .expect("semaphore")
        .acquire(&LockOptions::new())
        .await
        .expect("permit");
    assert_eq!(
        permit.release().await.expect("release"),
        fencelock::ReleaseOutcome::Released
    );

    // Several locks at once, waiting for one that is held: the all-or-none script
    // refuses and registers the waiter, then grants (and unregisters) after the release.
    let x = locks.lock("x", &LockOptions::new()).await.expect("x");
    let both = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.lock_all(&["y", "x"], &LockOptions::new()).await })
    };
    // (The default user is off: read the waiters' set as the lock user, which may.)
    let mut conn = redis::Client::open(as_locker(&masters[0]))
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect as locker");
    tokio::time::timeout(Duration::from_secs(5), async {
        // Registered (or failed: its error is reported below).
        while !both.is_finished() {
            let waiting: u64 = redis::cmd("ZCARD")
                .arg("jobs:waiters:x")
                .query_async(&mut conn)
                .await
                .expect("ZCARD");
            if waiting == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the lock_all waiter registers");
    assert_eq!(
        x.release().await.expect("release"),
        fencelock::ReleaseOutcome::Released
    );
    let both = tokio::time::timeout(Duration::from_secs(5), both)
        .await
        .expect("the lock_all waiter is woken")
        .expect("task")
        .expect("lock_all under the ACL user");
    assert_eq!(
        both.release().await.expect("release"),
        fencelock::ReleaseOutcome::Released
    );

    // Keys outside the prefix are refused.
    let other = RedisLocker::connect(RedisConfig::new(as_locker(&masters[0])).with_prefix("other"))
        .await
        .expect("connect");
    let err = other
        .try_lock("job", &LockOptions::new())
        .await
        .expect_err("a key outside ~jobs:*");
    assert!(err.is_permission_denied(), "{err}");
    // The default user is off.
    let err = RedisLocker::connect(RedisConfig::new(masters[0].url()).with_prefix("jobs"))
        .await
        .expect_err("default user disabled");
    assert!(err.is_permission_denied(), "{err}");

    let redlock = RedlockLocker::connect(
        RedisConfig::masters(masters.iter().map(as_locker)).with_prefix("jobs"),
    )
    .await
    .expect("redlock as locker");
    let guard = redlock
        .lock("batch", &LockOptions::new())
        .await
        .expect("redlock");
    assert_eq!(
        guard.release().await.expect("release"),
        fencelock::ReleaseOutcome::Released
    );
    let all = redlock
        .lock_all(&["batch", "other-batch"], &LockOptions::new())
        .await
        .expect("redlock lock_all");
    assert_eq!(
        all.release().await.expect("release"),
        fencelock::ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_role_with_the_fence_tables_privileges_only_can_write_fenced() {
    let server = PostgresServer::start().await.expect("postgres");
    let admin = server.admin_connect("postgres").await.expect("admin");
    // Schema first, by its owner: an explicit, separate step.
    let fence = fencelock::postgres::Fence::new();
    fence.ensure_schema(&admin).await.expect("schema");
    admin
        .batch_execute(
            "CREATE ROLE fencer LOGIN; \
             GRANT SELECT, INSERT, UPDATE ON fencelock_fences TO fencer",
        )
        .await
        .expect("role");
    let connection = format!(
        "host=127.0.0.1 port={} user=fencer dbname=postgres connect_timeout=2",
        server.port()
    );
    let mut db = fencelock::postgres::connect(&connection, None)
        .await
        .expect("connect as fencer");
    let tx = fence
        .begin(&mut db, "orders", FencingToken::new(3))
        .await
        .expect("fenced write");
    tx.commit().await.expect("commit");
    let stale = fence
        .begin(&mut db, "orders", FencingToken::new(2))
        .await
        .expect_err("older token");
    assert!(stale.is_stale(), "{stale}");
    // Creating schema is not this role's business.
    let refused = fencelock::postgres::Fence::new()
        .with_table("fencer_fences")
        .expect("table")
        .ensure_schema(&db)
        .await
        .expect_err("no CREATE");
    assert!(
        refused.to_string().contains("permission denied"),
        "{refused}"
    );
}
