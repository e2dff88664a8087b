//! Releasing several etcd locks together (a [`MultiGuard`](crate::MultiGuard) of
//! `lock_all`, through [`LockGuard::release_all`](crate::LockGuard::release_all)): **one
//! transaction** deletes every key of a session, one Raft proposal where a release of
//! each guard on its own cost one per lock (or per batch of the session's group commit).
//!
//! Each guard goes through the steps of its own
//! [`release`](crate::LockGuard::release); only the delete is shared
//! ([`QueueKey::delete_all`], under `key_life.rs`'s rules for every key):
//!
//! - begun: what it knew before it let go, its own delete no loss to hear of, armed for
//!   its drop ([`EtcdGuard::begin_release`]). Dropped before the answer (this future
//!   cancelled), every guard's drop finishes its release in the background, its name
//!   spent, exactly as a single guard's whose release was dropped;
//! - answered: each key's own [`Deleted`](super::key_life::Deleted) through the same
//!   bookkeeping and the same outcome rule as a single release
//!   ([`EtcdGuard::released`]); then a guard that owned its session closes it;
//! - refused whole before anything was applied (a permission one lock lacks, more
//!   operations than the server takes) and no attempt left without an answer: each key is
//!   deleted alone and gets its own answer, as the group commit does with a refused
//!   batch;
//! - failed after the retries: each key is removed in the background, as a single failed
//!   release's ([`EtcdGuard::release_failed`]).
//!
//! The worst outcome stands for all (an error, then `NotHeld`, then `Unconfirmed`, then
//! `Released`: [`crate::multi::worse`]). The guards of one `lock_all` share one session
//! (none of them owns it: without renewal the session is the acquisition's own, and its
//! lease is revoked when the last guard's handle goes); guards of several sessions (the
//! trait's method takes any) are released in one transaction per session, all at once,
//! at most [`MAX_DELETES`] keys in each.

use futures_util::future::join_all;

use super::call::may_have_applied;
use super::guard::EtcdGuard;
use super::key_life::QueueKey;
use crate::{LockError, ReleaseOutcome};

/// The most keys one release transaction deletes: etcd's default `--max-txn-ops` (a
/// `lock_all` holds at most [`MAX_LOCK_ALL`](super::MAX_LOCK_ALL) of them).
pub(super) const MAX_DELETES: usize = 128;

/// Releases `guards`: one transaction per session (of at most [`MAX_DELETES`] keys),
/// all at once; the worst outcome stands for all.
pub(super) async fn release_all(guards: Vec<EtcdGuard>) -> Result<ReleaseOutcome, LockError> {
    let released = join_all(by_session(guards).into_iter().map(release_together)).await;
    released
        .into_iter()
        .fold(Ok(ReleaseOutcome::Released), crate::multi::worse)
}

/// `guards` in groups of one session each, of at most [`MAX_DELETES`], in their order.
fn by_session(guards: Vec<EtcdGuard>) -> Vec<Vec<EtcdGuard>> {
    let mut groups: Vec<Vec<EtcdGuard>> = Vec::new();
    for guard in guards {
        let session = &guard.session().inner;
        let group = groups.iter_mut().find(|group| {
            group.len() < MAX_DELETES
                && group
                    .first()
                    .is_some_and(|first| std::sync::Arc::ptr_eq(&first.session().inner, session))
        });
        match group {
            Some(group) => group.push(guard),
            None => groups.push(vec![guard]),
        }
    }
    groups
}

/// Releases the guards of one session with one transaction.
async fn release_together(mut guards: Vec<EtcdGuard>) -> Result<ReleaseOutcome, LockError> {
    let lost_before: Vec<bool> = guards.iter_mut().map(EtcdGuard::begin_release).collect();
    // The guards stay armed in `guards` until the answer is in (cancel safety).
    let keys: Vec<&QueueKey> = guards.iter().map(EtcdGuard::queue_key).collect();
    let deleted = QueueKey::delete_all(&keys).await;
    match deleted {
        Ok(deleted) => {
            // Every key's bookkeeping first, then the sessions: a drop while one closes
            // leaves no guard armed with its key already deleted.
            let mut outcome = Ok(ReleaseOutcome::Released);
            let mut detached = Vec::with_capacity(guards.len());
            for ((guard, lost_before), deleted) in guards.into_iter().zip(lost_before).zip(deleted)
            {
                let (released, parts) = guard.released(lost_before, deleted);
                outcome = crate::multi::worse(outcome, Ok(released));
                detached.push(parts);
            }
            for parts in &detached {
                parts.close_own_session().await;
            }
            outcome
        }
        // Refused whole before anything was applied (a permission one of the locks lacks,
        // more operations or bytes than this server takes) and no attempt without an
        // answer: each key goes alone and gets its own answer, as the group commit does
        // with a refused batch (`batch.rs`: no member refused for another).
        Err(err)
            if guards.len() > 1
                && !may_have_applied(&err)
                && !guards.iter().any(|guard| guard.queue_key().is_spent()) =>
        {
            tracing::debug!(%err, "a release transaction refused whole; each key alone");
            release_each(guards, lost_before).await
        }
        Err(err) => {
            for guard in guards {
                guard.release_failed(&err);
            }
            Err(err)
        }
    }
}

/// Releases begun `guards` (`lost_before`: what each knew before) one delete each, one
/// after the other. Dropped midway, the guards not yet answered finish in the background
/// as any dropped release does.
async fn release_each(
    guards: Vec<EtcdGuard>,
    lost_before: Vec<bool>,
) -> Result<ReleaseOutcome, LockError> {
    let mut outcome = Ok(ReleaseOutcome::Released);
    let mut detached = Vec::with_capacity(guards.len());
    for (guard, lost_before) in guards.into_iter().zip(lost_before) {
        match guard.queue_key().delete().await {
            Ok(deleted) => {
                let (released, parts) = guard.released(lost_before, deleted);
                outcome = crate::multi::worse(outcome, Ok(released));
                detached.push(parts);
            }
            Err(err) => {
                guard.release_failed(&err);
                outcome = crate::multi::worse(outcome, Err(err));
            }
        }
    }
    for parts in &detached {
        parts.close_own_session().await;
    }
    outcome
}
