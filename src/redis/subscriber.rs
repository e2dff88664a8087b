//! One pub/sub connection per client, shared by all of its waits.
//!
//! Waiters register interest in a lock's release channel (in the channels of every lock of
//! a `lock_all`, at once); the first interest subscribes (later ones wait until that
//! subscription is done), the last one to go unsubscribes. Messages wake every waiter of
//! that channel (Redis locks are not fair: whoever retries first wins).
//!
//! A lost connection (a Redis restart or failover, `CLIENT KILL`, an output-buffer limit,
//! a request on it that timed out) is replaced, for as long as any channel is wanted,
//! without waiting for a new interest ([`recover`](Subscriber::recover)): the new
//! connection subscribes every wanted channel in one round trip, then wakes every waiter
//! of them, so that a release published while nobody listened is not waited out (the
//! woken waiters try again). Meanwhile waiters still retry after their bounded sleep.
//! Before, channels that kept a waiter through the loss were never subscribed again:
//! every handoff on a busy name cost a whole sleep for as long as the process lived
//! (`tests/redis/pubsub_reconnects.rs`). The first loss of a connection that stayed up
//! [`STABLE`] is reopened at once; a loss sooner after (a connection killed again and
//! again: a `CLIENT KILL` cron, `maxmemory-clients`, a recycling proxy), or a reopening
//! that failed, waits a backoff that carries over from one recovery to the next, so that
//! such a connection is not reopened at round-trip speed, each time waking every waiter
//! (`tests/redis/pubsub_reconnect_backoff.rs`).
//!
//! A connection can also die without closing (its host crashed behind the same address, a
//! failover behind a VIP, a load balancer's idle timeout): no end of stream ever comes.
//! While any channel is wanted, the connection's reader sends a `PING` every
//! `pubsub_ping_interval` (and at once when a waiter's attempt failed as unavailable): one
//! unanswered within the request timeout loses the connection, as an end of stream does
//! (`tests/redis/pubsub_silent_loss.rs`). Before, such a connection stayed in place for as
//! long as anyone waited, every release heard by no one.
//!
//! Opening the connection is bounded by the connect timeout and each (un)subscribe and
//! ping by the request timeout: a half-open connection (a peer that stopped answering
//! without closing) must cost a waiter at most that, never the kernel's retransmission
//! timeout. A connection that timed out is dropped, and its reader task with it (and
//! another opened).
//!
//! The connection is only ever used by tasks of this module (subscribing, unsubscribing,
//! reopening), never from a waiter's own future: a waiter whose future is dropped, or alive
//! and no longer polled, holds up no other waiter.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{Notify, oneshot, watch};
use tokio::time::Instant;

use super::RedisConfig;
use super::owner::jittered;
use crate::retry::backoff;

/// The longest pause between two attempts to reopen a lost connection.
const MAX_RECOVERY_PAUSE: Duration = Duration::from_secs(1);

/// How long a connection must have stayed up for its loss to be reopened at once (and
/// the backoff to start again): one lost sooner adds to the backoff.
const STABLE: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Channels {
    by_name: HashMap<String, Channel>,
}

struct Channel {
    notify: Arc<Notify>,
    interests: usize,
    subscription: Subscription,
}

/// Where a channel's subscription stands.
enum Subscription {
    /// Not subscribed yet: the next interest subscribes it.
    Unsubscribed,
    /// An interest's task is subscribing it: `true` is sent when that is done. Closed
    /// without it, that task was dropped on the way (its runtime shut down), and the next
    /// interest takes over.
    InFlight(watch::Receiver<bool>),
    /// Subscribed on the connection in place; or the attempt failed and left no
    /// connection in place, and then the recovery ([`Subscriber::recover`]) subscribes
    /// it with every other wanted channel on the next connection; or the server refused
    /// it (an ACL without the channel: its waiters rely on their sleep).
    Settled,
}

/// What an interest does about a channel's subscription.
enum Part {
    /// Nothing: it is settled.
    Done,
    /// Subscribe it.
    Mine,
    /// Wait for the subscription another interest has in flight.
    Wait(watch::Receiver<bool>),
}

