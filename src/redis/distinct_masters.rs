//! Redlock's masters must be distinct servers: each counts once toward the quorum, so a
//! server reached under two names (`localhost` and `127.0.0.1`, a DNS alias, a proxy in
//! front of it, its plain and TLS ports) could grant a lock alone. The URLs' addresses
//! are compared before connecting (`config.rs`); this compares the servers once
//! connected, by what they say they are and by what they hold.

use std::time::Duration;

use futures_util::future::{join_all, try_join_all};

use super::node::Node;
use super::owner::owner_value;
use crate::{Backend, LockError};

/// Refuses (`InvalidConfig`) a set of masters of which two are one server. `shown[i]`:
/// how to name node `i` in the error (its URL without credentials); `prefix`: the
/// configured key prefix (an ACL may allow only keys under it).
///
/// Two ways, both always:
/// - **By `run_id`** (`INFO server`), where the masters tell it: Redis draws it at random
///   when a server process starts, so two processes never share one, while every
///   connection to one process sees the same. The only way that catches two databases
///   of one server.
/// - **By marker keys**: each master gets a key of its own (which expires), then every
///   master reads every key (`TYPE`); a master that sees another's is the same database under
///   two names. This needs no `INFO` (the minimal ACL has none) and does not trust what
///   a proxy says of itself: it asks the data. One master that refuses every write (out
///   of memory, a failed save) still reads the others', and passes on its `run_id`
///   alone; two such, or one without a `run_id`, or one that does not show its own
///   marker (a proxy splitting reads from writes), cannot be checked and fail the
///   connect.
///
/// A master that does not answer fails the connect, as it would anyway. The check holds
/// at connect; a name that later resolves elsewhere (DNS) is not seen.
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
    let refused = |i: usize, j: usize, reason: &str| LockError::InvalidConfig {
        backend,
        reason: format!(
            "{:?} and {:?} are the same server ({reason}): each Redlock master must be a \
             server of its own",
            shown[i], shown[j]
        ),
    };
    let ids = try_join_all(nodes.iter().map(Node::run_id)).await?;
    for (j, id) in ids.iter().enumerate() {
        let Some(id) = id else { continue };
        if let Some(i) = ids[..j].iter().position(|seen| seen.as_ref() == Some(id)) {
            return Err(refused(i, j, &format!("run_id {id}")));
        }
    }
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
        Ok(placed) => try_join_all(nodes.iter().map(|node| seen_markers(node, &markers)))
            .await
            .map(|found| (placed, found)),
        Err(err) => Err(err),
    };
    // Removed in the background: the check's answer does not wait for it (nor does a
    // connect given up meanwhile leave them; they expire anyway).
    let removal: Vec<(Node, String)> = nodes.iter().cloned().zip(markers).collect();
    tokio::spawn(async move {
        join_all(removal.iter().map(|(node, marker)| remove(node, marker))).await;
    });
    let (placed, found) = found?;
    // Two that refused their markers could be one server: only their word (a run_id,
    // which a proxy may answer for itself) would tell them apart.
    let refusing: Vec<usize> = (0..placed.len()).filter(|&j| !placed[j]).collect();
    if let [first, second, ..] = refusing[..] {
        return Err(LockError::InvalidConfig {
            backend,
            reason: format!(
                "{:?} and {:?} both refused a key written to them (out of memory, a failed \
                 save): cannot check that each Redlock master is a server of its own",
                shown[first], shown[second]
            ),
        });
    }
    for (j, seen) in found.iter().enumerate() {
        if let Some(i) = (0..seen.len()).find(|&i| i != j && seen[i]) {
            return Err(refused(
                i.min(j),
                i.max(j),
                "one sees the other's marker key",
            ));
        }
        let own = seen.get(j).copied().unwrap_or(false);
        let cannot = |why: &str| LockError::InvalidConfig {
            backend,
            reason: format!(
                "{:?} {why}: cannot check that each Redlock master is a server of its own",
                shown[j]
            ),
        };
        match (placed[j], own, &ids[j]) {
            (true, true, _) => {}
            // Refused the write: its run_id was compared, and it read the others'
            // markers (none of them is its own database).
            (false, _, Some(_)) => tracing::warn!(
                server = %shown[j],
                "the master refused its marker key; it was compared by run_id"
            ),
            (false, _, None) => {
                return Err(cannot(
                    "refused a key written to it (out of memory, a failed save) and does \
                     not tell its run_id",
                ));
            }
            (true, false, _) => {
                return Err(cannot(
                    "does not show the key just written to it (a proxy that reads elsewhere?)",
                ));
            }
        }
    }
    Ok(())
}

/// How long a marker key lives if its removal fails.
const MARKER_LIFE: Duration = Duration::from_secs(60);

/// Writes `marker` on `node`: `Ok(false)` if the server refused every write (`OOM`:
/// out of memory under `noeviction`; `MISCONF`: a failed save): it can still read the
/// others' markers. Any other refusal (a read-only replica, a proxy's error) fails.
async fn place(node: &Node, marker: &str) -> Result<bool, LockError> {
    let mut conn = node.connection();
    let life = u64::try_from(MARKER_LIFE.as_millis()).unwrap_or(u64::MAX);
    let written: Result<(), redis::RedisError> = redis::cmd("SET")
        .arg(marker)
        .arg(1)
        .arg("NX")
        .arg("PX")
        .arg(life)
        .query_async(&mut conn)
        .await;
    match written {
        Ok(()) => Ok(true),
        // Only the server's own refusals of any write: its data is as it says.
        Err(err) if matches!(err.code(), Some("OOM" | "MISCONF")) => {
            tracing::debug!(server = %node.address, %err, "marker key refused");
            Ok(false)
        }
        Err(err) => {
            node.call("place a marker key", None, std::future::ready(Err(err)))
                .await
        }
    }
}

/// Which of `markers` `node` holds.
async fn seen_markers(node: &Node, markers: &[String]) -> Result<Vec<bool>, LockError> {
    let mut conn = node.connection();
    // `TYPE` ("string" or "none"): in the minimal ACL, and no `GET` (the lock's own
    // read) is spent on it.
    let mut pipe = redis::pipe();
    for marker in markers {
        pipe.cmd("TYPE").arg(marker);
    }
    let types: Vec<String> = node
        .call("read marker keys", None, pipe.query_async(&mut conn))
        .await?;
    Ok(types.iter().map(|kind| kind != "none").collect())
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
