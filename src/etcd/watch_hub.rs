//! One watch stream per session, shared by all of its waits.
//!
//! Waiters ask the hub to watch one key (their predecessor) for deletion. Watches are
//! created *without* a start revision: etcd then puts them in its "synced" group and
//! delivers events at once. A watch that starts at a past revision lands in the "unsynced"
//! group, which a loop catches up only every 100 ms (`syncWatchersLoop`), and each handoff
//! would wait for it. Waiters must therefore re-read after the watch is created, so that
//! a deletion just before the watch is not missed; see `acquire.rs`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use etcd_client::{Client, EventType, WatchFilterType, WatchOptions, WatchResponse};
use etcd_client::{WatchRequestSender, WatchResponseStream};
use tokio::sync::mpsc;

/// How long opening the session's watch stream may take.
const OPEN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// What a registered watch reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WatchSignal {
    /// The watch is registered at this store revision: deletions after it will be seen.
    Created,
    /// The watched key (or a key under the watched prefix) was deleted.
    Deleted,
    /// The watched key was written (only for watches that include puts).
    Changed,
    /// The watch ended without seeing a deletion (cancelled by the server, compaction,
    /// stream broken). The waiter must re-read and watch again.
    Ended(String),
}

/// What a watch covers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scope {
    /// Every key under `key` as a prefix, instead of `key` alone.
    pub(crate) prefix: bool,
    /// Report writes too, not only deletions.
    pub(crate) puts: bool,
}

enum Command {
    Watch {
        id: i64,
        key: Vec<u8>,
        scope: Scope,
        signals: mpsc::UnboundedSender<WatchSignal>,
    },
    Cancel {
        id: i64,
    },
}

/// Handle to the session's watch task. The task stops when the hub is dropped.
#[derive(Debug)]
pub(crate) struct WatchHub {
    commands: mpsc::UnboundedSender<Command>,
    next_id: Arc<AtomicI64>,
}

impl WatchHub {
    pub(crate) fn start(client: Client) -> Self {
        let (commands, receiver) = mpsc::unbounded_channel();
        tokio::spawn(HubTask::new(client).run(receiver));
        Self {
            commands,
            next_id: Arc::new(AtomicI64::new(1)),
        }
    }

    /// Starts watching `key` for deletion. The registration reports `Created` first (or
    /// `Ended` if the watch could not be set up). Dropping it cancels the watch.
    pub(crate) fn watch_deletion(&self, key: Vec<u8>) -> Registration {
        self.watch(
            key,
            Scope {
                prefix: false,
                puts: false,
            },
        )
    }

    /// Starts a watch on `key` (or every key under it) with the given scope; see
    /// [`watch_deletion`](Self::watch_deletion).
    pub(crate) fn watch(&self, key: Vec<u8>, scope: Scope) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (signals, receiver) = mpsc::unbounded_channel();
        let registered = self
            .commands
            .send(Command::Watch {
                id,
                key: key.clone(),
                scope,
                signals,
            })
            .is_ok();
        Registration {
            id,
            key,
            receiver,
            commands: self.commands.clone(),
            ended: !registered,
        }
    }
}

/// One watch on one key.
#[derive(Debug)]
pub(crate) struct Registration {
    id: i64,
    key: Vec<u8>,
    receiver: mpsc::UnboundedReceiver<WatchSignal>,
    commands: mpsc::UnboundedSender<Command>,
    ended: bool,
}

impl Registration {
    /// The watched key.
    pub(crate) fn key(&self) -> &[u8] {
        &self.key
    }

    /// Whether the watch has ended; an ended watch reports nothing more.
    pub(crate) fn has_ended(&self) -> bool {
        self.ended
    }

    /// The next signal. After `Ended` (or if the hub is gone) it keeps returning `Ended`.
    pub(crate) async fn next(&mut self) -> WatchSignal {
        if self.ended {
            return WatchSignal::Ended("watch already ended".into());
        }
        let signal = self
            .receiver
            .recv()
            .await
            .unwrap_or_else(|| WatchSignal::Ended("watch task stopped".into()));
        if matches!(signal, WatchSignal::Ended(_)) {
            self.ended = true;
        }
        signal
    }

