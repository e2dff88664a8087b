//! Distributed locks that stay correct when the world misbehaves.
//!
//! A distributed lock cannot by itself guarantee mutual exclusion: a holder can pause past
//! its lease, a network can split. What it *can* guarantee is that every grant carries a
//! [`FencingToken`] larger than every earlier grant's, so that storage can refuse the writes
//! of a holder that lost the lock without knowing it. The etcd backend uses the lock key's
//! create revision as that token: assigned by the Raft log, never reused, never lost on
//! leader failover.
//!
//! Start with `etcd::EtcdLocker`, which implements the backend-neutral [`LockBackend`].
//!
//! # Cargo features
//!
//! Each backend is a feature, so that a service compiles only the client it uses:
//!
//! | feature | what it brings | pulls in |
//! |---|---|---|
//! | `etcd` (default) | `etcd`: lock, semaphore, read-write lock, election | etcd-client, tonic |
//! | `redis` | `redis`: the Redis lock, its semaphore, Redlock | redis-rs |
//! | `postgres` | `postgres`: the fence, idempotency and compare-and-set helpers, advisory locks | tokio-postgres |
//! | `zookeeper` | `zookeeper`: the ZooKeeper lock (Curator's recipe, czxid token) | zookeeper-client |
//! | `testkit` | `testkit`: real servers on loopback for tests (all three backends) | tempfile, rcgen |
//!
//! The core types ([`FencingToken`], [`LockBackend`], [`LockError`], [`TlsConfig`]) are
//! always there.
#![warn(missing_docs)]
// Without a backend only the core types remain, and the backends' shared parts are unused.
#![cfg_attr(
    not(any(
        feature = "etcd",
        feature = "redis",
        feature = "postgres",
        feature = "zookeeper"
    )),
    allow(dead_code)
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod error;
// The lease deadline of the lease-based backends.
#[cfg(any(feature = "etcd", feature = "redis", feature = "zookeeper"))]
mod lease_clock;
mod loss;
pub mod metrics;
mod name;
mod options;
#[cfg(any(feature = "etcd", feature = "redis"))]
mod retry;
// Used by the etcd, Redis and PostgreSQL connectors (the ZooKeeper backend has no TLS).
#[cfg_attr(
    not(any(feature = "etcd", feature = "redis", feature = "postgres")),
    allow(dead_code)
)]
mod tls;
mod token;

#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub mod etcd;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(feature = "testkit")]
#[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
pub mod testkit;
#[cfg(feature = "zookeeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
pub mod zookeeper;

pub use backend::{LockBackend, LockGuard, ReleaseOutcome};
pub use error::{Backend, BoxError, LockError};
pub use loss::LossReason;
pub use name::{MAX_NAME_LEN, validate_name};
pub use options::{LockOptions, MAX_TTL};
pub use tls::{Pem, TlsConfig};
pub use token::FencingToken;

// The README's examples compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
