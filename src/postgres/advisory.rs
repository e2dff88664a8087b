//! PostgreSQL advisory locks behind the common lock trait: the third backend.
//!
//! Each held lock owns a connection (session-level `pg_advisory_lock`): the lock lives
//! exactly as long as that connection's server session, so a crashed client frees it at
//! once, and a dropped connection is reported through [`LockGuard::lost`]. The token comes
//! from a sequence, taken in the same statement as the lock. The TTL bounds how long a
//! connection that died silently can go unnoticed (`heartbeat.rs`): the guard is trusted
//! until the send time of its last answered heartbeat plus the TTL, and the server is
//! told not to give up on the session sooner. The renewal option does not apply: the
//! heartbeat always runs, and a lock lives as long as its session.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Config};

use super::cancel::{self, Cancel, Target};
use super::connect::{Connector, connect_timeout, map_error, parse, spawn_connection};
use super::heartbeat::{BEAT, Beat, Heartbeat, client_keepalives, settings_sql};
use super::ident::Ident;
use tracing::Instrument;

use crate::lease_clock::{Clock, ClockInstant, LeaseClock};
use crate::loss::{LossNotifier, LossWatch, loss_channel};
use crate::metrics::{self, Holding, Release};
use crate::{
    Backend, FencingToken, LockBackend, LockError, LockGuard, LockOptions, LossReason,
    ReleaseOutcome, TlsConfig, validate_name,
};

/// The token sequence, schema-qualified: roles with different `search_path`s must draw
/// from the same one (two sequences would hand out the same tokens).
const SEQUENCE: &str = "\"public\".\"fencelock_advisory_tokens\"";
/// The shortest TTL: the server's keepalive settings are whole seconds.
pub const MIN_TTL: Duration = Duration::from_secs(1);
/// The lock key is a 64-bit hash of the name, computed by the server.
const KEY: &str = "hashtextextended($1, 0)";
const MAX_IDLE: usize = 64;

/// Advisory locks in PostgreSQL, one pooled connection per held lock.
///
/// A held lock's connection is proved alive every third of the TTL; the guard trusts the
/// lock until the send time of the last answered heartbeat plus the TTL, and the server's
/// session is set not to give up on a silent connection sooner (`heartbeat.rs`,
/// `docs/fencing-postgres.md`). Not through a pooler in transaction or statement mode: a
/// session advisory lock needs one server session for its whole life.
///
/// A [wait timeout](LockOptions::with_wait_timeout) bounds the whole `lock` call: taking
/// a connection from the pool, or opening one, counts against it. A wait that is given
/// up (timed out, or its future dropped) cancels its statement as libpq does: it waits
/// until the server has closed the cancel connection (over TLS when the locks use TLS),
/// so the cancel cannot hit a later statement, and only then reuses the connection. A
/// cancel that could not be confirmed (no answer within the `connect_timeout`, or a
/// connection string naming several hosts) closes the connection instead.
///
/// Each connection runs on a task of the runtime that opened it (the first at `connect`,
/// others in `lock` calls), as tokio-postgres's connections do. A runtime that shuts
/// down ends its connections: their locks are reported lost (`Disconnected`) and the pool
/// hands them out no more. A runtime kept but not running (a current-thread runtime
/// outside `block_on`) stalls its connections' statements until the wait timeout: use
/// the locker from a runtime that keeps running, as with any tokio client.
///
/// ```no_run
/// use fencelock::postgres::PgAdvisoryLocker;
/// use fencelock::{LockBackend, LockGuard, LockOptions};
///
/// # async fn run() -> Result<(), fencelock::LockError> {
/// let locks = PgAdvisoryLocker::connect("host=127.0.0.1 user=app dbname=app").await?;
/// locks.ensure_schema().await?; // once: the token sequence, public.fencelock_advisory_tokens
/// let guard = locks.lock("nightly-report", &LockOptions::new()).await?;
/// println!("token {}", guard.token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PgAdvisoryLocker {
    inner: Arc<Inner>,
    /// The token sequence, quoted.
    sequence: Ident,
}

