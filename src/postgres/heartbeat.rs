//! The heartbeat of a held advisory lock: a connection that dies without a word (a
//! failover or a moved address with no RST, a cable, a frozen VM) must not leave the
//! guard saying "held" while the server may have handed the lock to someone else.
//!
//! A session advisory lock lives as long as its server session, and the server ends the
//! session once *it* decides the connection is dead: a TCP keepalive that goes
//! unanswered, data of its own left unacknowledged for `tcp_user_timeout`, an
//! `idle_session_timeout`. The lock's connection therefore sets these for its own session
//! ([`session_settings`]) so that the server's detection cannot end the session sooner
//! than `TTL` after the last packet it received from us; and the guard sends a cheap query
//! every `TTL / 3`, trusting the lock until the *send time* of the last answered one plus
//! `TTL` (on the boot-time clock, [`LeaseClock`]). The server received that query after we
//! sent it, so its own detection comes later than our deadline: `lost()` fires first.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::{AbortHandle, JoinHandle};
use tokio_postgres::{Client, Config};

use crate::LossReason;
use crate::lease_clock::{ClockInstant, LeaseClock};
use crate::loss::LossNotifier;

/// The heartbeat's query: which server session answers (through a pooler that moves
/// statements between sessions, not always ours).
pub(super) const BEAT: &str = "SELECT pg_backend_pid()";

/// How many keepalive probes the server sends before it gives up on the connection.
const PROBES: u64 = 3;

/// The server-side settings of a lock connection's session for locks of `ttl`:
/// `(name, value)`, in the units PostgreSQL takes (seconds; milliseconds for
/// `tcp_user_timeout`).
///
/// - `tcp_keepalives_idle` at least `ttl` (whole seconds, rounded up), then
///   [`PROBES`] probes `tcp_keepalives_interval` apart (a tenth of `ttl`, at least 1 s):
///   the server notices a silent peer no sooner than `ttl` plus the probes after the last
///   packet it received, and about that soon (instead of the system's two hours).
/// - `tcp_user_timeout` as long: data of the server's own left unacknowledged (an
///   answer to a heartbeat the network ate) ends the session no sooner either.
/// - `idle_session_timeout = 0`: a server-wide idle timeout shorter than the heartbeat's
///   period would end a healthy session, and one shorter than `ttl` would end a silent
///   one before the guard's deadline.
///
/// Ignored on a Unix socket (which cannot die silently); `tcp_user_timeout` and
/// `idle_session_timeout` are skipped on servers older than 12 and 14 that lack them.
pub(super) fn session_settings(ttl: Duration) -> [(&'static str, u64); 5] {
    let idle = ttl.as_millis().div_ceil(1000).max(1);
    let idle = u64::try_from(idle).unwrap_or(u64::MAX);
    let interval = (idle / 10).max(1);
    let gives_up = idle.saturating_add(interval.saturating_mul(PROBES));
    [
        ("tcp_keepalives_idle", idle),
        ("tcp_keepalives_interval", interval),
        ("tcp_keepalives_count", PROBES),
        ("tcp_user_timeout", gives_up.saturating_mul(1000)),
        ("idle_session_timeout", 0),
    ]
}

/// The statement that applies [`session_settings`] to the session, skipping the ones this
/// server does not have.
pub(super) fn settings_sql(ttl: Duration) -> String {
    let values: Vec<String> = session_settings(ttl)
        .iter()
        .map(|(name, value)| format!("('{name}', '{value}')"))
        .collect();
    format!(
        "SELECT count(set_config(name, setting, false)) FROM (VALUES {}) AS s (name, setting) \
         WHERE name IN (SELECT name FROM pg_settings)",
        values.join(", ")
    )
}

/// Client-side TCP settings of the lock connections, where the connection string sets
/// none: keepalive probes after 10 s idle, 5 s apart, 3 of them; and 30 s at most for
/// data of ours to go unacknowledged. Without them (tokio-postgres keeps the system's
/// 2 h idle and 15 min of retransmissions) a pooled connection that died silently would
/// be handed out again, and a lock statement sent on it, or a wait for a lock on one that
/// dies, would hang that long. A held lock does not rely on them: its heartbeat's deadline
/// comes first for a TTL under 25 s, and they can only end a longer-lived silent
/// connection sooner (a loss reported early, never late).
pub(super) fn client_keepalives(config: &mut Config) {
    if config.get_keepalives()
        && config.get_keepalives_interval().is_none()
        && config.get_keepalives_retries().is_none()
        && config.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60)
    {
        config
            .keepalives_idle(Duration::from_secs(10))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(Duration::from_secs(30));
    }
}

/// A held lock's heartbeat: its deadline, and the task that moves it. Dropping it stops
/// the task.
#[derive(Debug)]
pub(super) struct Heartbeat {
    lease: Arc<LeaseClock>,
    task: JoinHandle<()>,
}

