//! A counting wrapper around the system allocator: live heap blocks and bytes, and what
//! glibc's malloc takes for them (its chunks: the size plus 8 bytes of header, rounded up
//! to 16, at least 32), which is what a process's resident memory sees. Shared by the
//! memory test and `examples/held_memory.rs`; install it with
//! `#[global_allocator] static GLOBAL: Counting = Counting;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};

/// The allocator; see the module docs.
pub struct Counting;

static LIVE_BLOCKS: AtomicI64 = AtomicI64::new(0);
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
static LIVE_CHUNK_BYTES: AtomicI64 = AtomicI64::new(0);

/// What is live on the heap at one moment.
#[derive(Clone, Copy, Debug)]
pub struct Live {
    pub blocks: i64,
    pub bytes: i64,
    pub chunk_bytes: i64,
}

impl Live {
    pub fn now() -> Self {
        Self {
            blocks: LIVE_BLOCKS.load(Ordering::Relaxed),
            bytes: LIVE_BYTES.load(Ordering::Relaxed),
            chunk_bytes: LIVE_CHUNK_BYTES.load(Ordering::Relaxed),
        }
    }

    /// What grew since `before`, per one of `n` things.
    #[allow(clippy::cast_precision_loss)]
    pub fn per(self, before: Self, n: usize) -> (f64, f64, f64) {
        let n = n.max(1) as f64;
        (
            (self.blocks - before.blocks) as f64 / n,
            (self.bytes - before.bytes) as f64 / n,
            (self.chunk_bytes - before.chunk_bytes) as f64 / n,
        )
    }
}

/// The bytes glibc's malloc takes for a request of `size` on x86_64.
fn chunk(size: usize) -> i64 {
    let size = i64::try_from(size).unwrap_or(i64::MAX);
    (size.saturating_add(8 + 15) & !15).max(32)
}

fn note(size: usize, sign: i64) {
    LIVE_BLOCKS.fetch_add(sign, Ordering::Relaxed);
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
