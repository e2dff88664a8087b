//! The futures of a lock and a release stay small. Every frame an `async fn` future passes
//! through copies it whole, so a lock whose future carried its rare paths (opening a
//! session, leaving the queue, revoking a lease of its own: 20 KiB for a lock, 12 KiB for
//! a release) spent more client CPU copying futures than in its own code (see `call.rs`;
//! `examples/alloc_count.rs` under callgrind measures it).

use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{etcd, locker, namespace};

/// Well above today's sizes (about 6 KiB and 5 KiB), well below what a rare path boxed no
/// more would bring back.
const BOUND: usize = 8 * 1024;

#[tokio::test]
async fn lock_and_release_futures_stay_small() {
    let cluster = etcd().await;
    let locks = locker(&cluster, &namespace("sizes")).await;
    let options = LockOptions::new();
    let lock = locks.lock("sized", &options);
    let lock_size = std::mem::size_of_val(&lock);
    let guard = lock.await.expect("lock");
    let release = guard.release();
    let release_size = std::mem::size_of_val(&release);
    crate::support::released(release.await);
    assert!(
        lock_size <= BOUND && release_size <= BOUND,
        "a lock's future is {lock_size} bytes, a release's {release_size} (bound {BOUND})"
    );
}
