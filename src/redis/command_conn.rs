//! The connection a Redis server's commands go over, replaced once it stops answering.
//!
//! redis-rs's `ConnectionManager` opens a new connection when its connection ends (a
//! reset, an end of stream, a broken pipe), never when a request times out. A connection
//! that dies without closing (its host crashed behind the same address or VIP, a
//! partition, a load balancer that forgot the flow: no FIN ever comes, and no TCP
//! keepalive is set) would stay in place, every request on it (attempts, renewals,
//! releases) timing out until the kernel gives it up (its retransmission timeout, about
//! 15 minutes on Linux).
//!
//! So a request that goes unanswered (its response timeout, or a renewal attempt's
//! shorter bound) makes the connection suspect: a `PING` is sent
//! on it in the background, and if that goes unanswered within the request timeout too,
//! the connection is replaced by a new one, opened on its first request
//! (`tests/redis/command_conn_silent_loss.rs`). Two requests unanswered in a row, the
//! second sent after the first timed out, and not one: a server that stalls (a fork on a
//! large dataset, a slow script, `CLIENT PAUSE`) for less than the first request's wait
//! plus the request timeout (twice the request timeout; about 2.25-3 s at the default
//! 2 s when a renewal, whose wait is at most 1 s, times out first) keeps every client's
//! connection, where replacing at the first timeout would
//! have every client reconnect at once when the stall ends (what the pub/sub connection
//! does, `subscriber.rs`). A ping rather than the next request: a client that only
//! renews gives each renewal up before the connection's own timeout, and one that made
//! a request and went idle would otherwise find the connection dead again on its next.
//! However many requests time out at once, one ping is in flight at a time, and it
//! replaces only the connection it found silent.
//!
//! No backoff between replacements: a server that answers nothing within the request
//! timeout for longer (stalled, overloaded) has each client open a new connection about
//! once per request timeout, one at a time per client and server, each logged, until it
//! answers again (a review's finding, left as it is). A new connection is not checked
//! for an evicting `maxmemory-policy` as the first was (neither is one redis-rs reopens
//! after a reset).
//!
//! Replacing changes no guarantee. A request sent on the old connection may still reach
//! the server later (a partition that heals before the kernel gives up), as one sent
//! before any timeout always could: callers take a timed-out request as "may have been
//! applied" (an acquisition undoes it with a compare-and-delete of its owner value, a
//! renewal only extends a lock that is still ours, a release deletes only its own key).
//! What replacing adds is an order: a request sent on the new connection may now run
//! before one still on its way on the old, as after any reconnection (docs/redis.md).
//! For an acquisition's undo that order matters: an attempt whose bytes the kernel still
//! delivers after a partition heals (it retransmits them for minutes) would set a key
//! with an owner value nobody holds after its undo had found nothing on the new
//! connection, and the lock would be refused to everyone until that key's TTL. So a
//! replaced connection is kept for a while (its socket open: what was written to it is
//! still on its way; `CommandConn::retired_window`), and an undo is sent on it too, in
//! the background ([`retired`](CommandConn::retired)), where it queues behind the
//! attempt as it did before the replacement (this module's test). The replacement came
//! after the attempt was sent, and the undo is sent within the attempt's own timeout
//! plus a retry's backoff of it: it finds its attempt's connection among the retired
//! ones. A copy may land at any time later, so its owner value is never used again
//! (a single Redis always takes a new one after an undo; Redlock does when it sent a
//! copy, `acquire.rs` `clean_up`).
//!
//! The scripts need no loading on the new connection: the server's script cache is not
//! per connection. A server that lost them (a restart, a failover) answers `NOSCRIPT`,
//! on which a script call loads the script and calls it again (`script_call.rs`), and
//! each renewal call does the same (`node_renewal.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::time::Instant;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, ErrorKind};

