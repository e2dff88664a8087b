//! One server's part of a renewal round: every lock's renewal, in script calls of
//! [`RENEW_CHUNK`] locks, at most [`WINDOW`] of them unanswered at a time.
//!
//! Not one pipeline of every chunk, as before. The answer to a pipeline comes once the
//! server has run all of it, so the renewal's answer wait (at most 1 s) bounded the time
//! of a whole round, however many locks it carried. A round that took longer was given
//! up and sent again whole, behind the first on the same connection, which the server
//! still ran: each attempt added a round's work to a server (or a link) that already
//! could not answer one in time, and no attempt was ever answered. A bench run lost
//! Redlock's 100,000 held locks so, the three masters busy only with renewals
//! (`tests/redis/renewal_slow_link.rs`: 10,000 locks over a link that carries a round in
//! twice the wait).
//!
//! With a window, the wait bounds the time from one answer to the next: a round takes
//! as long as the server and the link need to carry it, and a server that stops
//! answering is still given up within the wait. An attempt given up leaves at most
//! [`WINDOW`] calls unanswered. If the server was answering until then, the next attempt
//! there waits for its first answer as much longer as those calls took at the pace it
//! was answering ([`NodeRenewal::ahead`]): they may still be ahead of it, and a retry
//! that timed out behind them would leave its own (a link slow enough would then fail
//! every retry). A server that answered nothing gets no more than the wait: its
//! connection is likely dead, and the retry must find out soon, to go on a new one.
//!
//! The window keeps the server busy: a chunk costs it about a millisecond to run, more
//! than a loopback or LAN round trip (at a 50 ms round trip, 4 chunks carry 80,000
//! renewals a second). Its limit: redis-rs times each call from when it is queued, so a
//! server or link taking a quarter of the request timeout for one chunk (about 0.5 s
//! for 1,000 renewals at the default 2 s) times out the window's last call.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::stream::FuturesOrdered;
use futures_util::{FutureExt, StreamExt};
use redis::aio::ConnectionManager;
use tokio::time::Instant;

use super::node::{Node, millis};
use super::script_call::ScriptCall;
use super::scripts;
use crate::LockError;
use crate::lease_clock::{Clock, ClockInstant};

/// How many locks one renewal script call covers.
pub(crate) const RENEW_CHUNK: usize = 1000;

/// How many of a round's script calls may go unanswered at a time, per server.
const WINDOW: usize = 4;

/// A lock to renew: its key, its owner value, its TTL.
pub(crate) type Renewing<'a> = (&'a str, &'a str, Duration);

/// What a round's calls share over its servers.
#[derive(Debug, Default)]
pub(crate) struct RoundProgress {
    /// Set when no more calls are to be sent (the next round is due).
    pub(crate) stop: AtomicBool,
    /// How many of the round's locks have been sent to at least one server.
    pub(crate) sent: AtomicUsize,
}

/// How one server's part of a round ended (its answers went to the round as they came).
#[derive(Debug)]
pub(crate) struct NodeRenewal {
    /// Why it ended before every lock was answered, if it failed (not if it was stopped).
    pub(crate) failure: Option<LockError>,
    /// How long the calls it left unanswered may still take, at the pace the server was
    /// answering them: they may be ahead of what is sent to it next. Zero if it answered
    /// none (a silent server) or left none.
    pub(crate) ahead: Duration,
}

impl Node {
    /// Renews `locks` on this server: one script call per chunk of [`RENEW_CHUNK`],
    /// [`WINDOW`] unanswered at most. Stops at the first call that fails, or once no
    /// answer has come for `wait` (for the first one: plus `ahead`, what the last
    /// attempt's calls left unanswered may still take); the server's connection is then
    /// checked, as for any request unanswered (`command_conn.rs`). Once the round's
    /// `stop` is set it sends no more calls, and ends when those in flight are answered.
    /// Each call's answers go to `answered` as they come, with the index of the first
    /// lock they are for (`true`: renewed) and when the call was sent (no earlier than
    /// the server could have run it).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped, the calls in flight may still be run by the server, which
    /// only extends locks that are still ours.
    pub(crate) async fn renew(
        &self,
        locks: &[Renewing<'_>],
        wait: Duration,
        ahead: Duration,
        round: &RoundProgress,
        mut answered: impl FnMut(usize, &[bool], ClockInstant),
    ) -> NodeRenewal {
        let began = Instant::now();
        let mut last_answer = began;
        let conn = self.connection();
        let mut chunks = locks.chunks(RENEW_CHUNK);
        let mut in_flight = FuturesOrdered::new();
        let (mut first, mut sent) = (0, 0);
        let mut next_wait = wait + ahead;
        let mut calls_answered = 0u32;
        let failure = loop {
            while in_flight.len() < WINDOW && !round.stop.load(Ordering::Acquire) {
                let Some(chunk) = chunks.next() else { break };
                // Read before the call is made: it is sent when first polled, after this.
                let at = Clock::BOOT.now();
                in_flight.push_back(self.renew_chunk(conn.clone(), chunk).map(move |r| (at, r)));
                sent += chunk.len();
                round.sent.fetch_max(sent, Ordering::AcqRel);
            }
            match tokio::time::timeout(next_wait, in_flight.next()).await {
                Ok(None) => break None,
                Ok(Some((at, Ok(renewed)))) => {
                    answered(first, &renewed, at);
                    first += renewed.len();
                    calls_answered += 1;
                    last_answer = Instant::now();
                }
                Ok(Some((_, Err(err)))) => break Some(err),
                Err(_) => {
                    // Given up before the connection's own timeout could tell.
                    self.unanswered();
                    break Some(LockError::Timeout {
                        backend: self.backend,
                        operation: "renew",
                        lock: None,
                        after: next_wait,
                    });
                }
            }
            next_wait = wait;
        };
        let ahead = match (calls_answered, failure.is_some()) {
            (0, _) | (_, false) => Duration::ZERO,
            (answered, true) => {
                // The pace of its answers, not counting the wait after the last.
                let pace = last_answer.saturating_duration_since(began) / answered;
                pace.saturating_mul(u32::try_from(in_flight.len()).unwrap_or(u32::MAX))
            }
        };
        NodeRenewal { failure, ahead }
    }

    /// One script call: per lock, whether it was still ours (and is renewed).
    async fn renew_chunk(
        &self,
        mut conn: ConnectionManager,
        chunk: &[Renewing<'_>],
    ) -> Result<Vec<bool>, LockError> {
        let keys: Vec<&str> = chunk.iter().map(|(key, ..)| *key).collect();
        let mut call = ScriptCall::new(&scripts::RENEW, &keys, 2 * chunk.len());
        for (_, owner, ttl) in chunk {
            call.arg(*owner).arg(millis(*ttl));
        }
        // A server that lost its scripts (restart, failover, SCRIPT FLUSH) answers
        // `NOSCRIPT`, and the call loads the script and is sent again (`script_call.rs`).
        let replies: Vec<i64> = self.call("renew", None, call.invoke(&mut conn)).await?;
        if replies.len() != chunk.len() {
            return Err(LockError::Backend {
                backend: self.backend,
                operation: "renew",
                lock: None,
                source: format!(
                    "{} answers to a renewal of {} locks",
                    replies.len(),
                    chunk.len()
                )
                .into(),
            });
        }
        Ok(replies.into_iter().map(|renewed| renewed == 1).collect())
    }
}