/// The sending half of the pub/sub connection, when it was opened, and the handle whose
/// drop stops the task that reads its messages (which closes the connection).
struct Connection {
    sink: PubSubSink,
    opened: Instant,
    _reader: oneshot::Sender<()>,
}

/// The shared subscriber of one client.
pub(crate) struct Subscriber {
    client: redis::Client,
    connect_timeout: Duration,
    request_timeout: Duration,
    /// How often the connection's reader pings it while any channel is wanted.
    ping_interval: Duration,
    /// Asks the connection's reader for a ping now ([`check`](Self::check)).
    check: Arc<Notify>,
    channels: Mutex<Channels>,
    // `None` until first use or after it broke or timed out. Held by whoever uses it,
    // always a task of this module.
    connection: tokio::sync::Mutex<Option<Connection>>,
    /// Whether the task that reopens a lost connection runs. Set and cleared with
    /// `connection` held (but when that task is dropped with its runtime).
    recovering: AtomicBool,
    /// How many connections were opened: bumped before a new one wakes the waiters.
    opened: AtomicU64,
    /// Connections lost before they stayed up [`STABLE`], and reopenings that failed, in a
    /// row: the backoff of the next reopening. Changed with `connection` held; reset by
    /// the loss of a connection that stayed up `STABLE`.
    failures: AtomicU32,
}

impl Subscriber {
    /// The subscriber of `client`, with the timeouts and ping interval of `config`.
    pub(crate) fn new(client: redis::Client, config: &RedisConfig) -> Self {
        Self {
            client,
            connect_timeout: config.connect_timeout,
            request_timeout: config.request_timeout,
            ping_interval: config.pubsub_ping_interval,
            check: Arc::new(Notify::new()),
            channels: Mutex::default(),
            connection: tokio::sync::Mutex::default(),
            recovering: AtomicBool::new(false),
            opened: AtomicU64::new(0),
            failures: AtomicU32::new(0),
        }
    }