struct Inner {
    config: Config,
    connector: Connector,
    /// Where cancel requests go (`None`: the string names several servers).
    cancel_target: Option<Target>,
    connect_timeout: Duration,
    idle: Mutex<Vec<Conn>>,
}

impl std::fmt::Debug for PgAdvisoryLocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgAdvisoryLocker")
            .field("hosts", &self.inner.config.get_hosts())
            .field("dbname", &self.inner.config.get_dbname())
            .field("sequence", &self.sequence.sql())
            .finish_non_exhaustive()
    }
}

/// One connection and the watch that fires when it closes.
struct Conn {
    /// Shared with the heartbeat of the lock it holds.
    client: Arc<Client>,
    /// The server session (`pg_backend_pid()`), which holds the locks taken on it.
    pid: i32,
    closed: LossWatch,
    notifier: Arc<LossNotifier>,
    /// The connection's task: aborting it closes the connection.
    task: tokio::task::AbortHandle,
    /// The TTL the session's keepalive settings were made for (`heartbeat.rs`).
    tuned_for: Option<Duration>,
}

impl PgAdvisoryLocker {
    /// Connects with a libpq-style string (`host=... user=... dbname=...` or a
    /// `postgresql://` URL), proving it with one connection that is kept for reuse.
    #[tracing::instrument(skip(connection), fields(backend = "postgres"))]
    pub async fn connect(connection: &str) -> Result<Self, LockError> {
        Self::open_with(connection, None).await
    }

    /// [`connect`](Self::connect) over TLS: encrypted, the server's certificate verified
    /// against the configured CA (see [`connect`](super::connect) for the modes).
    #[tracing::instrument(skip(connection, tls), fields(backend = "postgres"))]
    pub async fn connect_with_tls(connection: &str, tls: &TlsConfig) -> Result<Self, LockError> {
        Self::open_with(connection, Some(tls)).await
    }

    async fn open_with(connection: &str, tls: Option<&TlsConfig>) -> Result<Self, LockError> {
        let mut config = parse(connection)?;
        client_keepalives(&mut config);
        let connector = Connector::new(&mut config, tls)?;
        let inner = Arc::new(Inner {
            connect_timeout: connect_timeout(&config),
            cancel_target: Target::of(&config),
            config,
            connector,
            idle: Mutex::default(),
        });
        let first = inner.open().await?;
        inner.put_back(first);
        Ok(Self {
            inner,
            sequence: Ident::trusted(SEQUENCE),
        })
    }

    /// Draws tokens from another sequence (`schema.name`, or `name` resolved by each
    /// connection's `search_path`, which is only safe if every client resolves it the
    /// same way); the default is `public.fencelock_advisory_tokens`. Every client of the
    /// same locks must use the same sequence: tokens from two sequences are not ordered.
    pub fn with_sequence(mut self, sequence: &str) -> Result<Self, LockError> {
        self.sequence = Ident::parse(sequence).map_err(|_| LockError::InvalidConfig {
            backend: Backend::Postgres,
            reason: format!(
                "invalid sequence name {sequence:?}: use letters, digits and '_', optionally \
                 schema-qualified"
            ),
        })?;
        Ok(self)
    }

    /// Creates the token sequence if it does not exist (explicitly, once).
    pub async fn ensure_schema(&self) -> Result<(), LockError> {
        let conn = self.inner.take().await?;
        let created = conn
            .client
            .batch_execute(&format!(
                "CREATE SEQUENCE IF NOT EXISTS {}",
                self.sequence.sql()
            ))
            .await
            .map_err(|err| map_error("ensure schema", None, err));
        self.inner.put_back(conn);
        created
    }

    async fn acquire(
        &self,
        name: &str,
        options: &LockOptions,
        wait: bool,
    ) -> Result<Option<PgAdvisoryGuard>, LockError> {
        let counted = std::time::Instant::now();
        let result = self.acquire_uncounted(name, options, wait).await;
        metrics::acquisition(Backend::Postgres, name, counted, &result);
        result
    }

