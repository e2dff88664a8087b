//! `fencelock chaos-worker`: one chaos client, a separate OS process so that the runner
//! can kill, pause and cut it off like a real one. It loops: take the lock, read both
//! counters, work (sleep: the window the faults aim at), write both counters, release,
//! and report every step as a JSON line on standard output.
//!
//! The worker deliberately does not check whether it still holds the lock before writing:
//! it plays the article's client whose pause nobody noticed, so that only the fence
//! stands between it and the data.

use std::future::Future;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use fencelock::etcd::{EtcdConfig, EtcdLocker};
use fencelock::redis::{RedisConfig, RedisLocker, RedlockLocker};
use fencelock::zookeeper::{ZooKeeperConfig, ZooKeeperLocker};
use fencelock::{FencingToken, LockBackend, LockGuard, LockOptions, ReleaseOutcome};
use serde::Serialize;
use tokio::io::AsyncReadExt;

use super::checker::{Release, Section};
use super::events::Event;
use super::monotonic::now_ns;
use super::naive::{NaiveGuard, NaiveLocker};
use super::storage::Store;
use crate::bench::parse_duration;

/// The lock a chaos client uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChaosBackend {
    /// etcd lock, create-revision token.
    Etcd,
    /// Single-instance Redis lock (with a replica that may be promoted).
    Redis,
    /// Redlock over several Redis masters.
    Redlock,
    /// The naive Redis lock (unconditional `DEL`), baseline of S3 only.
    Naive,
    /// ZooKeeper lock (Curator's recipe), czxid token.
    Zookeeper,
}

impl ChaosBackend {
    /// Its value on the command line.
    pub fn flag(self) -> &'static str {
        match self {
            Self::Etcd => "etcd",
            Self::Redis => "redis",
            Self::Redlock => "redlock",
            Self::Naive => "naive",
            Self::Zookeeper => "zookeeper",
        }
    }

    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Self::Etcd => "etcd",
            Self::Redis => "redis",
            Self::Redlock => "redlock",
            Self::Naive => "naive redis",
            Self::Zookeeper => "zookeeper",
        }
    }
}

/// Options of `fencelock chaos-worker` (started by `fencelock chaos`, not by hand).
#[derive(Clone, Debug, Args)]
pub struct WorkerArgs {
    /// Which lock to use.
    #[arg(long, value_enum)]
    pub backend: ChaosBackend,
    /// Lock service endpoints: etcd members, Redis servers in failover order (the first
    /// that reports itself master is used), the Redlock masters, or ZooKeeper members
    /// (host:port).
    #[arg(long, value_delimiter = ',', required = true)]
    pub endpoints: Vec<String>,
    /// PostgreSQL connection string of the shared rows.
    #[arg(long)]
    pub postgres: String,
    /// The run's name: the lock's name and the rows' prefix.
    #[arg(long)]
    pub run: String,
    /// This client's name in the log.
    #[arg(long)]
    pub client: String,
    /// Lock TTL.
    #[arg(long, value_parser = parse_duration)]
    pub ttl: Duration,
    /// How long each critical section works between its reads and its writes.
    #[arg(long, value_parser = parse_duration)]
    pub hold: Duration,
    /// Do not renew the lock (S3: the lease runs out during long sections).
    #[arg(long)]
    pub no_renewal: bool,
    /// TLS for the given servers (and the etcd user, from the environment).
    #[command(flatten)]
    pub tls: crate::security::BackendTls,
}

