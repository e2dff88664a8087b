//! The heap one held etcd lock costs its process: `HELD_MEMORY_LOCKS` locks (default
//! 10,000) taken on one client, 64 at a time as `fencelock bench`'s renewal row takes them,
//! held until every one has its watch, then counted by a wrapper around the system
//! allocator: live heap blocks and bytes per lock, and what glibc's malloc takes for them,
//! which is what the bench's resident-memory bar sees. The guards' vector is counted too,
//! as there. `tests/memory` is the regression test of the same count.
//!
//! `cargo run --release --example held_memory`; under `valgrind --tool=dhat` with a smaller
//! count, the allocation sites live at the peak say where the bytes are.

#[path = "../tests/memory/counting.rs"]
mod counting;
#[path = "../tests/memory/held.rs"]
mod held;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("HELD_MEMORY_LOCKS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    let cost = held::etcd_locks(n).await;
    println!(
        "{n} held etcd locks: {:.1} live heap blocks, {:.0} bytes asked, {:.0} bytes of \
         malloc chunks per lock",
        cost.blocks, cost.bytes, cost.chunk_bytes
    );
}
