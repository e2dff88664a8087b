//! Distributed locks that stay correct when the world misbehaves.
//!
//! A distributed lock cannot by itself guarantee mutual exclusion: a holder can pause past
//! its lease, a network can split. What it *can* guarantee is that every grant carries a
//! [`FencingToken`] larger than every earlier grant's, so that storage can refuse the writes
//! of a holder that lost the lock without knowing it. The etcd backend uses the lock key's
//! create revision as that token: assigned by the Raft log, never reused, never lost on
//! leader failover.
//!
//! Start with [`etcd::EtcdLocker`], which implements the backend-neutral [`LockBackend`].
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod error;
mod lease_clock;
mod loss;
mod name;
mod options;
mod tls;
mod token;

pub mod etcd;
pub mod postgres;
pub mod redis;
#[cfg(feature = "testkit")]
pub mod testkit;

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
