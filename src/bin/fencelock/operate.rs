//! `fencelock check` (is this token still current?) and `fencelock break` (end one stuck
//! holder, safely).
//!
//! Both name a holder by its fencing token on etcd and ZooKeeper, where the lock service
//! itself keeps the token with the key or node (its create revision, its czxid), so that
//! a break deletes exactly that holder's key and never one granted in between. On Redis
//! the token lives in a counter beside the lock, not with its key: a holder is named by
//! its owner value there (`RedisGuard::owner`, shown by `fencelock locks`), and the break
//! is a compare-and-delete on it.

use std::io::{BufRead, Write};
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use fencelock::etcd::EtcdLocker;
use fencelock::redis::RedisLocker;
use fencelock::zookeeper::ZooKeeperLocker;
use fencelock::{BreakOutcome, FencingToken, LockError, TokenCheck};

/// Where the lock lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OperateBackend {
    /// etcd: the token is the key's create revision.
    Etcd,
    /// A single Redis server: holders are named by their owner value.
    Redis,
    /// A ZooKeeper ensemble: the token is the node's czxid.
    Zookeeper,
}

/// Options of `fencelock check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The lock.
    #[arg(long)]
    lock: String,
    /// The token to check (etcd, ZooKeeper).
    #[arg(long, required_unless_present = "owner")]
    token: Option<u64>,
    /// The owner value to check (Redis, which keeps no token with its key).
    #[arg(long, conflicts_with = "token")]
    owner: Option<String>,
    /// Which lock service.
    #[arg(long, value_enum, default_value_t = OperateBackend::Etcd, env = "FENCELOCK_BACKEND")]
    backend: OperateBackend,
    #[command(flatten)]
    service: crate::service::ServiceArgs,
}

/// Options of `fencelock break`.
#[derive(Debug, Args)]
pub struct BreakArgs {
    /// The lock.
    #[arg(long)]
    lock: String,
    /// Break exactly the holder with this token (etcd, ZooKeeper); a holder granted in
    /// between is never touched. Without --token, --owner or --all: shows the holder and
    /// asks.
    #[arg(long, conflicts_with_all = ["owner", "all"])]
    token: Option<u64>,
    /// Break exactly the holder with this owner value (Redis).
    #[arg(long, conflicts_with = "all")]
    owner: Option<String>,
    /// Delete every holder and waiter of the lock.
    #[arg(long)]
    all: bool,
    /// Do not ask for confirmation.
    #[arg(long)]
    yes: bool,
    /// Which lock service.
    #[arg(long, value_enum, default_value_t = OperateBackend::Etcd, env = "FENCELOCK_BACKEND")]
    backend: OperateBackend,
    #[command(flatten)]
    service: crate::service::ServiceArgs,
}

/// A connected lock service.
enum Service {
    Etcd(EtcdLocker),
    Redis(RedisLocker),
    ZooKeeper(ZooKeeperLocker),
}

/// A failure: its exit status and message.
type Failure = (u8, String);

fn failed(err: LockError) -> Failure {
    let code = if err.is_invalid_input() || err.is_incompatible_recipe() {
        2
    } else {
        70
    };
    (code, err.to_string())
}

impl Service {
    async fn connect(
        backend: OperateBackend,
        service: &crate::service::ServiceArgs,
    ) -> Result<Self, Failure> {
        Ok(match backend {
            OperateBackend::Etcd => {
                let config = service.etcd_config().map_err(|err| (2, err))?;
                Self::Etcd(EtcdLocker::connect(config).await.map_err(failed)?)
            }
            OperateBackend::Redis => {
                let config = service.redis_config([service.redis.clone()]);
                Self::Redis(RedisLocker::connect(config).await.map_err(failed)?)
            }
            OperateBackend::Zookeeper => Self::ZooKeeper(
                ZooKeeperLocker::connect(service.zookeeper_config())
                    .await
                    .map_err(failed)?,
            ),
        })
    }

