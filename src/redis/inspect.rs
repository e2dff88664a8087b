//! A Redis lock seen from outside, as far as Redis can tell: who holds it (the owner
//! value, and the holder record after it: `value.rs`), for how much longer, and the last
//! token handed out. Waiters are not listed: they wait on a release channel and
//! re-attempt, and the waiters' set (`scripts.rs`) holds only random ids with an expiry,
//! nothing that says who waits.

use std::collections::BTreeMap;
use std::time::Duration;

use super::locker::RedisLocker;
use super::node::Node;
use super::value;
use crate::{HolderInfo, LockError, validate_name};

/// One held slot: the lock's key, or one permit of a semaphore.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisHolder {
    /// The key.
    pub key: String,
    /// The holder's owner value (`RedisGuard::owner`).
    pub owner: String,
    /// Who holds, as the holder recorded itself; `None` for a holder that records
    /// nothing (`with_holder_info(false)`, an older fencelock).
    pub holder: Option<HolderInfo>,
    /// What is left of its `PX`; `None` for a key without expiry.
    pub remaining: Option<Duration>,
    /// The key's whole value as read: what `break` compares before it deletes (a value
    /// it does not recognise as fencelock's is broken too, exactly as it was read).
    pub(crate) value: Vec<u8>,
}

/// What Redis knows of one lock or semaphore.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisLockState {
    /// The lock's name.
    pub name: String,
    /// Whether it is a semaphore (its permit slots) rather than a lock.
    pub semaphore: bool,
    /// The held slots.
    pub holders: Vec<RedisHolder>,
    /// The last token the lock's counter handed out: at least the holder's token (refused
    /// attempts also draw one). `None` before the first attempt.
    pub last_token: Option<u64>,
}

impl RedisLocker {
    fn node(&self) -> &Node {
        &self.core().nodes[0]
    }

    /// The holders of lock `name` (and of a semaphore of that name) in this locker's
    /// prefix. A lock nobody holds has no holders.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    #[tracing::instrument(skip(self), fields(backend = "redis"))]
    pub async fn inspect(&self, name: &str) -> Result<Vec<RedisLockState>, LockError> {
        validate_name(name)?;
        let prefix = self.prefix();
        let mut states = Vec::new();
        // The lock's key is known; a semaphore's permit count is not: scan for its slots.
        let key = format!("{prefix}:lock:{name}");
        let lock = state(self.node(), prefix, name, false, vec![key]).await?;
        if !lock.holders.is_empty() {
            states.push(lock);
        }
        let pattern = format!("{}:permit:{}:*", glob_escape(prefix), glob_escape(name));
        let permits = scan(self.node(), &pattern, Some(name)).await?;
        if !permits.is_empty() {
            let semaphore = state(self.node(), prefix, name, true, permits).await?;
            // Slots may expire between the scan and the read.
            if !semaphore.holders.is_empty() {
                states.push(semaphore);
            }
        }
        Ok(states)
    }

    /// The last token lock `name`'s counter handed out, whether or not the lock is held
    /// now; `None` before the first attempt, or when the counter is gone (a flush, an
    /// eviction, a failover to a replica that missed it). An operator compares it with
    /// the newest token storage has accepted (`fencelock locks --newest-token`): a
    /// counter below it hands out tokens again.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    #[tracing::instrument(skip(self), fields(backend = "redis"))]
    pub async fn last_token(&self, name: &str) -> Result<Option<u64>, LockError> {
        validate_name(name)?;
        let key = format!("{}:lock:{name}", self.prefix());
        Ok(state(self.node(), self.prefix(), name, false, vec![key])
            .await?
            .last_token)
    }

    /// Every lock and semaphore of this locker's prefix that is held, by name.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    #[tracing::instrument(skip(self), fields(backend = "redis"))]
    pub async fn inspect_all(&self) -> Result<Vec<RedisLockState>, LockError> {
        let prefix = self.prefix();
        let mut groups: BTreeMap<(String, bool), Vec<String>> = BTreeMap::new();
        let lock_prefix = format!("{prefix}:lock:");
        for key in scan(
            self.node(),
            &format!("{}*", glob_escape(&lock_prefix)),
            None,
        )
        .await?
        {
            if let Some(name) = key.strip_prefix(&lock_prefix) {
                groups
                    .entry((name.to_owned(), false))
                    .or_default()
                    .push(key.clone());
            }
        }
        let permit_prefix = format!("{prefix}:permit:");
        for key in scan(
            self.node(),
            &format!("{}*", glob_escape(&permit_prefix)),
            None,
        )
        .await?
        {
            // `<prefix>:permit:<name>:<slot>`: names may hold ':', the slot is last.
            if let Some((name, _slot)) = key
                .strip_prefix(&permit_prefix)
                .and_then(|rest| rest.rsplit_once(':'))
            {
                groups
                    .entry((name.to_owned(), true))
                    .or_default()
                    .push(key.clone());
            }
        }
        let mut states = Vec::with_capacity(groups.len());
        for ((name, semaphore), keys) in groups {
            states.push(state(self.node(), prefix, &name, semaphore, keys).await?);
        }
        Ok(states)
    }
}

/// Every key of `node` matching `pattern` (SCAN: no server stall on a large keyspace).
pub(super) async fn scan(
    node: &Node,
    pattern: &str,
    lock: Option<&str>,
) -> Result<Vec<String>, LockError> {
    let mut conn = node.connection();
    let mut cursor: u64 = 0;
    let mut keys = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = node
            .call(
                "inspect",
                lock,
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn),
            )
            .await?;
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    keys.sort();
    keys.dedup();
    Ok(keys)
}

/// What `node` holds of lock (or semaphore) `name` under `prefix`: each of `keys` that
/// exists, and the counter's last token, read in one pipeline.
pub(super) async fn state(
    node: &Node,
    prefix: &str,
    name: &str,
    semaphore: bool,
    keys: Vec<String>,
) -> Result<RedisLockState, LockError> {
    let mut conn = node.connection();
    let mut pipe = redis::pipe();
    for key in &keys {
        pipe.cmd("GET").arg(key).cmd("PTTL").arg(key);
    }
    let counter = if semaphore {
        format!("{prefix}:permit-token:{name}")
    } else {
        format!("{prefix}:token:{name}")
    };
    pipe.cmd("GET").arg(&counter);
    let replies: Vec<redis::Value> = node
        .call("inspect", Some(name), pipe.query_async(&mut conn))
        .await?;
    let mut holders = Vec::new();
    for (key, pair) in keys.iter().zip(replies.chunks(2)) {
        let [stored, pttl] = pair else { continue };
        // A key that expired between the scan and the read is no holder.
        let Ok(Some(stored)) = redis::from_redis_value::<Option<Vec<u8>>>(stored.clone()) else {
            continue;
        };
        let pttl = redis::from_redis_value::<i64>(pttl.clone()).unwrap_or(-2);
        if pttl == -2 {
            continue;
        }
        let (owner, holder) = value::parse(&stored);
        holders.push(RedisHolder {
            key: key.clone(),
            owner,
            holder,
            remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
            value: stored,
        });
    }
    let last_token = replies.last().and_then(|v| {
        redis::from_redis_value::<Option<u64>>(v.clone())
            .ok()
            .flatten()
    });
    Ok(RedisLockState {
        name: name.to_owned(),
        semaphore,
        holders,
        last_token,
    })
}

/// `pattern` with SCAN's glob characters escaped (lock names may not hold them today; a
/// prefix might).
pub(super) fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