    async fn acquire_uncounted(
        &self,
        name: &str,
        options: &LockOptions,
        wait: bool,
    ) -> Result<Option<PgAdvisoryGuard>, LockError> {
        validate_name(name)?;
        options.validate(MIN_TTL)?;
        let (reply, answer) = oneshot::channel();
        let task = Acquisition {
            inner: self.inner.clone(),
            name: name.to_owned(),
            deadline: options.wait_timeout().map(|t| Instant::now() + t),
            wait_timeout: options.wait_timeout(),
            ttl: options.ttl(),
            sequence: self.sequence.clone(),
        };
        tokio::spawn(task.run(wait, reply).instrument(tracing::Span::current()));
        answer.await.unwrap_or_else(|_| {
            Err(LockError::Backend {
                backend: Backend::Postgres,
                operation: "acquire",
                lock: Some(name.to_owned()),
                source: "the acquisition task stopped (runtime shutting down?)".into(),
            })
        })
    }
}

impl Inner {
    async fn open(&self) -> Result<Conn, LockError> {
        let (client, connection) = self
            .connector
            .connect(&self.config, self.connect_timeout)
            .await?;
        let (notifier, closed) = loss_channel(Backend::Postgres);
        let notifier = Arc::new(notifier);
        let task = spawn_connection(connection, notifier.clone());
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .and_then(|row| row.try_get(0))
            .map_err(|err| map_error("connect", None, err))?;
        Ok(Conn {
            client: Arc::new(client),
            pid,
            closed,
            notifier,
            task,
            tuned_for: None,
        })
    }

    /// [`take`](Self::take), with the session's keepalive settings made for `ttl`.
    async fn take_for(&self, ttl: Duration) -> Result<Conn, LockError> {
        let mut conn = self.take().await?;
        if conn.tuned_for != Some(ttl) {
            conn.client
                .batch_execute(&settings_sql(ttl))
                .await
                .map_err(|err| map_error("connect", None, err))?;
            conn.tuned_for = Some(ttl);
        }
        Ok(conn)
    }

    /// An idle connection that is still open, or a new one.
    async fn take(&self) -> Result<Conn, LockError> {
        loop {
            let idle = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            match idle {
                Some(conn) if conn.closed.current().is_none() => return Ok(conn),
                Some(_) => continue,
                None => return self.open().await,
            }
        }
    }

    fn put_back(&self, conn: Conn) {
        if conn.closed.current().is_some() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }
}

struct Acquisition {
    inner: Arc<Inner>,
    name: String,
    deadline: Option<Instant>,
    wait_timeout: Option<Duration>,
    ttl: Duration,
    sequence: Ident,
}

type Reply = oneshot::Sender<Result<Option<PgAdvisoryGuard>, LockError>>;