    /// The current holders of `lock`, each as (how to name it, a line describing it).
    async fn holders(&self, lock: &str) -> Result<Vec<(Named, String)>, LockError> {
        let now = std::time::SystemTime::now();
        let describe = |holder: Option<&fencelock::HolderInfo>| {
            holder.map_or_else(|| "(no holder record)".to_owned(), |h| h.describe(now))
        };
        Ok(match self {
            Self::Etcd(locks) => locks
                .inspect(lock)
                .await?
                .holders()
                .map(|e| {
                    let line = format!(
                        "token {} {} key {}",
                        e.token,
                        describe(e.holder.as_ref()),
                        e.key
                    );
                    (Named::Token(e.token), line)
                })
                .collect(),
            Self::Redis(locks) => locks
                .inspect(lock)
                .await?
                .into_iter()
                .flat_map(|state| state.holders)
                .map(|h| {
                    let line = format!(
                        "owner {} {} key {}",
                        h.owner,
                        describe(h.holder.as_ref()),
                        h.key
                    );
                    (Named::Owner(h.owner), line)
                })
                .collect(),
            Self::ZooKeeper(locks) => locks
                .inspect(lock)
                .await?
                .entries
                .into_iter()
                .filter(|e| e.holds)
                .map(|e| {
                    let line = format!(
                        "token {} {} node {}",
                        e.token,
                        describe(e.holder.as_ref()),
                        e.path
                    );
                    (Named::Token(e.token), line)
                })
                .collect(),
        })
    }

    async fn close(self) {
        if let Self::Etcd(locks) = self {
            let _ = locks.close().await;
        }
    }
}

/// How a holder is named on its lock service.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Named {
    Token(FencingToken),
    Owner(String),
}

impl std::fmt::Display for Named {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Token(token) => write!(f, "token {token}"),
            Self::Owner(owner) => write!(f, "owner {owner}"),
        }
    }
}

/// `--token` or `--owner`, as the backend names its holders.
fn named(
    backend: OperateBackend,
    token: Option<u64>,
    owner: Option<String>,
) -> Result<Named, Failure> {
    match (backend, token, owner) {
        (OperateBackend::Redis, Some(_), _) => Err((
            2,
            "--token on Redis: Redis keeps no token with a lock's key (the token is a \
             counter beside it), so a holder is named by its owner value there: --owner \
             (`fencelock locks --backend redis` shows it)"
                .into(),
        )),
        (OperateBackend::Redis, None, Some(owner)) => Ok(Named::Owner(owner)),
        (_, Some(token), _) => Ok(Named::Token(FencingToken::new(token))),
        (_, None, Some(_)) => Err((2, "--owner names Redis holders: use --token".into())),
        (_, None, None) => Err((2, "name the holder: --token (or --owner on Redis)".into())),
    }
}

/// Exit 0 when the token (or owner) holds the lock now; 1 when another holds it or it
/// is free; 2 for invalid arguments; 70 when the lock service cannot be asked.
pub async fn check(args: CheckArgs) -> ExitCode {
    let outcome = async {
        fencelock::validate_name(&args.lock).map_err(failed)?;
        let holder = named(args.backend, args.token, args.owner.clone())?;
        let service = Service::connect(args.backend, &args.service).await?;
        let answer = match (&service, &holder) {
            (Service::Redis(locks), Named::Owner(owner)) => {
                let holders = locks.inspect(&args.lock).await.map_err(failed)?;
                let owners: Vec<String> = holders
                    .into_iter()
                    .flat_map(|state| state.holders)
                    .map(|h| h.owner)
                    .collect();
                if owners.contains(owner) {
                    (0, "current".to_owned())
                } else if let Some(other) = owners.first() {
                    (1, format!("superseded: owner {other} holds the lock"))
                } else {
                    (1, "free: nobody holds the lock".to_owned())
                }
            }
            (Service::Etcd(locks), Named::Token(token)) => {
                token_answer(locks.check(&args.lock, *token).await.map_err(failed)?)
            }
            (Service::ZooKeeper(locks), Named::Token(token)) => {
                token_answer(locks.check(&args.lock, *token).await.map_err(failed)?)
            }
            _ => return Err((2, "name Redis holders by --owner, others by --token".into())),
        };
        service.close().await;
        Ok::<_, Failure>(answer)
    }
    .await;
    finish("check", outcome)
}

/// The exit status and line for what a token check found.
fn token_answer(found: TokenCheck) -> (u8, String) {
    match found {
        TokenCheck::Current => (0, "current".to_owned()),
        TokenCheck::Superseded { by } => (1, format!("superseded: token {by} holds the lock")),
        TokenCheck::Free => (1, "free: nobody holds the lock".to_owned()),
        _ => (1, "not current".to_owned()),
    }
}

