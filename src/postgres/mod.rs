//! Fencing tokens in PostgreSQL, the database-first alternatives, and advisory locks.
//!
//! - [`Fence`]: a fence row per resource holding the newest token seen; a fenced write
//!   passes it and runs the caller's statements in the same transaction, or fails with
//!   [`FenceError::Stale`] having applied nothing.
//! - [`TokenColumn`]: the article's single-statement form, the token kept in the data row.
//! - [`IdempotencyKeys`]: first request versus duplicate, by a unique constraint.
//! - [`VersionColumn`]: optimistic compare-and-set on a version column.
//! - [`PgAdvisoryLocker`]: advisory locks behind the common [`LockBackend`](crate::LockBackend).
//!
//! - [`connect`]: a client for these helpers, plaintext or over TLS (rustls).
//!
//! Schema is created only by the explicit `ensure_schema` calls, never by a write.

mod advisory;
mod cancel;
mod connect;
mod error;
mod fence;
mod heartbeat;
mod idempotency;
mod ident;
mod single_statement;
mod version_cas;

pub use advisory::{MIN_TTL, PgAdvisoryGuard, PgAdvisoryLocker};
pub use connect::connect;
pub use error::FenceError;
pub use fence::{CommitStatus, Fence, FenceMode, FencedTransaction};
pub use idempotency::{Claim, IdempotencyKeys};
pub use single_statement::TokenColumn;
pub use version_cas::VersionColumn;
