//! Heap allocations per lock + release cycle: fencelock's Redis lock against the bare
//! `SET NX PX` + compare-and-delete cycle on the same connection, and fencelock's etcd lock
//! against the bare acquire transaction + delete, one task, against local servers this
//! example starts. On a 2-core machine the client's allocations are where its CPU goes at
//! high concurrency (glibc's malloc arenas are shared by the runtime's threads), so this
//! is the number to drive down. Counted by a wrapper around the system allocator.
//!
//! `cargo run --release --example alloc_count` (`ALLOC_COUNT_REDIS_ONLY=1` or
//! `ALLOC_COUNT_ETCD_ONLY=1` for one backend, `ALLOC_COUNT_CYCLES=N` for another count,
//! e.g. under `valgrind --tool=callgrind`, whose caller tree names where they come from;
//! `ALLOC_COUNT_ETCD_ROW=lock` or `=bare` for one etcd row, `ALLOC_COUNT_REDIS_ROW` for
//! one Redis row: two runs with different
//! cycle counts, subtracted, give the instructions of one cycle).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use fencelock::etcd::EtcdLocker;
use fencelock::redis::RedisLocker;
use fencelock::testkit::{BareRedisCycle, EtcdCluster, RedisServer, bare_etcd_cycle};
use fencelock::{LockBackend, LockGuard, LockOptions};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Cycles counted per row (`ALLOC_COUNT_CYCLES` sets another number, e.g. for a run under
/// valgrind).
fn cycles() -> u64 {
    std::env::var("ALLOC_COUNT_CYCLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000)
}

async fn count<F, Fut>(what: &str, mut cycle: F) -> Result<(), Box<dyn std::error::Error>>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Result<(), Box<dyn std::error::Error>>>,
{
    for i in 0..100 {
        cycle(i).await?;
    }
    let (a, b) = (
        ALLOCATIONS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    );
    let cycles = cycles();
    for i in 0..cycles {
        cycle(i).await?;
    }
    let allocations = (ALLOCATIONS.load(Ordering::Relaxed) - a) as f64 / cycles as f64;
    let bytes = (BYTES.load(Ordering::Relaxed) - b) as f64 / cycles as f64;
    println!("{what:<30} {allocations:>7.1} allocations  {bytes:>8.0} bytes per cycle");
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = LockOptions::new();
    if std::env::var_os("ALLOC_COUNT_ETCD_ONLY").is_none() {
        redis_rows(&options).await?;
    }
    if std::env::var_os("ALLOC_COUNT_REDIS_ONLY").is_some() {
        return Ok(());
    }
    etcd_rows(&options).await
}

/// One lock + release of lock `cycle`.
async fn lock_cycle<B: LockBackend>(
    locks: &B,
    options: &LockOptions,
) -> Result<(), Box<dyn std::error::Error>> {
    let guard = locks.lock("cycle", options).await?;
    let _released = guard.release().await?;
    Ok(())
}

/// The Redis lock and the bare Redis cycle.
async fn redis_rows(options: &LockOptions) -> Result<(), Box<dyn std::error::Error>> {
    let redis = RedisServer::start().await?;
    let locks = RedisLocker::connect(redis.config("alloc-count")).await?;
    let row = std::env::var("ALLOC_COUNT_REDIS_ROW").unwrap_or_default();
    if row != "bare" {
        count("redis lock + release", |_| lock_cycle(&locks, options)).await?;
    }
    if row == "lock" {
        return Ok(());
    }
    let conn = locks.connection();
    let bare = BareRedisCycle::new();
    count("redis bare SET NX PX + CAD", |i| {
        let (mut conn, bare) = (conn.clone(), bare.clone());
        async move {
            bare.run(&mut conn, "bare", &i.to_string()).await?;
            Ok(())
        }
    })
    .await?;
    Ok(())
}

/// The etcd lock and the bare etcd cycle.
async fn etcd_rows(options: &LockOptions) -> Result<(), Box<dyn std::error::Error>> {
    let etcd = EtcdCluster::builder().start().await?;
    let locks = EtcdLocker::connect(etcd.config("alloc-count")).await?;
    locks.session(options.ttl()).await?;
    let row = std::env::var("ALLOC_COUNT_ETCD_ROW").unwrap_or_default();
    if row != "bare" {
        count("etcd lock + release", |_| lock_cycle(&locks, options)).await?;
    }
    if row == "lock" {
        return Ok(());
    }
    let mut client = locks.client().clone();
    let lease = client.lease_grant(60, None).await?.id();
    count("etcd bare txn + delete", |_| {
        let mut client = client.clone();
        async move { Ok(bare_etcd_cycle(&mut client, "bare/k", lease).await?) }
    })
    .await?;
    Ok(())
}