/// A server's command connection, as it is now.
pub(crate) struct CommandConn {
    /// Where a new connection comes from, with the settings of the first one.
    client: Client,
    config: ConnectionManagerConfig,
    /// How long the ping may go unanswered: the request timeout.
    timeout: Duration,
    /// The server, for the logs.
    address: String,
    /// Read on every request (a clone of the manager: a reference count), written only
    /// to replace it. An `ArcSwap`, not a `RwLock`: a read lock is two atomic writes to
    /// one word that every task of the client shares, moved between the runtime's
    /// threads four times per lock cycle; `ArcSwap::load` reads without writing to it.
    current: ArcSwap<ConnectionManager>,
    /// A ping is in flight: the requests that time out meanwhile send none.
    probing: AtomicBool,
    /// A view of one connection ([`pinned`](Self::pinned)): never replaced; a request
    /// it finds unanswered is told to `parent`, if any (the view of a current
    /// connection; a retired one was given up already).
    pinned: bool,
    parent: Option<Arc<CommandConn>>,
    /// The connections replaced within [`retired_window`](Self::retired_window), and
    /// when: an undo goes on them too (module docs). At most [`RETIRED_MAX`].
    retired: Mutex<Vec<(Instant, ConnectionManager)>>,
}

/// How many replaced connections are kept at most, a bound on sockets: a server that
/// answers nothing has one replaced per request timeout (a ping's), four within the
/// window at the default timeout, as many as this with a 500 ms one; a shorter timeout
/// can push an attempt's connection out before its undo.
const RETIRED_MAX: usize = 16;

/// The longest pause before an acquisition's retry (`acquire.rs` `retry_after`: 1 s,
/// jittered up by at most a fifth), rounded up: what an undo may wait beyond its
/// attempt's timeout.
const RETRY_PAUSE: Duration = Duration::from_secs(2);

impl CommandConn {
    /// Holds `conn`, made by `client` with `config`, whose response timeout is `timeout`.
    pub(crate) fn new(
        client: Client,
        config: ConnectionManagerConfig,
        timeout: Duration,
        address: String,
        conn: ConnectionManager,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            config,
            timeout,
            address,
            current: ArcSwap::from_pointee(conn),
            probing: AtomicBool::new(false),
            pinned: false,
            parent: None,
            retired: Mutex::new(Vec::new()),
        })
    }

    /// The connections an undo goes on: the current one, then those replaced lately
    /// ([`retired`](Self::retired)), read in that order: a replacement in between puts
    /// the connection read as current among the retired too (a copy more), never one
    /// read nowhere. Each pinned, to send on.
    pub(crate) fn for_undo(self: &Arc<Self>) -> (Arc<Self>, Vec<Arc<Self>>) {
        let current = self.pinned(self.current(), Some(self.clone()));
        let retired = self
            .retired()
            .into_iter()
            .map(|conn| self.pinned(conn, None))
            .collect();
        (current, retired)
    }

    /// `conn` with this one's settings, never replaced; `parent` hears of its unanswered
    /// requests (none for a retired connection: it was given up already).
    fn pinned(&self, conn: ConnectionManager, parent: Option<Arc<Self>>) -> Arc<Self> {
        Arc::new(Self {
            client: self.client.clone(),
            config: self.config.clone(),
            timeout: self.timeout,
            address: self.address.clone(),
            current: ArcSwap::from_pointee(conn),
            probing: AtomicBool::new(false),
            pinned: true,
            parent,
            retired: Mutex::new(Vec::new()),
        })
    }

    /// The connections replaced lately (within [`retired_window`](Self::retired_window)):
    /// an undo is sent on each of them too, behind whatever attempt may still be on its
    /// way there (module docs). Empty but after a replacement.
    fn retired(&self) -> Vec<ConnectionManager> {
        self.kept().iter().map(|(_, conn)| conn.clone()).collect()
    }

    /// How long a replaced connection is kept for undos: the replacement came after the
    /// attempt was sent on it, the attempt failed within the request timeout of that,
    /// and its undo is sent then or after a retry's pause ([`RETRY_PAUSE`]); twice that,
    /// for a loaded runtime (8 s at the default 2 s).
    fn retired_window(&self) -> Duration {
        (self.timeout + RETRY_PAUSE) * 2
    }

    /// The replaced connections still within the window, locked (older ones dropped:
    /// closed, once their requests in flight end).
    fn kept(&self) -> MutexGuard<'_, Vec<(Instant, ConnectionManager)>> {
        let window = self.retired_window();
        let mut retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        retired.retain(|(at, _)| at.elapsed() < window);
        retired
    }

    /// The connection to send on now. A clone taken earlier stays on its connection,
    /// replaced or not.
    pub(crate) fn current(&self) -> ConnectionManager {
        ConnectionManager::clone(&self.current.load())
    }

    /// A request went unanswered: pings the connection in the background, unless a
    /// ping is already in flight, and replaces it if that goes unanswered too.
    pub(crate) fn unanswered(self: &Arc<Self>) {
        if self.pinned {
            if let Some(parent) = &self.parent {
                parent.unanswered();
            }
            return;
        }
        if self.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        // Made before the spawn and moved into the task: the flag is cleared however the
        // probe ends (a panic, the task dropped at a runtime's shutdown, even before it
        // was first polled): a flag left set would keep every later probe from running.
        tokio::spawn(self.clone().probe(Probing(self.clone())));
    }

    /// Pings the current connection; replaces it if no answer comes within the timeout.
    /// `_probing` clears the flag when the probe ends (an argument: an async fn's
    /// arguments are moved into its future when it is called, before any poll).
    async fn probe(self: Arc<Self>, _probing: Probing) {
        let mut conn = self.current();
        let cmd = redis::cmd("PING");
        let ping = cmd.query_async::<redis::Value>(&mut conn);
        let silent = match tokio::time::timeout(self.timeout, ping).await {
            Ok(Ok(_)) => false,
            // An error reply is an answer (an ACL without `PING`), as for the pub/sub
            // connection's pings.
            Ok(Err(err)) if matches!(err.kind(), ErrorKind::Server(_)) => false,
            Ok(Err(err)) if err.is_timeout() => true,
            // Closed, or not opened: the manager notices that itself and reconnects.
            Ok(Err(err)) => {
                tracing::debug!(server = %self.address, %err, "the command connection's ping failed");
                false
            }
            // Bounded also while the manager (re)connects: a connection that cannot even
            // be opened within the request timeout is no better.
            Err(_) => true,
        };
        if silent {
            self.replace();
        }
    }

    /// Puts a new connection (opened on its first request) in the current one's place.
    pub(crate) fn replace(self: &Arc<Self>) {
        match ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone()) {
            Ok(conn) => {
                // Kept for the undos of attempts sent on it (module docs); its requests
                // in flight keep it too, until they end. Swapped and kept under the
                // list's lock: an undo that reads the new one as current then reads the
                // list after this, with the old one in it (between a swap and a push
                // outside the lock, it could read neither).
                {
                    let mut retired = self.kept();
                    let old = ConnectionManager::clone(&self.current.swap(Arc::new(conn)));
                    if retired.len() >= RETIRED_MAX {
                        retired.remove(0);
                    }
                    retired.push((Instant::now(), old));
                }
                // Closed once the window is over, even if no undo looks for it again.
                let this = Arc::downgrade(self);
                let window = self.retired_window();
                tokio::spawn(async move {
                    tokio::time::sleep(window).await;
                    if let Some(this) = this.upgrade() {
                        drop(this.kept());
                    }
                });
                tracing::warn!(
                    server = %self.address,
                    timeout = ?self.timeout,
                    "the command connection stopped answering (a request, then a ping, \
                     unanswered within the request timeout); replaced by a new one"
                );
            }
            // Only a configuration the first connection was made with could be refused.
            Err(err) => tracing::warn!(
                server = %self.address,
                %err,
                "the command connection stopped answering; no new one could be made"
            ),
        }
    }
}

