//! One Redis server: its connection, the lock scripts, and error mapping.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike as _, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, ServerErrorKind};

use super::RedisConfig;
use super::command_conn::CommandConn;
use super::keys::LockKeys;
use super::script_call::ScriptCall;
use super::scripts;
use crate::{Backend, FencingToken, LockError};

/// What one acquire attempt on one server found. `G`: what a grant hands over: a lock's
/// (or a semaphore's) token and the slot taken, or each lock's token for several locks
/// taken together (`lock_all.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attempt<G = (FencingToken, usize)> {
    /// The lock (this slot of it; every lock of the set) was free and is now ours.
    Granted(G),
    /// Someone holds it (some of the set); it expires in this long unless renewed (a
    /// semaphore: the soonest of its permits; a set: the held lock that expires last,
    /// which no grant can come before). `registered`: the waiter was registered in the
    /// lock's waiters' set by this attempt, in the same step as the refusal (see
    /// [`Waiter`]). `wake_on`: a set's refusal registers in one held lock's set, this one
    /// (its index in the set): only its release message can let the next attempt succeed
    /// (`None`: any of the target's channels).
    Held {
        remaining: Duration,
        registered: bool,
        wake_on: Option<usize>,
    },
}

/// An acquisition that waits on release messages, as its attempts tell the server: its
/// registration in the lock's waiters' set makes releases publish (`scripts.rs`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Waiter<'a> {
    /// Its id in the set (random, not the owner value: the set is readable by anyone who
    /// can read keys, and ids do not let anyone release anything).
    pub(crate) id: &'a str,
    /// How long a registration lasts unless refreshed.
    pub(crate) lease: Duration,
    /// Whether this attempt must (re-)register if refused: a lock's attempts refresh the
    /// registration only when it is due, a semaphore's script always does.
    pub(crate) register: bool,
    /// Several locks (`lock_all`): the lock (index in the set) whose waiters' set the
    /// last refusal registered in, which a refusal that registers in another's leaves.
    pub(crate) previous: Option<usize>,
}

/// A connection to one Redis server (one master of a Redlock set).
#[derive(Clone)]
pub(crate) struct Node {
    pub(crate) address: String,
    /// Replaced when it stops answering (`command_conn.rs`).
    conn: Arc<CommandConn>,
    timeout: Duration,
    pub(crate) backend: Backend,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("address", &self.address)
            .finish()
    }
}