    fn channels(&self) -> MutexGuard<'_, Channels> {
        lock(&self.channels)
    }

    /// Registers interest in each of `channels` (one per name: a lock's, or the locks' of
    /// a `lock_all`), subscribing those nobody listens to yet **at once**: one round trip
    /// for the whole set (pipelined, see [`subscribe_all`]), bounded once by the request
    /// timeout, and by the connect timeout if the pub/sub connection must be opened.
    /// When this returns, releases published on any of `channels` wake the returned
    /// interests (unless the subscription failed: then waiters rely on their sleep until
    /// the connection is reopened, which wakes them; or its task was dropped unrun, as a
    /// runtime that shuts down drops what is spawned: then the next interest subscribes),
    /// also where another interest's subscription was still on its way: that is awaited,
    /// not taken for done.
    ///
    /// The subscribing runs in a task of its own, so that an interest whose caller stops
    /// polling it (or drops it) holds up no later interest in the same channels: they
    /// wait for that task, which always runs, each of its steps bounded by a timeout.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the interests are counted by the [`Interest`]s built before anything
    /// is awaited, so a call dropped meanwhile (a wait timeout while the pub/sub
    /// connection opens) takes its counts with it. (Counted and never built, a channel
    /// would keep an interest nobody holds: every later waiter "not first", none
    /// subscribing, every release heard by no one for as long as the process lives.) Its
    /// subscription goes on without it, for the other interests in those channels; what
    /// nobody wants any more by the time it has the connection, it leaves alone.
    pub(crate) async fn interests(self: &Arc<Self>, channels: &[&str]) -> Vec<Interest> {
        let interests: Vec<Interest> = {
            let mut all = self.channels();
            channels
                .iter()
                .map(|&channel| {
                    let entry = all
                        .by_name
                        .entry(channel.to_owned())
                        .or_insert_with(|| Channel {
                            notify: Arc::new(Notify::new()),
                            interests: 0,
                            subscription: Subscription::Unsubscribed,
                        });
                    entry.interests += 1;
                    Interest {
                        subscriber: self.clone(),
                        channel: channel.to_owned(),
                        notify: entry.notify.clone(),
                    }
                })
                .collect()
        };
        loop {
            let (done, _) = watch::channel(false);
            let (mine, theirs) = self.claim(channels, &done);
            let own = (!mine.is_empty()).then(|| {
                let own = done.subscribe();
                let this = self.clone();
                tokio::spawn(async move {
                    if let Err(err) = this.subscribe(&mine).await {
                        tracing::debug!(%err, channels = mine.len(), "subscribe failed; waiters fall back to sleeping until the connection is reopened");
                    }
                    done.send_replace(true);
                    this.settle(&mine);
                });
                own
            });
            let mut abandoned = false;
            for mut subscribing in theirs {
                abandoned |= subscribing.wait_for(|done| *done).await.is_err();
            }
            if let Some(mut own) = own {
                if own.wait_for(|done| *done).await.is_err() {
                    // Our own task was dropped before it was done: its runtime shuts down
                    // (which shuts a task down as it is spawned), or it panicked. Spawning
                    // again could go on without end, never `Pending` (a `watch` closed
                    // answers at once; only tokio's coop budget, where there is one, would
                    // make it yield): the interests go back unsubscribed, their waiter
                    // relying on its bounded sleep, and the next interest subscribes
                    // (these channels are left as "dropped on the way").
                    return interests;
                }
            }
            if !abandoned {
                return interests;
            }
            // Another interest's subscription was dropped on its way: claimed next round,
            // after a yield (the runtime may be shutting down).
            tokio::task::yield_now().await;
        }
    }

    /// Sorts `channels` (each with an interest of ours) into those this interest
    /// subscribes (marked in flight with `done`), and the subscriptions in flight it
    /// waits for.
    fn claim(
        &self,
        channels: &[&str],
        done: &watch::Sender<bool>,
    ) -> (Vec<String>, Vec<watch::Receiver<bool>>) {
        let (mut mine, mut theirs) = (Vec::new(), Vec::new());
        let mut all = self.channels();
        for &channel in channels {
            let Some(entry) = all.by_name.get_mut(channel) else {
                continue;
            };
            let part = match &entry.subscription {
                Subscription::Settled => Part::Done,
                Subscription::InFlight(subscribing) if *subscribing.borrow() => Part::Done,
                // Still on its way (its sender alive): wait for it.
                Subscription::InFlight(subscribing) if subscribing.has_changed().is_ok() => {
                    Part::Wait(subscribing.clone())
                }
                // Not yet, or dropped on its way.
                Subscription::InFlight(_) | Subscription::Unsubscribed => Part::Mine,
            };
            match part {
                Part::Done => entry.subscription = Subscription::Settled,
                Part::Mine => {
                    entry.subscription = Subscription::InFlight(done.subscribe());
                    mine.push(channel.to_owned());
                }
                Part::Wait(subscribing) => theirs.push(subscribing),
            }
        }
        (mine, theirs)
    }

    /// Marks the subscriptions of `channels` that are done as settled.
    fn settle(&self, channels: &[String]) {
        let mut all = self.channels();
        for channel in channels {
            if let Some(entry) = all.by_name.get_mut(channel) {
                if matches!(&entry.subscription, Subscription::InFlight(done) if *done.borrow()) {
                    entry.subscription = Subscription::Settled;
                }
            }
        }
    }

    /// Subscribes those of `channels` still wanted once the connection is ours (checked
    /// then, as [`unsubscribe_unwanted`](Self::unsubscribe_unwanted) checks), opening the
    /// connection if there is none, which subscribes every wanted channel. While the
    /// recovery reopens a lost connection, it is left to that: it subscribes these too.
    async fn subscribe(self: &Arc<Self>, channels: &[String]) -> redis::RedisResult<()> {
        let mut connection = self.connection.lock().await;
        let wanted: Vec<String> = {
            let all = self.channels();
            channels
                .iter()
                .filter(|&channel| all.by_name.contains_key(channel))
                .cloned()
                .collect()
        };
        if wanted.is_empty() || self.recovering.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(open) = connection.as_mut() else {
            // A new connection subscribes to every channel wanted: these among them.
            return match self.reconnect().await {
                Ok(open) => {
                    *connection = Some(open);
                    Ok(())
                }
                Err(err) => {
                    self.failed();
                    self.recover();
                    Err(err)
                }
            };
        };
        let subscribed = bounded(self.request_timeout, subscribe_all(&open.sink, &wanted)).await;
        if subscribed.is_err() {
            // No answer: the connection is of no use; another is opened.
            self.lose(&mut connection);
        }
        subscribed
    }

    /// Empties the slot after its connection failed (it ended, or a request on it went
    /// unanswered), counts the loss for the backoff (one that came before the connection
    /// stayed up [`STABLE`] adds to it, a later one starts it again), and starts the
    /// recovery. Called with `connection` held (`slot` is its content).
    fn lose(self: &Arc<Self>, slot: &mut Option<Connection>) {
        if let Some(lost) = slot.take() {
            if lost.opened.elapsed() >= STABLE {
                self.failures.store(0, Ordering::Release);
            } else {
                self.failed();
            }
        }
        self.recover();
    }

    /// Counts a failure for the backoff of the next reopening.
    fn failed(&self) {
        let _ = self
            .failures
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_add(1))
            });
    }

    /// Asks the connection's reader to ping it now (a waiter's attempt failed as
    /// unavailable: the pub/sub connection may have died with it, maybe without closing).
    /// One ping however many ask at once; an ask while a ping is on its way leaves a
    /// permit, and the reader pings once more right after that answer (harmless: one
    /// extra `PING`).
    pub(crate) fn check(&self) {
        self.check.notify_one();
    }

    /// Opens a new pub/sub connection, resubscribes to every channel still wanted (at
    /// once: one round trip), starts the task that turns messages into wake-ups, and
    /// wakes every waiter of those channels: what was published while no connection
    /// listened (since the last one was lost) was heard by no one, and the waiters try
    /// again. (On the first connection that wakes the waiters of a channel subscribed
    /// meanwhile for nothing, at most once.)
    async fn reconnect(self: &Arc<Self>) -> redis::RedisResult<Connection> {
        let pubsub = bounded(self.connect_timeout, self.client.get_async_pubsub()).await?;
        let (sink, stream) = pubsub.split();
        let wanted: Vec<String> = self.channels().by_name.keys().cloned().collect();
        bounded(self.request_timeout, subscribe_all(&sink, &wanted)).await?;
        let (reader, stop) = oneshot::channel::<()>();
        let pings = Pings {
            sink: sink.clone(),
            every: self.ping_interval,
            timeout: self.request_timeout,
            asked: self.check.clone(),
        };
        tokio::spawn(read(Arc::downgrade(self), stream, stop, pings));
        // Bumped before the wake-ups: a woken waiter sees a new connection (`opened`).
        self.opened.fetch_add(1, Ordering::AcqRel);
        {
            let all = self.channels();
            for channel in &wanted {
                if let Some(entry) = all.by_name.get(channel) {
                    entry.notify.notify_waiters();
                }
            }
        }
        Ok(Connection {
            sink,
            opened: Instant::now(),
            _reader: reader,
        })
    }

    /// Starts the task that reopens the connection (unless it runs), after whoever had
    /// the connection left it empty: a failure, not the wish of the interests, so it must
    /// not wait for a new interest. That task reopens it at once if no failure is counted
    /// (`failures`: the last connection stayed up [`STABLE`] before it was lost), else
    /// after a backoff (100 ms doubling with each failure, at most
    /// [`MAX_RECOVERY_PAUSE`], jittered), counting each failed reopening, until a
    /// connection is in place (its own, or one opened meanwhile) or no channel is wanted
    /// (the next interest opens one), or the subscriber is gone. The count outlives the
    /// recovery: a connection lost again soon after it was reopened waits longer.
    ///
    /// Called with `connection` held, so that the task, which decides to end with it
    /// held, never ends unseen between the emptying and this call.
    fn recover(self: &Arc<Self>) {
        if self.recovering.swap(true, Ordering::AcqRel) {
            return;
        }
        let recovery = Recovery(Arc::downgrade(self));
        tokio::spawn(async move {
            loop {
                let failures = match recovery.0.upgrade() {
                    Some(this) => this.failures.load(Ordering::Acquire),
                    None => return,
                };
                if failures > 0 {
                    tokio::time::sleep(jittered(backoff(failures, MAX_RECOVERY_PAUSE))).await;
                }
                let Some(this) = recovery.0.upgrade() else {
                    return;
                };
                let mut connection = this.connection.lock().await;
                if connection.is_some() || this.channels().by_name.is_empty() {
                    // Cleared with the connection held: see above.
                    drop(recovery);
                    return;
                }
                match this.reconnect().await {
                    Ok(open) => {
                        *connection = Some(open);
                        drop(recovery);
                        return;
                    }
                    Err(err) => {
                        this.failed();
                        tracing::debug!(%err, failures = failures.saturating_add(1), "reopening the pub/sub connection failed; waiters fall back to sleeping");
                    }
                }
            }
        });
    }

    /// How many pub/sub connections were opened so far: a waiter seeing it change may
    /// have missed releases, and its registration may be gone (a restart empties the
    /// waiters' sets).
    pub(crate) fn connections_opened(&self) -> u64 {
        self.opened.load(Ordering::Acquire)
    }

    /// Uncounts one interest in `channel`; `true` if it was the last (the channel is
    /// forgotten).
    fn uncount(&self, channel: &str) -> bool {
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
    }

    fn drop_interest(self: &Arc<Self>, channel: &str) {
        if !self.uncount(channel) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (this, channel) = (self.clone(), channel.to_owned());
            runtime.spawn(async move { this.unsubscribe_unwanted(&channel).await });
        }
    }

    /// Unsubscribes `channel` if no interest wants it by the time the connection is ours.
    ///
    /// Checked with the connection held, not before taking it: an interest that came
    /// meanwhile is counted by then (and the channel, subscribed by it or still by the
    /// old one, stays), or it comes later and its subscription waits for the connection,
    /// so goes out after this unsubscription. Checked before, a waiter could subscribe
    /// between the check and this `UNSUBSCRIBE`, and be left unsubscribed with its
    /// interest counted: every later waiter "not first", none subscribing.
    async fn unsubscribe_unwanted(self: &Arc<Self>, channel: &str) {
        let mut connection = self.connection.lock().await;
        if self.channels().by_name.contains_key(channel) {
            return;
        }
        if let Some(open) = connection.as_mut() {
            let timeout = self.request_timeout;
            if bounded(timeout, open.sink.unsubscribe(channel))
                .await
                .is_err()
            {
                self.lose(&mut connection);
            }
        }
    }
}

