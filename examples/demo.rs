//! Starts a local single-node etcd, takes a lock three times and prints the fencing tokens.
//!
//! `cargo run --example demo` (needs the `etcd` binary: `apt-get install etcd-server`).

use fencelock::etcd::EtcdLocker;
use fencelock::testkit::EtcdCluster;
use fencelock::{LockBackend, LockGuard, LockOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let etcd = EtcdCluster::single().await?;
    println!("started etcd at {}", etcd.endpoint(0));
    let locks = EtcdLocker::connect(etcd.config("demo")).await?;
    let options = LockOptions::new();
    for round in 1..=3 {
        let guard = locks.lock("inventory:sku-1", &options).await?;
        println!(
            "round {round}: holding {:?} with fencing token {} (key {})",
            guard.name(),
            guard.token(),
            guard.key()
        );
        let outcome = guard.release().await?;
        println!("round {round}: released: {outcome:?}");
    }
    locks.close().await?;
    println!("each holder's token is larger than the last: storage can refuse stale holders");
    Ok(())
}
