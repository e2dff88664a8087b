//! The soak's record of the truth: a watch from revision 1 over the namespace, on a client
//! of its own that no fault touches, resumed from the revision after the last one it saw
//! whenever its stream breaks (a member killed). The nemesis compacts only up to what the
//! recorder has seen, so the record never has a hole.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{Client, EventType, WatchOptions};
use tokio::sync::watch;
use tokio::time::Instant;

use super::checker::{Observed, Put};

/// The recorder's shared state.
#[derive(Debug, Default)]
pub(crate) struct Record {
    events: Mutex<Vec<Observed>>,
}

impl Record {
    fn push(&self, observed: Vec<Observed>) {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(observed);
    }

    /// Everything recorded so far.
    pub(crate) fn snapshot(&self) -> Vec<Observed> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Records every change under `namespace/` into `record` until `stop` turns true;
/// `progress` tells the highest revision up to which every change has been seen.
///
/// A watch that stops delivering without an error (its member restarting, a stream that
/// hangs) would leave the record silently incomplete, and the checker would then see keys
/// alive that are gone: so the recorder asks for a progress notification every second
/// (etcd answers once every event up to the store's revision has been sent) and opens a
/// new watch, from the revision after the last it saw, when none comes within 3 s.
pub(crate) async fn record(
    client: Client,
    namespace: String,
    record: Arc<Record>,
    progress: watch::Sender<i64>,
    mut stop: watch::Receiver<bool>,
) {
    const OPEN: Duration = Duration::from_secs(3);
    const SILENCE: Duration = Duration::from_secs(3);
    let prefix = format!("{namespace}/");
    let mut next = 1;
    loop {
        if *stop.borrow() {
            return;
        }
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(next)
            .with_progress_notify();
        let mut watcher = client.watch_client();
        let opened = tokio::select! {
            opened = tokio::time::timeout(OPEN, watcher.watch(prefix.as_str(), Some(options))) => opened,
            _ = stop.changed() => return,
        };
        let Ok(Ok(mut stream)) = opened else {
            // (A restarted member refuses the token it forgot: log in again.)
            let _ = client.refresh_token().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut heard = Instant::now();
        let mut ask = tokio::time::interval(Duration::from_secs(1));
        loop {
            let message = tokio::select! {
                message = stream.message() => message,
                _ = ask.tick() => {
                    if heard.elapsed() > SILENCE || stream.request_progress().await.is_err() {
                        tracing::debug!("soak recorder: watch silent; opening another");
                        break;
                    }
                    continue;
                }
                _ = stop.changed() => return,
            };
            let Ok(Some(response)) = message else { break };
            heard = Instant::now();
            if response.canceled() {
                tracing::warn!(
                    compact = response.compact_revision(),
                    "the soak recorder's watch was cancelled"
                );
                break;
            }
            let observed: Vec<Observed> = response
                .events()
                .iter()
                .filter_map(|event| {
                    let kv = event.kv()?;
                    let put = (event.event_type() == EventType::Put).then(|| Put {
                        create_revision: kv.create_revision(),
                        value: kv.value().to_vec(),
                        lease: kv.lease(),
                    });
                    Some(Observed {
                        revision: kv.mod_revision(),
                        key: kv.key().to_vec(),
                        put,
                        seen: heard,
                    })
                })
                .collect();
            // Recorded before the progress is told: whoever waits for a revision then
            // finds it in the record.
            let seen_through = match observed.last() {
                Some(last) => Some(last.revision),
                // A progress notification: every event up to its revision has been sent.
                None if !response.created() => response
                    .header()
                    .map(|h| h.revision())
                    .filter(|revision| *revision >= next),
                None => None,
            };
            record.push(observed);
            if let Some(revision) = seen_through {
                next = revision + 1;
                progress.send_replace(revision);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