impl Node {
    /// Connects (within the connect timeout) and loads the scripts, so that every later
    /// call is a plain `EVALSHA`.
    pub(crate) async fn connect(
        url: &str,
        config: &RedisConfig,
        backend: Backend,
    ) -> Result<Self, LockError> {
        let tls = config.loaded_tls(url, backend)?;
        let client = config.client(url, tls.as_ref(), backend)?;
        let address = client.get_connection_info().addr().to_string();
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.request_timeout))
            .set_number_of_retries(1);
        let connecting = async {
            let mut conn =
                ConnectionManager::new_with_config(client.clone(), manager_config.clone()).await?;
            for script in scripts::all() {
                script.prepare_invoke().load_async(&mut conn).await?;
            }
            Ok::<_, RedisError>(conn)
        };
        let timeout = config.connect_timeout;
        let attempt = async {
            match tokio::time::timeout(timeout, connecting).await {
                Ok(Ok(conn)) => Ok(conn),
                Ok(Err(err)) => Err(map_error(backend, "connect", None, err)),
                Err(_) => Err(LockError::Timeout {
                    backend,
                    operation: "connect",
                    lock: None,
                    after: timeout,
                }),
            }
        };
        let endpoint = [crate::tls::Endpoint {
            address: address.clone(),
            tls: tls.is_some(),
            shown: address.clone(),
        }];
        let conn = crate::tls::first_contact(backend, timeout, attempt, |limit| {
            let (endpoint, tls) = (&endpoint, tls.as_ref());
            async move { crate::tls::explain(endpoint, tls, b"", backend, limit).await }
        })
        .await?;
        let conn = CommandConn::new(
            client,
            manager_config,
            config.request_timeout,
            address.clone(),
            conn,
        );
        let node = Self {
            address,
            conn,
            timeout: config.request_timeout,
            backend,
        };
        node.check_eviction(config.allow_eviction).await?;
        Ok(node)
    }

    /// Refuses a server whose `maxmemory-policy` may evict keys (anything but
    /// `noeviction`): eviction can remove a held lock's key (two holders) or the token
    /// counter (tokens restart at 1). With `allow`, warns instead. A server that does not
    /// let us read the policy (an ACL without `CONFIG` and `INFO`) gets a warning.
    #[tracing::instrument(skip(self), fields(server = %self.address))]
    async fn check_eviction(&self, allow: bool) -> Result<(), LockError> {
        let policy = match self.eviction_policy().await {
            Ok(policy) => policy,
            Err(err) => {
                tracing::warn!(
                    server = %self.address,
                    %err,
                    "cannot read maxmemory-policy; the lock needs noeviction (allow INFO to let it check)"
                );
                return Ok(());
            }
        };
        if policy == "noeviction" {
            return Ok(());
        }
        if allow {
            tracing::warn!(
                server = %self.address,
                %policy,
                "maxmemory-policy may evict lock keys or token counters; allowed by configuration"
            );
            return Ok(());
        }
        Err(LockError::UnsafeServer {
            backend: self.backend,
            address: self.address.clone(),
            reason: format!(
                "its maxmemory-policy is {policy:?}, which may evict keys: a held lock's key \
                 (two holders) or the token counter (tokens start again at 1). Set \
                 maxmemory-policy noeviction, or allow eviction explicitly \
                 (RedisConfig::with_allow_eviction, --redis-allow-eviction)"
            ),
        })
    }

    /// The server's `maxmemory-policy`: `CONFIG GET`, or `INFO memory` where `CONFIG` is
    /// not allowed (managed services, ACL users).
    async fn eviction_policy(&self) -> Result<String, LockError> {
        let mut conn = self.connection();
        let operation = "read maxmemory-policy";
        let config: Result<Vec<String>, LockError> = self
            .call(
                operation,
                None,
                redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("maxmemory-policy")
                    .query_async(&mut conn),
            )
            .await;
        if let Some(policy) = config.ok().and_then(|reply| reply.get(1).cloned()) {
            return Ok(policy);
        }
        let info: String = self
            .call(
                operation,
                None,
                redis::cmd("INFO").arg("memory").query_async(&mut conn),
            )
            .await?;
        info.lines()
            .find_map(|line| line.strip_prefix("maxmemory_policy:"))
            .map(|policy| policy.trim().to_owned())
            .ok_or_else(|| LockError::Backend {
                backend: self.backend,
                operation,
                lock: None,
                source: "INFO memory has no maxmemory_policy".into(),
            })
    }

    /// The server's `run_id` (`INFO server`): drawn at random when its process starts,
    /// the same on every connection to it (`distinct_masters.rs`). `None` if the server
    /// answered without one: `INFO` refused (an ACL without it, the command renamed), an
    /// answer of another shape or without a `run_id` line (a proxy answering `INFO`
    /// itself). A server that does not answer is an error.
    pub(crate) async fn run_id(&self) -> Result<Option<String>, LockError> {
        let mut conn = self.connection();
        let reply: Result<String, RedisError> = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await;
        match reply {
            Ok(info) => Ok(info
                .lines()
                .find_map(|line| line.strip_prefix("run_id:"))
                .map(|id| id.trim().to_owned())
                .filter(|id| !id.is_empty())),
            // Refused, renamed, or an answer of another shape (a proxy's): not told.
            // The marker keys compare every master anyway.
            Err(err)
                if !(err.is_timeout()
                    || err.is_io_error()
                    || err.is_connection_dropped()
                    || err.is_connection_refusal()) =>
            {
                tracing::debug!(server = %self.address, %err, "INFO server gave no run_id");
                Ok(None)
            }
            Err(err) => {
                self.call("read run_id", None, std::future::ready(Err(err)))
                    .await
            }
        }
    }

    /// Moves the token `counter` up to `floor` if it is below, and returns the next
    /// token: one above every token handed out so far.
    pub(crate) async fn advance_counter(
        &self,
        counter: &str,
        key: &str,
        owner: &str,
        floor: FencingToken,
        lock: &str,
    ) -> Result<Option<FencingToken>, LockError> {
        let mut conn = self.connection();
        let mut call = ScriptCall::new(&scripts::ADVANCE, &[counter, key], 2);
        call.arg(floor.get()).arg(owner);
        let token: i64 = self
            .call("advance token", Some(lock), call.invoke(&mut conn))
            .await?;
        if token == -1 {
            return Ok(None);
        }
        u64::try_from(token)
            .map(|token| Some(FencingToken::new(token)))
            .map_err(|_| malformed(self.backend, "advance token", lock))
    }

    /// The connection to send on now (a reference count: cheap enough for every
    /// request), for this node's requests and the caller's own commands. A clone keeps
    /// its connection: one replaced later (it stopped answering, `command_conn.rs`)
    /// stays silent for it.
    pub(crate) fn connection(&self) -> ConnectionManager {
        self.conn.current()
    }

    /// This node on the connections an undo goes on (`command_conn.rs`): its current
    /// one, and each of those replaced lately (empty but after a replacement), behind an
    /// attempt that may still be on its way there. Read current first: no connection an
    /// attempt was sent on is missed by a replacement in between.
    pub(crate) fn for_undo(&self) -> (Node, Vec<Node>) {
        let view = |conn| Self {
            address: self.address.clone(),
            conn,
            timeout: self.timeout,
            backend: self.backend,
        };
        let (current, retired) = self.conn.for_undo();
        (view(current), retired.into_iter().map(view).collect())
    }

    /// Replaces the connection now, as a probe that found it silent would (tests: the
    /// probe's own timing is `tests/redis/command_conn_silent_loss.rs`'s).
    #[cfg(all(test, feature = "testkit"))]
    pub(crate) fn replace_connection(&self) {
        self.conn.replace();
    }

    /// A request on this node went unanswered within its caller's own bound, shorter
    /// than the connection's response timeout or as long (a renewal attempt, a Redlock
    /// master's attempt), which [`call`](Self::call) then does not see: the connection
    /// may have died without closing, and is checked (`command_conn.rs`).
    pub(crate) fn unanswered(&self) {
        self.conn.unanswered();
    }

    /// One request; the connection's own response timeout bounds it (no second timer).
    /// A request it times out gets the connection checked, and replaced if it stopped
    /// answering (`command_conn.rs`).
    pub(crate) async fn call<T>(
        &self,
        operation: &'static str,
        lock: Option<&str>,
        request: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, LockError> {
        request.await.map_err(|err| {
            if err.is_timeout() {
                self.conn.unanswered();
                LockError::Timeout {
                    backend: self.backend,
                    operation,
                    lock: lock.map(str::to_owned),
                    after: self.timeout,
                }
            } else {
                map_error(self.backend, operation, lock, err)
            }
        })
    }

    /// One acquire attempt: `SET NX PX` and `INCR` (a semaphore's N slots: one script).
    /// `value` is what the key gets: the owner value, and the holder record if any
    /// (`value.rs`). `waiter`: an acquisition that waits on release messages, registered
    /// by a refused attempt (see [`Waiter`]).
    pub(crate) async fn acquire(
        &self,
        keys: &LockKeys,
        value: &[u8],
        ttl: Duration,
        lock: &str,
        waiter: Option<Waiter<'_>>,
    ) -> Result<Attempt, LockError> {
        if let [slot] = keys.slots() {
            return self.acquire_one(slot, keys, value, ttl, lock, waiter).await;
        }
        // Boxed: a lock's acquisition future (the uncontended cycle's) does not carry a
        // semaphore's script call; a semaphore's attempt pays an allocation for it.
        Box::pin(self.acquire_slots(keys, value, ttl, lock, waiter)).await
    }

    /// A semaphore's attempt: the [`scripts::ACQUIRE`] script over its slots.
    async fn acquire_slots(
        &self,
        keys: &LockKeys,
        value: &[u8],
        ttl: Duration,
        lock: &str,
        waiter: Option<Waiter<'_>>,
    ) -> Result<Attempt, LockError> {
        let mut conn = self.connection();
        let mut names: Vec<&str> = keys.slots().iter().map(|slot| &**slot).collect();
        names.extend([keys.counter(), keys.waiters()]);
        let mut call = ScriptCall::new(&scripts::ACQUIRE, &names, 4);
        let (id, lease) = waiter.map_or(("", 0), |w| (w.id, millis(w.lease)));
        call.arg(value).arg(millis(ttl)).arg(id).arg(lease);
        let reply: Vec<i64> = self
            .call("acquire", Some(lock), call.invoke(&mut conn))
            .await?;
        match reply.as_slice() {
            [1, token, slot] => match (u64::try_from(*token), usize::try_from(*slot)) {
                (Ok(token), Ok(slot)) => Ok(Attempt::Granted((FencingToken::new(token), slot))),
                _ => Err(malformed(self.backend, "acquire", lock)),
            },
            [0, pttl, _] => Ok(Attempt::Held {
                remaining: remaining(*pttl),
                registered: waiter.is_some(),
                wake_on: None,
            }),
            _ => Err(malformed(self.backend, "acquire", lock)),
        }
    }

    /// One slot: `SET key value NX PX ttl` and `INCR counter`, pipelined in one round trip
    /// and no script (a script call costs the server several times these two commands;
    /// measured: the lock cycle went from 0.70x to 0.87x of a bare `SET NX PX` + delete
    /// cycle at 64 clients).
    ///
    /// The `INCR` runs whether or not the `SET` took the lock: a refused attempt burns a
    /// counter value, which costs nothing (tokens need only increase from grant to
    /// grant). They do: a holder's `INCR` runs before its release (it waited for the
    /// pipeline's answer), and the next holder's `INCR` after its own `SET`, which comes
    /// after that release. A refused attempt then reads how long the holder has left:
    /// `PTTL`, or, when `waiter` is due to register, the `REGISTER` script, which reads
    /// it and registers in one step (and finds the lock gone if it was released since
    /// the `SET`: the waiter then tries again at once).
    async fn acquire_one(
        &self,
        slot: &str,
        keys: &LockKeys,
        value: &[u8],
        ttl: Duration,
        lock: &str,
        waiter: Option<Waiter<'_>>,
    ) -> Result<Attempt, LockError> {
        let counter = keys.counter();
        let mut conn = self.connection();
        // Each command allocated once at its size: `pipe().cmd(..)` starts each from
        // empty (`Cmd::new`) and grows it an allocation per doubling, about five per
        // attempt.
        let mut set = Cmd::with_capacity(6, slot.len() + value.len() + 32);
        set.arg("SET")
            .arg(slot)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(millis(ttl));
        let mut incr = Cmd::with_capacity(2, counter.len() + 4);
        incr.arg("INCR").arg(counter);
        let mut pipe = Pipeline::with_capacity(2);
        pipe.add_command(set).add_command(incr);
        // The two answers read as they come: `Pipeline::query_async` would gather them
        // into an array and convert that again (`complete_request`). A server error in
        // either fails the attempt, the first one's kind deciding, as redis-rs's pipeline
        // error did; its code now reaches `map_error` too (a `NOAUTH` answer is a
        // permission error here, as it is on the script calls, where the pipeline's error
        // had no code and made it a backend error).
        // The `SET` answers `OK` or nil: read as a value, not a `String` (an allocation
        // per attempt for two known bytes), and only `OK` grants.
        let answers = self
            .call("acquire", Some(lock), conn.req_packed_commands(&pipe, 0, 2))
            .await?;
        let (set, token) = match answers.as_slice() {
            [redis::Value::ServerError(err), _] | [_, redis::Value::ServerError(err)] => {
                let err = RedisError::from(err.clone());
                return Err(map_error(self.backend, "acquire", Some(lock), err));
            }
            [set, token] => match redis::from_redis_value_ref::<i64>(token) {
                Ok(token) => (set, token),
                Err(err) => return Err(map_error(self.backend, "acquire", Some(lock), err.into())),
            },
            _ => return Err(malformed(self.backend, "acquire", lock)),
        };
        let unexpected = || LockError::Backend {
            backend: self.backend,
            operation: "acquire",
            lock: Some(lock.to_owned()),
            source: format!("SET NX answered neither OK nor nil: {set:?}").into(),
        };
        if set_granted(set).ok_or_else(unexpected)? {
            return match u64::try_from(token) {
                Ok(token) => Ok(Attempt::Granted((FencingToken::new(token), 0))),
                Err(_) => Err(malformed(self.backend, "acquire", lock)),
            };
        }
        // Boxed: its requests' futures would otherwise make every acquisition's future
        // (and every future awaiting one, up to the caller's) about 900 bytes larger,
        // copied as they are moved on every uncontended cycle; a refusal can afford an
        // allocation.
        Box::pin(self.refused(slot, keys, lock, waiter, conn)).await
    }

    /// A refused attempt reads how long the holder has left (see [`acquire_one`]).
    ///
    /// [`acquire_one`]: Self::acquire_one
    async fn refused(
        &self,
        slot: &str,
        keys: &LockKeys,
        lock: &str,
        waiter: Option<Waiter<'_>>,
        mut conn: ConnectionManager,
    ) -> Result<Attempt, LockError> {
        let pttl: i64 = match waiter.filter(|w| w.register) {
            Some(waiter) => {
                let mut call = ScriptCall::new(&scripts::REGISTER, &[slot, keys.waiters()], 2);
                call.arg(waiter.id).arg(millis(waiter.lease));
                let pttl = self
                    .call("acquire", Some(lock), call.invoke(&mut conn))
                    .await?;
                return Ok(Attempt::Held {
                    remaining: remaining(pttl),
                    registered: pttl != -2,
                    wake_on: None,
                });
            }
            None => {
                self.call(
                    "acquire",
                    Some(lock),
                    redis::cmd("PTTL").arg(slot).query_async(&mut conn),
                )
                .await?
            }
        };
        Ok(Attempt::Held {
            remaining: remaining(pttl),
            registered: false,
            wake_on: None,
        })
    }

    /// Compare-and-delete (on the owner value alone: the record after it is not sent),
    /// then publish the release if anyone waits for it. `waiter`: the holder's own id in
    /// the waiters' set, unregistered by the same script. `true` if the lock was still
    /// ours.
    pub(crate) async fn release(
        &self,
        keys: &LockKeys,
        owner: &str,
        lock: &str,
        waiter: Option<&str>,
    ) -> Result<bool, LockError> {
        let mut conn = self.connection();
        let mut call = ScriptCall::new(&scripts::RELEASE, &[&*keys.lock, keys.waiters()], 3);
        call.arg(owner).arg(keys.channel());
        // The waiter id only if there is one: the uncontended cycle sends one less.
        if let Some(waiter) = waiter {
            call.arg(waiter);
        }
        let deleted: i64 = self
            .call("release", Some(lock), call.invoke(&mut conn))
            .await?;
        Ok(deleted == 1)
    }

    /// Removes `waiter` from the lock's waiters' set: a waiter that gave up (timed out,
    /// dropped, failed). Best effort: the registration expires anyway.
    pub(crate) async fn unregister(
        &self,
        keys: &LockKeys,
        waiter: &str,
        lock: &str,
    ) -> Result<(), LockError> {
        let mut conn = self.connection();
        self.call(
            "unregister waiter",
            Some(lock),
            redis::cmd("ZREM")
                .arg(keys.waiters())
                .arg(waiter)
                .query_async::<()>(&mut conn),
        )
        .await
    }
}

