//! A fault-injecting TCP proxy: put it between one client and a server to freeze that
//! client's traffic (a process paused from the network's point of view) or cut it off (a
//! partition), while everyone else still reaches the server.

use std::io;
use std::net::SocketAddr;

use futures_util::FutureExt;
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
/// proxy.cut();    // ... nothing gets through, and what is sent meanwhile is lost
/// proxy.heal();   // ... connections that saw the cut are closed; new ones work
/// proxy.hold_new_connections(); // ... new connections hang, open ones flow
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct FaultProxy {
    address: SocketAddr,
    state: watch::Sender<State>,
    accepted: watch::Sender<usize>,
    // Dropping the proxy aborts the accept loop, which aborts every connection.
    _accepting: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (state, _) = watch::channel(State::Open);
        let (accepted, _) = watch::channel(0usize);
        let states = state.clone();
        let count = accepted.clone();
        let accepting = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                count.send_modify(|n| *n += 1);
                let mut state = states.subscribe();
                connections.spawn(async move {
                    let now = *state.borrow_and_update();
                    match now {
                        // Cut off: the connection is accepted, nothing goes through, and
                        // it is closed when the cut heals.
                        State::Cut => {
                            let _ = state.wait_for(|s| *s != State::Cut).await;
                            return;
                        }
                        // A new connection that hangs: accepted, then nothing until the
                        // proxy opens again.
                        State::HoldNew => {
                            if state.wait_for(|s| *s != State::HoldNew).await.is_err() {
                                return;
                            }
                        }
                        State::Open | State::Paused => {}
                    }
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
            state,
            accepted,
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
        self.state.send_replace(State::Paused);
    }

    /// Forwards again, including what waited.
    pub fn resume(&self) {
        self.state.send_replace(State::Open);
    }

    /// Cuts the client off (a partition): nothing gets through in either direction, and
    /// what is sent meanwhile is lost. Connections stay open until [`heal`](Self::heal),
    /// which closes every one of them that saw the cut, as TCP and gRPC keep-alives would
    /// after a long partition; requests in flight are never delivered late.
    pub fn cut(&self) {
        self.state.send_replace(State::Cut);
    }

    /// Ends a [`cut`](Self::cut): the connections that saw it are closed, new ones work.
    pub fn heal(&self) {
        self.state.send_replace(State::Open);
    }

    /// Waits until `count` connections have been accepted since the start (a client
    /// opening a connection is often the event a test waits for).
    pub async fn accepted(&self, count: usize) {
        let _ = self.accepted.subscribe().wait_for(|n| *n >= count).await;
    }

    /// Connections opened from now on hang (accepted, nothing forwarded: a half-open
    /// connection) until [`resume`](Self::resume); the ones already open keep working.
    pub fn hold_new_connections(&self) {
        self.state.send_replace(State::HoldNew);
    }
}

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Forwards.
    Open,
    /// Holds: bytes wait and flow again on resume.
    Paused,
    /// Drops: nothing flows, and connections that saw it close when it ends.
    Cut,
    /// New connections hang; open ones flow.
    HoldNew,
}

async fn forward_both(client: TcpStream, server: TcpStream, state: watch::Receiver<State>) {
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let upstream = forward(client_read, server_write, state.clone());
    let downstream = forward(server_read, client_write, state);
    // When either side closes, close both.
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
    }
}

async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut state: watch::Receiver<State>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        // Hold still while paused: nothing read, nothing written.
        if !passable(&mut state).await {
            return;
        }
        let read = tokio::select! {
            read = from.read(&mut buffer) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            // Cut while waiting for bytes: wait for the heal, then close.
            Ok(()) = state.wait_for(|s| *s == State::Cut).map(|r| r.map(drop)) => {
                let _ = state.wait_for(|s| *s != State::Cut).await;
                return;
            }
        };
        if !passable(&mut state).await {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

/// Waits while paused; `false` if the connection must close (it saw a cut, or the proxy
/// is gone). Bytes read during a cut are dropped with the connection.
async fn passable(state: &mut watch::Receiver<State>) -> bool {
    let Ok(now) = state.wait_for(|s| *s != State::Paused).await.map(|s| *s) else {
        return false;
    };
    if now == State::Cut {
        let _ = state.wait_for(|s| *s != State::Cut).await;
        return false;
    }
    true
}
