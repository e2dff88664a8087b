//! The soak's nemesis: faults on a random schedule drawn from the seed. Per client and
//! member (the proxy on that path): added latency; requests held, the client's connection
//! broken, and the held requests delivered late (a request applied after its sender gave
//! up and retried elsewhere), or just one request so; answers lost; a cut; a pause.
//! Cluster-wide: a member killed and restarted, an operator's prefix delete of a lock, a
//! delete of one key, or of a holder's that has held for a while (guarded by its create
//! revision), a compaction (never past what the recorder has seen), a lease revoked by an
//! operator, the clients' role losing its write permission on the namespace for up to 2 s
//! (so joins and releases are refused) and getting it back.
//! At most three faults run at once, never two on one path.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, GetOptions, Permission, RoleRevokePermissionOptions,
    Txn, TxnOp,
};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::checker::Target;
use super::rng::Rng;
use crate::testkit::{EtcdCluster, FaultProxy};

/// The faults injected, by kind, and a line per fault for reports.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    counts: Mutex<BTreeMap<&'static str, u64>>,
    log: Mutex<Vec<(Instant, String)>>,
    /// The revisions of the operator's deletes and revokes that may have deleted, and
    /// what each could delete: the deletions they explain.
    operator: Mutex<Vec<(i64, Target)>>,
    /// When operator requests that got no answer were in flight (they may have deleted),
    /// and what each could delete.
    unanswered: Mutex<Vec<(Instant, Instant, Target)>>,
    /// When the clients' write permission may have been revoked.
    revoked: Mutex<Vec<(Instant, Instant)>>,
}

impl Faults {
    fn note(&self, kind: &'static str, what: String) {
        *self
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(kind)
            .or_default() += 1;
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((Instant::now(), what));
    }

    /// Records an operator request sent at `sent` that could delete `target`: its
    /// revision, or, without an answer, the time it may have been applied in. (Give no
    /// header for an answer that says nothing was deleted: its revision is the store's,
    /// someone else's change.)
    fn operator_at(
        &self,
        sent: Instant,
        header: Option<&etcd_client::ResponseHeader>,
        target: Target,
    ) {
        match header {
            Some(header) => {
                self.operator
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((header.revision(), target));
            }
            None => self
                .unanswered
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((sent, Instant::now(), target)),
        }
    }

    /// Records an operator delete sent at `sent` that could delete `target`, by its
    /// answer: one that deleted nothing explains nothing.
    fn deleted_by_operator(
        &self,
        sent: Instant,
        answer: &Result<etcd_client::DeleteResponse, etcd_client::Error>,
        target: Target,
    ) {
        match answer {
            Ok(answer) if answer.deleted() == 0 => {}
            Ok(answer) => self.operator_at(sent, answer.header(), target),
            Err(_) => self.operator_at(sent, None, target),
        }
    }

