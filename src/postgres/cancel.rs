//! Cancelling a running statement the way libpq's `PQcancel` does: send the cancel
//! request, then wait until the server closes the cancel connection.
//!
//! The server answers a cancel request with nothing: the process that takes it signals
//! the backend (SIGINT, to the backend and to its process group) and then closes the
//! connection. tokio-postgres's `cancel_query` returns as soon as the request is written,
//! so the signal can reach the backend later, after the statement it was meant for has
//! ended on its own, and cancel the connection's *next* statement (57014, "canceling
//! statement due to user request"). Once the server has closed the cancel connection, the
//! signal is pending at the backend, which acts on it before it reads another command; a
//! cancel that arrives between statements is dropped there. So a connection is only
//! reused after a cancel that was seen to close ([`Cancel::Confirmed`]).

use std::io;
#[cfg(unix)]
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;
use tokio_postgres::config::Host;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{CancelToken, Config, NoTls};

use super::connect::Connector;

/// Where the server that runs a connection's backend takes cancel requests: the one host
/// of the connection string. `None` (see [`Target::of`]) when the string names several.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    /// A TCP address: a fixed IP (`hostaddr`) or a name to resolve, and the name TLS
    /// checks the certificate against.
    Tcp {
        host: Option<String>,
        addr: Option<std::net::IpAddr>,
        port: u16,
    },
    /// The server's Unix socket.
    #[cfg(unix)]
    Unix(PathBuf),
}

impl Target {
    /// The cancel target of connections made with `config`, if it names exactly one
    /// server (with several, which one a connection reached is not known).
    pub(crate) fn of(config: &Config) -> Option<Self> {
        let (hosts, addrs, ports) = (
            config.get_hosts(),
            config.get_hostaddrs(),
            config.get_ports(),
        );
        if hosts.len().max(addrs.len()) != 1 || ports.len() > 1 {
            return None;
        }
        let port = ports.first().copied().unwrap_or(5432);
        let addr = addrs.first().copied();
        match hosts.first() {
            None => Some(Self::Tcp {
                host: None,
                addr,
                port,
            }),
            Some(Host::Tcp(host)) => Some(Self::Tcp {
                host: Some(host.clone()),
                addr,
                port,
            }),
            #[cfg(unix)]
            Some(Host::Unix(dir)) => match addr {
                // A hostaddr wins over the host for the connection itself.
                Some(addr) => Some(Self::Tcp {
                    host: None,
                    addr: Some(addr),
                    port,
                }),
                None => Some(Self::Unix(dir.join(format!(".s.PGSQL.{port}")))),
            },
        }
    }
}

/// How a cancel request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cancel {
    /// The server took the request and closed the cancel connection: the signal has
    /// been sent, and cannot reach a statement sent from now on.
    Confirmed,
    /// Sent (or tried) without seeing the server close: the signal may still come.
    Unconfirmed,
}

/// Cancels the statement running on `token`'s connection and waits, within `limit`,
/// until the server has closed the cancel connection.
#[tracing::instrument(skip_all, fields(backend = "postgres"))]
pub(crate) async fn cancel(
    connector: &Connector,
    target: Option<&Target>,
    token: &CancelToken,
    limit: Duration,
) -> Cancel {
    let Some(target) = target else {
        // Several hosts: tokio-postgres knows which one, but only sends.
        let _ = tokio::time::timeout(limit, connector.cancel(token)).await;
        return Cancel::Unconfirmed;
    };
    match tokio::time::timeout(limit, cancel_at(connector, target, token)).await {
        Ok(Ok(())) => Cancel::Confirmed,
        Ok(Err(err)) => {
            tracing::debug!(%err, "PostgreSQL cancel request failed");
            Cancel::Unconfirmed
        }
        Err(_elapsed) => {
            tracing::debug!(
                ?limit,
                "PostgreSQL did not close the cancel connection in time"
            );
            Cancel::Unconfirmed
        }
    }
}