/// Runs the worker until the runner closes its standard input or kills it.
pub async fn work(args: WorkerArgs) -> ExitCode {
    // The runner holds our stdin open; when it goes away, so do we.
    tokio::spawn(async {
        let mut stdin = tokio::io::stdin();
        let mut buffer = [0u8; 64];
        while let Ok(n) = stdin.read(&mut buffer).await {
            if n == 0 {
                break;
            }
        }
        std::process::exit(0);
    });
    let out = Emitter {
        client: args.client.clone(),
    };
    let postgres_tls = args.tls.postgres();
    let mut store = loop {
        match Store::connect(&args.postgres, &args.run, postgres_tls.as_ref()).await {
            Ok(store) => break store,
            Err(err) => out.trouble(format!("postgres: {err}")).await,
        }
    };
    match args.backend {
        ChaosBackend::Etcd => {
            let config = EtcdConfig::new(args.endpoints.clone())
                .with_namespace("fencelock-chaos")
                .with_connect_timeout(Duration::from_secs(2))
                .with_request_timeout(Duration::from_secs(2));
            let config = match args.tls.etcd(config) {
                Ok(config) => config,
                Err(err) => {
                    out.trouble(format!("etcd credentials: {err}")).await;
                    return ExitCode::FAILURE;
                }
            };
            serve(
                || async {
                    EtcdLocker::connect(config.clone())
                        .await
                        .map(|locks| Library(locks, WAIT))
                },
                &mut store,
                &args,
                &out,
            )
            .await
        }
        ChaosBackend::Redis => {
            let wait = if args.endpoints.len() > 1 {
                FAILOVER_WAIT
            } else {
                WAIT
            };
            serve(
                || async {
                    let url = find_master(&args.endpoints).await?;
                    RedisLocker::connect(redis_config(RedisConfig::new(url), &args))
                        .await
                        .map(|locks| Library(locks, wait))
                        .map_err(|e| e.to_string())
                },
                &mut store,
                &args,
                &out,
            )
            .await
        }
        ChaosBackend::Redlock => {
            let config = redis_config(RedisConfig::masters(args.endpoints.clone()), &args);
            serve(
                || async {
                    RedlockLocker::connect(config.clone())
                        .await
                        .map(|locks| Library(locks, WAIT))
                },
                &mut store,
                &args,
                &out,
            )
            .await
        }
        ChaosBackend::Zookeeper => {
            let config = ZooKeeperConfig::new(args.endpoints.join(","))
                .with_namespace("/fencelock-chaos")
                .with_connect_timeout(Duration::from_secs(2))
                .with_request_timeout(Duration::from_secs(1));
            serve(
                || async {
                    ZooKeeperLocker::connect(config.clone())
                        .await
                        .map(|locks| Library(locks, WAIT))
                },
                &mut store,
                &args,
                &out,
            )
            .await
        }
        ChaosBackend::Naive => {
            let config = redis_config(RedisConfig::new(args.endpoints[0].clone()), &args);
            serve(
                || async {
                    NaiveLocker::connect(config.clone())
                        .await
                        .map_err(|e| e.to_string())
                },
                &mut store,
                &args,
                &out,
            )
            .await
        }
    }
}

fn redis_config(config: RedisConfig, args: &WorkerArgs) -> RedisConfig {
    let config = match args.tls.redis.tls() {
        Some(tls) => config.with_tls(tls),
        None => config,
    };
    config
        .with_prefix("fencelock-chaos")
        .with_connect_timeout(Duration::from_secs(1))
        .with_request_timeout(Duration::from_secs(1))
        // Waiters retry at least this often: a waiter on a master that died learns it
        // within this bound and moves to the promoted replica.
        .with_max_wait_sleep(Duration::from_millis(200))
}

/// What a Sentinel-aware client does after a failover, without Sentinel: the first of
/// `urls` that reports `role:master`.
async fn find_master(urls: &[String]) -> Result<String, String> {
    // One server (given endpoints, TLS perhaps): nothing to choose.
    if let [url] = urls {
        return Ok(url.clone());
    }
    for url in urls {
        let Ok(client) = redis::Client::open(url.as_str()) else {
            continue;
        };
        let probe = async {
            let mut connection = client.get_multiplexed_async_connection().await?;
            redis::cmd("INFO")
                .arg("replication")
                .query_async::<String>(&mut connection)
                .await
        };
        if let Ok(Ok(info)) = tokio::time::timeout(Duration::from_millis(500), probe).await {
            if info.contains("role:master") {
                return Ok(url.clone());
            }
        }
    }
    Err(format!("no master among {}", urls.join(", ")))
}

/// Takes the lock, runs sections, forever; reconnects after a failed attempt.
async fn serve<G, F, Fut, E>(
    connect: F,
    store: &mut Store,
    args: &WorkerArgs,
    out: &Emitter,
) -> ExitCode
where
    G: Grants,
    F: Fn() -> Fut,
    Fut: Future<Output = Result<G, E>>,
    E: std::fmt::Display,
{
    let mut announced = false;
    loop {
        let locks = match connect().await {
            Ok(locks) => locks,
            Err(err) => {
                out.trouble(format!("connect: {err}")).await;
                continue;
            }
        };
        if !announced {
            out.emit(&Event::Ready {
                client: args.client.clone(),
            });
            announced = true;
        }
        loop {
            match locks.grant(args).await {
                Ok(Some(grant)) => section(grant, store, args, out).await,
                Ok(None) => {}
                Err(err) => {
                    out.trouble(format!("lock: {err}")).await;
                    break;
                }
            }
        }
    }
}

