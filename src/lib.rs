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
//! | `mysql` | `mysql`: the fence, idempotency and compare-and-set helpers for MariaDB/MySQL | mysql_async |
//! | `zookeeper` | `zookeeper`: the ZooKeeper lock (Curator's recipe, czxid token) | zookeeper-client |
//! | `testkit` | `testkit`: real servers on loopback for tests (every backend, MariaDB) | tempfile, rcgen |
//!
//! The core types ([`FencingToken`], [`LockBackend`], [`LockError`], [`TlsConfig`]) are
//! always there.
//!
//! # Guide
//!
//! The repository's `README.md` has the first steps (the two commands, why the token
//! matters, the backends and what each promises); its `docs/` directory is the guide, one
//! page per topic (index: `docs/README.md`):
//!
//! | page | what it covers |
//! |---|---|
//! | `docs/etcd.md` | the etcd lock: sessions, FIFO waiting, holders that follow their key, cancel safety, group commit, Go's `etcdctl lock` on the same queue |
//! | `docs/primitives.md` | semaphores, leader election, read-write locks |
//! | `docs/redis.md` | the Redis configuration the token needs; etcd or Redis: what each promises |
//! | `docs/zookeeper.md` | the ZooKeeper lock: Curator's recipe, why the czxid is the token, sessions and loss, what is not offered |
//! | `docs/fencing-postgres.md` | fenced writes on PostgreSQL, the helpers, advisory locks |
//! | `docs/mysql.md` | fenced writes on MariaDB and MySQL: the statements and why, isolation levels, TLS |
//! | `docs/security.md` | TLS and mutual TLS, least-privilege users, what each mistake says |
//! | `docs/features.md` | the cargo features and what each compiles |
//! | `docs/run.md` | `fencelock run`: a command under a lock |
//! | `docs/operating.md` | metrics, `fencelock locks` |
//! | `docs/bench.md` | `fencelock bench` and its measured tables |
//! | `docs/chaos.md` | `fencelock chaos`: the failure scenarios, the fault soak |
//! | `docs/testing.md` | the test harness (`testkit`), the container tests |
//! | `docs/server-versions.md` | the server versions CI runs |
//! | `docs/roadmap.md` | what is not done yet |
//!
//! Every Rust snippet of the README and the guide compiles as a doctest.
#![warn(missing_docs)]
// Without a lock backend only the core types remain, and the backends' shared parts are
// unused (`mysql` alone is storage: no lock).
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
#[cfg(feature = "etcd")]
mod grpc_transport;
mod holder;
// The lease deadline of the lease-based backends, and of the PostgreSQL heartbeat.
#[cfg(any(
    feature = "etcd",
    feature = "redis",
    feature = "zookeeper",
    feature = "postgres"
))]
mod lease_clock;
mod loss;
pub mod metrics;
mod multi;
mod name;
mod operate;
mod options;
#[cfg(any(feature = "etcd", feature = "redis"))]
mod retry;
mod scoped;
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
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
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
pub use holder::{HolderInfo, MAX_LABEL_LEN};
pub use loss::LossReason;
pub use multi::{MAX_LOCKS, MultiGuard, lock_all, try_lock_all};
pub use name::{MAX_NAME_LEN, validate_name};
pub use operate::{BreakOutcome, TokenCheck};
pub use options::{LockOptions, MAX_TTL};
pub use tls::{Pem, TlsConfig};
pub use token::FencingToken;

// The examples of the README and of every page of the guide compile as doctests (one
// line per page: tests/docs.rs checks that every page under docs/ has one).
#[cfg(doctest)]
mod doctests {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/README.md")]
    struct GuideIndex;
    #[doc = include_str!("../docs/bench.md")]
    struct GuideBench;
    #[doc = include_str!("../docs/chaos.md")]
    struct GuideChaos;
    #[doc = include_str!("../docs/etcd.md")]
    struct GuideEtcd;
    #[doc = include_str!("../docs/features.md")]
    struct GuideFeatures;
    #[doc = include_str!("../docs/fencing-postgres.md")]
    struct GuideFencingPostgres;
    #[doc = include_str!("../docs/mysql.md")]
    struct GuideMysql;
    #[doc = include_str!("../docs/operating.md")]
    struct GuideOperating;
    #[doc = include_str!("../docs/zookeeper.md")]
    struct GuideZookeeper;
    #[doc = include_str!("../docs/primitives.md")]
    struct GuidePrimitives;
    #[doc = include_str!("../docs/redis.md")]
    struct GuideRedis;
    #[doc = include_str!("../docs/roadmap.md")]
    struct GuideRoadmap;
    #[doc = include_str!("../docs/run.md")]
    struct GuideRun;
    #[doc = include_str!("../docs/security.md")]
    struct GuideSecurity;
    #[doc = include_str!("../docs/server-versions.md")]
    struct GuideServerVersions;
    #[doc = include_str!("../docs/testing.md")]
    struct GuideTesting;
}
