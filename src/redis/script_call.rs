//! One script call, built straight into one command sized for it.
//!
//! redis-rs's `ScriptInvocation` copies every key and argument into a vector of its own,
//! then into the `EVALSHA` command, which it grows as it goes: seven to nine allocations
//! for the release's five strings, on every lock cycle (`examples/alloc_count.rs`; on a
//! 2-core machine at 64 tasks the client's allocations are about a third of its CPU,
//! contended in glibc's arenas). A [`ScriptCall`] writes them once, into a command
//! allocated once, and answers `NOSCRIPT` as `ScriptInvocation::invoke_async` does: it
//! loads the script and sends the same command again (a server that lost its scripts: a
//! restart, a failover, `SCRIPT FLUSH`). Sending it again is safe for every script it is
//! used for: each is a compare-and-act that a second run after a `NOSCRIPT` (which ran
//! nothing) applies once.

use redis::aio::ConnectionManager;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, ToRedisArgs};

/// Bytes reserved per argument beyond the keys: an owner value (32), a channel name or a
/// waiter id; a longer one grows the command once.
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

    /// Sends the call; on `NOSCRIPT`, loads the script and sends it again.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut ConnectionManager,
    ) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.prepare_invoke().load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            answer => answer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ScriptCall;

    static ECHO: std::sync::LazyLock<redis::Script> =
        std::sync::LazyLock::new(|| redis::Script::new("return {KEYS[1], ARGV[1], ARGV[2]}"));

    #[test]
    fn the_command_is_the_evalsha_redis_rs_builds() {
        let mut call = ScriptCall::new(&ECHO, &["lock:a"], 2);
        call.arg("0123456789abcdef0123456789abcdef").arg(1500_u64);
        let packed = call.cmd.get_packed_command();
        let text = String::from_utf8_lossy(&packed);
        let hash = ECHO.get_hash();
        assert_eq!(
            text,
            format!(
                "*6\r\n$7\r\nEVALSHA\r\n$40\r\n{hash}\r\n$1\r\n1\r\n$6\r\nlock:a\r\n$32\r\n0123456789abcdef0123456789abcdef\r\n$4\r\n1500\r\n"
            )
        );
    }
}