/// Exit 0 when the holder was broken (or every contender with --all); 1 when nothing was
/// deleted (no such holder any more, or not confirmed); 2 for invalid arguments; 70 when
/// the lock service cannot be asked.
pub async fn break_lock(args: BreakArgs) -> ExitCode {
    let outcome = async {
        fencelock::validate_name(&args.lock).map_err(failed)?;
        let service = Service::connect(args.backend, &args.service).await?;
        let answer = break_with(&service, &args).await;
        service.close().await;
        answer
    }
    .await;
    finish("break", outcome)
}

async fn break_with(service: &Service, args: &BreakArgs) -> Result<(u8, String), Failure> {
    if args.all {
        let holders = service.holders(&args.lock).await.map_err(failed)?;
        for (_, line) in &holders {
            println!("holds: {line}");
        }
        if !confirmed(
            args.yes,
            &format!("delete every holder and waiter of {:?}?", args.lock),
        ) {
            return Ok((1, "not confirmed: nothing deleted".into()));
        }
        let deleted = match service {
            Service::Etcd(locks) => locks.break_all(&args.lock).await,
            Service::Redis(locks) => locks.break_all(&args.lock).await,
            Service::ZooKeeper(locks) => locks.break_all(&args.lock).await,
        }
        .map_err(failed)?;
        return Ok((0, format!("deleted {deleted} holder and waiter entries")));
    }
    let target = if args.token.is_none() && args.owner.is_none() {
        let holders = service.holders(&args.lock).await.map_err(failed)?;
        let Some((first, line)) = holders.into_iter().next() else {
            return Ok((1, format!("nobody holds {:?}: nothing deleted", args.lock)));
        };
        println!("holds: {line}");
        first
    } else {
        let backend = match service {
            Service::Etcd(_) => OperateBackend::Etcd,
            Service::Redis(_) => OperateBackend::Redis,
            Service::ZooKeeper(_) => OperateBackend::Zookeeper,
        };
        named(backend, args.token, args.owner.clone())?
    };
    if !confirmed(
        args.yes,
        &format!("break the holder of {:?} with {target}?", args.lock),
    ) {
        return Ok((1, "not confirmed: nothing deleted".into()));
    }
    let outcome = match (service, &target) {
        (Service::Etcd(locks), Named::Token(token)) => locks.break_holder(&args.lock, *token).await,
        (Service::ZooKeeper(locks), Named::Token(token)) => {
            locks.break_holder(&args.lock, *token).await
        }
        (Service::Redis(locks), Named::Owner(owner)) => {
            let broken = locks
                .break_holder(&args.lock, owner)
                .await
                .map_err(failed)?;
            return Ok(if broken {
                (0, format!("broke the holder with {target}"))
            } else {
                (
                    1,
                    format!("no holder has {target} any more: nothing deleted"),
                )
            });
        }
        _ => return Err((2, "name Redis holders by --owner, others by --token".into())),
    }
    .map_err(failed)?;
    Ok(match outcome {
        BreakOutcome::Broken => (0, format!("broke the holder with {target}")),
        BreakOutcome::NotHolding { holder: Some(now) } => (
            1,
            format!("no holder has {target} any more (token {now} holds now): nothing deleted"),
        ),
        _ => (
            1,
            format!("no holder has {target} any more (the lock is free): nothing deleted"),
        ),
    })
}

/// Whether the operator confirms `question` (always with `--yes`): a line starting with
/// `y` on stdin.
fn confirmed(yes: bool, question: &str) -> bool {
    if yes {
        return true;
    }
    print!("{question} [y/N] ");
    let _ = std::io::stdout().flush();
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer).is_ok()
        && answer.trim_start().to_ascii_lowercase().starts_with('y')
}

fn finish(what: &str, outcome: Result<(u8, String), Failure>) -> ExitCode {
    match outcome {
        Ok((code, message)) => {
            println!("{message}");
            ExitCode::from(code)
        }
        Err((code, message)) => {
            eprintln!("fencelock {what}: {message}");
            ExitCode::from(code)
        }
    }
}
