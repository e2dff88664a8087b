//! Measures, in one run against a local single-node etcd and a local redis-server that
//! this example starts itself: the median latency of an uncontended etcd lock + release
//! next to a plain put, the median etcd handoff latency (release by one holder to the next
//! holder running) with 8 tasks contending for one lock, and the Redis lock + release next
//! to a bare `SET NX PX` + compare-and-delete cycle.
//!
//! `cargo run --release --example latency [-- --fsync]`

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fencelock::etcd::EtcdLocker;
use fencelock::redis::RedisLocker;
use fencelock::testkit::{BareRedisCycle, EtcdCluster, RedisServer};
use fencelock::{FencingToken, LockBackend, LockGuard, LockOptions};

const CYCLES: usize = 2000;
const CONTENDERS: usize = 8;
const HANDOFFS: usize = 2000;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fsync = std::env::args().any(|a| a == "--fsync");
    let etcd = EtcdCluster::builder().fsync(fsync).start().await?;
    let locks = EtcdLocker::connect(etcd.config("latency")).await?;
    let options = LockOptions::new();
    locks.session(options.ttl()).await?;
    let mut client = locks.client().clone();

    let mut puts = Vec::with_capacity(CYCLES);
    let mut cycles = Vec::with_capacity(CYCLES);
    for i in 0..CYCLES {
        let started = Instant::now();
        client.put("latency-probe", i.to_string(), None).await?;
        puts.push(started.elapsed());
        let started = Instant::now();
        let guard = locks.lock("uncontended", &options).await?;
        let _ = guard.release().await?;
        cycles.push(started.elapsed());
    }

    // (token, acquired at, release started at) of every grant.
    let grants: Arc<Mutex<Vec<(FencingToken, Instant, Instant)>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..CONTENDERS {
        let locks = EtcdLocker::connect(etcd.config("latency")).await?;
        let (grants, options) = (grants.clone(), options.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..HANDOFFS / CONTENDERS {
                let guard = locks.lock("contended", &options).await?;
                let acquired = Instant::now();
                let releasing = Instant::now();
                if let Ok(mut grants) = grants.lock() {
                    grants.push((guard.token(), acquired, releasing));
                }
                let _ = guard.release().await?;
            }
            Ok::<_, fencelock::LockError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let mut grants = grants.lock().map_err(|_| "poisoned")?.clone();
    grants.sort_by_key(|(token, _, _)| *token);
    let handoffs: Vec<Duration> = grants
        .windows(2)
        .map(|w| w[1].1.saturating_duration_since(w[0].2))
        .collect();

    println!(
        "etcd {} (fsync {})",
        etcd.endpoint(0),
        if fsync { "on" } else { "off" }
    );
    println!(
        "plain put              median {:?} over {CYCLES}",
        median(puts.clone())
    );
    println!(
        "lock + release         median {:?} over {CYCLES}",
        median(cycles.clone())
    );
    println!(
        "handoff, {CONTENDERS} contenders  median {:?} over {} handoffs",
        median(handoffs.clone()),
        handoffs.len()
    );
    println!(
        "ratios: lock+release / put = {:.2}, handoff / put = {:.2}",
        median(cycles).as_secs_f64() / median(puts.clone()).as_secs_f64(),
        median(handoffs).as_secs_f64() / median(puts).as_secs_f64()
    );
    locks.close().await?;

    let server = RedisServer::start().await?;
    let redis_locks = RedisLocker::connect(server.config("latency")).await?;
    let mut conn = server.connection().await?;
    let bare_cycle = BareRedisCycle::new();
    let mut bare = Vec::with_capacity(CYCLES);
    let mut ours = Vec::with_capacity(CYCLES);
    for i in 0..CYCLES {
        let owner = format!("owner-{i}");
        let started = Instant::now();
        bare_cycle.run(&mut conn, "bare-lock", &owner).await?;
        bare.push(started.elapsed());
        let started = Instant::now();
        let guard = redis_locks.lock("uncontended", &options).await?;
        let _ = guard.release().await?;
        ours.push(started.elapsed());
    }
    println!("redis {}", server.url());
    println!(
        "bare SET NX PX + CAD   median {:?} over {CYCLES}",
        median(bare.clone())
    );
    println!(
        "redis lock + release   median {:?} over {CYCLES}",
        median(ours.clone())
    );
    println!(
        "ratio: redis lock+release / bare cycle = {:.2}",
        median(ours).as_secs_f64() / median(bare).as_secs_f64()
    );
    Ok(())
}
