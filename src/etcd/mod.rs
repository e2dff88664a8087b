//! The etcd backend: locks fenced by the create revision of their key.
//!
//! - A [`Session`] is one lease, kept alive by one task for all the locks of a client.
//! - A lock is a key `<namespace>/<name>/<lease>-<slot>` put under the lease in one
//!   transaction; its create revision is the [`FencingToken`](crate::FencingToken).
//! - Waiters queue by create revision; the join reads every key ahead, and a waiter
//!   follows their deletions on one watch per lock (`queue.rs`): no read after waiting.
//! - Every delete is a plain delete of exactly its key (the release of several locks held
//!   together deletes each of its keys so, in one transaction: `release_all.rs`), whose
//!   name (`<lease>-<slot>`) is given to a new acquisition only once every request about
//!   its earlier key was answered and that key is confirmed deleted (`slots.rs`); a join
//!   whose outcome is unknown retires its session, and a join adopts only a key it can
//!   prove it made (`key_life.rs`): no request of one acquisition, however late, can
//!   remove or stand in for another acquisition's key. (`break_holder` and guarded
//!   writes compare the create revision: they act on keys of other acquisitions.)
//! - A holder follows its own key on the lock's watch: a key deleted under a live lease
//!   is a lost lock (`LossReason::KeyDeleted`).
//! - Every primitive under one name shares one queue; see `kind.rs` for who may hold
//!   beside whom (and Go's `etcdctl lock` queues in it too).
//! - An uncontended lock + release costs exactly two round trips, one Raft write each.
//! - Several locks at once (`lock_all.rs`): one transaction puts a key in every lock's
//!   queue, so all share one create revision (the token of each), and each key waits in
//!   its own queue; waiting only ever points to lower revisions, so no deadlock.

mod acquire;
mod answers;
mod batch;
#[cfg(feature = "testkit")]
pub(crate) use batch::batched_so_far;
#[cfg(feature = "testkit")]
mod observed;
#[cfg(feature = "testkit")]
pub(crate) use observed::{Recorded, Recording, unanswered_so_far};
mod call;
mod config;
mod election;
mod guard;
mod inspect;
mod key_life;
mod keys;
mod kind;
mod late_joins;
mod lock_all;
mod locker;
mod operate;
mod queue;
mod release_all;
mod request;
mod rwlock;
mod semaphore;
mod session;
mod slots;
mod small_map;
mod token_renewal;
mod watch_hub;
mod watch_state;
mod watch_stream;
mod watch_timers;
mod watch_token;

pub use config::EtcdConfig;
pub use election::{EtcdElection, Leader, Leadership, Observer};
pub use guard::EtcdGuard;
pub use inspect::{LockState, QueueEntry, Role};
pub use keys::{lock_prefix, waiter_key};
pub use lock_all::MAX_LOCK_ALL;
pub use locker::{EtcdLocker, MIN_TTL};
pub use rwlock::EtcdRwLock;
pub use semaphore::EtcdSemaphore;
pub use session::Session;
