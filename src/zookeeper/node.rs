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
    const ALL: [Mark; 3] = [Mark::Lock, Mark::Read, Mark::Write];

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

/// The kind and sequence number of a contender's node name, if it is one.
pub(crate) fn parse(node: &str) -> Option<(Mark, u64)> {
    let (mark, at) = Mark::ALL
        .iter()
        .filter_map(|mark| node.rfind(mark.as_str()).map(|at| (*mark, at)))
        .max_by_key(|(_, at)| *at)?;
    let digits = &node[at + mark.as_str().len()..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((mark, digits.parse().ok()?))
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

/// The sequence number of a contender's node name, if it is one.
pub(crate) fn sequence(node: &str) -> Option<u64> {
    parse(node).map(|(_, sequence)| sequence)
}

/// The contenders among `children`, in queue order (by sequence number).
pub(crate) fn queue(mut children: Vec<String>) -> Vec<String> {
    children.retain(|child| sequence(child).is_some());
    children.sort_by_key(|child| sequence(child));
    children
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
}

impl NodeRef {
    /// Finds our node by its id: after a `sync`, so that the server we read from has
    /// applied every earlier request of the session (the create among them).
    pub(crate) async fn find(&self, session: &Session) -> Result<Option<String>, RequestError> {
        let dir = self.dir.clone();
        session
            .call(|client| async move { client.sync(&dir).await })
            .await?;
        let dir = self.dir.clone();
        let children = session
            .call(|client| async move { client.list_children(&dir).await })
            .await;
        let children = match children {
            Err(RequestError::Server(ZkError::NoNode)) => return Ok(None),
            other => other?,
        };
        Ok(children
            .into_iter()
            .find(|child| child.starts_with(&self.id))
            .map(|child| format!("{}/{child}", self.dir)))
    }

    /// Deletes our node (looking for it first if the create's answer never came). `Ok`
    /// once it is gone or was never created.
    pub(crate) async fn remove(&self, session: &Session) -> Result<(), RequestError> {
        let path = match &self.path {
            Some(path) => path.clone(),
            None => match self.find(session).await? {
                Some(path) => path,
                None => return Ok(()),
            },
        };
        let deleted = session
            .call(|client| async move { client.delete(&path, None).await })
            .await;
        match deleted {
            Ok(()) | Err(RequestError::Server(ZkError::NoNode)) => Ok(()),
            Err(err) => Err(err),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_contenders_by_sequence_and_ignores_others() {
        let children = vec![
            "_c_b-lock-0000000010".to_owned(),
            "stray".to_owned(),
            "_c_a-lock-0000000002".to_owned(),
            "_c_c-lock-".to_owned(),
        ];
        assert_eq!(
            queue(children),
            vec!["_c_a-lock-0000000002", "_c_b-lock-0000000010"]
        );
    }

    #[test]
    fn readers_writers_and_locks_share_one_queue() {
        let children = vec![
            "_c_b-__WRIT__0000000003".to_owned(),
            "_c_a-__READ__0000000001".to_owned(),
            "_c_c-lock-0000000002".to_owned(),
        ];
        let queued = queue(children);
        assert_eq!(
            queued,
            vec![
                "_c_a-__READ__0000000001",
                "_c_c-lock-0000000002",
                "_c_b-__WRIT__0000000003"
            ]
        );
        assert_eq!(parse(&queued[0]), Some((Mark::Read, 1)));
        assert_eq!(parse(&queued[2]), Some((Mark::Write, 3)));
    }

    #[test]
    fn ids_are_unique_and_look_like_curators() {
        let (a, b) = (protected_id(), protected_id());
        assert_ne!(a, b);
        assert!(a.starts_with("_c_") && a.len() == 39, "{a}");
    }
}
