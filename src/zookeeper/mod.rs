//! The ZooKeeper backend: the lock recipe ZooKeeper users know, fenced by the lock node's
//! `czxid`.
//!
//! # The recipe
//!
//! The one of Curator's `InterProcessMutex` and kazoo's `Lock`: each contender creates an
//! ephemeral sequential node `<namespace>/<name>/_c_<uuid>-lock-<sequence>` in its
//! session; the oldest node holds the lock; every other contender watches only the node
//! just before its own and looks again when that one goes (FIFO, one waiter woken per
//! release). Other clients' nodes on the path (kazoo's `__lock__`, any name ending in a
//! sequence number) are contenders too, exclusive unless known to be readers, and a
//! path that a semaphore of theirs uses is refused (`contender.rs`, docs/zookeeper.md).
//! The create and the listing of the queue are sent together
//! (one round trip), the release is one delete: an uncontended lock and release cost two
//! round trips, each one write through ZooKeeper's atomic broadcast.
//!
//! # The fencing token: `czxid`, not the sequence number
//!
//! The token is the node's **`czxid`**: the zxid of the transaction that created it. Zxids
//! are assigned by the leader to every write in the order the ensemble commits them
//! (epoch in the high 32 bits, counter in the low), so a later grant always carries a
//! larger one, across the whole ensemble and across leader changes (a new leader starts
//! a new epoch above every earlier zxid), and no two nodes ever share one.
//!
//! The sequence number in the node's name is *not* a safe token. It is a counter of the
//! parent node (its `cversion`), not of the ensemble: when the lock's parent node is
//! deleted and created again (the container node the server removes once it is empty,
//! an operator's cleanup, a namespace moved), the next contender gets sequence 0 again,
//! smaller than what storage has already seen, and every write of the new holder would
//! be refused (or, with a check that accepts equal tokens, a stale holder's accepted).
//! `tests/zookeeper/token_is_czxid.rs` shows it on a real server.
//!
//! # Sessions, TTL and loss
//!
//! A lock node lives as long as its session. Locks taken with the same TTL share one
//! session whose timeout is that TTL (the server may raise or lower it to its
//! `minSessionTimeout`/`maxSessionTimeout`; [`ZooKeeperGuard::session_timeout`] says what
//! it granted). A lock taken without renewal gets a session of its own, closed by this
//! side when the TTL runs out.
//!
//! [`LockGuard::lost`](crate::LockGuard::lost) resolves when:
//! - the server reports the session expired (`Revoked`) or it was closed (`Closed`);
//! - the local deadline passes (`Expired`): the session timeout after the send time of a
//!   heartbeat (a `sync`, one every tenth of the timeout) the leader is known to have
//!   heard of, on the boot-time clock (`session.rs`, `heartbeat.rs`). A holder cut off
//!   from the ensemble, or talking to a follower cut off from the leader ("suspended" in
//!   Curator's words), learns it has lost the lock *before* the leader can expire its
//!   session and hand the lock on; the session is then closed from this side too.
//!   Fencing still refuses a stale holder's writes (the next token is larger);
//! - its node is deleted under a live session (`KeyDeleted`).
//!
//! # Cancel safety and protected mode
//!
//! The random `_c_<uuid>` id in the node's name is chosen before the create is sent. If
//! the create's answer is lost (the connection broke, the request timed out), the node is
//! looked for by that id (after a `sync`) instead of being created a second time, and
//! the session is retired (it closes with its last lock, taking any node a create applied
//! still later left behind). A dropped or timed-out acquisition removes its node in the
//! background, finding it by the id if need be, retrying until the server confirms or the
//! session is gone.
//!
//! # What is offered beside the lock, and what is not
//!
//! - **Read-write lock**: [`ZooKeeperLocker::rwlock`], Curator's
//!   `InterProcessReadWriteLock` recipe in the same queue.
//! - **Semaphore** (not offered): Curator's `InterProcessSemaphoreV2` needs a lease node
//!   per permit *and* a lock around counting them, two queues per acquisition; not done
//!   yet. `fencelock run --permits` is refused on ZooKeeper.
//! - **TLS**: `zookeeper-client` can speak TLS, but its `tls` feature switches rustls to
//!   the aws-lc-rs provider, a C build dependency this crate avoids (it uses ring). The
//!   connect string is plaintext; put the ensemble on a trusted network.
//! - **Authentication** (digest, SASL): not wired; nodes are created with the open ACL.
//!
//! See `docs/zookeeper.md` for the whole story, and how the tests start the servers.

mod acquire;
mod config;
mod contender;
mod error;
mod guard;
mod heartbeat;
mod inspect;
mod locker;
mod multi;
mod node;
mod operate;
mod rwlock;
mod session;
mod turn;

pub use config::ZooKeeperConfig;
pub use contender::ContenderKind;
pub use guard::ZooKeeperGuard;
pub use inspect::{ZooKeeperEntry, ZooKeeperLockState};
pub use locker::{MIN_TTL, ZooKeeperLocker};
pub use multi::{MAX_LOCK_ALL, ZooKeeperMultiGuard};
pub use rwlock::ZooKeeperRwLock;

/// The least time a healthy lock has left ([`LockGuard::lease_remaining`]) with a
/// session `timeout` (the one the server granted: [`ZooKeeperLocker::session_timeout`]):
/// half of it, less a heartbeat's round trip. The local deadline lies 0.6 of the timeout
/// past the last answered heartbeat's sending and the next answer comes a tenth later,
/// so the time left swings between 0.6 and 0.5 of the timeout, never near the whole of
/// it as an etcd or Redis lock renewed every third of its TTL does (between 2/3 and all
/// of it). Whatever acts before the deadline (`fencelock run`'s SIGTERM) is sized by
/// this.
///
/// [`LockGuard::lease_remaining`]: crate::LockGuard::lease_remaining
#[must_use]
pub fn healthy_lease_floor(timeout: std::time::Duration) -> std::time::Duration {
    heartbeat::healthy_floor(timeout)
}
