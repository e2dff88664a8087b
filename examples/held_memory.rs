//! The heap one held etcd lock costs its process: `HELD_MEMORY_LOCKS` locks (default
//! 10,000) taken on one client, 64 at a time as `fencelock bench`'s renewal row takes them,
//! held until every one has its watch, then counted by a wrapper around the system
//! allocator: live bytes and live allocations per lock, and what glibc's malloc takes for
//! them (its chunks: the size plus 8 bytes of header, rounded up to 16, at least 32), which
//! is what the bench's resident-memory bar sees. The bench's own guard vector and names are
//! counted too, as there.
//!
//! `cargo run --release --example held_memory`; under `valgrind --tool=dhat` with a smaller
//! count, the allocation sites live at the peak say where the bytes are.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use fencelock::etcd::EtcdLocker;
use fencelock::testkit::EtcdCluster;
use fencelock::{LockBackend, LockGuard, LockOptions};

struct Counting;

static LIVE_ALLOCATIONS: AtomicI64 = AtomicI64::new(0);
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
static LIVE_CHUNK_BYTES: AtomicI64 = AtomicI64::new(0);

/// The bytes glibc's malloc takes for a request of `size` on x86_64.
fn chunk(size: usize) -> i64 {
    let size = i64::try_from(size).unwrap_or(i64::MAX);
    ((size + 8 + 15) & !15).max(32)
}

fn note(size: usize, sign: i64) {
    LIVE_ALLOCATIONS.fetch_add(sign, Ordering::Relaxed);
    LIVE_BYTES.fetch_add(
        sign * i64::try_from(size).unwrap_or(i64::MAX),
        Ordering::Relaxed,
    );
    LIVE_CHUNK_BYTES.fetch_add(sign * chunk(size), Ordering::Relaxed);
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size(), 1);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(layout.size(), -1);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(layout.size(), -1);
        note(new_size, 1);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> [i64; 3] {
    [
        LIVE_ALLOCATIONS.load(Ordering::Relaxed),
        LIVE_BYTES.load(Ordering::Relaxed),
        LIVE_CHUNK_BYTES.load(Ordering::Relaxed),
    ]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let n: usize = std::env::var("HELD_MEMORY_LOCKS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    let etcd = EtcdCluster::builder().start().await?;
    let locks = EtcdLocker::connect(etcd.config("held-memory")).await?;
    let options = LockOptions::new().with_ttl(Duration::from_secs(10));
    locks.session(options.ttl()).await?;
    // One lock taken and released first: what is made once per client is not counted.
    let _warm = locks.lock("warm-up", &options).await?.release().await?;
    let before = live();
    let mut guards = Vec::with_capacity(n);
    let mut pending = Vec::new();
    for i in 0..n {
        let (locks, options, name) = (locks.clone(), options.clone(), format!("held-{i}"));
        pending.push(tokio::spawn(
            async move { locks.lock(&name, &options).await },
        ));
        if pending.len() == 64 || i + 1 == n {
            for task in pending.drain(..) {
                guards.push(task.await??);
            }
        }
    }
    // Holders open their lock's watch once a grant has held 100 ms.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = live();
    let held_now = guards.iter().filter(|g| g.is_held()).count();
    #[allow(clippy::cast_precision_loss)]
    let per = |i: usize| (held[i] - before[i]) as f64 / n as f64;
    println!(
        "{n} held etcd locks ({held_now} still held): {:.1} live allocations, {:.0} bytes \
         asked, {:.0} bytes of malloc chunks per lock",
        per(0),
        per(1),
        per(2)
    );
    for guard in guards {
        let _released = guard.release().await?;
    }
    Ok(())
}
