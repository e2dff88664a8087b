//! The Redis backends, for comparison: a single-instance lock and Redlock.
//!
//! Both implement [`LockBackend`](crate::LockBackend) like the etcd lock, so that the two
//! can be benchmarked head to head and compared under faults. What they do not promise:
//!
//! - Replication is asynchronous. If the master dies before a lock reached its replica
//!   and the replica is promoted, a second client gets the same lock while the first
//!   still holds it (two holders), and the `INCR` token counter can repeat.
//! - A paused holder keeps believing it holds the lock after its TTL: only a fencing
//!   check in storage stops its writes.
//! - Redlock depends on the masters' clocks; a jump on one can grant the lock twice.
//!
//! The tests in `tests/redis/` reproduce the first failure on real servers.

mod acquire;
mod command_conn;
mod config;
mod core;
mod distinct_masters;
mod guard;
mod id_map;
mod inspect;
mod keys;
mod lock_all;
mod locker;
mod node;
mod node_renewal;
mod operate;
mod owner;
mod redlock_inspect;
mod renewer;
mod round_tally;
mod script_call;
mod scripts;
mod semaphore;
mod subscriber;
mod target;
mod value;
mod waiter;

pub use config::RedisConfig;
pub use guard::RedisGuard;
pub use inspect::{RedisHolder, RedisLockState};
pub use lock_all::MAX_LOCK_ALL;
pub use locker::{MIN_TTL, RedisLocker, RedlockLocker};
pub use redlock_inspect::{RedlockHolder, RedlockLockState};
pub use semaphore::RedisSemaphore;
