//! The etcd rows of `fencelock bench`, peer-style and interleaved: fencelock's lock, the
//! bare acquire transaction + delete and etcd's Lock RPC (this process), and Go's
//! `concurrency.Mutex` (the bench's peer, `benches/go_mutex`, as a child process), each
//! run for a short slice in turn against one local etcd, round after round. A machine
//! whose speed drifts (a shared VM, builds beside it) moves every subject of a round
//! alike, so the median of the per-round ratios is steadier than cells measured seconds
//! apart; this is the run behind the bench's c=1 and c=8 bars when they are close.
//!
//! ```text
//! cargo run --release --example peer_cycle -- --go /path/to/go-mutex \
//!     [--concurrency 1,8] [--rounds 9] [--slice 1s] [--fsync]
//! ```
//!
//! `--go` is the peer built as `benches/go_mutex/main.go` says (without it the Go rows are
//! left out). Each subject's tasks (or goroutines) lock and release names of their own,
//! sharing one client and one session, as in the bench's distinct-names rows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, LockOptions as RpcLockOptions};
use fencelock::etcd::EtcdLocker;
use fencelock::testkit::{EtcdCluster, acquire_shaped};
use fencelock::{LockBackend, LockGuard, LockOptions};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What one slice measured: cycles per second.
type Rate = f64;

struct Args {
    go: Option<String>,
    concurrency: Vec<usize>,
    rounds: usize,
    slice: Duration,
    fsync: bool,
}

fn args() -> Result<Args, BoxError> {
    let mut parsed = Args {
        go: None,
        concurrency: vec![1, 8],
        rounds: 9,
        slice: Duration::from_secs(1),
        fsync: false,
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let mut value = || given.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--go" => parsed.go = Some(value()?),
            "--concurrency" => {
                parsed.concurrency = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?;
            }
            "--rounds" => parsed.rounds = value()?.parse()?,
            "--slice" => parsed.slice = Duration::from_millis(value()?.parse::<u64>()? * 1000),
            "--slice-ms" => parsed.slice = Duration::from_millis(value()?.parse()?),
            "--fsync" => parsed.fsync = true,
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    Ok(parsed)
}

/// Runs `cycle(task, i)` from `tasks` tasks for `slice`; cycles per second.
async fn slice<F, Fut>(tasks: usize, slice: Duration, cycle: F) -> Result<Rate, BoxError>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), BoxError>> + Send,
{
    let cycle = Arc::new(cycle);
    let started = Instant::now();
    let deadline = started + slice;
    let mut running = Vec::new();
    for task in 0..tasks {
        let cycle = cycle.clone();
        running.push(tokio::spawn(async move {
            let mut done = 0u64;
            while Instant::now() < deadline {
                cycle(task, done).await?;
                done += 1;
            }
            Ok::<u64, BoxError>(done)
        }));
    }
    let mut cycles = 0;
    for task in running {
        cycles += task.await??;
    }
    #[allow(clippy::cast_precision_loss)]
    Ok(cycles as f64 / started.elapsed().as_secs_f64())
}

/// Go's Mutex for `slice` from `tasks` goroutines: its own count of cycles over its own
/// clock (the process's start and connection are not counted).
async fn go_slice(
    go: &str,
    endpoint: &str,
    tasks: usize,
    slice: Duration,
    prefix: &str,
) -> Result<Rate, BoxError> {
    let output = tokio::process::Command::new(go)
        .args(["-endpoints", endpoint, "-mode", "distinct", "-n"])
        .arg(tasks.to_string())
        .arg("-duration")
        .arg(format!("{}ms", slice.as_millis()))
        .args(["-prefix", prefix])
        .output()
        .await?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned().into());
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let cycles = text.lines().filter(|l| l.starts_with("cycle ")).count();
    let elapsed_us: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("elapsed_us "))
        .ok_or("no elapsed_us line")?
        .trim()
        .parse()?;
    #[allow(clippy::cast_precision_loss)]
    Ok(cycles as f64 / (elapsed_us / 1e6))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = args()?;
    let etcd = EtcdCluster::builder().fsync(args.fsync).start().await?;
    let endpoint = etcd.endpoints()[0].clone();
    let locks = EtcdLocker::connect(etcd.config("peer-cycle")).await?;
    let options = LockOptions::new();
    locks.session(options.ttl()).await?;
    let client: Client = locks.client().clone();
    let lease = client.clone().lease_grant(60, None).await?.id();
    let (mut keeper, _stream) = client.clone().lease_keep_alive(lease).await?;
    let keeping = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            if keeper.keep_alive().await.is_err() {
                return;
            }
        }
    });
    println!(
        "etcd fsync {}, {} rounds of {:?} slices per subject, subjects interleaved",
        args.fsync, args.rounds, args.slice
    );
    for &c in &args.concurrency {
        let mut rates: Vec<(&str, Vec<Rate>)> = vec![
            ("fencelock lock", Vec::new()),
            ("bare txn + delete", Vec::new()),
            ("etcd Lock RPC", Vec::new()),
            ("Go concurrency.Mutex", Vec::new()),
        ];
        for round in 0..=args.rounds {
            let lock = {
                let locks = locks.clone();
                let options = options.clone();
                slice(c, args.slice, move |task, _| {
                    let (locks, options) = (locks.clone(), options.clone());
                    async move {
                        let guard = locks.lock(&format!("p-{task}"), &options).await?;
                        let _released = guard.release().await?;
                        Ok(())
                    }
                })
                .await?
            };
            let bare = {
                let client = client.clone();
                slice(c, args.slice, move |task, _| {
                    let mut client = client.clone();
                    async move {
                        let prefix = format!("bare/{task}/");
                        let key = format!("{prefix}0");
                        client.txn(acquire_shaped(&prefix, &key, lease)).await?;
                        client.delete(key, None).await?;
                        Ok(())
                    }
                })
                .await?
            };
            let rpc = {
                let client = client.clone();
                slice(c, args.slice, move |task, _| {
                    let mut client = client.clone();
                    async move {
                        let held = client
                            .lock(
                                format!("rpc/{task}"),
                                Some(RpcLockOptions::new().with_lease(lease)),
                            )
                            .await?;
                        client.unlock(held.key()).await?;
                        Ok(())
                    }
                })
                .await?
            };
            let go = match &args.go {
                Some(go) => Some(go_slice(go, &endpoint, c, args.slice, "go").await?),
                None => None,
            };
            // Round 0 warms every subject up (connections, sessions, the Go binary's
            // page cache) and is not counted.
            if round == 0 {
                continue;
            }
            rates[0].1.push(lock);
            rates[1].1.push(bare);
            rates[2].1.push(rpc);
            if let Some(go) = go {
                rates[3].1.push(go);
            }
        }
        println!("c={c}");
        for (subject, values) in &rates {
            if !values.is_empty() {
                println!("  {subject:<22} median {:>7.0}/s", median(values.clone()));
            }
        }
        let lock = &rates[0].1;
        for (peer, values) in rates.iter().skip(1) {
            if values.len() == lock.len() {
                let ratios: Vec<f64> = lock.iter().zip(values).map(|(l, p)| l / p).collect();
                let mut sorted = ratios.clone();
                sorted.sort_by(f64::total_cmp);
                println!(
                    "  lock / {peer:<22} median {:.2}x (rounds: {})",
                    median(ratios),
                    sorted
                        .iter()
                        .map(|r| format!("{r:.2}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                );
            }
        }
    }
    keeping.abort();
    Ok(())
}