impl Acquisition {
    async fn run(self, wait: bool, mut reply: Reply) {
        // A waiting call's timeout bounds all of it: taking a connection from the pool,
        // or opening one (connect, `pg_backend_pid()`, the session's settings), counts
        // against it.
        let taken = match self.deadline.filter(|_| wait) {
            Some(deadline) => tokio::time::timeout_at(deadline, self.inner.take_for(self.ttl))
                .await
                .unwrap_or_else(|_elapsed| Err(self.timed_out())),
            None => self.inner.take_for(self.ttl).await,
        };
        let conn = match taken {
            Ok(conn) => conn,
            Err(err) => {
                let _ = reply.send(Err(err));
                return;
            }
        };
        let name = self.name.as_str();
        if !wait {
            let sql = format!(
                "SELECT CASE WHEN pg_try_advisory_lock({KEY}) THEN nextval('{}') END",
                self.sequence.sql()
            );
            let sent = Clock::BOOT.now();
            let result = conn
                .client
                .query_typed_one(&sql, &[(&name, Type::TEXT)])
                .await
                .and_then(|row| row.try_get::<_, Option<i64>>(0));
            let outcome = match result {
                Ok(Some(token)) => Ok(Some(self.guard(conn, token, sent).await)),
                Ok(None) => {
                    self.inner.put_back(conn);
                    Ok(None)
                }
                Err(err) => Err(map_error("try_lock", Some(name), err)),
            };
            let _ = reply.send(outcome);
            return;
        }
        // The subquery takes the lock before the outer query draws the token.
        let sql = format!(
            "SELECT nextval('{}') FROM (SELECT pg_advisory_lock({KEY})) AS locked",
            self.sequence.sql()
        );
        let limit = self.inner.connect_timeout;
        let sent = Clock::BOOT.now();
        let (outcome, settled, cancelled) = {
            let cancel = conn.client.cancel_token();
            let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 1] =
                [(&name, Type::TEXT)];
            let query = conn.client.query_typed_one(&sql, &params);
            tokio::pin!(query);
            let outcome = tokio::select! {
                result = &mut query => Waited::Answered(
                    result
                        .and_then(|row| row.try_get::<_, i64>(0))
                        .map_err(|err| map_error("acquire", Some(name), err)),
                ),
                () = sleep_until_opt(self.deadline) => Waited::TimedOut,
                () = reply.closed() => Waited::CallerGone,
            };
            // Given up: the server hands a released lock to its first waiter at once, so
            // it may have granted this query the lock before the cancel reached it, and a
            // session-level advisory lock outlives the cancelled statement. Wait for the
            // statement's end before anything else.
            //
            // The cancel is confirmed (the server closed the cancel connection) before
            // anything else is sent: a cancel signal that reached the backend only after
            // this statement ended would fail the connection's next statement instead.
            let (settled, cancelled) = match outcome {
                Waited::Answered(_) => (true, Cancel::Confirmed),
                Waited::TimedOut | Waited::CallerGone => {
                    // The statement's own end (57014, or the lock granted just before)
                    // comes with the cancel's: both are awaited before the next statement.
                    let (cancelled, ended) = tokio::join!(
                        cancel::cancel(
                            &self.inner.connector,
                            self.inner.cancel_target.as_ref(),
                            &cancel,
                            limit,
                        ),
                        tokio::time::timeout(limit, &mut query),
                    );
                    (ended.is_ok(), cancelled)
                }
            };
            (outcome, settled, cancelled)
        };
        match outcome {
            Waited::Answered(Ok(token)) => {
                let guard = self.guard(conn, token, sent).await;
                // If the caller is gone, the guard comes back and its drop releases.
                let _ = reply.send(Ok(Some(guard)));
            }
            Waited::Answered(Err(err)) => {
                let _ = reply.send(Err(err));
            }
            given_up => {
                // Free whatever this connection holds before answering: the lock is free
                // when the caller hears of the timeout.
                let freed = settled
                    && tokio::time::timeout(
                        limit,
                        conn.client.execute("SELECT pg_advisory_unlock_all()", &[]),
                    )
                    .await
                    .is_ok_and(|done| done.is_ok());
                if freed && cancelled == Cancel::Confirmed {
                    self.inner.put_back(conn);
                } else {
                    // No answer: closing the connection frees the lock once the server
                    // sees it close. An unconfirmed cancel may still arrive: the
                    // connection is not reused either.
                    drop(conn);
                }
                if matches!(given_up, Waited::TimedOut) {
                    let _ = reply.send(Err(self.timed_out()));
                }
            }
        }
    }

    fn timed_out(&self) -> LockError {
        LockError::WaitTimeout {
            name: self.name.clone(),
            waited: self.wait_timeout.unwrap_or_default(),
        }
    }

    /// The guard of a lock granted by a statement sent at `sent`, its heartbeat started.
    async fn guard(self, conn: Conn, token: i64, sent: ClockInstant) -> PgAdvisoryGuard {
        let clock = Clock::BOOT;
        let mut sent = sent;
        if clock.now().saturating_duration_since(sent) > self.ttl / 3 {
            // A grant after a long wait: the statement's send time proves little about
            // the session now (the server may have heard nothing from us since), and a
            // deadline counted from it may already have passed. A heartbeat at once
            // proves the session alive with the lock, and the deadline starts at its
            // send time; unanswered, the guard keeps the statement's deadline (and is
            // lost at once). Bounded by the heartbeat's own deadline, not the
            // statement's: past `beat + ttl` an answer proves nothing any more, while
            // the statement's deadline had passed before the heartbeat was sent whenever
            // the wait lasted a TTL (40f9998 lost every such grant).
            let beat = clock.now();
            let answered =
                tokio::time::timeout(self.ttl, conn.client.query_typed_one(BEAT, &[])).await;
            let pid = answered
                .ok()
                .and_then(|row| row.and_then(|row| row.try_get::<_, i32>(0)).ok());
            if pid == Some(conn.pid) {
                sent = beat;
            }
        }
        let heartbeat = Heartbeat::start(
            Beat {
                client: conn.client.clone(),
                pid: conn.pid,
                ttl: self.ttl,
                notifier: conn.notifier.clone(),
                connection: conn.task.clone(),
            },
            LeaseClock::new(clock, sent + self.ttl),
            sent,
        );
        PgAdvisoryGuard {
            holding: Some(conn.closed.holding()),
            inner: self.inner,
            conn: Some(conn),
            heartbeat: Some(heartbeat),
            name: self.name,
            token: FencingToken::new(u64::try_from(token).unwrap_or(0)),
        }
    }
}