    /// When operator requests without an answer were in flight.
    pub(crate) fn unanswered(&self) -> Vec<(Instant, Instant, Target)> {
        self.unanswered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// When the clients' write permission may have been revoked.
    pub(crate) fn revoked(&self) -> Vec<(Instant, Instant)> {
        lock(&self.revoked).clone()
    }

    /// The revisions of the operator's deletes and revokes, and what each could delete.
    pub(crate) fn operator_revisions(&self) -> Vec<(i64, Target)> {
        self.operator
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Faults injected, by kind.
    pub(crate) fn counts(&self) -> BTreeMap<&'static str, u64> {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The faults' log, with times relative to `start`.
    pub(crate) fn log(&self, start: Instant) -> Vec<String> {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(at, what)| format!("{:>8.3}s {what}", at.duration_since(start).as_secs_f64()))
            .collect()
    }
}

/// Everything the nemesis acts on.
pub(crate) struct Targets {
    pub(crate) cluster: Arc<tokio::sync::Mutex<EtcdCluster>>,
    /// `proxies[client][member]`.
    pub(crate) proxies: Arc<Vec<Vec<FaultProxy>>>,
    pub(crate) admin: Client,
    pub(crate) namespace: String,
    pub(crate) names: Arc<Vec<String>>,
    /// The highest revision the recorder has seen: compactions stay at or below it + 1.
    pub(crate) recorded: watch::Receiver<i64>,
}

/// Injects faults until `until`, then heals everything.
pub(crate) async fn run(targets: Targets, mut rng: Rng, until: Instant, faults: Arc<Faults>) {
    let targets = Arc::new(targets);
    let busy: Arc<Mutex<HashSet<(usize, usize)>>> = Arc::default();
    let member_down: Arc<Mutex<bool>> = Arc::default();
    let revoked: Arc<Mutex<bool>> = Arc::default();
    let mut running = JoinSet::new();
    let mut stream = 0;
    while Instant::now() < until {
        tokio::time::sleep(rng.millis(100, 500)).await;
        while running.try_join_next().is_some() {}
        if running.len() >= 3 {
            continue;
        }
        stream += 1;
        let mut fault_rng = rng.fork(stream);
        let kind = rng.weighted(&[14, 24, 20, 10, 8, 8, 8, 8, 6, 4, 6, 16, 16]);
        let clients = targets.proxies.len();
        let members = targets.proxies.first().map_or(0, Vec::len);
        let path = (rng.index(clients), rng.index(members));
        if (kind <= 4 || kind == 12) && !lock(&busy).insert(path) {
            continue;
        }
        let (targets, faults, busy, down, revoked) = (
            targets.clone(),
            faults.clone(),
            busy.clone(),
            member_down.clone(),
            revoked.clone(),
        );
        running.spawn(async move {
            let (client, member) = path;
            let proxy = &targets.proxies[client][member];
            let at = format!("client {client} -> member {member}");
            match kind {
                0 => {
                    let delay = fault_rng.millis(20, 250);
                    faults.note("delay", format!("{at}: {delay:?} latency"));
                    proxy.delay(delay);
                    tokio::time::sleep(fault_rng.millis(500, 2500)).await;
                    proxy.delay(Duration::ZERO);
                }
                1 => {
                    faults.note(
                        "late requests",
                        format!("{at}: requests held, delivered late"),
                    );
                    proxy.hold_requests();
                    tokio::time::sleep(fault_rng.millis(100, 800)).await;
                    proxy.sever();
                    // Delivered soon, or (a third of the time) long after the client
                    // retried elsewhere and moved on.
                    let late = if fault_rng.chance(33) { 2500 } else { 600 };
                    tokio::time::sleep(fault_rng.millis(0, late)).await;
                    proxy.deliver_held();
                    proxy.heal();
                }
                2 => {
                    faults.note("lost answers", format!("{at}: answers lost"));
                    proxy.hold_answers();
                    tokio::time::sleep(fault_rng.millis(100, 500)).await;
                    proxy.sever();
                    proxy.heal();
                }
                3 => {
                    faults.note("cut", format!("{at}: cut"));
                    proxy.cut();
                    tokio::time::sleep(fault_rng.millis(300, 2500)).await;
                    proxy.heal();
                }
                4 => {
                    faults.note("pause", format!("{at}: paused"));
                    proxy.pause();
                    tokio::time::sleep(fault_rng.millis(200, 1500)).await;
                    proxy.resume();
                }
                5 => kill_member(&targets, &mut fault_rng, &faults, &down).await,
                6 => {
                    let name = &targets.names[fault_rng.index(targets.names.len())];
                    let prefix = format!("{}/{name}/", targets.namespace);
                    let mut admin = targets.admin.clone();
                    let sent = Instant::now();
                    let answer = admin
                        .delete(prefix.as_str(), Some(DeleteOptions::new().with_prefix()))
                        .await;
                    faults.deleted_by_operator(
                        sent,
                        &answer,
                        Target::Prefix(prefix.clone().into_bytes()),
                    );
                    let deleted = answer.map_or(0, |r| r.deleted());
                    faults.note(
                        "prefix delete",
                        format!("operator: del --prefix {prefix} ({deleted} keys)"),
                    );
                }
                7 => {
                    // Mostly a lock's holder (the oldest key of its queue).
                    let head = fault_rng.chance(70);
                    if let Some((key, _)) = pick_key(&targets, &mut fault_rng, head).await {
                        let mut admin = targets.admin.clone();
                        let sent = Instant::now();
                        let answer = admin.delete(key.as_str(), None).await;
                        faults.deleted_by_operator(
                            sent,
                            &answer,
                            Target::Key(key.clone().into_bytes()),
                        );
                        faults.note("key delete", format!("operator: del {key}"));
                    }
                }
                8 => {
                    let recorded = *targets.recorded.borrow();
                    let mut admin = targets.admin.clone();
                    let current = admin
                        .get("soak-compaction-probe", None)
                        .await
                        .ok()
                        .and_then(|r| r.header().map(|h| h.revision()))
                        .unwrap_or(0);
                    let at = current.min(recorded + 1);
                    if at > 1 && admin.compact(at, None).await.is_ok() {
                        faults.note("compaction", format!("compact at revision {at}"));
                    }
                }
                10 => revoke_write(&targets, &mut fault_rng, &faults, &revoked).await,
                11 => delete_settled_holder(&targets, &mut fault_rng, &faults).await,
                12 => {
                    // Exactly one request late, the rest of the client's traffic through
                    // its other paths: a late release that does not also retire the
                    // session (as a late join would), so that its name is soon wanted
                    // again by the same session.
                    faults.note(
                        "one late request",
                        format!("{at}: next request held, delivered late"),
                    );
                    let next = proxy.requests_held_so_far() + 1;
                    proxy.hold_one_request();
                    let held = tokio::time::timeout(
                        fault_rng.millis(500, 2000),
                        proxy.requests_held(next),
                    )
                    .await;
                    if held.is_ok() {
                        tokio::time::sleep(fault_rng.millis(100, 1500)).await;
                    }
                    proxy.deliver_held();
                    proxy.heal();
                }
                _ => {
                    if let Some((key, lease)) = pick_key(&targets, &mut fault_rng, false).await {
                        if lease != 0 {
                            let mut admin = targets.admin.clone();
                            let sent = Instant::now();
                            let answer = admin.lease_revoke(lease).await;
                            faults.operator_at(
                                sent,
                                answer.as_ref().ok().and_then(|r| r.header()),
                                Target::Lease(lease),
                            );
                            faults.note(
                                "lease revoke",
                                format!("operator: revoke lease {lease:x} (of {key})"),
                            );
                        }
                    }
                }
            }
            lock(&busy).remove(&path);
        });
    }
    while running.join_next().await.is_some() {}
    heal_all(&targets).await;
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn kill_member(targets: &Targets, rng: &mut Rng, faults: &Faults, down: &Mutex<bool>) {
    {
        let mut down = lock(down);
        if *down {
            return;
        }
        *down = true;
    }
    let mut cluster = targets.cluster.lock().await;
    let member = if rng.chance(50) {
        cluster.leader().await.unwrap_or(0)
    } else {
        rng.index(cluster.len())
    };
    if cluster.kill(member).is_ok() {
        faults.note("member kill", format!("member {member} killed"));
        drop(cluster);
        tokio::time::sleep(rng.millis(500, 2500)).await;
        let mut cluster = targets.cluster.lock().await;
        if let Err(err) = cluster.restart(member).await {
            tracing::warn!(%err, member, "soak: restarting a member failed");
        }
    }
    *lock(down) = false;
}

/// The clients' role may read the namespace but not write it, for up to 2 s (the
/// checker's bounds allow for no longer), then may write again.
async fn revoke_write(targets: &Targets, rng: &mut Rng, faults: &Faults, revoked: &Mutex<bool>) {
    {
        let mut revoked = lock(revoked);
        if *revoked {
            return;
        }
        *revoked = true;
    }
    let mut admin = targets.admin.clone();
    let prefix = format!("{}/", targets.namespace);
    let from = Instant::now();
    let taken = admin
        .role_revoke_permission(
            super::auth::ROLE,
            prefix.as_str(),
            Some(RoleRevokePermissionOptions::new().with_prefix()),
        )
        .await;
    if taken.is_ok() {
        let _ = admin
            .role_grant_permission(
                super::auth::ROLE,
                Permission::read(prefix.as_str()).with_prefix(),
            )
            .await;
        let hold = rng.millis(200, 2000);
        faults.note(
            "write revoked",
            format!(
                "operator: role {} may not write {prefix} for {hold:?}",
                super::auth::ROLE
            ),
        );
        tokio::time::sleep(hold).await;
    }
    // Restored whatever the revoke's answer (an unanswered one may have applied), and
    // retried until etcd confirms it (a member killed meanwhile): the revocation is
    // recorded as lasting until then, and the checker allows for that long.
    let give_up = Instant::now() + Duration::from_secs(10);
    while let Err(err) = super::auth::restore_write(&mut admin, &targets.namespace).await {
        if Instant::now() >= give_up {
            tracing::warn!(%err, "soak: restoring the clients' write permission failed");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lock(&faults.revoked).push((from, Instant::now()));
    *lock(revoked) = false;
}

/// Deletes the holder of a random lock once it has held for a while (the same key, with
/// the same create revision, at the head of its queue 60-300 ms apart), by a delete
/// guarded by that create revision: most grants are let go within 20 ms, so a delete of
/// whatever heads a queue mostly meets a key on its way out, and the holder never has
/// time to show whether it noticed (`is_held()`, `lost()`). A holder that has held this
/// long is sampled for a while after its key goes.
async fn delete_settled_holder(targets: &Targets, rng: &mut Rng, faults: &Faults) {
    let name = &targets.names[rng.index(targets.names.len())];
    let prefix = format!("{}/{name}/", targets.namespace);
    let mut admin = targets.admin.clone();
    let Some(first) = head_of(&mut admin, &prefix).await else {
        return;
    };
    tokio::time::sleep(rng.millis(60, 300)).await;
    if head_of(&mut admin, &prefix).await.as_ref() != Some(&first) {
        return;
    }
    let (key, created) = first;
    let guarded = Txn::new()
        .when([Compare::create_revision(
            key.clone(),
            CompareOp::Equal,
            created,
        )])
        .and_then([TxnOp::delete(key.clone(), None)]);
    let sent = Instant::now();
    let answer = admin.txn(guarded).await;
    let shown = String::from_utf8_lossy(&key);
    match &answer {
        // Only a delete that happened explains a deletion: the header of a transaction
        // that changed nothing names the revision of someone else's change.
        Ok(txn) if txn.succeeded() => {
            faults.operator_at(sent, txn.header(), Target::Key(key.clone()));
            faults.note(
                "holder delete",
                format!("operator: del {shown} (held since revision {created})"),
            );
        }
        Ok(_) => {}
        Err(_) => faults.operator_at(sent, None, Target::Key(key.clone())),
    }
}

/// The oldest key under `prefix` (a lock's holder) and its create revision.
async fn head_of(admin: &mut Client, prefix: &str) -> Option<(Vec<u8>, i64)> {
    let options = GetOptions::new()
        .with_prefix()
        .with_sort(
            etcd_client::SortTarget::Create,
            etcd_client::SortOrder::Ascend,
        )
        .with_limit(1);
    let read = admin.get(prefix, Some(options)).await.ok()?;
    read.kvs()
        .first()
        .map(|kv| (kv.key().to_vec(), kv.create_revision()))
}

/// A live key under the namespace, with its lease: any, or (`head`) the oldest key of a
/// random lock, its holder.
async fn pick_key(targets: &Targets, rng: &mut Rng, head: bool) -> Option<(String, i64)> {
    let mut admin = targets.admin.clone();
    let prefix = if head {
        let name = &targets.names[rng.index(targets.names.len())];
        format!("{}/{name}/", targets.namespace)
    } else {
        format!("{}/", targets.namespace)
    };
    let mut options = GetOptions::new().with_prefix();
    if head {
        options = options
            .with_sort(
                etcd_client::SortTarget::Create,
                etcd_client::SortOrder::Ascend,
            )
            .with_limit(1);
    }
    let read = admin.get(prefix, Some(options)).await.ok()?;
    let kvs = read.kvs();
    if kvs.is_empty() {
        return None;
    }
    let kv = &kvs[rng.index(kvs.len())];
    Some((String::from_utf8_lossy(kv.key()).into_owned(), kv.lease()))
}

/// Every path open again, latency gone, what was held delivered; every member running.
pub(crate) async fn heal_all(targets: &Targets) {
    for proxies in targets.proxies.iter() {
        for proxy in proxies {
            proxy.deliver_held();
            proxy.delay(Duration::ZERO);
            proxy.heal();
        }
    }
    let mut admin = targets.admin.clone();
    if let Err(err) = super::auth::restore_write(&mut admin, &targets.namespace).await {
        tracing::warn!(%err, "soak: restoring the clients' write permission failed");
    }
    let mut cluster = targets.cluster.lock().await;
    for member in 0..cluster.len() {
        if cluster.pid(member).is_none() {
            if let Err(err) = cluster.restart(member).await {
                tracing::warn!(%err, member, "soak: restarting a member failed");
            }
        }
    }
}
