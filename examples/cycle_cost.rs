//! Where the time of one uncontended lock + release goes, on a local single-node etcd and a
//! local redis-server that this example starts itself: wall time per cycle, the client
//! process's CPU time per cycle (this process: the library, tonic or redis-rs, tokio) and
//! the server's (read from `/proc/<pid>/stat`), and what is left, which is waiting: the
//! loopback round trips, and on etcd the Raft log's write (and its fsync with `--fsync`).
//! The same for the bare protocol (etcd: acquire transaction + delete; Redis: `SET NX PX`
//! + compare-and-delete), so that the library's own share stands out.
//!
//! `cargo run --release --example cycle_cost [-- --fsync]`

use std::time::Instant;

use fencelock::etcd::EtcdLocker;
use fencelock::redis::RedisLocker;
use fencelock::testkit::{BareRedisCycle, EtcdCluster, RedisServer, bare_etcd_cycle, cpu_time};
use fencelock::{LockBackend, LockGuard, LockOptions};

const CYCLES: u32 = 3000;

/// Runs `cycle` CYCLES times; prints wall, client CPU and server CPU per cycle.
async fn measure<F, Fut>(
    what: &str,
    server: u32,
    mut cycle: F,
) -> Result<(), Box<dyn std::error::Error>>
where
    F: FnMut(u32) -> Fut,
    Fut: std::future::Future<Output = Result<(), Box<dyn std::error::Error>>>,
{
    let me = std::process::id();
    let (client_before, server_before) = (cpu_time(me), cpu_time(server));
    let started = Instant::now();
    for i in 0..CYCLES {
        cycle(i).await?;
    }
    let wall = started.elapsed() / CYCLES;
    let client = (cpu_time(me) - client_before) / CYCLES;
    let server_cpu = (cpu_time(server) - server_before) / CYCLES;
    let waiting = wall.saturating_sub(client + server_cpu);
    println!(
        "{what:<34} wall {:>6} us  client CPU {:>5} us  server CPU {:>5} us  rest (waiting) {:>6} us",
        wall.as_micros(),
        client.as_micros(),
        server_cpu.as_micros(),
        waiting.as_micros()
    );
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fsync = std::env::args().any(|a| a == "--fsync");
    let etcd = EtcdCluster::builder().fsync(fsync).start().await?;
    let etcd_pid = etcd.pid(0).ok_or("etcd has no pid")?;
    let locks = EtcdLocker::connect(etcd.config("cycle-cost")).await?;
    let options = LockOptions::new();
    locks.session(options.ttl()).await?;
    println!("{CYCLES} uncontended cycles each, one task, etcd fsync {fsync}");
    measure("etcd lock + release", etcd_pid, |_| {
        let locks = locks.clone();
        let options = options.clone();
        async move {
            let guard = locks.lock("cycle", &options).await?;
            let _released = guard.release().await?;
            Ok(())
        }
    })
    .await?;
    let mut client = locks.client().clone();
    let lease = client.lease_grant(60, None).await?.id();
    measure("etcd bare txn + delete", etcd_pid, |_| {
        let mut client = client.clone();
        async move { Ok(bare_etcd_cycle(&mut client, "cycle-cost-bare/k", lease).await?) }
    })
    .await?;

    let redis = RedisServer::start().await?;
    let redis_pid = redis.pid().ok_or("redis-server has no pid")?;
    let redis_locks = RedisLocker::connect(redis.config("cycle-cost")).await?;
    measure("redis lock + release", redis_pid, |_| {
        let locks = redis_locks.clone();
        let options = options.clone();
        async move {
            let guard = locks.lock("cycle", &options).await?;
            let _released = guard.release().await?;
            Ok(())
        }
    })
    .await?;
    let conn = redis_locks.connection();
    let bare = BareRedisCycle::new();
    measure("redis bare SET NX PX + CAD", redis_pid, |i| {
        let (mut conn, bare) = (conn.clone(), bare.clone());
        async move {
            bare.run(&mut conn, "cycle-cost-bare", &i.to_string())
                .await?;
            Ok(())
        }
    })
    .await?;
    Ok(())
}