/// The running recovery task ([`Subscriber::recover`]): dropped, it lets the next loss
/// start another.
struct Recovery(Weak<Subscriber>);

impl Drop for Recovery {
    fn drop(&mut self) {
        if let Some(subscriber) = self.0.upgrade() {
            subscriber.recovering.store(false, Ordering::Release);
        }
    }
}

/// A ping on its way: resolves to whether the connection answered.
type Ping = Pin<Box<dyn Future<Output = bool> + Send>>;

/// How the reader checks its connection: a `PING` on `sink` every `every` while any
/// channel is wanted, and at once when `asked`, each answered within `timeout` or the
/// connection is lost.
struct Pings {
    sink: PubSubSink,
    every: Duration,
    timeout: Duration,
    asked: Arc<Notify>,
}

impl Pings {
    /// One ping: whether the connection answered (an error reply is an answer: an ACL
    /// without `PING` must not make the connection seem lost, again and again). redis-rs
    /// 1.x hands an error reply back as `Ok(Value::ServerError)`, which the first arm
    /// takes; the `Server` arm keeps the rule for a client that reports it as an error.
    fn ping(&self) -> Ping {
        let (mut sink, timeout) = (self.sink.clone(), self.timeout);
        Box::pin(async move {
            match bounded(timeout, sink.ping::<redis::Value>()).await {
                Ok(_) => true,
                Err(err) if matches!(err.kind(), redis::ErrorKind::Server(_)) => true,
                Err(err) => {
                    tracing::debug!(%err, "the pub/sub connection did not answer a ping; it is replaced");
                    false
                }
            }
        })
    }
}

