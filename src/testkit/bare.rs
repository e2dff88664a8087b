//! The bare protocol cycles that measurements set the locks against: the cheapest correct
//! Redis lock cycle (`SET key owner NX PX` + a compare-and-delete script), with no token,
//! no renewal, no loss detection. One definition for `fencelock bench`'s ceiling row and
//! the examples that profile the client (`cycle_cost`, `concurrent_cost`, `alloc_count`,
//! `latency`), so that they all measure the same two commands; and the bare etcd cycle of
//! the examples that count one cycle's cost.

use std::sync::Arc;
use std::time::Duration;

/// A bare Redis lock cycle; cheap to clone (the script is shared).
#[derive(Clone, Debug)]
pub struct BareRedisCycle {
    compare_and_delete: Arc<redis::Script>,
}

impl Default for BareRedisCycle {
    fn default() -> Self {
        Self::new()
    }
}

impl BareRedisCycle {
    /// The cycle, with its compare-and-delete script (loaded on first use).
    #[must_use]
    pub fn new() -> Self {
        Self {
            compare_and_delete: Arc::new(redis::Script::new(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
            )),
        }
    }

    /// `SET key owner NX PX 10000`, then delete `key` if it still holds `owner`.
    ///
    /// # Errors
    /// What the server or the connection answered instead.
    pub async fn run<C>(&self, conn: &mut C, key: &str, owner: &str) -> redis::RedisResult<()>
    where
        C: redis::aio::ConnectionLike + Send,
    {
        let _: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(owner)
            .arg("NX")
            .arg("PX")
            .arg(10_000)
            .query_async(conn)
            .await?;
        let _: i64 = self
            .compare_and_delete
            .key(key)
            .arg(owner)
            .invoke_async(conn)
            .await?;
        Ok(())
    }
}

/// The bare etcd lock cycle of the examples that count one cycle's cost (`cycle_cost`,
/// `alloc_count`): put `key` under `lease` if it is new, then delete it. (The bench's
/// `txn+delete` ceiling and `concurrent_cost` also read the lock's prefix in the
/// transaction, as the lock's acquire does.)
///
/// # Errors
/// What etcd or the connection answered instead.
pub async fn bare_etcd_cycle(
    client: &mut etcd_client::Client,
    key: &str,
    lease: i64,
) -> Result<(), etcd_client::Error> {
    use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            "",
            Some(PutOptions::new().with_lease(lease)),
        )]);
    client.txn(txn).await?;
    client.delete(key, None).await?;
    Ok(())
}

/// CPU time (user + system) process `pid` has used so far, from `/proc/<pid>/stat`; zero
/// when it cannot be read (the process is gone, or no `/proc`).
#[must_use]
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after ')'.
    // SAFETY: sysconf has no preconditions.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
    Duration::from_micros((ticks(11) + ticks(12)) * 1_000_000 / per_second.max(1))
}

/// The etcd lock's acquire transaction, bare: put `key` under `lease` if it is new, and read
/// the two newest keys of `prefix` (what the lock's acquire answers from). The bench's
/// `txn+delete` ceilings and `examples/peer_cycle.rs` follow it with a plain delete.
#[must_use]
pub fn acquire_shaped(prefix: &str, key: &str, lease: i64) -> etcd_client::Txn {
    use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget};
    use etcd_client::{Txn, TxnOp};
    let newest_two = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(2)
        .with_keys_only();
    Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(key, [], Some(PutOptions::new().with_lease(lease))),
            TxnOp::get(prefix, Some(newest_two)),
        ])
}

#[cfg(test)]
mod tests {
    use super::cpu_time;

    #[test]
    fn this_process_has_used_some_cpu_and_a_missing_one_none() {
        let mut spin = 0u64;
        let started = std::time::Instant::now();
        while started.elapsed() < std::time::Duration::from_millis(30) {
            spin = std::hint::black_box(spin.wrapping_add(1));
        }
        assert!(cpu_time(std::process::id()) > std::time::Duration::ZERO);
        assert_eq!(cpu_time(u32::MAX), std::time::Duration::ZERO);
    }
}
