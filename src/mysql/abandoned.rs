//! Connections that may be one answer behind, and how the fence refuses them.
//!
//! mysql_async marks a connection disconnected while a command waits for its answer and
//! clears the mark when *any* later command has read an answer: the first command after
//! an abandoned statement (a caller's `timeout` around any statement: its own, a fence
//! call, a helper of this module) reads that statement's answer as its own and clears
//! the mark, and every later answer is then one behind. No mark of the client's can
//! follow every statement a caller may abandon, so the fence does not try to remember
//! abandonments: it takes every decision (a fence passed, a stale token, a commit) only
//! on an answer that carries a number the statement just sent chose at random
//! ([`nonce`]). An answer one behind never carries it, so a lagging connection is
//! refused ([`FenceError::ConnectionUnusable`]) whatever was abandoned on it, and
//! [`condemn`]ed so that a pool does not hand it out again.

use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Waker};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Transaction};

use super::FenceError;

/// What a fence call sends on: a connection, or a transaction on one.
pub(super) trait Link: Queryable {
    fn conn(&self) -> &Conn;
}

impl Link for Conn {
    fn conn(&self) -> &Conn {
        self
    }
}

impl Link for Transaction<'_> {
    fn conn(&self) -> &Conn {
        self
    }
}

/// Refuses, without sending anything, a connection mysql_async itself knows to owe an
/// answer (its next command would read that answer as its own). A connection that owes
/// one unknown to mysql_async is caught by the nonce in the deciding answer instead.
pub(super) fn usable(link: &impl Link) -> Result<(), FenceError> {
    if link.conn().is_disconnected() {
        return Err(FenceError::ConnectionUnusable);
    }
    Ok(())
}

/// A connection whose answers were found out of step: refused, and made one that
/// mysql_async's pool discards instead of handing out again (its recycler drops a
/// returned `Conn` whose `is_disconnected()` is true; outside a pool, such a `Conn` is
/// dropped by closing its socket, and the server rolls back what it had open).
///
/// mysql_async sets that flag when a command starts and clears it when the command has
/// read an answer, so a no-op command polled once and dropped while it waits leaves it
/// set. On a lagging connection an answer may already be waiting in the socket, which
/// the first poll reads at once: then try again (each try sends a `DO 0`, harmless on a
/// connection that is never trusted again).
pub(super) fn condemn(link: &mut impl Link) -> FenceError {
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..CONDEMN_TRIES {
        if link.conn().is_disconnected() {
            break;
        }
        let mut sent = std::pin::pin!(link.query_drop("DO 0"));
        if sent.as_mut().poll(&mut cx).is_pending() {
            break;
        }
    }
    tracing::debug!(
        id = link.conn().id(),
        discarded = link.conn().is_disconnected(),
        "a connection whose answers lag was refused"
    );
    FenceError::ConnectionUnusable
}

/// [`condemn`] for a caller's `impl Queryable` (a `Conn` or a `Transaction`, whose
/// flag cannot be read through the trait): stops at the first `DO 0` that waits, which
/// on a connection with no unread result (the fence reads every result in full) is one
/// that has set the flag and sent its command.
pub(super) fn condemn_queryable(q: &mut impl Queryable) -> FenceError {
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..CONDEMN_TRIES {
        let mut sent = std::pin::pin!(q.query_drop("DO 0"));
        if sent.as_mut().poll(&mut cx).is_pending() {
            break;
        }
    }
    tracing::debug!("a connection whose answers lag was refused");
    FenceError::ConnectionUnusable
}

/// Whether the connection answers in step now: `SELECT <nonce>` comes back with that
/// nonce. Asked after an answer that carries no nonce of its own (a server error, an
/// insert into a table whose AUTO_INCREMENT id the server reports instead of
/// `LAST_INSERT_ID(expr)`'s value): if the connection is in step after it, that answer was
/// the statement's own; if it lagged, this one reads the statement's real answer instead
/// and never the nonce. One round trip, on those paths only.
pub(super) async fn in_step(q: &mut impl Queryable) -> bool {
    let proof = nonce();
    // A `Row`, checked by hand: mysql_async's conversion to `u64` panics on a row of
    // another width (an earlier statement's answer read as this one's).
    let answered: Result<Option<mysql_async::Row>, _> = q.exec_first("SELECT ?", (proof,)).await;
    matches!(answered, Ok(Some(row)) if row.len() == 1
        && row.as_ref(0).cloned().and_then(|v| mysql_async::from_value_opt::<u64>(v).ok())
            == Some(proof))
}

/// A server error answered to a helper's statement that carries no nonce: the error
/// itself if the connection proves in step after it ([`in_step`]), else refused (it may
/// be an earlier statement's error, the helper's own outcome unknown).
pub(super) async fn proven_error(q: &mut impl Queryable, err: mysql_async::Error) -> FenceError {
    if matches!(err, mysql_async::Error::Server(_)) && !in_step(q).await {
        return condemn_queryable(q);
    }
    err.into()
}

/// How many `DO 0`s [`condemn`] sends at most before leaving the connection as it is
/// (still refused by every fence call, which checks each answer).
const CONDEMN_TRIES: usize = 8;

/// A number no earlier statement answers with by chance: random (the standard library's
/// per-process random keys, hashed with a counter), at least 1 (`LAST_INSERT_ID()`'s
/// "none" is 0) and below 2^62 (every server types it as a plain BIGINT).
pub(super) fn nonce() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    (RandomState::new().hash_one(n) >> 2).max(1)
}
