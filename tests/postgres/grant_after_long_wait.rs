//! A waiter that queued behind a holder for longer than its TTL is granted a live lock:
//! its deadline starts at the heartbeat that proves the grant alive, not at the send time
//! of the statement that waited. On 40f9998 the proof was bounded by the statement's own
//! deadline (already past after such a wait), so it was never answered in time, the guard
//! came back lost and its connection was closed: the lock granted was freed at once.
//!
//! The waiter talks to the server through a proxy that delays every chunk by a few
//! milliseconds, as any network does: on bare loopback the proof's round trip sometimes
//! beat the zero-length timer of the old code (tokio's timer has a millisecond grain), and
//! the old code then passed by luck (6 of 10 runs).

use std::net::SocketAddr;
use std::time::Duration;

use fencelock::postgres::PgAdvisoryLocker;
use fencelock::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::support::Db;

const TTL: Duration = Duration::from_secs(1);

/// How long the proxy holds each chunk, each way.
const LATENCY: Duration = Duration::from_millis(5);

/// A proxy on loopback to `upstream` that forwards each chunk `LATENCY` late; returns
/// its address. It lives as long as the test's runtime.
async fn delaying_proxy(upstream: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(upstream).await else {
                continue;
            };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::spawn(forward_late(client_read, server_write));
            tokio::spawn(forward_late(server_read, client_write));
        }
    });
    address
}

async fn forward_late(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
) {
    let mut buffer = vec![0; 64 * 1024];
    while let Ok(n) = from.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        tokio::time::sleep(LATENCY).await;
        if to.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Waits until some session waits for an advisory lock on the server.
async fn until_someone_waits(db: &Db) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = db
            .client
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                &[],
            )
            .await
            .expect("pg_locks")
            .get(0);
        if waiting > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_granted_after_waiting_longer_than_its_ttl_is_held() {
    let db = Db::start().await;
    let connection = db.server.connection_string(&db.name);
    let a = PgAdvisoryLocker::connect(&connection)
        .await
        .expect("connect");
    a.ensure_schema().await.expect("schema");
    let proxy = delaying_proxy(SocketAddr::from(([127, 0, 0, 1], db.server.port()))).await;
    let b = PgAdvisoryLocker::connect(&format!(
        "host=127.0.0.1 port={} user=postgres dbname={} connect_timeout=5",
        proxy.port(),
        db.name
    ))
    .await
    .expect("connect");
    let options = LockOptions::new().with_ttl(TTL);

    let held = a.lock("job", &options).await.expect("lock");
    let waiter = tokio::spawn({
        let options = options.clone();
        async move { b.lock("job", &options).await.map(|guard| (b, guard)) }
    });
    until_someone_waits(&db).await;
    // The waiter queues for 2.5 TTLs before the holder lets go.
    tokio::time::sleep(TTL * 5 / 2).await;
    assert!(held.is_held(), "the holder's heartbeat kept it");
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::Released
    );

    let (_b, granted) = tokio::time::timeout(TTL * 3, waiter)
        .await
        .expect("granted after the release")
        .expect("task")
        .expect("lock");
    assert!(granted.is_held(), "granted, and held");
    let first = granted.lease_remaining().expect("a deadline");
    assert!(first > TTL / 3, "a fresh deadline: {first:?} left");

    // Heartbeats keep moving the deadline: wait for two of them to be seen (each moves
    // the remaining time up again), and the loss must not come meanwhile.
    let watched = async {
        let mut beats = 0;
        let mut last = first;
        while beats < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let now = granted.lease_remaining().expect("a deadline");
            if now > last {
                beats += 1;
            }
            last = now;
        }
    };
    tokio::select! {
        reason = granted.lost() => panic!("the granted lock was lost: {reason}"),
        () = watched => {}
        () = tokio::time::sleep(TTL * 3) => panic!("no heartbeat moved the deadline"),
    }
    assert!(granted.is_held());
    assert_eq!(
        granted.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}
