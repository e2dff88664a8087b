//! The etcd backend: locks fenced by the create revision of their key.
//!
//! - A [`Session`] is one lease, kept alive by one task for all the locks of a client.
//! - A lock is a key `<namespace>/<name>/<lease>-<slot>` put under the lease in one
//!   transaction; its create revision is the [`FencingToken`](crate::FencingToken).
//! - Waiters queue by create revision; the join reads every key ahead, and a waiter
//!   follows their deletions on one watch per lock (`queue.rs`): no read after waiting.
//! - Release deletes exactly its key: names are reused only once a delete is confirmed
//!   (`slots.rs`), so no late delete can meet a newer holder's key.
//! - Every primitive under one name shares one queue; see `kind.rs` for who may hold
//!   beside whom (and Go's `etcdctl lock` queues in it too).
//! - An uncontended lock + release costs exactly two round trips, one Raft write each.

mod acquire;
mod call;
mod config;
mod election;
mod guard;
mod inspect;
mod keys;
mod kind;
mod locker;
mod queue;
mod rwlock;
mod semaphore;
mod session;
mod slots;
mod watch_hub;

pub use config::EtcdConfig;
pub use election::{EtcdElection, Leader, Leadership, Observer};
pub use guard::EtcdGuard;
pub use inspect::{LockState, QueueEntry, Role};
pub use keys::{lock_prefix, waiter_key};
pub use locker::{EtcdLocker, MIN_TTL};
pub use rwlock::EtcdRwLock;
pub use semaphore::EtcdSemaphore;
pub use session::Session;