/// The answer of the ping in flight (never, without one).
async fn answer(ping: &mut Option<Ping>) -> bool {
    match ping {
        Some(ping) => ping.await,
        None => std::future::pending().await,
    }
}

/// The task that reads the connection's messages and wakes the waiters of their channel,
/// and pings the connection while any channel is wanted ([`Pings`]), until the
/// connection is replaced or dropped (`stop`), or lost (its stream ended, or a ping went
/// unanswered): then it empties the slot, if its connection is still the one there, and
/// starts the recovery.
///
/// A ping runs beside the reading (messages are not held up by it), one at a time.
async fn read(
    subscriber: Weak<Subscriber>,
    mut stream: PubSubStream,
    mut stop: oneshot::Receiver<()>,
    pings: Pings,
) {
    let mut next_ping = Instant::now() + pings.every;
    let mut ping: Option<Ping> = None;
    loop {
        let pinging = ping.is_some();
        tokio::select! {
            message = stream.next() => {
                let Some(message) = message else { break };
                let Some(subscriber) = subscriber.upgrade() else {
                    return;
                };
                if let Some(channel) = subscriber
                    .channels()
                    .by_name
                    .get(message.get_channel_name())
                {
                    channel.notify.notify_waiters();
                }
            }
            // The connection was replaced or dropped: stop reading it.
            _ = &mut stop => return,
            answered = answer(&mut ping), if pinging => {
                ping = None;
                if !answered {
                    break;
                }
                next_ping = Instant::now() + pings.every;
            }
            () = tokio::time::sleep_until(next_ping), if !pinging => {
                let Some(subscriber) = subscriber.upgrade() else {
                    return;
                };
                if subscriber.channels().by_name.is_empty() {
                    // Nobody waits: nothing to check for.
                    next_ping = Instant::now() + pings.every;
                } else {
                    ping = Some(pings.ping());
                }
            }
            () = pings.asked.notified(), if !pinging => ping = Some(pings.ping()),
        }
    }
    // Only if it is still the one in the slot (its `Connection`, holding the other end of
    // `stop`, lives only there): one installed meanwhile must not be dropped by the old
    // reader.
    let Some(subscriber) = subscriber.upgrade() else {
        return;
    };
    let mut connection = subscriber.connection.lock().await;
    if matches!(stop.try_recv(), Err(oneshot::error::TryRecvError::Empty)) {
        subscriber.lose(&mut connection);
    }
}

