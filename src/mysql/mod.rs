//! Fencing tokens in MariaDB and MySQL (InnoDB), and the database-first alternatives.
//!
//! - [`Fence`]: a fence row per resource holding the newest token seen; a fenced write
//!   passes it and runs the caller's statements in the same transaction, or fails with
//!   [`FenceError::Stale`] having applied nothing.
//! - [`TokenColumn`]: the article's single-statement form, the token kept in the data row.
//! - [`IdempotencyKeys`]: first request versus duplicate, by a unique key.
//! - [`VersionColumn`]: optimistic compare-and-set on a version column.
//! - [`connect`]: a client for these helpers, plaintext or over TLS (rustls).
//!
//! The helpers take mysql_async connections and transactions; schema is created only by
//! the explicit `ensure_schema` calls, never by a write. The guide is `docs/mysql.md`.
//!
//! # Which statements give the guarantee on InnoDB
//!
//! The promise: a write carrying a token older than one the storage has already seen is
//! refused, and the refusal is atomic with the write (no newer token can commit between
//! the check and the write), under REPEATABLE READ (InnoDB's default) and READ
//! COMMITTED alike. Two InnoDB facts carry it:
//!
//! - `UPDATE`, `INSERT ... ON DUPLICATE KEY UPDATE` and locking reads (`FOR UPDATE`,
//!   `LOCK IN SHARE MODE`) see the **latest committed** row version and lock it, whatever
//!   the isolation level; only plain `SELECT`s read a snapshot. Under READ COMMITTED an
//!   `UPDATE` may first look at a locked row's last committed version
//!   ("semi-consistent read"), but re-reads and re-evaluates its `WHERE` once it has the
//!   lock; it skips a row without waiting only when that committed version already
//!   fails the guard, and committed tokens only grow, so that skip is right.
//! - A row lock taken in a transaction is held until it commits or rolls back.
//!
//! [`Fence`] therefore runs, in the caller's transaction: an upsert that makes the fence
//! row exist and takes its exclusive lock (`INSERT ... ON DUPLICATE KEY UPDATE resource
//! = resource`, which changes no token), then the guarded `UPDATE ... WHERE token <= ?`,
//! whose "rows affected" says whether the guard passed. The caller's statements follow
//! while the row stays locked, so every other fenced writer of the resource waits, and
//! then sees the committed token. Starting with the upsert (not the `UPDATE`) means two
//! first writers of a new resource queue on its row instead of deadlocking on REPEATABLE
//! READ's gap locks.
//!
//! `INSERT ... ON DUPLICATE KEY UPDATE token = IF(token <= ?, ?, token)` is **not** enough
//! by itself: when the guard fails it changes nothing and still succeeds, and its "rows
//! affected" (1 for an insert, 2 for a change, 0 for no change, but 1 under
//! `CLIENT_FOUND_ROWS`) cannot tell a refusal from a first insert on every connection, so
//! the write that follows would run anyway.
//!
//! "Rows affected" itself depends on `CLIENT_FOUND_ROWS` (changed rows by default,
//! matched rows with it). Every guarded statement here changes a column on each row it
//! matches (a write counter, a version, a strictly newer token), so the two counts agree
//! and the helpers work on any connection.
//!
//! Under REPEATABLE READ a transaction's plain `SELECT`s see the snapshot taken at its
//! first plain `SELECT`. Pass the fence first (as [`Fence::begin`] does): the snapshot is
//! then taken after the previous holder committed.

mod abandoned;
mod capacity;
mod connect;
mod error;
mod fence;
mod idempotency;
mod ident;
mod rows;
mod single_statement;
mod version_cas;

pub use connect::connect;
pub use error::FenceError;
pub use fence::{Fence, FenceMode, FencedTransaction};
pub use idempotency::{Claim, IdempotencyKeys};
pub use single_statement::TokenColumn;
pub use version_cas::VersionColumn;
