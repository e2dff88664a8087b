//! One pub/sub connection per client, shared by all of its waits.
//!
//! Waiters register interest in a lock's release channel; the first interest subscribes,
//! the last one to go unsubscribes. Messages wake every waiter of that channel (Redis
//! locks are not fair: whoever retries first wins). A broken connection only costs
//! waiters their wake-ups until the next interest reconnects: they still retry after
//! their bounded sleep.
//!
//! Opening the connection is bounded by the connect timeout and each (un)subscribe by the
//! request timeout: a half-open connection (a peer that stopped answering without closing)
//! must cost a waiter at most that, never the kernel's retransmission timeout. A connection
//! that timed out is dropped, and its reader task with it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::PubSubSink;
use tokio::sync::{Notify, oneshot};

#[derive(Default)]
struct Channels {
    by_name: HashMap<String, Channel>,
}

struct Channel {
    notify: Arc<Notify>,
    interests: usize,
}

/// The sending half of the pub/sub connection, and the handle whose drop stops the task
/// that reads its messages (which closes the connection).
struct Connection {
    sink: PubSubSink,
    _reader: oneshot::Sender<()>,
}

/// The shared subscriber of one client.
pub(crate) struct Subscriber {
    client: redis::Client,
    connect_timeout: Duration,
    request_timeout: Duration,
    channels: Arc<Mutex<Channels>>,
    // `None` until first use or after it broke or timed out.
    connection: Arc<tokio::sync::Mutex<Option<Connection>>>,
}

impl Subscriber {
    pub(crate) fn new(
        client: redis::Client,
        connect_timeout: Duration,
        request_timeout: Duration,
    ) -> Self {
        Self {
            client,
            connect_timeout,
            request_timeout,
            channels: Arc::default(),
            connection: Arc::default(),
        }
    }

    fn channels(&self) -> MutexGuard<'_, Channels> {
        lock(&self.channels)
    }

    /// Registers interest in `channel`, subscribing if this is the first. When this
    /// returns, releases published on `channel` wake the returned interest (unless the
    /// connection failed: then waiters rely on their sleep).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the interest is counted by the [`Interest`] built before the
    /// subscription is awaited, so a call dropped meanwhile (a wait timeout while the
    /// pub/sub connection opens) takes its count with it, and the next interest in the
    /// channel subscribes. (Counted and never built, it would leave the channel with an
    /// interest nobody holds: every later waiter "not first", none subscribing, every
    /// release heard by no one for as long as the process lives.)
    pub(crate) async fn interest(self: &Arc<Self>, channel: &str) -> Interest {
        let (notify, first) = {
            let mut channels = self.channels();
            let entry = channels
                .by_name
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    notify: Arc::new(Notify::new()),
                    interests: 0,
                });
            entry.interests += 1;
            (entry.notify.clone(), entry.interests == 1)
        };
        let interest = Interest {
            subscriber: self.clone(),
            channel: channel.to_owned(),
            notify,
        };
        if first {
            if let Err(err) = self.subscribe(channel).await {
                tracing::debug!(%err, channel, "subscribe failed; waiters fall back to sleeping");
            }
        }
        interest
    }

    async fn subscribe(&self, channel: &str) -> redis::RedisResult<()> {
        let mut connection = self.connection.lock().await;
        if connection.is_none() {
            *connection = Some(self.reconnect().await?);
        }
        let Some(open) = connection.as_mut() else {
            return Ok(());
        };
        let subscribed = bounded(self.request_timeout, open.sink.subscribe(channel)).await;
        if subscribed.is_err() {
            // No answer: the connection is of no use; the next interest opens another.
            *connection = None;
        }
        subscribed
    }

    /// Opens a new pub/sub connection, resubscribes to every channel still wanted, and
    /// starts the task that turns messages into wake-ups.
    async fn reconnect(&self) -> redis::RedisResult<Connection> {
        let pubsub = bounded(self.connect_timeout, self.client.get_async_pubsub()).await?;
        let (mut sink, mut stream) = pubsub.split();
        let wanted: Vec<String> = self.channels().by_name.keys().cloned().collect();
        for channel in wanted {
            bounded(self.request_timeout, sink.subscribe(channel)).await?;
        }
        let channels = Arc::downgrade(&self.channels);
        let slot = Arc::downgrade(&self.connection);
        let (reader, mut stop) = oneshot::channel::<()>();
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    message = stream.next() => message,
                    // The connection was replaced or dropped: stop reading it.
                    _ = &mut stop => return,
                };
                let Some(message) = message else { break };
                let Some(channels) = channels.upgrade() else {
                    return;
                };
                if let Some(channel) = lock(&channels).by_name.get(message.get_channel_name()) {
                    channel.notify.notify_waiters();
                }
            }
            // The connection is gone: the next interest reconnects. Only if it is still the
            // one in the slot (its `Connection`, holding the other end of `stop`, lives
            // only there): one installed meanwhile must not be dropped by the old reader.
            if let Some(slot) = slot.upgrade() {
                let mut slot = slot.lock().await;
                if matches!(stop.try_recv(), Err(oneshot::error::TryRecvError::Empty)) {
                    *slot = None;
                }
            }
        });
        Ok(Connection {
            sink,
            _reader: reader,
        })
    }

    fn drop_interest(self: &Arc<Self>, channel: &str) {
        let last = {
            let mut channels = self.channels();
            match channels.by_name.get_mut(channel) {
                Some(entry) if entry.interests > 1 => {
                    entry.interests -= 1;
                    false
                }
                Some(_) => {
                    channels.by_name.remove(channel);
                    true
                }
                None => false,
            }
        };
        if last {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let (this, channel) = (self.clone(), channel.to_owned());
                runtime.spawn(async move {
                    // Someone may have become interested again in the meantime.
                    if this.channels().by_name.contains_key(&channel) {
                        return;
                    }
                    let mut connection = this.connection.lock().await;
                    if let Some(open) = connection.as_mut() {
                        let timeout = this.request_timeout;
                        if bounded(timeout, open.sink.unsubscribe(&channel))
                            .await
                            .is_err()
                        {
                            *connection = None;
                        }
                    }
                });
            }
        }
    }
}

/// A waiter's interest in one release channel; dropping it may unsubscribe.
pub(crate) struct Interest {
    subscriber: Arc<Subscriber>,
    channel: String,
    notify: Arc<Notify>,
}

impl Interest {
    /// What releases on this channel notify.
    pub(crate) fn notify(&self) -> Arc<Notify> {
        self.notify.clone()
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        self.subscriber.drop_interest(&self.channel);
    }
}

/// `request` within `timeout`, a timeout reported as Redis reports its own.
async fn bounded<T>(
    timeout: Duration,
    request: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    match tokio::time::timeout(timeout, request).await {
        Ok(result) => result,
        Err(_) => Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "pub/sub request timed out",
        ))),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
