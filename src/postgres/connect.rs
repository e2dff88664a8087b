//! Connecting to PostgreSQL: plaintext, or TLS through rustls (no OpenSSL).
//!
//! With a [`TlsConfig`], the connection is encrypted and the server's certificate is
//! verified against the CA for the host (or the configured server name): libpq's
//! `sslmode=verify-full`, whatever the connection string says, except `sslmode=disable`,
//! which is refused as a contradiction. Without one, `sslmode=require` in the string uses
//! TLS verified against the system's trust store; anything else is plaintext.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio_postgres::config::SslMode;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{CancelToken, Client, Config, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::{Backend, LockError, LossReason, TlsConfig};

/// How connections are made: plaintext or TLS.
#[derive(Clone)]
pub(crate) enum Connector {
    Plain,
    Tls(Named),
}

/// The rustls connector, checking the certificate against a fixed name when one is set.
#[derive(Clone)]
pub(crate) struct Named {
    inner: MakeRustlsConnect,
    name: Option<String>,
}

impl<S> MakeTlsConnect<S> for Named
where
    MakeRustlsConnect: MakeTlsConnect<S>,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type TlsConnect = <MakeRustlsConnect as MakeTlsConnect<S>>::TlsConnect;
    type Error = <MakeRustlsConnect as MakeTlsConnect<S>>::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Self::TlsConnect, Self::Error> {
        let name = self.name.clone();
        self.inner
            .make_tls_connect(name.as_deref().unwrap_or(domain))
    }
}

/// A connection's task, to be spawned, and the client that talks over it.
pub(crate) type Connection =
    Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send>>;

impl Connector {
    /// The connector for `config` and `tls`; sets `config`'s TLS mode to match.
    pub(crate) fn new(config: &mut Config, tls: Option<&TlsConfig>) -> Result<Self, LockError> {
        let tls = match (tls, config.get_ssl_mode()) {
            (Some(_), SslMode::Disable) => {
                return Err(LockError::InvalidConfig {
                    backend: Backend::Postgres,
                    reason: "TLS is configured, but the connection string says sslmode=disable"
                        .into(),
                });
            }
            (Some(tls), _) => tls.clone(),
            (None, SslMode::Require) => TlsConfig::new(),
            (None, _) => return Ok(Self::Plain),
        };
        // Never fall back to plaintext once TLS was asked for.
        config.ssl_mode(SslMode::Require);
        let loaded = tls.load(Backend::Postgres)?;
        let rustls = loaded.rustls_config(Backend::Postgres)?;
        Ok(Self::Tls(Named {
            inner: MakeRustlsConnect::new(rustls),
            name: loaded.server_name,
        }))
    }

    /// Connects, within `timeout`.
    pub(crate) async fn connect(
        &self,
        config: &Config,
        timeout: Duration,
    ) -> Result<(Client, Connection), LockError> {
        let connecting = async {
            match self {
                Self::Plain => config
                    .connect(NoTls)
                    .await
                    .map(|(client, conn)| (client, Box::pin(conn) as Connection)),
                Self::Tls(tls) => config
                    .connect(tls.clone())
                    .await
                    .map(|(client, conn)| (client, Box::pin(conn) as Connection)),
            }
        };
        match tokio::time::timeout(timeout, connecting).await {
            Ok(result) => result.map_err(|err| map_error("connect", None, err)),
            Err(_) => Err(LockError::Timeout {
                backend: Backend::Postgres,
                operation: "connect",
                lock: None,
                after: timeout,
            }),
        }
    }

    /// Asks the server to cancel the query running on the connection of `token`, without
    /// waiting for the server to deliver it (see `cancel.rs` for the wait).
    pub(crate) async fn cancel(&self, token: &CancelToken) {
        let _ = match self {
            Self::Plain => token.cancel_query(NoTls).await,
            Self::Tls(tls) => token.cancel_query(tls.clone()).await,
        };
    }
}

