//! One watch stream per session, and on it one watch per lock name (its whole prefix,
//! deletions only), shared by every wait of the session on that lock and kept open for
//! [`LINGER`] after the last one ends.
//!
//! A watch that already exists is in etcd's "synced" group and delivers a deletion at
//! once. A watch created per wait races with the commits around it: etcd turns "no start
//! revision" into `current + 1` before it registers the watcher, so a commit in between
//! puts it in the "unsynced" group, which a loop catches up only every 100 ms
//! (`mvcc/watchable_store.go`, `syncWatchersLoop`), and a contended handoff waits for that
//! loop (measured: p99 ~90 ms). A waiter subscribes *before* it joins the queue when the
//! watch is open: every deletion after its read reaches it, provided the watch was created
//! at or before the read's revision (the subscription says when; `queue.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, EventType, WatchFilterType, WatchOptions, WatchResponse};
use etcd_client::{WatchRequestSender, WatchResponseStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How long opening the session's watch stream may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a lock watch stays open after its last subscriber left: successive waits on
/// one lock (a busy queue) find it already synced.
pub(crate) const LINGER: Duration = Duration::from_secs(10);

/// What a lock watch reports to a subscriber.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LockSignal {
    /// The watch exists since this store revision: every deletion after it is delivered.
    Created(i64),
    /// This key under the lock's prefix was deleted, at this revision.
    Deleted(Vec<u8>, i64),
    /// The watch ended (cancelled by the server, stream broken).
    Ended(String),
}

enum Command {
    Subscribe {
        prefix: Vec<u8>,
        subscriber: u64,
        signals: mpsc::UnboundedSender<LockSignal>,
    },
    Unsubscribe {
        prefix: Vec<u8>,
        subscriber: u64,
    },
}

/// Handle to the session's watch task. The task stops when the hub is dropped.
#[derive(Debug)]
pub(crate) struct WatchHub {
    commands: mpsc::UnboundedSender<Command>,
    next_subscriber: AtomicU64,
    /// The prefixes with an open lock watch, as the task last knew them.
    open: Arc<Mutex<HashSet<Vec<u8>>>>,
}

impl WatchHub {
    pub(crate) fn start(client: Client) -> Self {
        let (commands, receiver) = mpsc::unbounded_channel();
        let open = Arc::new(Mutex::new(HashSet::new()));
        tokio::spawn(HubTask::new(client, open.clone()).run(receiver));
        Self {
            commands,
            next_subscriber: AtomicU64::new(1),
            open,
        }
    }

    /// [`subscribe`](Self::subscribe), only if the lock's watch is open already (a recent
    /// wait on this lock): subscribing before joining the queue then costs nothing, where
    /// opening a watch for every lock taken would cost a request even when nobody waits.
    pub(crate) fn subscribe_if_open(&self, prefix: &str) -> Option<Subscription> {
        let open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(prefix.as_bytes());
        open.then(|| self.subscribe(prefix))
    }

    /// Subscribes to the deletions under the lock prefix `prefix`, opening the lock's
    /// watch if it is not open. Dropping the subscription unsubscribes.
    pub(crate) fn subscribe(&self, prefix: &str) -> Subscription {
        let subscriber = self.next_subscriber.fetch_add(1, Ordering::Relaxed);
        let (signals, receiver) = mpsc::unbounded_channel();
        let prefix = prefix.as_bytes().to_vec();
        let sent = self
            .commands
            .send(Command::Subscribe {
                prefix: prefix.clone(),
                subscriber,
                signals,
            })
            .is_ok();
        Subscription {
            prefix,
            subscriber,
            receiver,
            commands: self.commands.clone(),
            created: None,
            ended: !sent,
        }
    }
}

/// One wait's share of a lock watch.
#[derive(Debug)]
pub(crate) struct Subscription {
    prefix: Vec<u8>,
    subscriber: u64,
    receiver: mpsc::UnboundedReceiver<LockSignal>,
    commands: mpsc::UnboundedSender<Command>,
    created: Option<i64>,
    ended: bool,
}

