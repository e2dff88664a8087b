//! One pub/sub connection per client, shared by all of its waits.
//!
//! Waiters register interest in a lock's release channel; the first interest subscribes,
//! the last one to go unsubscribes. Messages wake every waiter of that channel (Redis
//! locks are not fair: whoever retries first wins). A broken connection only costs
//! waiters their wake-ups until the next interest reconnects: they still retry after
//! their bounded sleep.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures_util::StreamExt;
use redis::aio::PubSubSink;
use tokio::sync::Notify;

#[derive(Default)]
struct Channels {
    by_name: HashMap<String, Channel>,
}

struct Channel {
    notify: Arc<Notify>,
    interests: usize,
}

/// The shared subscriber of one client.
pub(crate) struct Subscriber {
    client: redis::Client,
    channels: Arc<Mutex<Channels>>,
    // The sending half of the connection; `None` until first use or after it broke.
    sink: Arc<tokio::sync::Mutex<Option<PubSubSink>>>,
}

impl Subscriber {
    pub(crate) fn new(client: redis::Client) -> Self {
        Self {
            client,
            channels: Arc::default(),
            sink: Arc::default(),
        }
    }

    fn channels(&self) -> MutexGuard<'_, Channels> {
        lock(&self.channels)
    }

    /// Registers interest in `channel`, subscribing if this is the first. When this
    /// returns, releases published on `channel` wake the returned interest (unless the
    /// connection failed: then waiters rely on their sleep).
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
        if first {
            if let Err(err) = self.subscribe(channel).await {
                tracing::debug!(%err, channel, "subscribe failed; waiters fall back to sleeping");
            }
        }
        Interest {
            subscriber: self.clone(),
            channel: channel.to_owned(),
            notify,
        }
    }

    async fn subscribe(&self, channel: &str) -> redis::RedisResult<()> {
        let mut sink = self.sink.lock().await;
        if sink.is_none() {
            *sink = Some(self.reconnect().await?);
        }
        match sink.as_mut() {
            Some(s) => s.subscribe(channel).await,
            None => Ok(()),
        }
    }

    /// Opens a new pub/sub connection, resubscribes to every channel still wanted, and
    /// starts the task that turns messages into wake-ups.
    async fn reconnect(&self) -> redis::RedisResult<PubSubSink> {
        let (mut sink, mut stream) = self.client.get_async_pubsub().await?.split();
        let wanted: Vec<String> = self.channels().by_name.keys().cloned().collect();
        for channel in wanted {
            sink.subscribe(channel).await?;
        }
        let channels = Arc::downgrade(&self.channels);
        let sink_slot = Arc::downgrade(&self.sink);
        tokio::spawn(async move {
            while let Some(message) = stream.next().await {
                let Some(channels) = channels.upgrade() else {
                    return;
                };
                if let Some(channel) = lock(&channels).by_name.get(message.get_channel_name()) {
                    channel.notify.notify_waiters();
                }
            }
            // The connection is gone: the next interest reconnects.
            if let Some(slot) = sink_slot.upgrade() {
                *slot.lock().await = None;
            }
        });
        Ok(sink)
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
                    if let Some(sink) = this.sink.lock().await.as_mut() {
                        let _ = sink.unsubscribe(&channel).await;
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

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