/// Connects to PostgreSQL for the fenced-write helpers ([`Fence`](super::Fence),
/// [`TokenColumn`](super::TokenColumn), ...): `connection` is a libpq-style string
/// (`host=... user=... dbname=...`) or a `postgresql://` URL; with `tls`, the connection
/// is encrypted and the server verified (see the module docs). The connection's task runs
/// in the background until the client is dropped. Errors are typed like the lock's:
/// [`LockError::is_tls`], [`LockError::is_permission_denied`], ...
///
/// ```no_run
/// use fencelock::TlsConfig;
///
/// # async fn run() -> Result<(), fencelock::LockError> {
/// let tls = TlsConfig::new().with_ca_file("/etc/postgresql/root.crt");
/// let db = fencelock::postgres::connect("host=db.internal user=app dbname=app", Some(&tls)).await?;
/// db.execute("SELECT 1", &[]).await.ok();
/// # Ok(()) }
/// ```
pub async fn connect(connection: &str, tls: Option<&TlsConfig>) -> Result<Client, LockError> {
    let mut config = parse(connection)?;
    let timeout = connect_timeout(&config);
    let connector = Connector::new(&mut config, tls)?;
    let (client, conn) = connector.connect(&config, timeout).await?;
    tokio::spawn(async move {
        if let Err(err) = conn.await {
            tracing::debug!(%err, "PostgreSQL connection ended");
        }
    });
    Ok(client)
}

/// Parses a connection string, its password kept out of the error.
pub(crate) fn parse(connection: &str) -> Result<Config, LockError> {
    connection
        .parse()
        .map_err(|err: tokio_postgres::Error| LockError::InvalidConfig {
            backend: Backend::Postgres,
            reason: err.to_string(),
        })
}

/// The string's `connect_timeout`, 5 s by default.
pub(crate) fn connect_timeout(config: &Config) -> Duration {
    config
        .get_connect_timeout()
        .copied()
        .unwrap_or(Duration::from_secs(5))
}

/// Sorts a PostgreSQL error into the kinds callers branch on.
pub(crate) fn map_error(
    operation: &'static str,
    lock: Option<&str>,
    err: tokio_postgres::Error,
) -> LockError {
    use tokio_postgres::error::SqlState;
    let lock = lock.map(str::to_owned);
    let backend = Backend::Postgres;
    if let Some(reason) = crate::tls::describe_tls_failure(&err) {
        return LockError::Tls {
            backend,
            operation,
            reason,
        };
    }
    // The server's own words, where it sent some ("db error" alone says nothing).
    let text = match err.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => err.to_string(),
    };
    let cause = std::error::Error::source(&err).map(ToString::to_string);
    if text.contains("server does not support TLS")
        || cause.is_some_and(|c| c.contains("server does not support TLS"))
    {
        return LockError::Tls {
            backend,
            operation,
            reason: "the server does not accept TLS connections (ssl = off?)".into(),
        };
    }
    match err.code() {
        // pg_hba.conf allows this client only with encryption.
        Some(code)
            if *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
                && text.contains("no encryption") =>
        {
            LockError::Tls {
                backend,
                operation,
                reason: format!("the server accepts this client only over TLS: {text}"),
            }
        }
        // pg_hba.conf's clientcert: a certificate was missing, or is not for this user.
        Some(code)
            if *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
                && text.contains("certificate") =>
        {
            LockError::Tls {
                backend,
                operation,
                reason: format!(
                    "the server requires a client certificate it trusts, for this user \
                     (--cert and --key): {text}"
                ),
            }
        }
        Some(code)
            if *code == SqlState::INVALID_PASSWORD
                || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
                || *code == SqlState::INSUFFICIENT_PRIVILEGE =>
        {
            LockError::PermissionDenied {
                backend,
                operation,
                lock,
                message: text,
            }
        }
        Some(code)
            if *code == SqlState::ADMIN_SHUTDOWN || *code == SqlState::CANNOT_CONNECT_NOW =>
        {
            LockError::Unavailable {
                backend,
                operation,
                lock,
                source: Box::new(err),
            }
        }
        Some(code) => LockError::Backend {
            backend,
            operation,
            lock,
            source: Box::new(ServerSaid {
                text: format!("{text} ({})", code.code()),
                source: err,
            }),
        },
        // No SQL state: the connection failed or closed.
        None => LockError::Unavailable {
            backend,
            operation,
            lock,
            source: Box::new(err),
        },
    }
}