enum Waited {
    Answered(Result<i64, LockError>),
    TimedOut,
    CallerGone,
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

impl LockBackend for PgAdvisoryLocker {
    type Guard = PgAdvisoryGuard;

    #[tracing::instrument(skip(self, options), fields(backend = "postgres"))]
    async fn lock(&self, name: &str, options: &LockOptions) -> Result<PgAdvisoryGuard, LockError> {
        self.acquire(name, options, true)
            .await?
            .ok_or_else(|| LockError::Backend {
                backend: Backend::Postgres,
                operation: "acquire",
                lock: Some(name.to_owned()),
                source: "a waiting acquisition returned without the lock".into(),
            })
    }

    #[tracing::instrument(skip(self, options), fields(backend = "postgres"))]
    async fn try_lock(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> Result<Option<PgAdvisoryGuard>, LockError> {
        self.acquire(name, options, false).await
    }
}

/// A held advisory lock and the connection that holds it.
#[must_use = "dropping the guard releases the lock at once"]
pub struct PgAdvisoryGuard {
    inner: Arc<Inner>,
    conn: Option<Conn>,
    /// Proves the session alive every third of the TTL; stopped with the guard.
    heartbeat: Option<Heartbeat>,
    name: String,
    token: FencingToken,
    /// Ends when the guard is released or dropped (metrics, loss counting).
    holding: Option<Holding>,
}

impl std::fmt::Debug for PgAdvisoryGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgAdvisoryGuard")
            .field("name", &self.name)
            .field("token", &self.token)
            .field("backend_pid", &self.backend_pid())
            .finish_non_exhaustive()
    }
}

impl PgAdvisoryGuard {
    /// Stops the heartbeat's task as a panic in it would (for tests: its loss must
    /// still be reported).
    #[doc(hidden)]
    pub fn stop_heartbeat_for_test(&self) {
        if let Some(heartbeat) = &self.heartbeat {
            heartbeat.stop();
        }
    }

    /// The server process holding the lock (for `pg_terminate_backend`, or monitoring).
    #[must_use]
    pub fn backend_pid(&self) -> Option<i32> {
        self.conn.as_ref().map(|c| c.pid)
    }