/// The probe in flight: clears the connection's flag when dropped.
struct Probing(Arc<CommandConn>);

impl Drop for Probing {
    fn drop(&mut self) {
        self.0.probing.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod probe_tests {
    use super::*;

    /// A probe whose task is dropped before it first ran (its runtime shut down) clears
    /// the flag: left set, no later unanswered request would ever probe, and a silent
    /// connection would never be replaced.
    #[test]
    fn a_probe_dropped_before_it_ran_lets_the_next_one_start() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let conn = runtime.block_on(async {
            // Lazy: nothing is connected (nothing listens there); the probe never runs.
            let client = Client::open("redis://127.0.0.1:1").expect("client");
            let config = ConnectionManagerConfig::new();
            let manager = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
                .expect("a lazy manager");
            let conn = CommandConn::new(
                client,
                config,
                Duration::from_secs(1),
                "127.0.0.1:1".into(),
                manager,
            );
            // Spawned as the block_on future ends: never polled.
            conn.unanswered();
            conn
        });
        assert!(conn.probing.load(Ordering::Acquire), "a probe was started");
        drop(runtime);
        assert!(
            !conn.probing.load(Ordering::Acquire),
            "the dropped probe cleared the flag"
        );
    }
}

#[cfg(all(test, feature = "testkit"))]
mod tests {
    //! Against a real `redis-server`, through a fault proxy. The replacement is made by
    //! hand (what a probe does once a ping goes unanswered), between an attempt sent on
    //! the silent connection and the attempt's undo: the window in which the undo used
    //! to go on the new connection alone.