    /// Waits until the watch is set up; `false` if it ended instead.
    pub(crate) async fn created(&mut self) -> bool {
        loop {
            match self.next().await {
                WatchSignal::Created => return true,
                WatchSignal::Ended(_) => return false,
                WatchSignal::Deleted | WatchSignal::Changed => {}
            }
        }
    }

    /// Waits until the next event (a deletion, or a write if the scope includes writes)
    /// or the end of the watch.
    pub(crate) async fn deleted(&mut self) {
        while matches!(self.next().await, WatchSignal::Created) {}
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.commands.send(Command::Cancel { id: self.id });
        }
    }
}

struct HubTask {
    client: Client,
    stream: Option<(WatchRequestSender, WatchResponseStream)>,
    watchers: HashMap<i64, mpsc::UnboundedSender<WatchSignal>>,
}

impl HubTask {
    fn new(client: Client) -> Self {
        Self {
            client,
            stream: None,
            watchers: HashMap::new(),
        }
    }

    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            tokio::select! {
                command = commands.recv() => match command {
                    Some(command) => self.handle(command).await,
                    None => return,
                },
                response = next_response(&mut self.stream) => match response {
                    Ok(Some(response)) => self.dispatch(&response),
                    Ok(None) => self.break_stream("watch stream ended"),
                    Err(err) => self.break_stream(&err.to_string()),
                },
            }
        }
    }

    async fn handle(&mut self, command: Command) {
        match command {
            Command::Watch {
                id,
                key,
                scope,
                signals,
            } => {
                let mut options = WatchOptions::new().with_watch_id(id);
                if scope.prefix {
                    options = options.with_prefix();
                }
                if !scope.puts {
                    options = options.with_filters([WatchFilterType::NoPut]);
                }
                let sent = match &mut self.stream {
                    Some((sender, _)) => sender.watch(key, Some(options)).await,
                    // Bounded: a hub stuck on an unreachable member would stall every wait.
                    None => match tokio::time::timeout(
                        OPEN_TIMEOUT,
                        self.client.watch(key, Some(options)),
                    )
                    .await
                    {
                        Ok(Ok(stream)) => {
                            self.stream = Some(stream.split());
                            Ok(())
                        }
                        Ok(Err(err)) => Err(err),
                        Err(_) => Err(etcd_client::Error::WatchError(
                            "opening the watch stream timed out".into(),
                        )),
                    },
                };
                match sent {
                    Ok(()) => {
                        self.watchers.insert(id, signals);
                    }
                    Err(err) => {
                        let _ = signals.send(WatchSignal::Ended(err.to_string()));
                        self.break_stream(&err.to_string());
                    }
                }
            }
            Command::Cancel { id } => {
                if self.watchers.remove(&id).is_some() {
                    if let Some((sender, _)) = &mut self.stream {
                        if let Err(err) = sender.cancel(id).await {
                            self.break_stream(&err.to_string());
                        }
                    }
                }
            }
        }
    }

    fn dispatch(&mut self, response: &WatchResponse) {
        let id = response.watch_id();
        let Some(signals) = self.watchers.get(&id) else {
            return;
        };
        if response.created() {
            let _ = signals.send(WatchSignal::Created);
        }
        for event in response.events() {
            let signal = match event.event_type() {
                EventType::Delete => WatchSignal::Deleted,
                EventType::Put => WatchSignal::Changed,
            };
            let _ = signals.send(signal);
        }
        if response.canceled() {
            let reason = match response.compact_revision() {
                0 => format!("watch cancelled: {}", response.cancel_reason()),
                rev => format!("watch start revision compacted (compact revision {rev})"),
            };
            if let Some(signals) = self.watchers.remove(&id) {
                let _ = signals.send(WatchSignal::Ended(reason));
            }
        }
    }

    /// Every watch on a broken stream has ended; the next watch opens a new stream.
    fn break_stream(&mut self, why: &str) {
        tracing::debug!(why, watchers = self.watchers.len(), "watch stream closed");
        self.stream = None;
        for (_, signals) in self.watchers.drain() {
            let _ = signals.send(WatchSignal::Ended(why.to_owned()));
        }
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