/// What the heartbeat's task works with.
pub(super) struct Beat {
    /// The lock's connection.
    pub(super) client: Arc<Client>,
    /// The server session that holds the lock.
    pub(super) pid: i32,
    pub(super) ttl: Duration,
    /// Marks the connection's loss for every guard on it.
    pub(super) notifier: Arc<LossNotifier>,
    /// The connection's task: aborted (the socket closed) once the lock is given up, so
    /// that the server frees it as soon as it hears of it.
    pub(super) connection: AbortHandle,
}

impl Heartbeat {
    /// Starts beating for a lock whose last proof of a live session is a statement sent
    /// at `sent` (on `lease`'s clock, which `lease` is created with).
    pub(super) fn start(beat: Beat, lease: LeaseClock, sent: ClockInstant) -> Self {
        let lease = Arc::new(lease);
        let task = tokio::spawn(beat.run(lease.clone(), sent));
        Self { lease, task }
    }

    /// How long the lock may still be trusted (zero once the deadline has passed).
    pub(super) fn remaining(&self) -> Duration {
        self.lease.remaining()
    }

    /// Whether the deadline has passed: the server may have freed the lock.
    pub(super) fn has_passed(&self) -> bool {
        self.lease.has_passed()
    }

    /// Resolves once the deadline has passed (following it as heartbeats move it), late
    /// by a suspend: a fallback beside the task, which reports on time
    /// ([`LeaseClock::passed_eventually`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads the clock.
    pub(super) async fn passed_eventually(&self) {
        self.lease.passed_eventually().await;
    }

    /// Stops the task without a word, as a panic in it would.
    pub(super) fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Beat {
    async fn run(self, lease: Arc<LeaseClock>, mut sent: ClockInstant) {
        let reason = tokio::select! {
            reason = self.beats(&lease, &mut sent) => reason,
            () = lease.passed() => LossReason::Expired,
        };
        tracing::warn!(
            backend = "postgres",
            pid = self.pid,
            %reason,
            "advisory lock connection given up"
        );
        self.notifier.mark(reason);
        self.connection.abort();
    }

    /// Sends a heartbeat a third of the TTL after the previous one was sent, one at a
    /// time (more would only queue behind an unanswered one); returns why it stopped.
    async fn beats(&self, lease: &LeaseClock, sent: &mut ClockInstant) -> LossReason {
        let period = self.ttl / 3;
        loop {
            let next = period.saturating_sub(lease.now().saturating_duration_since(*sent));
            tokio::time::sleep(next).await;
            *sent = lease.now();
            match self.client.query_typed_one(BEAT, &[]).await {
                Ok(row) => match row.try_get::<_, i32>(0) {
                    Ok(pid) if pid == self.pid => {
                        if !lease.extend_to(*sent + self.ttl) {
                            return LossReason::Expired;
                        }
                    }
                    // Another session answered: a pooler moves statements between server
                    // sessions, and ours (with the lock) is out of reach.
                    Ok(_) | Err(_) => return LossReason::Disconnected,
                },
                // The connection failed: its task marks the loss too.
                Err(err) if err.is_closed() || err.code().is_none() => {
                    return LossReason::Disconnected;
                }
                // A server error on a live session (a cancel by an operator): no proof
                // either way; the deadline decides unless the next beat is answered.
                Err(err) => tracing::debug!(%err, "heartbeat failed on the server"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setting(ttl: Duration, name: &str) -> u64 {
        session_settings(ttl)
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
            .expect(name)
    }

    #[test]
    fn the_server_gives_up_on_a_silent_peer_no_sooner_than_the_ttl() {
        for ttl in [
            Duration::from_secs(1),
            Duration::from_millis(1500),
            Duration::from_secs(10),
            Duration::from_secs(86_400),
        ] {
            let idle = setting(ttl, "tcp_keepalives_idle");
            let probes =
                setting(ttl, "tcp_keepalives_interval") * setting(ttl, "tcp_keepalives_count");
            assert!(Duration::from_secs(idle) >= ttl, "{ttl:?}");
            assert!(probes >= 3, "{ttl:?}: at least three probes a second apart");
            let user_timeout = Duration::from_millis(setting(ttl, "tcp_user_timeout"));
            assert_eq!(user_timeout, Duration::from_secs(idle + probes), "{ttl:?}");
            assert_eq!(setting(ttl, "idle_session_timeout"), 0);
        }
        // Ten seconds: the lock is freed about 13 s after the last packet, not 2 h.
        assert_eq!(setting(Duration::from_secs(10), "tcp_user_timeout"), 13_000);
    }

    #[test]
    fn the_statement_names_each_setting_once() {
        let sql = settings_sql(Duration::from_secs(10));
        for (name, value) in session_settings(Duration::from_secs(10)) {
            assert!(sql.contains(&format!("('{name}', '{value}')")), "{sql}");
        }
    }
}
