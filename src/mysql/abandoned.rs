//! Connections left owing an answer by a fence call given up mid-statement, and the proof
//! that lets one be used again.
//!
//! mysql_async marks a connection disconnected while a command waits for its answer and
//! clears the mark when *any* later command has read an answer: the first command after
//! an abandoned statement reads that statement's answer as its own and clears the mark,
//! and every later answer is then one behind (a fence `UPDATE` could read the answer of
//! the statement before it and pass with a stale token). So a fence call that is dropped
//! before it finished marks its connection here, in a mark of our own that no command
//! clears, and the fence refuses a marked connection until a query whose answer cannot
//! be anyone else's (`SELECT <random number>`) comes back with that number: then the
//! answers are in step again. One that lags keeps lagging (each proof leaves its own
//! answer behind), so it stays refused until it is dropped.
//!
//! A connection is named by the address of mysql_async's boxed state (stable while the
//! `Conn` lives, wherever the `Conn` is moved) and the server's connection id (which
//! changes on a reconnection, whose fresh stream owes nothing). An address reused by a
//! later connection with the same id costs that connection one proof, which it passes.
//! The mark of a connection dropped unproven stays (16 bytes each): mysql_async gives no
//! hook at a connection's drop, and forgetting a mark early would trust a lagging one.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Transaction};

use super::FenceError;

/// The connections marked; few, and each only until it is proven in step or dropped.
static MARKED: Mutex<Vec<Key>> = Mutex::new(Vec::new());

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key {
    state: usize,
    id: u32,
}

impl Key {
    fn of(conn: &Conn) -> Self {
        Self {
            state: std::ptr::from_ref(conn.opts()) as usize,
            id: conn.id(),
        }
    }
}

fn marked() -> std::sync::MutexGuard<'static, Vec<Key>> {
    MARKED.lock().unwrap_or_else(PoisonError::into_inner)
}

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

/// Held across a fence call's statements: dropped before [`done`](Self::done) (the
/// call's future dropped), it marks the connection.
pub(super) struct InFlight {
    key: Key,
    armed: bool,
}

impl InFlight {
    pub(super) fn on(conn: &Conn) -> Self {
        Self {
            key: Key::of(conn),
            armed: true,
        }
    }

    /// The call ran to its end (with an answer, or an error mysql_async read in full).
    pub(super) fn done(mut self) {
        self.armed = false;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.armed {
            let mut marked = marked();
            if !marked.contains(&self.key) {
                marked.push(self.key);
            }
        }
    }
}

/// Refuses a connection that may owe the answer to an abandoned statement
/// ([`FenceError::ConnectionUnusable`]): one mysql_async still marks (nothing is sent on
/// it: its next command would read that answer), and one a fence call abandoned unless a
/// proof query shows its answers in step (one round trip, on such a connection only).
pub(super) async fn usable(link: &mut impl Link) -> Result<(), FenceError> {
    let conn = link.conn();
    if conn.is_disconnected() {
        return Err(FenceError::ConnectionUnusable);
    }
    let key = Key::of(conn);
    if !marked().contains(&key) {
        return Ok(());
    }
    let nonce = nonce();
    // Dropped meanwhile, the connection simply stays marked.
    let answer = link.query_first::<Row, _>(format!("SELECT {nonce}")).await;
    let in_step = matches!(
        answer,
        Ok(Some(row)) if row.len() == 1
            && row.as_ref(0).cloned().and_then(|v| mysql_async::from_value_opt::<u64>(v).ok())
                == Some(nonce)
    );
    if !in_step {
        tracing::debug!(id = key.id, "a connection owing an answer failed its proof");
        return Err(FenceError::ConnectionUnusable);
    }
    marked().retain(|k| *k != key);
    Ok(())
}

/// A number no statement of the fence answers with by chance: random (the standard
/// library's per-process random keys, hashed with a counter), below 2^62 so that every
/// server types it as a plain BIGINT.
fn nonce() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    RandomState::new().hash_one(n) >> 2
}
