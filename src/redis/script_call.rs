//! One script call, built straight into one command.
//!
//! redis-rs's `ScriptInvocation` copies every key and argument into a vector of its own
//! (one allocation each, and the two vectors' growth), and only then into the `EVALSHA`
//! command: seven to nine allocations for the release's five strings, on every lock
//! cycle (`examples/alloc_count.rs`; on a 2-core machine at 64 tasks the client's
//! allocations were about a third of its CPU, contended in glibc's arenas). A
//! [`ScriptCall`] writes them once, into the command.
//!
//! It answers `NOSCRIPT` as `ScriptInvocation::invoke_async` does: it loads the script
//! and sends the same command again (a server that lost its scripts: a restart, a
//! failover, `SCRIPT FLUSH`). Sending again is safe because a `NOSCRIPT` answer means
//! the server ran nothing of the call: it looks the script up before running any of it.
//! Only that answer may be sent again. After a timeout or a dropped connection the call
//! may have run, and a second `ACQUIRE` or `LOCK_ALL` would take another free slot under
//! the same owner (a key nobody releases, until its TTL).

use redis::aio::ConnectionManager;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, ToRedisArgs};

/// Bytes reserved for the arguments, per argument (all share the budget): an owner value
/// (32 bytes), a channel name, a waiter id; an owner value with its holder record (about
/// 130) is balanced by the short ones. A call whose arguments outgrow it grows the
/// command, as redis-rs's would.
const ARG_BYTES: usize = 64;

/// An `EVALSHA` of a script with its keys and arguments.
pub(crate) struct ScriptCall {
    script: &'static Script,
    cmd: Cmd,
}

impl ScriptCall {
    /// A call of `script` on `keys` (`KEYS[1..]`), sized for `args` arguments to come
    /// ([`arg`](Self::arg): `ARGV[1..]`, in order).
    pub(crate) fn new(script: &'static Script, keys: &[&str], args: usize) -> Self {
        let hash = script.get_hash();
        let bytes = "EVALSHA".len()
            + hash.len()
            + 4
            + keys.iter().map(|key| key.len()).sum::<usize>()
            + args * ARG_BYTES;
        let mut cmd = Cmd::with_capacity(3 + keys.len() + args, bytes);
        cmd.arg("EVALSHA").arg(hash).arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        Self { script, cmd }
    }

    /// Appends the next argument.
    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Sends the call; on `NOSCRIPT` (and on nothing else: see the module docs), loads
    /// the script and sends it again.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut ConnectionManager,
    ) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            answer => answer,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::LazyLock;

    use super::ScriptCall;

    static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new("return 1"));

    const OWNER: &str = "0123456789abcdef0123456789abcdef";

    /// The bytes redis-rs's own invocation of `SCRIPT` with `keys` and `args` sends.
    fn as_redis_rs_sends(keys: &[&str], args: &[&str]) -> Vec<u8> {
        let mut invocation = SCRIPT.prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        for arg in args {
            invocation.arg(*arg);
        }
        redis::pipe()
            .invoke_script(&invocation)
            .get_packed_pipeline()
    }

    #[test]
    fn a_release_is_sent_as_redis_rs_sends_it_with_its_empty_waiter_id() {
        let keys = ["p:lock:door", "p:waiters:door"];
        let mut call = ScriptCall::new(&SCRIPT, &keys, 3);
        call.arg(OWNER).arg("p:released:door").arg("");
        assert_eq!(
            call.cmd.get_packed_command(),
            as_redis_rs_sends(&keys, &[OWNER, "p:released:door", ""])
        );
    }

    #[test]
    fn many_keys_and_numbers_are_sent_as_redis_rs_sends_them() {
        // A semaphore's three slots, its counter and its waiters (lock_all's three names
        // per lock are the same shape), a value longer than the arguments' budget, and
        // numbers as their decimal digits.
        let keys = [
            "p:permit:s:0",
            "p:permit:s:1",
            "p:permit:s:2",
            "p:permit-token:s",
            "p:permit-waiters:s",
        ];
        let value = format!(
            "{OWNER}\nfencelock-holder/1 host=host-a pid=4121 program=report.sh since=1764684131123 ttl=10000 label=nightly-report-job"
        );
        let mut call = ScriptCall::new(&SCRIPT, &keys, 4);
        call.arg(value.as_bytes())
            .arg(10_000_u64)
            .arg("")
            .arg(0_u64);
        assert_eq!(
            call.cmd.get_packed_command(),
            as_redis_rs_sends(&keys, &[&value, "10000", "", "0"])
        );
    }
}
