//! Keys that a late join may still create, or that a refused delete left, swept away
//! while their session lives.
//!
//! (A delete refused for want of permission leaves its key under the renewed lease in
//! the same way: the name is spent and the session retired, and the sweep deletes the
//! key once the role may again.)
//!
//! A join that got no answer may be applied after its acquisition gave up and removed
//! the key (`key_life.rs`): the key then appears under a lease that is still renewed. The
//! session is retired, so its lease is revoked once its last guard goes, but that guard
//! may be held for minutes, and the late key blocks the lock until then. The key's name
//! is spent (never used again by the session), so any key that appears under it is a
//! late join's: the session reads those names again (after 250 ms, backing off to every
//! second) and deletes what it finds, for as long as its lease lives. A put carrying a
//! revoked lease fails whole, so nothing can appear after that.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use etcd_client::GetOptions;

use super::call::call_retrying;
use super::session::SessionInner;

/// The names of one session whose join may still land.
#[derive(Debug, Default)]
pub(crate) struct LateJoins {
    keys: Mutex<Vec<(String, String)>>,
}

impl LateJoins {
    fn keys(&self) -> std::sync::MutexGuard<'_, Vec<(String, String)>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Starts sweeping `key` (of lock `name`) on `session`: the first such key starts the
/// session's sweeper, which ends with the session.
pub(crate) fn sweep(session: &Arc<SessionInner>, name: &str, key: &str) {
    let first = {
        let mut keys = session.late_joins.keys();
        if keys.iter().any(|(_, swept)| swept == key) {
            return;
        }
        keys.push((name.to_owned(), key.to_owned()));
        keys.len() == 1
    };
    if first {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(sweeper(Arc::downgrade(session)));
        }
    }
}

/// Reads the swept names and deletes what is there, until the session is gone (dropped,
/// or its lease lost: a revoked lease took the keys with it).
async fn sweeper(session: Weak<SessionInner>) {
    let mut pause = Duration::from_millis(250);
    loop {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
        let Some(inner) = session.upgrade() else {
            return;
        };
        if !inner.is_alive() {
            return;
        }
        let keys = inner.late_joins.keys().clone();
        for (name, key) in keys {
            let timeout = inner.config.request_timeout;
            // A read first: a delete is a Raft write even when there is nothing to delete.
            let renewal = &inner.renewal;
            let read = call_retrying("late join sweep", Some(&name), timeout, renewal, || {
                let mut client = inner.kv.clone();
                let key = key.clone();
                async move {
                    client
                        .get(key, Some(GetOptions::new().with_count_only()))
                        .await
                }
            })
            .await;
            if read.is_ok_and(|read| read.count() > 0) {
                let deleted =
                    call_retrying("late join sweep", Some(&name), timeout, renewal, || {
                        let mut client = inner.kv.clone();
                        let key = key.clone();
                        async move { client.delete(key, None).await }
                    })
                    .await;
                if let Some(_deleted) = deleted.ok().filter(|deleted| deleted.deleted() > 0) {
                    #[cfg(feature = "testkit")]
                    super::observed::deleted(
                        key.as_bytes(),
                        _deleted.header().map(|h| h.revision()),
                    );
                    tracing::warn!(key, "deleted a key a late join created");
                }
            }
        }
    }
}
