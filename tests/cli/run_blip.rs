//! `fencelock run` rides out a renewal that gets no answer: a member that stops answering
//! keep-alives on a connection that stays open (paused, overloaded, cut off from its
//! leader without knowing it yet) must not cost a healthy command its lock while another
//! member answers. Before issue 21 the unanswered keep-alive was replaced only at the
//! next tick, a whole renewal interval later, by when `run` had SIGTERMed the command.
//!
//! A link cut that heals is not the test here: the proxy closes the connections that saw
//! the cut when it heals (as TCP and gRPC keep-alives do after a partition), the broken
//! stream is reopened at once, and the old code rode that out as well. The deadline side
//! (a cut longer than the lease: the command is dead before the next grant) is
//! `run_cut_off.rs`.

use std::process::Stdio;
use std::time::Duration;

use fencelock::testkit::{EtcdCluster, FaultProxy, fetch_metrics, metric_sum};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{address, fencelock_run, next_line};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_stops_answering_keep_alives_does_not_interrupt_the_command() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    // Two routes to the one member: `stalled` carries the session's keep-alive stream,
    // `other` stays healthy.
    let stalled = FaultProxy::start(address(&etcd.endpoint(0)))
        .await
        .expect("proxy");
    let other = FaultProxy::start(address(&etcd.endpoint(0)))
        .await
        .expect("proxy");
    // Until the command runs only `stalled` is up, so the keep-alive stream is there.
    other.refuse();
    let mut fencelock = fencelock_run(&[stalled.http_url(), other.http_url()], "cli-blip")
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
    // The session opens its keep-alive stream at its first renewal: wait until etcd has
    // seen it (through `stalled`, the only route up), or it could open on `other` once
    // that is up, and nothing would stall.
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let metrics = fetch_metrics(&etcd.endpoint(0)).await.expect("metrics");
            let streams = metric_sum(
                &metrics,
                "grpc_server_started_total",
                &["grpc_method=\"LeaseKeepAlive\""],
            );
            if streams >= 1.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the keep-alive stream opens");
    other.heal();
    // The member behind `stalled` answers nothing for a whole TTL: the keep-alives sent
    // meanwhile get no answer, and the connection stays open. (The time is the fault's
    // length, not a wait for an event.)
    stalled.pause();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stalled.resume();
    crate::support::finishes_unsignalled(
        fencelock,
        &mut lines,
        "a member answered keep-alives all along",
    )
    .await;
}
