//! Where the CPU of concurrent lock + release cycles on distinct names goes, on a local
//! single-node etcd this example starts itself: for each concurrency, the cycles per
//! second, the client process's CPU per cycle, etcd's CPU per cycle, and etcd's Raft
//! proposals per cycle (from its own `etcd_server_proposals_committed_total`), for
//! fencelock's lock, for etcd's Lock RPC, and for the bare acquire transaction + delete.
//! Group commit shows here as fewer proposals and less server CPU per cycle; what is left
//! is the client's and the server's per-operation work.
//!
//! `cargo run --release --example concurrent_cost [-- --fsync --seconds 3 --concurrency 1,8,64 --in-flight 4]`
//! (`-- --redis`: the Redis lock against the bare `SET NX PX` + compare-and-delete cycle;
//! `--lock-only` leaves the other rows out, e.g. to profile the lock alone with `perf`.)

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, GetOptions, LockOptions as RpcLockOptions, PutOptions};
use etcd_client::{Txn, TxnOp};
use fencelock::etcd::EtcdLocker;
use fencelock::redis::RedisLocker;
use fencelock::testkit::{BareRedisCycle, EtcdCluster, RedisServer, cpu_time, fetch_metrics};
use fencelock::{LockBackend, LockGuard, LockOptions};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// etcd's committed proposals so far, and the gRPC requests it handled per method, from
/// its metrics endpoint.
async fn proposals(metrics: &str) -> (f64, BTreeMap<String, f64>) {
    let text = fetch_metrics(metrics).await.unwrap_or_default();
    let committed = text
        .lines()
        .find(|line| line.starts_with("etcd_server_proposals_committed_total "))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|value| value.parse().ok())
        .unwrap_or(f64::NAN);
    let mut methods = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("grpc_server_handled_total{"))
    {
        let method = line
            .split("grpc_method=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or("?");
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *methods.entry(method.to_owned()).or_insert(0.0) += value;
    }
    (committed, methods)
}