impl Subscription {
    /// Waits until the lock watch exists; returns the store revision it was created at
    /// (every deletion after it is delivered), or `None` if it ended instead.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a later call picks up where this one was.
    pub(crate) async fn ready(&mut self) -> Option<i64> {
        while self.created.is_none() && !self.ended {
            match self.receiver.recv().await {
                Some(LockSignal::Created(revision)) => self.created = Some(revision),
                // Deletions before the watch is confirmed precede it: the read after it
                // covers them.
                Some(LockSignal::Deleted(..)) => {}
                Some(LockSignal::Ended(_)) | None => self.ended = true,
            }
        }
        if self.ended { None } else { self.created }
    }

    /// The next key deleted under the lock's prefix, and the revision of its deletion;
    /// `None` once the watch has ended.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a deletion not yet taken stays in the queue.
    pub(crate) async fn next_deletion(&mut self) -> Option<(Vec<u8>, i64)> {
        if self.ended {
            return None;
        }
        loop {
            match self.receiver.recv().await {
                Some(LockSignal::Deleted(key, revision)) => return Some((key, revision)),
                Some(LockSignal::Created(revision)) => self.created = Some(revision),
                Some(LockSignal::Ended(_)) | None => {
                    self.ended = true;
                    return None;
                }
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Unsubscribe {
            prefix: std::mem::take(&mut self.prefix),
            subscriber: self.subscriber,
        });
    }
}

/// A lock watch and its subscribers.
struct LockWatch {
    id: i64,
    created: Option<i64>,
    subscribers: HashMap<u64, mpsc::UnboundedSender<LockSignal>>,
    /// Since when it has had no subscriber.
    idle_since: Option<Instant>,
}

struct HubTask {
    client: Client,
    next_id: i64,
    open: Arc<Mutex<HashSet<Vec<u8>>>>,
    stream: Option<(WatchRequestSender, WatchResponseStream)>,
    locks: HashMap<Vec<u8>, LockWatch>,
    lock_ids: HashMap<i64, Vec<u8>>,
    /// `locks` gained or lost an entry since `open` was last published.
    open_changed: bool,
}

impl HubTask {
    fn new(client: Client, open: Arc<Mutex<HashSet<Vec<u8>>>>) -> Self {
        Self {
            client,
            next_id: 1,
            open,
            stream: None,
            locks: HashMap::new(),
            lock_ids: HashMap::new(),
            open_changed: false,
        }
    }

    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            let sweep = self.next_sweep();
            tokio::select! {
                // Commands first: a subscription made before a waiter's read must be in
                // place before any event after that read is dispatched.
                biased;
                command = commands.recv() => match command {
                    Some(command) => self.handle(command).await,
                    None => return,
                },
                response = next_response(&mut self.stream) => match response {
                    Ok(Some(response)) => self.dispatch(&response),
                    Ok(None) => self.break_stream("watch stream ended"),
                    Err(err) => self.break_stream(&err.to_string()),
                },
                () = sleep_until_opt(sweep) => self.close_idle().await,
            }
            if self.open_changed {
                self.open_changed = false;
                self.publish_open();
            }
        }
    }

    /// Publishes which lock watches are open (for `subscribe_if_open`).
    fn publish_open(&self) {
        let mut open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        open.clear();
        open.extend(self.locks.keys().cloned());
    }

    /// When the next idle lock watch is due to close.
    fn next_sweep(&self) -> Option<Instant> {
        self.locks
            .values()
            .filter_map(|w| w.idle_since)
            .min()
            .map(|since| since + LINGER)
    }

    async fn close_idle(&mut self) {
        let now = Instant::now();
        let due: Vec<Vec<u8>> = self
            .locks
            .iter()
            .filter(|(_, w)| w.idle_since.is_some_and(|since| since + LINGER <= now))
            .map(|(prefix, _)| prefix.clone())
            .collect();
        for prefix in due {
            if let Some(watch) = self.locks.remove(&prefix) {
                self.open_changed = true;
                self.lock_ids.remove(&watch.id);
                self.cancel(watch.id).await;
            }
        }
    }

    async fn handle(&mut self, command: Command) {
        match command {
            Command::Subscribe {
                prefix,
                subscriber,
                signals,
            } => self.subscribe(prefix, subscriber, signals).await,
            Command::Unsubscribe { prefix, subscriber } => {
                if let Some(watch) = self.locks.get_mut(&prefix) {
                    watch.subscribers.remove(&subscriber);
                    if watch.subscribers.is_empty() {
                        watch.idle_since = Some(Instant::now());
                    }
                }
            }
        }
    }

    async fn subscribe(
        &mut self,
        prefix: Vec<u8>,
        subscriber: u64,
        signals: mpsc::UnboundedSender<LockSignal>,
    ) {
        if let Some(watch) = self.locks.get_mut(&prefix) {
            if let Some(revision) = watch.created {
                let _ = signals.send(LockSignal::Created(revision));
            }
            watch.subscribers.insert(subscriber, signals);
            watch.idle_since = None;
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        let options = WatchOptions::new()
            .with_watch_id(id)
            .with_prefix()
            .with_filters([WatchFilterType::NoPut]);
        match self.send_watch(prefix.clone(), options).await {
            Ok(()) => {
                self.open_changed = true;
                self.lock_ids.insert(id, prefix.clone());
                self.locks.insert(
                    prefix,
                    LockWatch {
                        id,
                        created: None,
                        subscribers: HashMap::from([(subscriber, signals)]),
                        idle_since: None,
                    },
                );
            }
            Err(err) => {
                let _ = signals.send(LockSignal::Ended(err.clone()));
                self.break_stream(&err);
            }
        }
    }

    /// Sends a watch request, opening the stream first if there is none.
    async fn send_watch(&mut self, key: Vec<u8>, options: WatchOptions) -> Result<(), String> {
        match &mut self.stream {
            Some((sender, _)) => sender
                .watch(key, Some(options))
                .await
                .map_err(|e| e.to_string()),
            // Bounded: a hub stuck on an unreachable member would stall every wait.
            None => match tokio::time::timeout(OPEN_TIMEOUT, self.client.watch(key, Some(options)))
                .await
            {
                Ok(Ok(stream)) => {
                    self.stream = Some(stream.split());
                    Ok(())
                }
                Ok(Err(err)) => Err(err.to_string()),
                Err(_) => Err("opening the watch stream timed out".into()),
            },
        }
    }

    async fn cancel(&mut self, id: i64) {
        if let Some((sender, _)) = &mut self.stream {
            if let Err(err) = sender.cancel(id).await {
                self.break_stream(&err.to_string());
            }
        }
    }

    fn dispatch(&mut self, response: &WatchResponse) {
        if let Some(prefix) = self.lock_ids.get(&response.watch_id()).cloned() {
            self.dispatch_lock(&prefix, response);
        }
    }

    fn dispatch_lock(&mut self, prefix: &[u8], response: &WatchResponse) {
        let Some(watch) = self.locks.get_mut(prefix) else {
            return;
        };
        let mut signals = Vec::new();
        if response.created() {
            let revision = response.header().map_or(0, |h| h.revision());
            watch.created = Some(revision);
            signals.push(LockSignal::Created(revision));
        }
        for event in response.events() {
            if event.event_type() == EventType::Delete {
                if let Some(kv) = event.kv() {
                    signals.push(LockSignal::Deleted(kv.key().to_vec(), kv.mod_revision()));
                }
            }
        }
        let canceled = response.canceled();
        if canceled {
            signals.push(LockSignal::Ended(cancel_reason(response)));
        }
        for sender in watch.subscribers.values() {
            for signal in &signals {
                let _ = sender.send(signal.clone());
            }
        }
        if canceled {
            self.lock_ids.remove(&watch.id);
            self.locks.remove(prefix);
            self.open_changed = true;
        }
    }

    /// Every watch on a broken stream has ended; the next watch opens a new stream.
    fn break_stream(&mut self, why: &str) {
        tracing::debug!(why, locks = self.locks.len(), "watch stream closed");
        self.stream = None;
        for (_, watch) in self.locks.drain() {
            for sender in watch.subscribers.values() {
                let _ = sender.send(LockSignal::Ended(why.to_owned()));
            }
        }
        self.lock_ids.clear();
        self.open_changed = true;
    }
}

fn cancel_reason(response: &WatchResponse) -> String {
    match response.compact_revision() {
        0 => format!("watch cancelled: {}", response.cancel_reason()),
        rev => format!("watch start revision compacted (compact revision {rev})"),
    }
}

async fn next_response(
    stream: &mut Option<(WatchRequestSender, WatchResponseStream)>,
) -> Result<Option<WatchResponse>, etcd_client::Error> {
    match stream {
        Some((_, responses)) => responses.message().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
