//! Redlock's masters must be distinct servers: each counts once toward the quorum, so a
//! server reached under two names (`localhost` and `127.0.0.1`, a DNS alias, a proxy in
//! front of it, its plain and TLS ports) could grant a lock alone. The URLs' addresses
//! are compared before connecting (`config.rs`); this compares what the servers say they
//! are once connected.

use futures_util::future::join_all;

use super::node::Node;
use crate::{Backend, LockError};

/// Refuses (`InvalidConfig`) a set of masters of which two report the same `run_id`
/// (`INFO server`): Redis draws it at random when a server process starts (40 hex
/// characters, `server.c`'s `getRandomHexChars`), so two processes never share one,
/// while every connection to one process sees the same. `shown[i]`: how to name node
/// `i` in the error (its URL without credentials).
///
/// A master whose `run_id` cannot be read (an ACL without `INFO`) is let through with a
/// warning: it cannot be told apart. The check holds at connect; a name that later
/// resolves elsewhere (DNS) is not seen.
#[tracing::instrument(skip_all, fields(masters = nodes.len()))]
pub(crate) async fn refuse_one_server_twice(
    nodes: &[Node],
    shown: &[String],
    backend: Backend,
) -> Result<(), LockError> {
    if nodes.len() < 2 {
        return Ok(());
    }
    let ids = join_all(nodes.iter().map(Node::run_id)).await;
    let mut seen: Vec<(&str, usize)> = Vec::with_capacity(ids.len());
    for (i, id) in ids.iter().enumerate() {
        let id = match id {
            Ok(id) => id.as_str(),
            Err(err) => {
                tracing::warn!(
                    server = %nodes[i].address,
                    %err,
                    "cannot read the server's run_id (allow INFO): if it is another \
                     master under a second name, it counts twice toward the quorum"
                );
                continue;
            }
        };
        if let Some(&(_, first)) = seen.iter().find(|(seen, _)| *seen == id) {
            let (this, first) = (&shown[i], &shown[first]);
            return Err(LockError::InvalidConfig {
                backend,
                reason: format!(
                    "{this:?} and {first:?} are the same server (run_id {id}): each \
                     Redlock master must be a server of its own"
                ),
            });
        }
        seen.push((id, i));
    }
    Ok(())
}