/// A PostgreSQL error in the server's own words and its SQLSTATE, e.g. `ERROR: canceling
/// statement due to user request (57014)` (tokio-postgres's own text is "db error"); the
/// client's error is its source.
#[derive(Debug, thiserror::Error)]
#[error("{text}")]
struct ServerSaid {
    text: String,
    #[source]
    source: tokio_postgres::Error,
}

/// Keeps `conn` running; marks `notifier` when it ends (the connection closed). Aborting
/// the returned handle closes the connection (its socket is dropped).
///
/// The mark is made however the task ends ([`MarkedConnection`], made here and moved
/// into the task): the connection closing, an abort, or the runtime it was spawned on
/// shutting down (dropped before or after it was first polled). Each of these drops the
/// socket, and the server frees the session's locks; a guard or a pooled connection on
/// another runtime must not read it as open (before, a lock held through it read as held
/// until its heartbeat's next failure, a third of the TTL, while the next holder could
/// have it).
pub(crate) fn spawn_connection(
    conn: Connection,
    notifier: std::sync::Arc<crate::loss::LossNotifier>,
) -> tokio::task::AbortHandle {
    tokio::spawn(MarkedConnection { conn, notifier }).abort_handle()
}

/// A connection that marks its loss (`Disconnected`) when dropped, before its socket is
/// closed: `drop` runs before the fields are dropped, so no guard can read the lock as
/// held once the server may have freed it, as the heartbeat marks before it aborts. A
/// mark made before (the heartbeat's `Expired`) is kept: the first reason wins.
struct MarkedConnection {
    conn: Connection,
    notifier: std::sync::Arc<crate::loss::LossNotifier>,
}

impl Future for MarkedConnection {
    type Output = ();

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.conn.as_mut().poll(cx).map(|ended| {
            if let Err(err) = ended {
                tracing::debug!(%err, "PostgreSQL connection ended");
            }
        })
    }
}

impl Drop for MarkedConnection {
    fn drop(&mut self) {
        self.notifier.mark(LossReason::Disconnected);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::loss::{LossNotifier, LossWatch, loss_channel};

    /// Stands for a connection's future: never ends by itself; when dropped (the socket
    /// closing), records whether the loss was already marked.
    struct Socket {
        watch: LossWatch,
        marked_before_close: Arc<AtomicBool>,
    }

    impl Future for Socket {
        type Output = Result<(), tokio_postgres::Error>;

        fn poll(
            self: Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Self::Output> {
            std::task::Poll::Pending
        }
    }

    impl Drop for Socket {
        fn drop(&mut self) {
            let marked = self.watch.current().is_some();
            self.marked_before_close.store(marked, Ordering::SeqCst);
        }
    }

    fn socket() -> (Connection, Arc<LossNotifier>, LossWatch, Arc<AtomicBool>) {
        let (notifier, watch) = loss_channel(Backend::Postgres);
        let marked_before_close = Arc::new(AtomicBool::new(false));
        let socket = Socket {
            watch: watch.clone(),
            marked_before_close: marked_before_close.clone(),
        };
        (
            Box::pin(socket),
            Arc::new(notifier),
            watch,
            marked_before_close,
        )
    }

    #[tokio::test]
    async fn an_aborted_connection_is_marked_lost_before_its_socket_closes() {
        let (conn, notifier, watch, marked_before_close) = socket();
        let task = spawn_connection(conn, notifier);
        tokio::task::yield_now().await;
        assert_eq!(watch.current(), None, "a running connection is not lost");
        task.abort();
        assert_eq!(watch.wait().await, LossReason::Disconnected);
        assert!(marked_before_close.load(Ordering::SeqCst));
    }

    #[test]
    fn a_connection_whose_runtime_ends_before_its_first_poll_is_marked_lost() {
        let (conn, notifier, watch, marked_before_close) = socket();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        // Spawned, never polled: a current-thread runtime runs tasks only in `block_on`.
        let _task = runtime.block_on(async { spawn_connection(conn, notifier) });
        drop(runtime);
        assert_eq!(watch.current(), Some(LossReason::Disconnected));
        assert!(marked_before_close.load(Ordering::SeqCst));
    }
}
