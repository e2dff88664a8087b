//! A fault-injecting TCP proxy: put it between one client and a server to freeze that
//! client's traffic (a partition, or a process paused from the network's point of view)
//! while everyone else still reaches the server.

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// A proxy on a free loopback port forwarding to one upstream address.
///
/// ```no_run
/// # async fn run() -> std::io::Result<()> {
/// use fencelock::testkit::FaultProxy;
/// let proxy = FaultProxy::start("127.0.0.1:2379".parse().unwrap()).await?;
/// // Point one client at proxy.address() ...
/// proxy.pause();  // ... its bytes stop flowing, its connections stay open
/// proxy.resume(); // ... and flow again
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct FaultProxy {
    address: SocketAddr,
    paused: watch::Sender<bool>,
    // Dropping the proxy aborts the accept loop, which aborts every connection.
    _accepting: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (paused, _) = watch::channel(false);
        let state = paused.clone();
        let accepting = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let state = state.subscribe();
                connections.spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        forward_both(client, server, state).await;
                    }
                });
                // Reap finished connections as we go.
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Self {
            address,
            paused,
            _accepting: accepting,
        })
    }

    /// Where clients should connect.
    #[must_use]
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `http://` URL of the proxy, for etcd endpoints.
    #[must_use]
    pub fn http_url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Stops forwarding in both directions. Connections stay open and bytes wait (TCP
    /// back-pressure), as with a partition that heals or a peer that froze.
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// Forwards again, including what waited.
    pub fn resume(&self) {
        self.paused.send_replace(false);
    }
}

async fn forward_both(client: TcpStream, server: TcpStream, paused: watch::Receiver<bool>) {
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let upstream = forward(client_read, server_write, paused.clone());
    let downstream = forward(server_read, client_write, paused);
    // When either side closes, close both.
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
    }
}

async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut paused: watch::Receiver<bool>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        // Hold still while paused: nothing read, nothing written.
        if paused.wait_for(|p| !p).await.is_err() {
            return;
        }
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if paused.wait_for(|p| !p).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}