/// One critical section, reported when it ends.
async fn section<G: Grant>(grant: G, store: &mut Store, args: &WorkerArgs, out: &Emitter) {
    let token = grant.token();
    let start_ns = now_ns();
    out.emit(&Event::Acquired {
        client: args.client.clone(),
        token: token.get(),
        at_ns: start_ns,
    });
    let fenced_read = store.fenced_read(token).await;
    let unfenced_read = store.unfenced_read().await;
    out.emit(&Event::Working {
        client: args.client.clone(),
        token: token.get(),
    });

    // The work, and the window of the faults.
    let mut lost_ns = None;
    let work = tokio::time::sleep(args.hold);
    tokio::pin!(work);
    tokio::select! {
        biased;
        () = grant.lost() => {
            lost_ns = Some(now_ns());
            work.await;
        }
        () = &mut work => {}
    }
    if lost_ns.is_none() && !grant.is_held() {
        lost_ns = Some(now_ns());
    }

    let unfenced_written = match unfenced_read {
        Ok(value) => store.unfenced_write(value + 1).await.is_ok(),
        Err(_) => false,
    };
    let write = match fenced_read {
        Ok(value) => store.fenced_write(token, value + 1).await,
        Err(refused) => refused,
    };
    let end_ns = now_ns();
    let release = grant.release().await;
    out.emit(&Event::Section {
        section: Section {
            client: args.client.clone(),
            token: token.get(),
            start_ns,
            end_ns,
            write,
            unfenced_written,
            lost_ns,
            release: Some(release),
        },
    });
}

/// The worker's view of a lock service: the library's backends and the naive baseline.
trait Grants: Send + Sync {
    type Grant: Grant;
    /// `Ok(None)` when the wait ran out: ask again.
    fn grant(
        &self,
        args: &WorkerArgs,
    ) -> impl Future<Output = Result<Option<Self::Grant>, String>> + Send;
}

/// The worker's view of a grant.
trait Grant: Send {
    fn token(&self) -> FencingToken;
    fn lost(&self) -> impl Future<Output = ()> + Send + '_;
    fn is_held(&self) -> bool;
    fn release(self) -> impl Future<Output = Release> + Send;
}

/// A library backend seen through [`Grants`], and how long one attempt waits.
struct Library<B>(B, Duration);

/// How long one attempt waits before asking again (every attempt leaves nothing behind).
const WAIT: Duration = Duration::from_secs(10);

/// The wait of a Redis client that can fail over (a master and its replica): a waiting
/// acquisition retries a master that stopped answering until its wait runs out, and only
/// then reports the error on which the worker looks for the promoted replica, as a
/// Sentinel-aware client would at once. A short wait keeps that within the holder's
/// section.
const FAILOVER_WAIT: Duration = Duration::from_millis(300);

impl<B: LockBackend> Grants for Library<B> {
    type Grant = B::Guard;

    async fn grant(&self, args: &WorkerArgs) -> Result<Option<B::Guard>, String> {
        let options = LockOptions::new()
            .with_ttl(args.ttl)
            .with_renewal(!args.no_renewal)
            .with_wait_timeout(self.1);
        match self.0.lock(&args.run, &options).await {
            Ok(guard) => Ok(Some(guard)),
            Err(err) if err.is_wait_timeout() => Ok(None),
            Err(err) => Err(err.to_string()),
        }
    }
}

impl<G: LockGuard> Grant for G {
    fn token(&self) -> FencingToken {
        LockGuard::token(self)
    }

    async fn lost(&self) {
        LockGuard::lost(self).await;
    }

    fn is_held(&self) -> bool {
        LockGuard::is_held(self)
    }

    async fn release(self) -> Release {
        match LockGuard::release(self).await {
            Ok(ReleaseOutcome::Released) => Release::Released,
            // Not a claim that it was held to the end: the checker must not count on it.
            Ok(ReleaseOutcome::NotHeld | ReleaseOutcome::Unconfirmed) => Release::NotHeld,
            Err(_) => Release::Failed,
        }
    }
}

impl Grants for NaiveLocker {
    type Grant = NaiveGuard;

    async fn grant(&self, args: &WorkerArgs) -> Result<Option<NaiveGuard>, String> {
        self.lock(&args.run, args.ttl, WAIT)
            .await
            .map_err(|e| e.to_string())
    }
}

impl Grant for NaiveGuard {
    fn token(&self) -> FencingToken {
        NaiveGuard::token(self)
    }

    async fn lost(&self) {
        // The naive lock never finds out.
        std::future::pending::<()>().await;
    }

    fn is_held(&self) -> bool {
        true
    }

    async fn release(self) -> Release {
        NaiveGuard::release(self).await
    }
}

/// Writes events to standard output, one line each.
struct Emitter {
    client: String,
}

impl Emitter {
    fn emit(&self, event: &Event) {
        let Ok(mut line) = serde_json::to_vec(event) else {
            return;
        };
        line.push(b'\n');
        let mut stdout = std::io::stdout().lock();
        // The runner reads every line; if it is gone there is no one to work for.
        if stdout
            .write_all(&line)
            .and_then(|()| stdout.flush())
            .is_err()
        {
            std::process::exit(0);
        }
    }

    /// Reports a failure, then pauses briefly before the caller retries.
    async fn trouble(&self, message: String) {
        self.emit(&Event::Trouble {
            client: self.client.clone(),
            message,
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