/// Runs `cycle` on `concurrency` tasks for `seconds`; prints the figures.
async fn measure<F, Fut>(
    what: &str,
    concurrency: usize,
    seconds: f64,
    server: u32,
    metrics: &str,
    cycle: F,
) -> Result<(), BoxError>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), BoxError>> + Send,
{
    let cycle = Arc::new(cycle);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let me = std::process::id();
    let (client_before, server_before) = (cpu_time(me), cpu_time(server));
    let before = if metrics.is_empty() {
        (0.0, BTreeMap::new())
    } else {
        proposals(metrics).await
    };
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let (cycle, stop, done) = (cycle.clone(), stop.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                cycle(worker, i).await?;
                i += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), BoxError>(())
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await??;
    }
    let wall = started.elapsed().as_secs_f64();
    let cycles = done.load(Ordering::Relaxed).max(1) as f64;
    let client = (cpu_time(me) - client_before).as_secs_f64() * 1e6 / cycles;
    let server_cpu = (cpu_time(server) - server_before).as_secs_f64() * 1e6 / cycles;
    let proposals = if metrics.is_empty() {
        String::new()
    } else {
        let after = proposals(metrics).await;
        let per_cycle = (after.0 - before.0) / cycles;
        let mut requests = String::new();
        for (method, count) in &after.1 {
            let per = (count - before.1.get(method).copied().unwrap_or(0.0)) / cycles;
            if per >= 0.005 {
                requests.push_str(&format!(" {method} {per:.2}"));
            }
        }
        format!("  proposals {per_cycle:.2} requests:{requests}")
    };
    println!(
        "c={concurrency:<3} {what:<24} {:>8.0} cycles/s  client CPU {client:>5.1} us  server CPU {server_cpu:>5.1} us{proposals}",
        cycles / wall
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let fsync = args.iter().any(|a| a == "--fsync");
    let seconds = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let concurrencies: Vec<usize> = args
        .iter()
        .position(|a| a == "--concurrency")
        .and_then(|i| args.get(i + 1))
        .map(|list| list.split(',').filter_map(|c| c.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 8, 64]);
    let lock_only = args.iter().any(|a| a == "--lock-only");
    if args.iter().any(|a| a == "--redis") {
        return redis(&concurrencies, seconds, lock_only).await;
    }
    let etcd = EtcdCluster::builder().fsync(fsync).start().await?;
    let pid = etcd.pid(0).ok_or("etcd has no pid")?;
    let metrics = etcd.admin_endpoint(0);
    let mut config = etcd.config("concurrent-cost");
    if let Some(k) = args
        .iter()
        .position(|a| a == "--in-flight")
        .and_then(|i| args.get(i + 1))
        .and_then(|k| k.parse().ok())
    {
        config = config.with_max_in_flight(k);
    }
    let locks = EtcdLocker::connect(config).await?;
    let options = LockOptions::new();
    locks.session(options.ttl()).await?;
    let client = locks.client().clone();
    // Outlives every cell of a run (nothing renews it).
    let lease = client.clone().lease_grant(3600, None).await?.id();
    println!("etcd fsync {fsync}, {seconds} s per cell");
    for &c in &concurrencies {
        for round in 0..2 {
            let (l, o) = (locks.clone(), options.clone());
            measure("fencelock lock", c, seconds, pid, &metrics, move |w, _| {
                let (locks, options) = (l.clone(), o.clone());
                async move {
                    let guard = locks.lock(&format!("cc{round}-{w}"), &options).await?;
                    let _released = guard.release().await?;
                    Ok(())
                }
            })
            .await?;
            if lock_only {
                continue;
            }
            let cl = client.clone();
            measure("etcd Lock RPC", c, seconds, pid, &metrics, move |w, _| {
                let mut cl = cl.clone();
                async move {
                    let options = RpcLockOptions::new().with_lease(lease);
                    let locked = cl.lock(format!("rpc{round}/{w}"), Some(options)).await?;
                    cl.unlock(locked.key().to_vec()).await?;
                    Ok(())
                }
            })
            .await?;
            let cl = client.clone();
            measure(
                "bare txn + delete",
                c,
                seconds,
                pid,
                &metrics,
                move |w, _| {
                    let mut cl = cl.clone();
                    async move {
                        let prefix = format!("bare{round}/{w}/");
                        let key = format!("{prefix}0");
                        let txn = Txn::new()
                            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                            .and_then([
                                TxnOp::put(
                                    key.as_str(),
                                    "",
                                    Some(PutOptions::new().with_lease(lease)),
                                ),
                                TxnOp::get(
                                    prefix.as_str(),
                                    Some(GetOptions::new().with_prefix().with_limit(1)),
                                ),
                            ]);
                        cl.txn(txn).await?;
                        cl.delete(key, None).await?;
                        Ok(())
                    }
                },
            )
            .await?;
            let _ = fencelock::testkit::compact_now(&mut client.clone()).await;
        }
    }
    Ok(())
}

/// The same for the Redis lock against the bare `SET NX PX` + compare-and-delete cycle on
/// the lock's own connection (`--redis`).
async fn redis(concurrencies: &[usize], seconds: f64, lock_only: bool) -> Result<(), BoxError> {
    let server = RedisServer::start().await?;
    let pid = server.pid().ok_or("redis-server has no pid")?;
    let locks = RedisLocker::connect(server.config("concurrent-cost")).await?;
    let options = LockOptions::new();
    let bare = BareRedisCycle::new();
    println!("redis, {seconds} s per cell");
    for &c in concurrencies {
        for _ in 0..2 {
            let (l, o) = (locks.clone(), options.clone());
            measure("fencelock redis lock", c, seconds, pid, "", move |w, _| {
                let (locks, options) = (l.clone(), o.clone());
                async move {
                    let guard = locks.lock(&format!("cc-{w}"), &options).await?;
                    let _released = guard.release().await?;
                    Ok(())
                }
            })
            .await?;
            if lock_only {
                continue;
            }
            let (conn, bare) = (locks.connection(), bare.clone());
            measure("bare SET NX PX + CAD", c, seconds, pid, "", move |w, i| {
                let (mut conn, bare) = (conn.clone(), bare.clone());
                async move {
                    bare.run(&mut conn, &format!("bare-{w}"), &i.to_string())
                        .await?;
                    Ok(())
                }
            })
            .await?;
        }
    }
    Ok(())
}
