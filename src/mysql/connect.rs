//! Connecting to MariaDB or MySQL: plaintext, or TLS through rustls (no OpenSSL).
//!
//! With a [`TlsConfig`], the connection is encrypted and the server's certificate is
//! verified against the configured CA (or, without one, the system's trust store) for the
//! URL's host or the configured server name, like `ssl-mode=VERIFY_IDENTITY`. A server
//! that does not offer TLS is an error, never a plaintext fallback; and the client does
//! not switch from TCP to the server's Unix socket (mysql_async's `prefer_socket` on
//! loopback), which would carry no TLS.

use std::time::Duration;

use mysql_async::{ClientIdentity, Conn, DriverError, IoError, Opts, OptsBuilder, SslOpts};

use crate::{Backend, LockError, TlsConfig};

/// How long a connection attempt may take (TCP, TLS and authentication).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects for the fenced-write helpers ([`Fence`](super::Fence),
/// [`TokenColumn`](super::TokenColumn), ...): `url` is a mysql_async URL,
/// `mysql://user:password@host:port/database` (its query parameters included); with
/// `tls`, the connection is encrypted and the server verified (see the module docs).
/// Errors are typed like the locks': [`LockError::is_permission_denied`] (wrong
/// credentials), [`LockError::is_unavailable`] (no server), [`LockError::is_tls`], ...
///
/// ```no_run
/// use fencelock::TlsConfig;
///
/// # async fn run() -> Result<(), fencelock::LockError> {
/// let tls = TlsConfig::new().with_ca_file("/etc/mysql/ca.pem");
/// let conn = fencelock::mysql::connect("mysql://app:secret@db.internal:3306/app", Some(&tls)).await?;
/// # drop(conn);
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// Dropping the future abandons the attempt; nothing is left on the server.
#[tracing::instrument(skip_all)]
pub async fn connect(url: &str, tls: Option<&TlsConfig>) -> Result<Conn, LockError> {
    let opts = options(url, tls)?;
    match tokio::time::timeout(CONNECT_TIMEOUT, Conn::new(opts)).await {
        Ok(result) => result.map_err(|err| map_error("connect", err)),
        Err(_) => Err(LockError::Timeout {
            backend: Backend::MySql,
            operation: "connect",
            lock: None,
            after: CONNECT_TIMEOUT,
        }),
    }
}

/// The client options for `url` and `tls`.
pub(crate) fn options(url: &str, tls: Option<&TlsConfig>) -> Result<Opts, LockError> {
    let opts = Opts::from_url(url).map_err(|err| LockError::InvalidConfig {
        backend: Backend::MySql,
        // The URL error names a parameter, never the password.
        reason: format!("invalid MySQL URL: {err}"),
    })?;
    let Some(tls) = tls else {
        return Ok(opts);
    };
    let builder = OptsBuilder::from_opts(opts)
        .ssl_opts(ssl_opts(tls)?)
        .prefer_socket(false);
    Ok(builder.into())
}

/// mysql_async's TLS settings from ours: the files read and checked here, so that an
/// unreadable one is reported with its path.
fn ssl_opts(tls: &TlsConfig) -> Result<SslOpts, LockError> {
    let loaded = tls.load(Backend::MySql)?;
    let roots = match loaded.ca {
        Some(ca) => vec![ca.into()],
        None => {
            // mysql_async would trust its compiled-in webpki roots; the other backends
            // trust the system's store, so this one does too.
            let native = rustls_native_certs::load_native_certs();
            native
                .certs
                .into_iter()
                .map(|cert| cert.as_ref().to_vec().into())
                .collect()
        }
    };
    let mut ssl = SslOpts::default()
        .with_root_certs(roots)
        .with_disable_built_in_roots(true);
    if let Some((certificate, key)) = loaded.identity {
        ssl = ssl.with_client_identity(Some(ClientIdentity::new(certificate.into(), key.into())));
    }
    if let Some(name) = loaded.server_name {
        // The name the certificate must be valid for; verification itself stays on.
        ssl = ssl.with_danger_tls_hostname_override(Some(name));
    }
    Ok(ssl)
}

/// MariaDB/MySQL error codes that mean "not allowed".
const ACCESS_DENIED: [u16; 6] = [
    1044, // ER_DBACCESS_DENIED_ERROR
    1045, // ER_ACCESS_DENIED_ERROR: wrong user or password
    1142, // ER_TABLEACCESS_DENIED_ERROR
    1143, // ER_COLUMNACCESS_DENIED_ERROR
    1227, // ER_SPECIFIC_ACCESS_DENIED_ERROR
    1698, // ER_ACCESS_DENIED_NO_PASSWORD_ERROR
];

/// Sorts a mysql_async error into the kinds callers branch on.
pub(crate) fn map_error(operation: &'static str, err: mysql_async::Error) -> LockError {
    let backend = Backend::MySql;
    if let Some(reason) = crate::tls::describe_tls_failure(&err) {
        return LockError::Tls {
            backend,
            operation,
            reason,
        };
    }
    match err {
        mysql_async::Error::Server(server) if ACCESS_DENIED.contains(&server.code) => {
            LockError::PermissionDenied {
                backend,
                operation,
                lock: None,
                message: server.to_string(),
            }
        }
        // MySQL's --require-secure-transport refusal (3159). MariaDB says "Access denied"
        // (1045) instead, which cannot be told from a wrong password.
        mysql_async::Error::Server(server) if server.message.contains("insecure transport") => {
            LockError::Tls {
                backend,
                operation,
                reason: format!("the server accepts this client only over TLS: {server}"),
            }
        }
        mysql_async::Error::Driver(DriverError::NoClientSslFlagFromServer) => LockError::Tls {
            backend,
            operation,
            reason: "the server does not accept TLS connections (no ssl-cert/ssl-key set?)".into(),
        },
        mysql_async::Error::Io(IoError::Tls(tls)) => LockError::Tls {
            backend,
            operation,
            reason: format!("TLS failed: {tls}"),
        },
        mysql_async::Error::Url(url) => LockError::InvalidConfig {
            backend,
            reason: format!("invalid MySQL URL: {url}"),
        },
        err @ mysql_async::Error::Server(_) => LockError::Backend {
            backend,
            operation,
            lock: None,
            source: Box::new(err),
        },
        // I/O, a closed connection, a protocol surprise: the server was not reachable or
        // went away.
        err => LockError::Unavailable {
            backend,
            operation,
            lock: None,
            source: Box::new(err),
        },
    }
}
