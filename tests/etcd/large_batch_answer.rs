//! A batch's answer carries every member's read of its queue: many members on long
//! queues (here, one key of 150 kB ahead on each of 64 locks) make it larger than gRPC's
//! default 4 MiB answer limit. The batch is applied whatever the client can decode, so
//! an answer it refuses to read fails every member and retires the session although
//! nothing went wrong; the client must read such answers (and a member whose queue is
//! busy must simply be told so).

use std::time::Duration;

use fencelock::etcd::EtcdLocker;
use fencelock::{LockBackend, LockError, LockOptions};

use crate::support::{PrefixWatch, address, etcd, namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_reads_exceed_four_mib_answers_every_member() {
    let cluster = etcd().await;
    let ns = namespace("large-batch-answer");
    let proxy = fencelock::testkit::FaultProxy::start(address(&cluster.endpoint(0)))
        .await
        .expect("proxy");
    let client = EtcdLocker::connect(
        fencelock::etcd::EtcdConfig::new([proxy.http_url()])
            .with_namespace(&ns)
            .with_request_timeout(Duration::from_secs(10))
            .with_max_in_flight(1),
    )
    .await
    .expect("connect");
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    let before = client.session(options.ttl()).await.expect("session");

    // A key nobody here recognises (exclusive) ahead on every lock, with a long name:
    // every member's read returns it.
    let mut admin = cluster.client().await.expect("admin");
    let names: Vec<String> = (0..64).map(|i| format!("big{i}")).collect();
    let long = "k".repeat(150_000);
    for name in &names {
        admin
            .put(format!("{ns}/{name}/{long}"), "", None)
            .await
            .expect("put a foreign key");
    }

    let mut watch = PrefixWatch::start(&mut admin, &format!("{ns}/big")).await;

    // A lone request in flight on a slow path: the 64 tries queue behind it and go out
    // together.
    proxy.delay(Duration::from_millis(100));
    let lead = {
        let (client, options) = (client.clone(), options.clone());
        tokio::spawn(async move { client.lock("lead", &options).await })
    };
    let tries: Vec<_> = names
        .iter()
        .map(|name| {
            let (client, name, options) = (client.clone(), name.clone(), options.clone());
            tokio::spawn(async move { client.try_lock(&name, &options).await.map(|g| g.is_some()) })
        })
        .collect();
    let mut failed: Vec<(String, LockError)> = Vec::new();
    for (name, tried) in names.iter().zip(tries) {
        match within(Duration::from_secs(30), "a try's answer", tried)
            .await
            .expect("task")
        {
            Ok(false) => {}
            Ok(true) => panic!("{name} granted beside the key ahead of it"),
            Err(err) => failed.push((name.clone(), err)),
        }
    }
    assert!(
        failed.is_empty(),
        "{} of 64 failed, first: {:?}",
        failed.len(),
        failed.first().map(|(name, err)| format!("{name}: {err}"))
    );
    let lead = lead.await.expect("task").expect("lead granted");
    let after = client.session(options.ttl()).await.expect("session");
    assert_eq!(
        before.lease_id(),
        after.lease_id(),
        "the session is not retired"
    );

    // No try left its key: each removed it (a removal may finish after its answer), and
    // each queue holds the foreign key alone.
    let mut removed = 0;
    while removed < names.len() {
        let (put, _) = within(Duration::from_secs(10), "the tries' removals", watch.next()).await;
        if !put {
            removed += 1;
        }
    }
    for name in &names {
        let left = admin
            .get(
                format!("{ns}/{name}/"),
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_count_only(),
                ),
            )
            .await
            .expect("count");
        assert_eq!(left.count(), 1, "{name}");
    }
    crate::support::released(fencelock::LockGuard::release(lead).await);
}
