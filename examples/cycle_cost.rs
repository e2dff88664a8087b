//! Where the time of one uncontended lock + release goes, on a local single-node etcd and a
//! local redis-server that this example starts itself: wall time per cycle, the client
//! process's CPU time per cycle (this process: the library, tonic or redis-rs, tokio) and
//! the server's (read from `/proc/<pid>/stat`), and what is left, which is waiting: the
//! loopback round trips, and on etcd the Raft log's write (and its fsync with `--fsync`).
//! The same for the bare protocol (etcd: acquire transaction + delete; Redis: `SET NX PX`
//! + compare-and-delete), so that the library's own share stands out.
//!
//! `cargo run --release --example cycle_cost [-- --fsync]`

use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use fencelock::etcd::EtcdLocker;
use fencelock::redis::RedisLocker;
use fencelock::testkit::{EtcdCluster, RedisServer};
use fencelock::{LockBackend, LockGuard, LockOptions};

const CYCLES: u32 = 3000;

/// CPU time (user + system) of process `pid` so far.
fn cpu_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after ')'.
    // SAFETY: sysconf has no preconditions.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
    Duration::from_micros((ticks(11) + ticks(12)) * 1_000_000 / per_second.max(1))
}

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
    let (client_before, server_before) = (cpu_of(me), cpu_of(server));
    let started = Instant::now();
    for i in 0..CYCLES {
        cycle(i).await?;
    }
    let wall = started.elapsed() / CYCLES;
    let client = (cpu_of(me) - client_before) / CYCLES;
    let server_cpu = (cpu_of(server) - server_before) / CYCLES;
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
        async move {
            let key = "cycle-cost-bare/k";
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key,
                    "",
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            client.txn(txn).await?;
            client.delete(key, None).await?;
            Ok(())
        }
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
    let cad = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    );
    measure("redis bare SET NX PX + CAD", redis_pid, |i| {
        let mut conn = conn.clone();
        let cad = cad.clone();
        async move {
            let owner = i.to_string();
            let _: Option<String> = redis::cmd("SET")
                .arg("cycle-cost-bare")
                .arg(&owner)
                .arg("NX")
                .arg("PX")
                .arg(10_000)
                .query_async(&mut conn)
                .await?;
            let _: i64 = cad
                .key("cycle-cost-bare")
                .arg(&owner)
                .invoke_async(&mut conn)
                .await?;
            Ok(())
        }
    })
    .await?;
    Ok(())
}
