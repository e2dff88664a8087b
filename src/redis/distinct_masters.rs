//! Redlock's masters must be distinct servers: each counts once toward the quorum, so a
//! server reached under two names (`localhost` and `127.0.0.1`, a DNS alias, a proxy in
//! front of it, its plain and TLS ports) could grant a lock alone. The URLs' addresses
//! are compared before connecting (`config.rs`); this compares the servers once
//! connected.

use std::time::Duration;

use futures_util::future::{join_all, try_join_all};

use super::node::Node;
use super::owner::owner_value;
use crate::{Backend, LockError};

/// Refuses (`InvalidConfig`) a set of masters of which two are one server. `shown[i]`:
/// how to name node `i` in the error (its URL without credentials); `prefix`: the
/// configured key prefix (an ACL may allow only keys under it).
///
/// First by `run_id` (`INFO server`): Redis draws it at random when a server process
/// starts (40 hex characters), so two processes never share one, while every connection
/// to one process sees the same. If any master does not tell its `run_id` (an ACL
/// without `INFO`, a proxy answering `INFO` itself), by a marker key instead: each
/// master gets a key of its own, which expires, and a master that sees another's key is
/// the same database under two names (two databases of one server are then not told
/// apart). A master that does not answer fails the connect, as it would anyway.
///
/// The check holds at connect; a name that later resolves elsewhere (DNS) is not seen.
#[tracing::instrument(skip_all, fields(masters = nodes.len()))]
pub(crate) async fn refuse_one_server_twice(
    nodes: &[Node],
    shown: &[String],
    prefix: &str,
    backend: Backend,
) -> Result<(), LockError> {
    if nodes.len() < 2 {
        return Ok(());
    }
    let ids = try_join_all(nodes.iter().map(Node::run_id)).await?;
    let same = |i: usize, j: usize, by: &str| LockError::InvalidConfig {
        backend,
        reason: format!(
            "{:?} and {:?} are the same server ({by}): each Redlock master must be a \
             server of its own",
            shown[j], shown[i]
        ),
    };
    for (j, id) in ids.iter().enumerate() {
        let Some(id) = id else { continue };
        if let Some(i) = ids[..j].iter().position(|seen| seen.as_ref() == Some(id)) {
            return Err(same(i, j, &format!("run_id {id}")));
        }
    }
    if ids.iter().all(Option::is_some) {
        return Ok(());
    }
    tracing::debug!("a master does not tell its run_id: comparing by marker keys");
    let check = owner_value();
    let markers: Vec<String> = (0..nodes.len())
        .map(|i| format!("{prefix}:master-check:{check}:{i}"))
        .collect();
    let placed = try_join_all(
        nodes
            .iter()
            .zip(&markers)
            .map(|(node, marker)| place(node, marker)),
    )
    .await;
    let found = match placed {
        Ok(_) => try_join_all(nodes.iter().map(|node| seen_markers(node, &markers))).await,
        Err(err) => Err(err),
    };
    join_all(
        nodes
            .iter()
            .zip(&markers)
            .map(|(node, marker)| remove(node, marker)),
    )
    .await;
    for (j, seen) in found?.iter().enumerate() {
        let other = (0..seen.len()).find(|&i| i != j && seen[i]);
        if let Some(i) = other {
            return Err(same(i.min(j), i.max(j), "one sees the other's marker key"));
        }
    }
    Ok(())
}

/// How long a marker key lives if its removal fails.
const MARKER_LIFE: Duration = Duration::from_secs(60);

async fn place(node: &Node, marker: &str) -> Result<(), LockError> {
    let mut conn = node.connection();
    let life = u64::try_from(MARKER_LIFE.as_millis()).unwrap_or(u64::MAX);
    node.call(
        "place a marker key",
        None,
        redis::cmd("SET")
            .arg(marker)
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(life)
            .query_async::<()>(&mut conn),
    )
    .await
}

/// Which of `markers` `node` holds.
async fn seen_markers(node: &Node, markers: &[String]) -> Result<Vec<bool>, LockError> {
    let mut conn = node.connection();
    let mut pipe = redis::pipe();
    for marker in markers {
        pipe.cmd("GET").arg(marker);
    }
    let values: Vec<Option<String>> = node
        .call("read marker keys", None, pipe.query_async(&mut conn))
        .await?;
    Ok(values.iter().map(Option::is_some).collect())
}

/// Best effort: the key expires anyway.
async fn remove(node: &Node, marker: &str) {
    let mut conn = node.connection();
    let removed = node
        .call(
            "remove a marker key",
            None,
            redis::cmd("DEL").arg(marker).query_async::<()>(&mut conn),
        )
        .await;
    if let Err(err) = removed {
        tracing::debug!(server = %node.address, %err, "marker key left to expire");
    }
}