    use std::time::Duration;

    use futures_util::StreamExt;

    use crate::redis::{RedisConfig, RedisLocker, RedlockLocker};
    use crate::testkit::{FaultProxy, RedisServer};
    use crate::{LockBackend, LockGuard, LockOptions};

    async fn proxy_to(server: &RedisServer) -> FaultProxy {
        let upstream = format!("127.0.0.1:{}", server.port())
            .parse()
            .expect("address");
        FaultProxy::start(upstream).await.expect("proxy")
    }

    /// How many scripts `server` has run (`EVALSHA` and `EVAL`): an undo is one.
    async fn scripts_run(server: &RedisServer) -> u64 {
        let mut conn = server.connection().await.expect("connect");
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .expect("INFO");
        info.lines()
            .filter(|line| {
                line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:")
            })
            .filter_map(|line| {
                line.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
        tokio::time::timeout(limit, future)
            .await
            .unwrap_or_else(|_| panic!("{what}: not done within {limit:?}"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_undo_follows_its_attempt_onto_the_replaced_connection() {
        let server = RedisServer::start().await.expect("redis");
        let proxy = proxy_to(&server).await;
        // Long: nothing times out during the test, so no probe replaces anything by
        // itself.
        let config = RedisConfig::new(format!("redis://{}/", proxy.address()))
            .with_prefix("undo-follows")
            .with_request_timeout(Duration::from_secs(10));
        let locks = RedisLocker::connect(config).await.expect("connect");
        assert_eq!(proxy.connections_accepted(), 1, "the command connection");
        let keys = locks.core().keys("late");

        // The connection goes silent, keeping what the client writes (a partition the
        // kernel's retransmissions will outlast); an attempt is sent on it.
        proxy.blackhole_keeping(1);
        let attempt = {
            let locks = locks.clone();
            let options = LockOptions::new().with_ttl(Duration::from_secs(30));
            tokio::spawn(async move { locks.try_lock("late", &options).await })
        };
        within(
            Duration::from_secs(5),
            "the attempt written to the silent connection",
            proxy.requests_held(1),
        )
        .await;
        // Found silent and replaced, then the caller gives up: the acquisition's drop
        // undoes the attempt, on the new connection (which it opens) and on the old.
        locks.core().nodes[0].replace_connection();
        attempt.abort();
        assert!(attempt.await.is_err_and(|err| err.is_cancelled()));
        within(
            Duration::from_secs(5),
            "the undo on the new connection",
            proxy.accepted(2),
        )
        .await;
        within(
            Duration::from_secs(5),
            "a copy of the undo written behind the attempt on the replaced connection",
            proxy.requests_held(2),
        )
        .await;

        // The partition heals: the attempt lands late, and its undo after it.
        proxy.deliver_held();
        let mut direct = server.connection().await.expect("connect");
        within(Duration::from_secs(5), "the late attempt applied", async {
            loop {
                let drawn: Option<u64> = redis::cmd("GET")
                    .arg(keys.counter())
                    .query_async(&mut direct)
                    .await
                    .expect("GET counter");
                if drawn.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        within(
            Duration::from_secs(2),
            "the late attempt's key undone (it was left for its 30 s TTL)",
            async {
                loop {
                    let exists: bool = redis::cmd("EXISTS")
                        .arg(&*keys.lock)
                        .query_async(&mut direct)
                        .await
                        .expect("EXISTS");
                    if !exists {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        )
        .await;
        let guard = locks
            .try_lock("late", &LockOptions::new())
            .await
            .expect("no error")
            .expect("the lock is free at once");
        assert!(guard.release().await.is_ok());
    }

    /// Redlock keeps its owner value after an undo that every master confirmed; a copy
    /// of that undo sent on a replaced connection may land at any time later, so the
    /// value must change then, or the copy deletes the next grant's key on that master
    /// (a holder left with fewer masters than it believes: with one of the others down,
    /// below the quorum, and someone else can take the lock).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_redlock_owner_value_whose_undo_was_copied_is_not_used_again() {
        let (a, b, c) = (
            RedisServer::start().await.expect("redis"),
            RedisServer::start().await.expect("redis"),
            RedisServer::start().await.expect("redis"),
        );
        let proxy = proxy_to(&a).await;
        // B and C are reached through proxies of their own, paused during the attempt
        // until A has granted it (below).
        let (slow_b, slow_c) = (proxy_to(&b).await, proxy_to(&c).await);
        let prefix = "undo-copied";
        // Long: nothing times out, no renewal runs during the test (a master's answer is
        // awaited min(request timeout, TTL / 10): 10 s).
        let ttl = LockOptions::new().with_ttl(Duration::from_secs(120));
        let ours = RedlockLocker::connect(
            RedisConfig::masters(
                [&proxy, &slow_b, &slow_c].map(|p| format!("redis://{}/", p.address())),
            )
            .with_prefix(prefix)
            .with_request_timeout(Duration::from_secs(10)),
        )
        .await
        .expect("connect");
        // The other client's masters are B and C alone: its grant (2 of 2) is on both. (On
        // all three, its grant came at the quorum and the third master's request could
        // be dropped unsent: on a loaded machine, our attempt then took A and B or C.)
        let other =
            RedlockLocker::connect(RedisConfig::masters([b.url(), c.url()]).with_prefix(prefix))
                .await
                .expect("connect");
        let key = ours.core().keys("l").lock.to_string();
        let mut on_a = a.connection().await.expect("connect");

        // The other client holds the lock on B and C: our attempt is granted by A alone,
        // and undone there.
        let held = other
            .try_lock("l", &ttl)
            .await
            .expect("no error")
            .expect("free");
        // A's connection goes silent and is replaced (as a probe would): the undo goes on
        // the new one, and a copy on the old one, kept by the proxy.
        proxy.blackhole_keeping(1);
        ours.core().nodes[0].replace_connection();
        // The new connection open before the attempt (opened by it, A would answer late).
        let _: String = redis::cmd("PING")
            .query_async(&mut ours.connections()[0])
            .await
            .expect("PING on the new connection");
        // One acquisition, which waits: refused first (B and C held), and granted on a
        // later attempt, with the owner value it has then. Its first attempt's grant on
        // A is in before B's and C's refusals decide it (a master still pending then is
        // undone in the background, and the owner value changes for that alone): they
        // get the attempt only once A has applied it (its keyspace event) and answered
        // (a PING on the same connection answered after it). Delays of B and C instead,
        // 250 ms each way, left that order to the scheduler.
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg("E$")
            .query_async(&mut on_a)
            .await
            .expect("CONFIG SET");
        let mut sets = redis::Client::open(a.url())
            .expect("url")
            .get_async_pubsub()
            .await
            .expect("pubsub");
        sets.subscribe("__keyevent@0__:set")
            .await
            .expect("subscribe");
        let mut sets = sets.into_on_message();
        slow_b.pause();
        slow_c.pause();
        let waiting = {
            let ours = ours.clone();
            let options = ttl.clone().with_wait_timeout(Duration::from_secs(30));
            tokio::spawn(async move { ours.lock("l", &options).await })
        };
        within(Duration::from_secs(5), "the attempt applied on A", async {
            while let Some(set) = sets.next().await {
                if set.get_payload::<String>().is_ok_and(|set| set == key) {
                    return;
                }
            }
            panic!("A's keyspace events ended");
        })
        .await;
        let _: String = redis::cmd("PING")
            .query_async(&mut ours.connections()[0])
            .await
            .expect("PING after the attempt on A");
        slow_b.resume();
        slow_c.resume();
        within(
            Duration::from_secs(5),
            "the undo's copy on A's replaced connection",
            proxy.requests_held(1),
        )
        .await;

        // Free: the waiter is granted on every master.
        assert!(held.release().await.is_ok());
        let guard = within(Duration::from_secs(10), "the grant", waiting)
            .await
            .expect("the task")
            .expect("granted");

        // The old connection's bytes arrive: the copy compare-and-deletes with the value
        // of the refused attempt, which must not be the holder's.
        let before = scripts_run(&a).await;
        proxy.deliver_held();
        within(Duration::from_secs(5), "the copy run on A", async {
            while scripts_run(&a).await == before {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        let exists: bool = redis::cmd("EXISTS")
            .arg(&key)
            .query_async(&mut on_a)
            .await
            .expect("EXISTS");
        assert!(
            exists,
            "the holder's key on A was deleted by a late copy of an earlier attempt's undo"
        );
        assert!(guard.release().await.is_ok());
    }
}