/// How long a held lock has left, from its `PTTL`: -2 (it vanished in between) means
/// retry at once; -1 (a key without expiry, written by someone else: not ours to fix)
/// means it may never expire, so a waiter sleeps its longest (until a release message or
/// its bound), never spinning every millisecond.
pub(crate) fn remaining(pttl: i64) -> Duration {
    match pttl {
        -1 => Duration::MAX,
        pttl => Duration::from_millis(u64::try_from(pttl).unwrap_or(0)),
    }
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn malformed(backend: Backend, operation: &'static str, lock: &str) -> LockError {
    LockError::Backend {
        backend,
        operation,
        lock: Some(lock.to_owned()),
        source: "malformed reply (a script's or the acquire pipeline's)".into(),
    }
}

/// Sorts a Redis client error into the kinds callers branch on.
pub(crate) fn map_error(
    backend: Backend,
    operation: &'static str,
    lock: Option<&str>,
    err: RedisError,
) -> LockError {
    let lock = lock.map(str::to_owned);
    if let Some(reason) = crate::tls::describe_tls_failure(&err) {
        return LockError::Tls {
            backend,
            operation,
            reason,
        };
    }
    if err.is_timeout() {
        return LockError::Unavailable {
            backend,
            operation,
            lock,
            source: Box::new(err),
        };
    }
    match err.kind() {
        ErrorKind::AuthenticationFailed | ErrorKind::Server(ServerErrorKind::NoPerm) => {
            LockError::PermissionDenied {
                backend,
                operation,
                lock,
                message: err.to_string(),
            }
        }
        ErrorKind::InvalidClientConfig => LockError::InvalidConfig {
            backend,
            reason: err.to_string(),
        },
        ErrorKind::Io | ErrorKind::Server(ServerErrorKind::BusyLoading) => LockError::Unavailable {
            backend,
            operation,
            lock,
            source: Box::new(err),
        },
        _ if err.is_connection_dropped() || err.is_connection_refusal() || err.is_io_error() => {
            LockError::Unavailable {
                backend,
                operation,
                lock,
                source: Box::new(err),
            }
        }
        // "NOAUTH Authentication required." arrives as a plain response error.
        _ if err.code() == Some("NOAUTH") || err.code() == Some("WRONGPASS") => {
            LockError::PermissionDenied {
                backend,
                operation,
                lock,
                message: err.to_string(),
            }
        }
        _ => LockError::Backend {
            backend,
            operation,
            lock,
            source: Box::new(err),
        },
    }
}

/// What `SET key owner NX PX ttl` answered: `Some(true)` for `OK` (the lock is ours),
/// `Some(false)` for nil (taken), `None` for anything else. Exact, not "anything but nil":
/// a RESP3 answer can come wrapped in attributes, and a wrapped nil is still a refusal
/// (an answer that cannot be read is an error, which the acquisition handles as an
/// attempt that may have set the key: it compare-and-deletes).
fn set_granted(answer: &redis::Value) -> Option<bool> {
    match answer {
        redis::Value::Okay => Some(true),
        redis::Value::SimpleString(text) if text == "OK" => Some(true),
        redis::Value::Nil => Some(false),
        redis::Value::Attribute { data, .. } => set_granted(data),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::set_granted;
    use redis::Value;

    #[test]
    fn only_ok_grants() {
        assert_eq!(set_granted(&Value::Okay), Some(true));
        assert_eq!(set_granted(&Value::SimpleString("OK".into())), Some(true));
        assert_eq!(set_granted(&Value::Nil), Some(false));
        let wrapped_nil = Value::Attribute {
            data: Box::new(Value::Nil),
            attributes: Vec::new(),
        };
        assert_eq!(set_granted(&wrapped_nil), Some(false));
        assert_eq!(set_granted(&Value::Int(1)), None);
        assert_eq!(set_granted(&Value::SimpleString("QUEUED".into())), None);
    }
}
