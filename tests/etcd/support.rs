//! Helpers shared by the etcd tests.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, WatchOptions, WatchStream};
use fencelock::etcd::EtcdLocker;
use fencelock::testkit::EtcdCluster;
use fencelock::{LockError, ReleaseOutcome};

/// A single-node etcd of this test's own.
pub async fn etcd() -> EtcdCluster {
    EtcdCluster::single().await.expect("start etcd")
}

/// A namespace no other test uses.
pub fn namespace(test: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("test-{test}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

pub async fn locker(cluster: &EtcdCluster, namespace: &str) -> EtcdLocker {
    EtcdLocker::connect(cluster.config(namespace))
        .await
        .expect("connect to etcd")
}

/// The keys under `prefix`, in create-revision order.
pub async fn keys(client: &mut Client, prefix: &str) -> Vec<String> {
    let options = GetOptions::new().with_prefix().with_sort(
        etcd_client::SortTarget::Create,
        etcd_client::SortOrder::Ascend,
    );
    client
        .get(prefix, Some(options))
        .await
        .expect("range read")
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

/// Fails the test if `future` takes longer than `limit`: a bound on a wait for an event,
/// never a way to let time pass.
pub async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {limit:?}"))
}

/// Watches every key under `prefix`, from now on.
pub struct PrefixWatch(WatchStream, VecDeque<(bool, String, i64)>);

impl PrefixWatch {
    pub async fn start(client: &mut Client, prefix: &str) -> Self {
        let stream = client
            .watch(prefix, Some(WatchOptions::new().with_prefix()))
            .await
            .expect("watch");
        let mut watch = Self(stream, VecDeque::new());
        // The first message confirms the watch exists; events after it are all seen.
        let created = watch
            .0
            .message()
            .await
            .expect("watch response")
            .expect("open");
        assert!(created.created());
        watch
    }

    /// The next event: (is a put, key).
    pub async fn next(&mut self) -> (bool, String) {
        let (put, key, _) = self.next_at().await;
        (put, key)
    }

    /// The next event: (is a put, key, the revision it happened at).
    async fn next_at(&mut self) -> (bool, String, i64) {
        loop {
            if let Some(event) = self.1.pop_front() {
                return event;
            }
            let response = self.0.message().await.expect("watch").expect("watch open");
            for event in response.events() {
                let kv = event.kv();
                let key = kv.map(|kv| String::from_utf8_lossy(kv.key()).into_owned());
                self.1.push_back((
                    event.event_type() == EventType::Put,
                    key.unwrap_or_default(),
                    kv.map_or(0, |kv| kv.mod_revision()),
                ));
            }
        }
    }

    /// Waits for the next put and returns its key.
    pub async fn next_put(&mut self) -> String {
        loop {
            if let (true, key) = self.next().await {
                return key;
            }
        }
    }

    /// Waits until every key of `keys` is deleted: the revision of each deletion, in the
    /// order of `keys` (one transaction deletes all of its keys at one revision).
    pub async fn deletions(&mut self, keys: &[String]) -> Vec<i64> {
        let mut revisions = vec![None; keys.len()];
        while revisions.iter().any(Option::is_none) {
            if let (false, deleted, revision) = self.next_at().await {
                if let Some(at) = keys.iter().position(|key| *key == deleted) {
                    revisions[at] = Some(revision);
                }
            }
        }
        revisions.into_iter().flatten().collect()
    }

    /// Waits until `key` is deleted.
    pub async fn deleted(&mut self, key: &str) {
        loop {
            if let (false, deleted) = self.next().await {
                if deleted == key {
                    return;
                }
            }
        }
    }
}

/// Asserts a release found the lock still ours and freed it.
pub fn released(outcome: Result<ReleaseOutcome, LockError>) {
    assert_eq!(outcome.expect("release"), ReleaseOutcome::Released);
}

/// The socket address of an `http://host:port` endpoint (for a fault proxy in front of it).
pub fn address(endpoint: &str) -> std::net::SocketAddr {
    endpoint
        .trim_start_matches("http://")
        .parse()
        .expect("endpoint address")
}

/// A locker that reaches etcd only through `proxy`, with the given request timeout.
pub async fn locker_through(
    proxy: &fencelock::testkit::FaultProxy,
    namespace: &str,
    request_timeout: Duration,
) -> EtcdLocker {
    let config = fencelock::etcd::EtcdConfig::new([proxy.http_url()])
        .with_namespace(namespace)
        .with_request_timeout(request_timeout);
    EtcdLocker::connect(config)
        .await
        .expect("connect through the proxy")
}

/// One etcd member reached by a client over two paths, each through its own fault proxy:
/// `a` (open) and `b` (refusing connections, so that the client's first connection is
/// through `a`). Requests kept on `a` and delivered after the client moved to `b` are the
/// late requests a slow member forwards to the leader after its client gave up.
pub struct TwoPaths {
    pub a: fencelock::testkit::FaultProxy,
    pub b: fencelock::testkit::FaultProxy,
}

impl TwoPaths {
    pub async fn start(cluster: &EtcdCluster) -> Self {
        let member = address(&cluster.endpoint(0));
        let a = fencelock::testkit::FaultProxy::start(member)
            .await
            .expect("proxy a");
        let b = fencelock::testkit::FaultProxy::start(member)
            .await
            .expect("proxy b");
        b.refuse();
        Self { a, b }
    }

    /// A locker whose endpoints are both paths (only `a` accepts for now).
    pub async fn locker(&self, namespace: &str, request_timeout: Duration) -> EtcdLocker {
        self.locker_with(namespace, request_timeout, true).await
    }

    /// [`locker`](Self::locker), with fencelock's own transport for the sessions'
    /// requests (`own`) or tonic's channel for everything.
    pub async fn locker_with(
        &self,
        namespace: &str,
        request_timeout: Duration,
        own: bool,
    ) -> EtcdLocker {
        let config = fencelock::etcd::EtcdConfig::new([self.a.http_url(), self.b.http_url()])
            .with_namespace(namespace)
            .with_request_timeout(request_timeout)
            .with_own_transport(own);
        EtcdLocker::connect(config)
            .await
            .expect("connect through path a")
    }

    /// The client's connection through `a` breaks (what `a` kept stays kept) and `b` opens.
    pub fn move_to_b(&self) {
        self.a.sever();
        self.b.heal();
    }

    /// The next request the client sends through `a` is kept there and the client's
    /// connection through `a` breaks at once (`b` stays as it is).
    pub fn hold_next_request_on_a(&self) {
        self.a.hold_one_request();
    }
}

/// Unary requests (of any service) the member has finished handling, by etcd's own gRPC
/// counter.
pub async fn unary_handled(cluster: &EtcdCluster) -> f64 {
    let metrics = cluster.metrics(0).await.expect("metrics");
    fencelock::testkit::metric_sum(
        &metrics,
        "grpc_server_handled_total",
        &["grpc_type=\"unary\""],
    )
}

/// Waits (10 s at most) until `read` gives `at_least`: for etcd's own counters and gauges,
/// whose changes no event announces.
pub async fn until_at_least<F, Fut>(what: &str, at_least: f64, read: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = f64>,
{
    within(Duration::from_secs(10), what, async {
        while read().await < at_least {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// etcd's watchers, on every client's streams (`etcd_debugging_mvcc_watcher_total`).
pub async fn watchers(cluster: &EtcdCluster) -> f64 {
    let metrics = cluster.metrics(0).await.expect("metrics");
    fencelock::testkit::metric_sum(&metrics, "etcd_debugging_mvcc_watcher_total", &[])
}

/// Requests of `method` (`"DeleteRange"`, `"Txn"`, ...) the member has finished handling.
pub async fn handled(cluster: &EtcdCluster, method: &str) -> f64 {
    let metrics = cluster.metrics(0).await.expect("metrics");
    let method = format!("grpc_method=\"{method}\"");
    fencelock::testkit::metric_sum(&metrics, "grpc_server_handled_total", &[&method])
}

/// Delivers the one request `proxy` kept ([`FaultProxy::hold_one_request`]) and waits
/// until the member has handled it (one more unary request than before): the late
/// request has been applied, or refused, when this returns.
pub async fn deliver_late(cluster: &EtcdCluster, proxy: &fencelock::testkit::FaultProxy) {
    let before = unary_handled(cluster).await;
    let delivered = proxy.held_requests() as f64;
    assert_eq!(delivered, 1.0, "one request kept to deliver");
    proxy.deliver_held();
    within(
        Duration::from_secs(10),
        "the late requests are handled",
        async {
            while unary_handled(cluster).await < before + delivered {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
}

/// Takes away the `locker` role's permission on `<namespace>/` (the one
/// [`with_locker_user`] granted).
pub async fn revoke_namespace(admin: &mut Client, namespace: &str) {
    admin
        .role_revoke_permission(
            "locker",
            format!("{namespace}/"),
            Some(etcd_client::RoleRevokePermissionOptions::new().with_prefix()),
        )
        .await
        .expect("revoke");
}

/// A locker that reaches etcd only through `proxy`, as `user` of [`with_locker_user`].
pub async fn locker_as_through(
    proxy: &fencelock::testkit::FaultProxy,
    namespace: &str,
    user: &str,
) -> EtcdLocker {
    EtcdLocker::connect(
        fencelock::etcd::EtcdConfig::new([proxy.http_url()])
            .with_namespace(namespace)
            .with_credentials(user, "pw"),
    )
    .await
    .expect("connect through the proxy")
}

/// Auth on: a root user, and `user` (password `pw`) whose role `locker` reads and writes
/// `<namespace>/`. Returns a client authenticated as root.
pub async fn with_locker_user(cluster: &EtcdCluster, namespace: &str, user: &str) -> Client {
    let mut admin = cluster.client().await.expect("client");
    admin.user_add("root", "rootpw", None).await.expect("root");
    admin
        .user_grant_role("root", "root")
        .await
        .expect("root role");
    admin.role_add("locker").await.expect("role");
    admin
        .role_grant_permission(
            "locker",
            etcd_client::Permission::read_write(format!("{namespace}/")).with_prefix(),
        )
        .await
        .expect("grant");
    admin.user_add(user, "pw", None).await.expect("user");
    admin
        .user_grant_role(user, "locker")
        .await
        .expect("user role");
    admin.auth_enable().await.expect("auth on");
    cluster
        .client_as("root", "rootpw")
        .await
        .expect("root client")
}

/// Deletes `guard`'s key as an operator would, then checks the guard finds out.
pub async fn delete_and_expect_loss(
    cluster: &fencelock::testkit::EtcdCluster,
    guard: &fencelock::etcd::EtcdGuard,
) {
    use fencelock::LockGuard;
    assert!(guard.is_held());
    let mut client = cluster.client().await.expect("client");
    client.delete(guard.key(), None).await.expect("delete");
    let reason = within(
        std::time::Duration::from_secs(5),
        "the guard learns its key is gone",
        guard.lost(),
    )
    .await;
    assert_eq!(reason, fencelock::LossReason::KeyDeleted);
    assert!(!guard.is_held());
    assert_eq!(guard.lease_remaining(), Some(std::time::Duration::ZERO));
}
