//! `fencelock run --backend redis|redlock` rides out a short blip: the link to Redis fails
//! right after a renewal went out (its answer is lost), and heals half a second later.
//! Before issue 21 the renewer waited for the lost answer, then a whole tick, before it
//! tried again, by when `run` had SIGTERMed the healthy command. A cut longer than the
//! lease still kills the command before anyone else can be granted the lock.

use std::process::Stdio;
use std::time::Duration;

use fencelock::redis::{RedisConfig, RedisLocker, RedlockLocker};
use fencelock::testkit::{FaultProxy, RedisServer};
use fencelock::{LockBackend, LockOptions};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::support::{last_sign_of_life, life_script, next_line, now_ns};

/// `count` Redis servers, each behind a fault proxy.
async fn servers(count: usize) -> (Vec<RedisServer>, Vec<FaultProxy>) {
    let mut servers = Vec::new();
    let mut proxies = Vec::new();
    for _ in 0..count {
        let server = RedisServer::start().await.expect("redis");
        let address = format!("127.0.0.1:{}", server.port())
            .parse()
            .expect("address");
        proxies.push(FaultProxy::start(address).await.expect("proxy"));
        servers.push(server);
    }
    (servers, proxies)
}

/// `fencelock run` on the servers behind `proxies`: Redis for one, Redlock for several.
fn fencelock_through(proxies: &[FaultProxy], ns: &str) -> Command {
    let urls: Vec<String> = proxies
        .iter()
        .map(|proxy| format!("redis://{}/", proxy.address()))
        .collect();
    let mut command = Command::new(env!("CARGO_BIN_EXE_fencelock"));
    command.args(["run", "--namespace", ns]);
    if let [url] = urls.as_slice() {
        command.args(["--backend", "redis", "--redis", url]);
    } else {
        command.args(["--backend", "redlock", "--redlock", &urls.join(",")]);
    }
    command.kill_on_drop(true);
    command
}

/// Cuts every proxy right after the next request it forwards (a renewal: nothing else
/// goes out while the lock is held) and waits until every cut has begun.
async fn cut_after_the_next_renewal(proxies: &[FaultProxy]) {
    for proxy in proxies {
        proxy.cut_after_next_request();
    }
    for proxy in proxies {
        tokio::time::timeout(Duration::from_secs(10), proxy.cut_started())
            .await
            .expect("a renewal goes out");
    }
}

/// Waits until `server` has run `count` more renewal scripts than `before`.
async fn renewals_after(server: &RedisServer, before: u64, count: u64) {
    tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            let calls = server.command_calls("evalsha").await.expect("commandstats");
            if calls >= before + count {
                return;
            }
            // INFO is the only way to see the server's count: look every 20 ms.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("renewals resume after the link heals");
}

async fn a_short_cut_does_not_interrupt_the_command(count: usize, ns: &str) {
    let (servers, proxies) = servers(count).await;
    let mut fencelock = fencelock_through(&proxies, ns)
        .args(["--lock", "job", "--ttl", "3s", "--"])
        .args([
            "sh",
            "-c",
            "trap 'echo terminated' TERM; echo running; read line; echo finished",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
    assert_eq!(next_line(&mut lines).await, "running");
    cut_after_the_next_renewal(&proxies).await;
    // The blip's length, not a wait for an event.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = servers[0].command_calls("evalsha").await.expect("stats");
    for proxy in &proxies {
        proxy.heal();
    }
    // Two renewals after the heal: past the moment (0.7 s after it, with TTL 3 s and the
    // default grace) when the old renewer, still a tick away from its next try, SIGTERMed.
    // The command prints nothing meanwhile unless it is signalled (or killed).
    tokio::select! {
        () = renewals_after(&servers[0], before, 2) => {}
        line = lines.next_line() => panic!(
            "the command was signalled after a 0.5 s blip: {:?}",
            line.ok().flatten()
        ),
    }
    crate::support::finishes_unsignalled(fencelock, &mut lines, "after a 0.5 s blip").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_half_second_cut_after_a_renewal_does_not_interrupt_the_command() {
    a_short_cut_does_not_interrupt_the_command(1, "cli-blip-redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redlock_a_half_second_cut_after_a_renewal_does_not_interrupt_the_command() {
    a_short_cut_does_not_interrupt_the_command(3, "cli-blip-redlock").await;
}

/// Cut off for good right after a renewal: the retries change nothing about the
/// guarantee, the command (which ignores SIGTERM) is dead before the next grant.
async fn a_long_cut_kills_the_command_before_the_next_grant(count: usize, ns: &str) {
    let (servers, proxies) = servers(count).await;
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let life = dir.path().join("life");
    let mut fencelock = fencelock_through(&proxies, ns)
        .args(["--lock", "job", "--ttl", "1s", "--"])
        .args(["sh", "-c", &life_script(&life)])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
    assert_eq!(next_line(&mut lines).await, "running");
    cut_after_the_next_renewal(&proxies).await;
    let options = LockOptions::new().with_wait_timeout(Duration::from_secs(10));
    let granted: Box<dyn std::any::Any> = if count == 1 {
        let next = RedisLocker::connect(RedisConfig::new(urls[0].clone()).with_prefix(ns))
            .await
            .expect("connect");
        let guard = next
            .lock("job", &options)
            .await
            .expect("the lock passes on");
        Box::new((next, guard))
    } else {
        let next = RedlockLocker::connect(RedisConfig::masters(urls).with_prefix(ns))
            .await
            .expect("connect");
        let guard = next
            .lock("job", &options)
            .await
            .expect("the lock passes on");
        Box::new((next, guard))
    };
    let grant = now_ns();
    let status = tokio::time::timeout(Duration::from_secs(20), fencelock.wait())
        .await
        .expect("fencelock exits")
        .expect("status");
    let last = last_sign_of_life(&life);
    assert!(
        last < grant,
        "the command wrote {} ms after the next grant",
        (last - grant) / 1_000_000
    );
    assert_eq!(status.code(), Some(76), "the lock was lost");
    drop(granted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_cut_longer_than_the_lease_kills_the_command_before_the_next_grant() {
    a_long_cut_kills_the_command_before_the_next_grant(1, "cli-long-cut-redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redlock_a_cut_longer_than_the_lease_kills_the_command_before_the_next_grant() {
    a_long_cut_kills_the_command_before_the_next_grant(3, "cli-long-cut-redlock").await;
}