    async fn unlock(inner: Arc<Inner>, conn: Conn, name: String) -> Result<bool, LockError> {
        let sql = format!("SELECT pg_advisory_unlock({KEY})");
        let unlocked = conn
            .client
            .query_typed_one(&sql, &[(&name.as_str(), Type::TEXT)])
            .await
            .and_then(|row| row.try_get::<_, bool>(0))
            .map_err(|err| map_error("release", Some(&name), err));
        if unlocked.is_ok() {
            inner.put_back(conn);
        }
        unlocked
    }
}

impl LockGuard for PgAdvisoryGuard {
    fn token(&self) -> FencingToken {
        self.token
    }

    fn name(&self) -> &str {
        &self.name
    }

    async fn lost(&self) -> LossReason {
        let (Some(conn), Some(heartbeat)) = (&self.conn, &self.heartbeat) else {
            return LossReason::Closed;
        };
        // The deadline too, not only the heartbeat's report: whatever becomes of the
        // heartbeat task (a panic in it), a lock whose time ran out is reported, as
        // `is_held()` reports it, and its connection closed, as the task would have
        // (the guard no longer vouches for the lock: let the server free it).
        tokio::select! {
            biased;
            reason = conn.closed.wait() => reason,
            () = heartbeat.passed_eventually() => {
                // Marked before the abort, as the heartbeat task does: the abort's own
                // mark (`Disconnected`) comes later, on the connection's runtime, and a
                // heartbeat answer landing now could still move the deadline on, so that
                // `is_held()` read held on a closed connection.
                conn.notifier.mark(LossReason::Expired);
                conn.task.abort();
                LossReason::Expired
            }
        }
    }

    fn is_held(&self) -> bool {
        self.conn
            .as_ref()
            .is_some_and(|conn| conn.closed.current().is_none())
            && self.heartbeat.as_ref().is_some_and(|h| !h.has_passed())
    }

    /// How long until the guard stops vouching for the lock unless a heartbeat is
    /// answered: the send time of the last answered one plus the TTL.
    fn lease_remaining(&self) -> Option<std::time::Duration> {
        Some(
            self.heartbeat
                .as_ref()
                .map_or(Duration::ZERO, Heartbeat::remaining),
        )
    }

    #[tracing::instrument(skip(self), fields(backend = "postgres", lock = %self.name, token = %self.token))]
    async fn release(mut self) -> Result<ReleaseOutcome, LockError> {
        self.holding = None;
        let past_deadline = self.heartbeat.take().is_none_or(|h| h.has_passed());
        let Some(conn) = self.conn.take() else {
            metrics::release(Backend::Postgres, Release::NotHeld);
            return Ok(ReleaseOutcome::NotHeld);
        };
        if conn.closed.current().is_some() || past_deadline {
            // The connection is gone, and the lock went with it; or the guard has stopped
            // vouching for it (and may have said so through `lost()`): the connection is
            // closed, which frees the lock if the server still had it.
            conn.task.abort();
            metrics::release(Backend::Postgres, Release::NotHeld);
            return Ok(ReleaseOutcome::NotHeld);
        }
        let name = std::mem::take(&mut self.name);
        match Self::unlock(self.inner.clone(), conn, name).await {
            Ok(true) => {
                metrics::release(Backend::Postgres, Release::Released);
                Ok(ReleaseOutcome::Released)
            }
            Ok(false) => {
                metrics::release(Backend::Postgres, Release::NotHeld);
                Ok(ReleaseOutcome::NotHeld)
            }
            Err(err) => {
                metrics::release(Backend::Postgres, Release::Failed);
                metrics::error(Backend::Postgres, "release", &err);
                Err(err)
            }
        }
    }
}

impl Drop for PgAdvisoryGuard {
    fn drop(&mut self) {
        self.holding = None;
        self.heartbeat = None;
        let Some(conn) = self.conn.take() else { return };
        metrics::release(Backend::Postgres, Release::Dropped);
        // Without a runtime, dropping the connection closes it, which frees the lock.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (inner, name) = (self.inner.clone(), std::mem::take(&mut self.name));
            runtime.spawn(async move {
                let _ = Self::unlock(inner, conn, name).await;
            });
        }
    }
}