/// Why a cancel was not confirmed (logged only).
#[derive(Debug, thiserror::Error)]
enum CancelError {
    #[error("connecting for the cancel request: {0}")]
    Connect(io::Error),
    #[error("sending the cancel request: {0}")]
    Send(#[from] tokio_postgres::Error),
    #[error("TLS for the cancel request: {0}")]
    Tls(String),
    #[error("reading until the server closes the cancel connection: {0}")]
    Read(io::Error),
}

async fn cancel_at(
    connector: &Connector,
    target: &Target,
    token: &CancelToken,
) -> Result<(), CancelError> {
    match target {
        Target::Tcp { host, addr, port } => {
            let stream = match addr {
                Some(addr) => tokio::net::TcpStream::connect((*addr, *port)).await,
                None => {
                    let name = host.as_deref().unwrap_or("localhost");
                    tokio::net::TcpStream::connect((name, *port)).await
                }
            }
            .map_err(CancelError::Connect)?;
            let _ = stream.set_nodelay(true);
            send_and_wait(connector, host.as_deref().unwrap_or(""), stream, token).await
        }
        #[cfg(unix)]
        Target::Unix(path) => {
            let stream = tokio::net::UnixStream::connect(path)
                .await
                .map_err(CancelError::Connect)?;
            send_and_wait(connector, "", stream, token).await
        }
    }
}

/// Sends the cancel request over `stream` (TLS first if the connector says so), then
/// reads until the server closes it.
async fn send_and_wait<S>(
    connector: &Connector,
    host: &str,
    stream: S,
    token: &CancelToken,
) -> Result<(), CancelError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // tokio-postgres takes the stream and drops it once the request is written (after a
    // write shutdown); the lent stream comes back on its drop, for the read.
    let (back, returned) = oneshot::channel();
    let lent = Lent {
        stream: Some(stream),
        back: Some(back),
    };
    match connector {
        Connector::Plain => token.cancel_query_raw(lent, NoTls).await?,
        Connector::Tls(named) => {
            let tls = MakeTlsConnect::<Lent<S>>::make_tls_connect(&mut named.clone(), host)
                .map_err(|err| CancelError::Tls(err.to_string()))?;
            token.cancel_query_raw(lent, tls).await?;
        }
    }
    let mut stream = returned.await.map_err(|_| {
        CancelError::Read(io::Error::other(
            "the cancel connection was not handed back",
        ))
    })?;
    // Whatever comes (over TLS: the server's closing records) is discarded; the end of
    // the stream is the answer.
    let mut buf = [0u8; 256];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            // The server closed with our write shutdown (or TLS close) unread.
            Err(err) if err.kind() == io::ErrorKind::ConnectionReset => return Ok(()),
            Err(err) => return Err(CancelError::Read(err)),
        }
    }
}

/// A stream lent to tokio-postgres, handed back through `back` when it is dropped.
struct Lent<S> {
    stream: Option<S>,
    back: Option<oneshot::Sender<S>>,
}

impl<S> Lent<S> {
    fn stream(&mut self) -> io::Result<&mut S> {
        self.stream
            .as_mut()
            .ok_or_else(|| io::Error::other("the lent stream was handed back"))
    }
}

impl<S> Drop for Lent<S> {
    fn drop(&mut self) {
        if let (Some(stream), Some(back)) = (self.stream.take(), self.back.take()) {
            let _ = back.send(stream);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Lent<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut().stream() {
            Ok(stream) => Pin::new(stream).poll_read(cx, buf),
            Err(err) => Poll::Ready(Err(err)),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Lent<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut().stream() {
            Ok(stream) => Pin::new(stream).poll_write(cx, buf),
            Err(err) => Poll::Ready(Err(err)),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().stream() {
            Ok(stream) => Pin::new(stream).poll_flush(cx),
            Err(err) => Poll::Ready(Err(err)),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().stream() {
            Ok(stream) => Pin::new(stream).poll_shutdown(cx),
            Err(err) => Poll::Ready(Err(err)),
        }
    }
}