/// Subscribes `sink` to every one of `channels` in one round trip: one `SUBSCRIBE` per
/// channel, pipelined. (Not one `SUBSCRIBE` of them all: redis-rs takes one reply per
/// request, and a `SUBSCRIBE` of k channels answers k confirmations, the k - 1 extra of
/// which would be taken as the answers of the requests sent after it, which would then
/// seem done before the server ran them.)
///
/// A channel the server refuses (an error reply: an ACL without it) is left unsubscribed,
/// its waiters relying on their sleep, and the others stay: the connection works. Any
/// other failure is the connection's. (redis-rs 1.x's `PubSubSink::subscribe` drops the
/// reply, so a refusal reads as `Ok` and is not warned about: the channel counts as
/// subscribed and its waiters rely on their sleep all the same.)
async fn subscribe_all(sink: &PubSubSink, channels: &[String]) -> redis::RedisResult<()> {
    let requests = channels.iter().map(|channel| {
        let mut sink = sink.clone();
        async move { sink.subscribe(channel).await }
    });
    for (channel, answer) in channels.iter().zip(join_all(requests).await) {
        match answer {
            Ok(()) => {}
            Err(err) if matches!(err.kind(), redis::ErrorKind::Server(_)) => {
                tracing::warn!(%err, channel, "the server refused a release channel's subscription; its waiters retry after their sleep");
            }
            Err(err) => return Err(err),
        }
    }
    Ok(())
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

    /// How many pub/sub connections its subscriber opened so far
    /// ([`Subscriber::connections_opened`]).
    pub(crate) fn connections_opened(&self) -> u64 {
        self.subscriber.connections_opened()
    }

    /// Asks for the pub/sub connection to be checked now ([`Subscriber::check`]).
    pub(crate) fn check_connection(&self) {
        self.subscriber.check();
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

#[cfg(all(test, feature = "testkit"))]
mod tests {
    //! Against a real `redis-server`. The races are set up by holding the connection (its
    //! mutex) and polling the futures by hand: deterministic, no timing.

    use std::pin::pin;

    use futures_util::FutureExt;

    use super::*;
    use crate::testkit::RedisServer;

    async fn subscriber(server: &RedisServer) -> Arc<Subscriber> {
        let client = redis::Client::open(server.url()).expect("client");
        let config = RedisConfig::new(server.url())
            .with_connect_timeout(Duration::from_secs(2))
            .with_request_timeout(Duration::from_secs(1));
        Arc::new(Subscriber::new(client, &config))
    }

    /// How many subscribers the server counts on `channel`.
    async fn subscribers(server: &RedisServer, channel: &str) -> u64 {
        let mut conn = server.connection().await.expect("connect");
        let (_, count): (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(&mut conn)
            .await
            .expect("PUBSUB NUMSUB");
        count
    }

    #[tokio::test]
    async fn a_later_interest_waits_for_the_subscription_in_flight() {
        let server = RedisServer::start().await.expect("redis");
        let sub = subscriber(&server).await;
        // The first interest's subscription cannot go out while we hold the connection.
        let held = sub.connection.lock().await;
        let mut first = pin!(sub.interests(&["a", "b"]));
        assert!((&mut first).now_or_never().is_none());
        // A second interest in `a` must not return before `a` is subscribed: a release
        // published meanwhile would wake no one.
        let mut second = pin!(sub.interests(&["a"]));
        assert!(
            (&mut second).now_or_never().is_none(),
            "returned while the subscription was in flight"
        );
        drop(held);
        let first = first.await;
        let second = second.await;
        assert_eq!(subscribers(&server, "a").await, 1);
        assert_eq!(subscribers(&server, "b").await, 1);
        drop((first, second));
    }

    #[tokio::test]
    async fn a_subscription_goes_on_when_its_interest_is_dropped() {
        let server = RedisServer::start().await.expect("redis");
        let sub = subscriber(&server).await;
        let held = sub.connection.lock().await;
        let mut first = Box::pin(sub.interests(&["a"]));
        assert!((&mut first).now_or_never().is_none());
        let mut second = pin!(sub.interests(&["a"]));
        assert!((&mut second).now_or_never().is_none());
        // The first waiter gives up (a wait timeout) while subscribing: its subscription
        // goes on for the second, which waits for it.
        drop(first);
        assert!(
            (&mut second).now_or_never().is_none(),
            "waits for the connection"
        );
        drop(held);
        let second = second.await;
        assert_eq!(subscribers(&server, "a").await, 1);
        drop(second);
    }

    /// A first interest whose future is alive but no longer polled (its caller busy
    /// elsewhere) holds up no later interest in the channel. Before, it subscribed from
    /// its own future, holding the connection: polled once, it held it with the
    /// subscription unsent, and every later interest waited for it without end.
    #[tokio::test]
    async fn an_unpolled_first_interest_holds_up_no_one() {
        let server = RedisServer::start().await.expect("redis");
        let sub = subscriber(&server).await;
        let mut first = pin!(sub.interests(&["x"]));
        assert!((&mut first).now_or_never().is_none());
        // What a subscription may take: opening the connection and one request.
        let bound = sub.connect_timeout + sub.request_timeout;
        let second = tokio::time::timeout(bound, sub.interests(&["x"]))
            .await
            .expect("the second interest waited for the unpolled first");
        assert_eq!(subscribers(&server, "x").await, 1);
        drop(second);
    }

    /// An interest taken while its runtime shuts down returns, its subscription left to
    /// the next interest, instead of spinning: the task it spawns to subscribe is shut
    /// down at once (the runtime's task list is closed), the subscription is abandoned,
    /// and before, the loop claimed it again and spawned again, never `Pending`: its
    /// worker spun at 100 % and the runtime's shutdown never finished.
    ///
    /// Deterministic: the interest is taken by a task blocked (its worker with it) until
    /// the shutdown has begun, which another task's drop tells. Taken `unconstrained`:
    /// since tokio 1.41 a `watch` wait spends the task's coop budget, which makes the old
    /// loop yield (and the shutdown drop it) after some 128 rounds; without the budget
    /// (an older tokio, which `tokio = "1"` allows, or a caller's `unconstrained`) it
    /// never did. The fix must not rely on the budget.
    #[test]
    fn an_interest_taken_while_the_runtime_shuts_down_returns() {
        use std::sync::mpsc;

        /// Tells its receiver when dropped.
        struct Dropped(mpsc::Sender<()>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                let _ = self.0.send(());
            }
        }

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let server = runtime.block_on(RedisServer::start()).expect("redis");
        let sub = runtime.block_on(subscriber(&server));
        // Dropped by the shutdown (idle: the other worker drops it at once).
        let (shutting_down, shutdown_began) = mpsc::channel();
        let sentinel = Dropped(shutting_down);
        runtime.spawn(async move {
            let _sentinel = sentinel;
            std::future::pending::<()>().await;
        });
        let (started, start) = mpsc::channel();
        let (done, finished) = mpsc::channel();
        let guard = Dropped(done);
        runtime.spawn(async move {
            let _guard = guard;
            let _ = started.send(());
            // Blocks this worker until the shutdown has begun.
            let _ = shutdown_began.recv();
            let _interests = tokio::task::unconstrained(sub.interests(&["x"])).await;
            // Pending: the shutdown drops the task here, and `_guard` with it.
            std::future::pending::<()>().await;
        });
        start.recv().expect("the task runs");
        runtime.shutdown_timeout(Duration::from_secs(2));
        finished
            .recv_timeout(Duration::from_secs(1))
            .expect("the task taking an interest during the shutdown spun, never dropped");
        drop(server);
    }

    /// The task that unsubscribes a channel whose last interest went checks, once the
    /// connection is its own, that nobody wants the channel again: here someone does
    /// (counted and subscribed, the channel having stayed subscribed) by then.
    #[tokio::test]
    async fn an_unsubscription_rechecks_once_the_connection_is_its_own() {
        let server = RedisServer::start().await.expect("redis");
        let sub = subscriber(&server).await;
        let interest = sub.interests(&["a"]).await;
        assert_eq!(subscribers(&server, "a").await, 1);
        let held = sub.connection.lock().await;
        // The last interest goes: the channel is forgotten, and the unsubscription (its
        // task's future, polled here by hand) waits for the connection.
        assert!(sub.uncount("a"));
        let mut unsubscribing = pin!(sub.unsubscribe_unwanted("a"));
        assert!((&mut unsubscribing).now_or_never().is_none());
        // Meanwhile a waiter is interested again, its subscription done (the server still
        // has the channel subscribed).
        sub.channels().by_name.insert(
            "a".to_owned(),
            Channel {
                notify: Arc::new(Notify::new()),
                interests: 1,
                subscription: Subscription::Settled,
            },
        );
        drop(held);
        unsubscribing.await;
        assert_eq!(
            subscribers(&server, "a").await,
            1,
            "unsubscribed while wanted"
        );
        // (Its drop uncounts what the waiter above counted: nothing is left.)
        drop(interest);
    }
}
