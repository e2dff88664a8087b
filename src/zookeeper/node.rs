//! Lock node names (Curator's protected mode) and their removal.
//!
//! A contender's node is `<namespace>/<name>/_c_<uuid>-lock-<sequence>`: the format of
//! Curator's `InterProcessMutex` with protection on. The random id is chosen before the
//! create is sent, so that a create whose answer was lost can be *found* (by the id)
//! instead of repeated: a second create would leave the first node queued under a live
//! session, blocking every later contender for as long as the session lives.

use std::sync::Arc;
use std::time::Duration;

use zookeeper_client::Error as ZkError;

use super::error::RequestError;
use super::session::Session;

/// What a contender's node name carries before its sequence number: Curator's lock names
/// (`InterProcessMutex`'s `lock-`, `InterProcessReadWriteLock`'s `__READ__` and
/// `__WRIT__`), after the protected id and a dash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mark {
    /// A mutex contender: excludes everyone.
    Lock,
    /// A reader of a read-write lock: shares with other readers.
    Read,
    /// A writer of a read-write lock: excludes everyone.
    Write,
}

impl Mark {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Lock => "-lock-",
            Self::Read => "-__READ__",
            Self::Write => "-__WRIT__",
        }
    }

    /// Whether a node of this kind keeps a reader behind it waiting.
    pub(crate) fn excludes_readers(self) -> bool {
        self != Self::Read
    }
}

/// A fresh protected-mode id, `_c_<uuid v4>`.
pub(crate) fn protected_id() -> String {
    let mut bytes = [0u8; 16];
    // Without an OS random source, fall back to the time and the process id: unique
    // enough to tell our node from others in one lock's queue.
    if getrandom::fill(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        bytes.copy_from_slice(&(nanos ^ u128::from(std::process::id()) << 64).to_le_bytes());
    }
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "_c_{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Where one acquisition's node is, or may be.
#[derive(Clone, Debug)]
pub(crate) struct NodeRef {
    /// The lock's node, `<namespace>/<name>`.
    pub(crate) dir: String,
    /// The protected-mode id in the node's name.
    pub(crate) id: String,
    /// The full path, once the create's answer told it.
    pub(crate) path: Option<String>,
    /// A create of this acquisition had an unknown outcome: a node with its id other
    /// than `path` may still appear (a create applied late), so removing ours looks for
    /// every node with the id.
    pub(crate) ambiguous: bool,
}

impl NodeRef {
    /// The paths of every node with our id: after a `sync`, so that the server we read
    /// from has applied every earlier request of the session (the creates among them).
    pub(crate) async fn find_all(&self, session: &Session) -> Result<Vec<String>, RequestError> {
        let dir = self.dir.clone();
        session
            .call(|client| async move { client.sync(&dir).await })
            .await?;
        let dir = self.dir.clone();
        let children = session
            .call(|client| async move { client.list_children(&dir).await })
            .await;
        let children = match children {
            Err(RequestError::Server(ZkError::NoNode)) => return Ok(Vec::new()),
            other => other?,
        };
        Ok(children
            .into_iter()
            .filter(|child| child.starts_with(&self.id))
            .map(|child| format!("{}/{child}", self.dir))
            .collect())
    }

    /// Deletes our node, and every other node with our id when a create's outcome was
    /// unknown (or the path was never told). `Ok` once they are gone or were never
    /// created.
    pub(crate) async fn remove(&self, session: &Session) -> Result<(), RequestError> {
        let mut paths: Vec<String> = self.path.iter().cloned().collect();
        if self.ambiguous || self.path.is_none() {
            for found in self.find_all(session).await? {
                if !paths.contains(&found) {
                    paths.push(found);
                }
            }
        }
        for path in paths {
            delete(session, path).await?;
        }
        Ok(())
    }

    /// Removes our node in the background, retrying until the server confirms it or the
    /// session is gone (which removes it too).
    pub(crate) fn remove_in_background(self, session: Arc<Session>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let mut pause = Duration::from_millis(50);
            loop {
                match self.remove(&session).await {
                    Ok(()) => return,
                    Err(err) if err.session_gone().is_some() => return,
                    Err(err) => {
                        tracing::debug!(%err, dir = %self.dir, "removing a lock node failed; retrying");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(2));
                    }
                }
            }
        });
    }
}

/// Deletes the node at `path`; `Ok` if it is gone already.
pub(crate) async fn delete(session: &Session, path: String) -> Result<(), RequestError> {
    let deleted = session
        .call(|client| async move { client.delete(&path, None).await })
        .await;
    match deleted {
        Ok(()) | Err(RequestError::Server(ZkError::NoNode)) => Ok(()),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_look_like_curators() {
        let (a, b) = (protected_id(), protected_id());
        assert_ne!(a, b);
        assert!(a.starts_with("_c_") && a.len() == 39, "{a}");
    }
}
