//! The workloads, each run through the same lock trait for every backend, and the raw
//! ceilings measured beside them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use fencelock::postgres::Fence;
use fencelock::testkit::{acquire_shaped, fetch_metrics, metric_sum};
use fencelock::{LockBackend, LockGuard, LockOptions};
use indicatif::ProgressBar;

use super::driver::drive;
use super::stats::{self, Cell, Renewal};
use super::{BenchArgs, BoxResult};

/// Collects the cells of one run.
pub struct Runner<'a> {
    pub args: &'a BenchArgs,
    /// The cells chosen (quick or full), with the renewal workload's size.
    pub plan: &'a super::plan::Plan,
    pub progress: ProgressBar,
    pub cells: Vec<Cell>,
    pub renewals: Vec<Renewal>,
    pub run: String,
    /// Clients of the etcd clusters under test, compacted before every etcd cell.
    pub etcd_clusters: Vec<etcd_client::Client>,
}

impl Runner<'_> {
    /// Compacts every etcd under test, so that each etcd cell starts from the same server
    /// state, as a cluster with auto-compaction is: without it, every cycle's revisions
    /// pile up and each cell runs against a bigger store than the one before it, which
    /// would favour whatever runs first.
    pub(super) async fn settle(&self) -> BoxResult<()> {
        for client in &self.etcd_clusters {
            match fencelock::testkit::compact_now(&mut client.clone()).await {
                // Nothing written since the last compaction: nothing to do.
                Err(err) if err.to_string().contains("has been compacted") => {}
                outcome => drop(outcome?),
            }
        }
        Ok(())
    }

    pub(super) fn step(&self, what: &str) {
        self.progress.set_message(what.to_owned());
        // Without a terminal the bar is hidden: say what runs, a line per step, so that a
        // log shows progress instead of minutes of silence.
        if self.progress.is_hidden() {
            let total = self.progress.length().unwrap_or(0);
            eprintln!(
                "[{}/{total} {:.0}s] {what}",
                self.progress.position(),
                self.progress.elapsed().as_secs_f64()
            );
        }
    }

    pub(super) fn done(&mut self, cell: Cell) {
        self.progress.inc(1);
        self.cells.push(cell);
    }

    /// A plain put (no lease, no transaction) on distinct keys from `c` tasks: the raw
    /// write rate of the server, the ceiling of a lock cycle's two writes.
    pub async fn etcd_put(&mut self, client: etcd_client::Client, c: usize) -> BoxResult<()> {
        let run = self.run.clone();
        self.step(&format!("etcd put, concurrency {c}"));
        self.settle().await?;
        let cell = drive("ceiling", "etcd put", c, self.args.duration, move |w, i| {
            let (mut cl, key) = (client.clone(), format!("bench/{run}/put/{w}"));
            async move {
                cl.put(key, i.to_string(), None).await?;
                Ok(())
            }
        })
        .await?;
        self.done(cell);
        Ok(())
    }

    /// Plain put, the bare acquire-shaped transaction + delete cycle, and etcd's own Lock
    /// RPC, on distinct keys at every concurrency.
    pub async fn etcd_ceilings(
        &mut self,
        client: etcd_client::Client,
        concurrencies: &[usize],
    ) -> BoxResult<()> {
        let lease = client.clone().lease_grant(60, None).await?.id();
        let keep = client.clone();
        // Keep the lease of the Lock RPC alive for the whole run.
        let (mut keeper, _stream) = keep.clone().lease_keep_alive(lease).await?;
        let keeping = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                if keeper.keep_alive().await.is_err() {
                    return;
                }
            }
        });
        for &c in concurrencies {
            self.etcd_put(client.clone(), c).await?;

            // The cheapest correct cycle: one key name per worker, reused every cycle (as
            // Go's mutex reuses one per session), so that etcd's index of dead keys does
            // not grow under the prefix the transaction reads. Then the same with a new key
            // name every cycle: what a name per acquisition costs once dead keys pile up in
            // the index (until etcd compacts).
            for (subject, segment, step, key_per_cycle) in [
                ("etcd txn+delete", "txn", "", false),
                ("etcd txn+del, new key", "ntxn", ", a key per cycle", true),
            ] {
                let run = self.run.clone();
                self.step(&format!("etcd acquire txn + delete{step}, concurrency {c}"));
                let cl = client.clone();
                self.settle().await?;
                let cell = drive("ceiling", subject, c, self.args.duration, move |w, i| {
                    let mut cl = cl.clone();
                    let prefix = format!("bench/{run}/{segment}/{w}/");
                    let key = format!("{prefix}{}", if key_per_cycle { i } else { 0 });
                    async move {
                        let txn = acquire_shaped(&prefix, &key, lease);
                        cl.txn(txn).await?;
                        cl.delete(key, None).await?;
                        Ok(())
                    }
                })
                .await?;
                self.done(cell);
            }

            // The same cycle with the release guarded by the create revision, as a correct
            // lock must: what the guard costs the server, apart from everything else.
            let run = self.run.clone();
            self.step(&format!(
                "etcd acquire txn + guarded delete, concurrency {c}"
            ));
            let cl = client.clone();
            self.settle().await?;
            let cell = drive(
                "ceiling",
                "etcd txn+guarded del",
                c,
                self.args.duration,
                move |w, _| {
                    let mut cl = cl.clone();
                    let prefix = format!("bench/{run}/gtxn/{w}/");
                    let key = format!("{prefix}0");
                    async move {
                        let txn = acquire_shaped(&prefix, &key, lease);
                        let revision = cl.txn(txn).await?.header().map_or(0, |h| h.revision());
                        let release = Txn::new()
                            .when([Compare::create_revision(
                                key.as_str(),
                                CompareOp::Equal,
                                revision,
                            )])
                            .and_then([TxnOp::delete(key.as_str(), None)]);
                        cl.txn(release).await?;
                        Ok(())
                    }
                },
            )
            .await?;
            self.done(cell);

            self.lock_rpc("etcd Lock RPC", &client, lease, c).await?;
        }
        keeping.abort();
        let _ = client.clone().lease_revoke(lease).await;
        Ok(())
    }

    /// etcd's server-side Lock RPC (lock + unlock) on distinct names at concurrency `c`,
    /// under `lease`, as cell `subject` of the ceilings: the 3-member row runs it on the
    /// cluster so that the lock's ratio there compares like with like.
    pub async fn lock_rpc(
        &mut self,
        subject: &'static str,
        client: &etcd_client::Client,
        lease: i64,
        c: usize,
    ) -> BoxResult<()> {
        let run = self.run.clone();
        self.step(&format!("{subject}, concurrency {c}"));
        let cl = client.clone();
        self.settle().await?;
        let cell = drive("ceiling", subject, c, self.args.duration, move |w, _| {
            let mut cl = cl.clone();
            let name = format!("bench/{run}/rpc/{w}");
            async move {
                let options = etcd_client::LockOptions::new().with_lease(lease);
                let locked = cl.lock(name, Some(options)).await?;
                cl.unlock(locked.key().to_vec()).await?;
                Ok(())
            }
        })
        .await?;
        self.done(cell);
        Ok(())
    }

    /// etcd's Lock RPC on a second cluster (the 3-member one) at concurrency `c`, with a
    /// lease of its own for the cell, outliving it.
    pub async fn lock_rpc_on(
        &mut self,
        subject: &'static str,
        client: etcd_client::Client,
        c: usize,
    ) -> BoxResult<()> {
        // Long enough for the cell, which renews nothing: the cell and a minute.
        let ttl = i64::try_from(self.args.duration.as_secs()).unwrap_or(i64::MAX / 2) + 60;
        let lease = client.clone().lease_grant(ttl, None).await?.id();
        let result = self.lock_rpc(subject, &client, lease, c).await;
        let _ = client.clone().lease_revoke(lease).await;
        result
    }

    /// A bare `SET NX PX` + compare-and-delete cycle on distinct keys, over `conn` (the
    /// lock client's own connection: same server, same TLS).
    pub async fn redis_ceiling(
        &mut self,
        conn: redis::aio::ConnectionManager,
        concurrencies: &[usize],
    ) -> BoxResult<()> {
        let bare = fencelock::testkit::BareRedisCycle::new();
        for &c in concurrencies {
            let run = self.run.clone();
            self.step(&format!("redis SET NX PX + CAD, concurrency {c}"));
            let (conn, bare) = (conn.clone(), bare.clone());
            let cell = drive(
                "ceiling",
                "redis SET NX PX+CAD",
                c,
                self.args.duration,
                move |w, i| {
                    let (mut conn, bare) = (conn.clone(), bare.clone());
                    let key = format!("bench:{run}:bare:{w}");
                    async move {
                        bare.run(&mut conn, &key, &i.to_string()).await?;
                        Ok(())
                    }
                },
            )
            .await?;
            self.done(cell);
        }
        Ok(())
    }

    /// Connecting a new client (TCP, the TLS handshake if any, the first read), one at a
    /// time: what TLS adds to a connect.
    pub async fn connects(
        &mut self,
        subject: &str,
        config: fencelock::etcd::EtcdConfig,
    ) -> BoxResult<()> {
        self.step(&format!("{subject} connect"));
        self.settle().await?;
        let cell = drive("connect", subject, 1, self.args.duration, move |_, _| {
            let config = config.clone();
            async move {
                let locks = fencelock::etcd::EtcdLocker::connect(config).await?;
                drop(locks);
                Ok(())
            }
        })
        .await?;
        self.done(cell);
        Ok(())
    }

    /// Lock + release cycles on distinct keys (one per worker) at every concurrency.
    pub async fn distinct<B>(
        &mut self,
        subject: &str,
        locks: B,
        concurrencies: &[usize],
    ) -> BoxResult<()>
    where
        B: LockBackend + Clone + 'static,
    {
        for &c in concurrencies {
            self.step(&format!("{subject} lock+release, concurrency {c}"));
            if subject.starts_with("etcd") {
                self.settle().await?;
            }
            let (locks, run) = (locks.clone(), self.run.clone());
            let cell = drive(
                "distinct keys",
                subject,
                c,
                self.args.duration,
                move |w, _| {
                    let locks = locks.clone();
                    let name = format!("bench-{run}-distinct-{w}");
                    async move {
                        let guard = locks.lock(&name, &LockOptions::new()).await?;
                        release(guard).await?;
                        Ok(())
                    }
                },
            )
            .await?;
            self.done(cell);
        }
        Ok(())
    }

    /// One key, `w` waiters for every `w` of `waiters`: cycles per second and the handoff
    /// latency (release by one holder to the next holder running).
    pub async fn contended<B>(
        &mut self,
        subject: &str,
        locks: B,
        waiters: &[usize],
    ) -> BoxResult<()>
    where
        B: LockBackend + Clone + 'static,
    {
        for &w in waiters {
            self.step(&format!("{subject} contended, {w} waiters"));
            if subject.starts_with("etcd") {
                self.settle().await?;
            }
            let grants: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
            let name = format!("bench-{}-contended-{w}", self.run);
            let (l, g) = (locks.clone(), grants.clone());
            let cell = drive("contended", subject, w, self.args.duration, move |_, _| {
                let (locks, grants, name) = (l.clone(), g.clone(), name.clone());
                async move {
                    let guard = locks.lock(&name, &LockOptions::new()).await?;
                    let acquired = Instant::now();
                    let releasing = Instant::now();
                    if let Ok(mut grants) = grants.lock() {
                        grants.push((acquired, releasing));
                    }
                    release(guard).await?;
                    Ok(())
                }
            })
            .await?;
            let mut grants = grants.lock().map_err(|_| "poisoned")?.clone();
            grants.sort_by_key(|(acquired, _)| *acquired);
            let mut handoffs = stats::histogram()?;
            for pair in grants.windows(2) {
                stats::record(
                    &mut handoffs,
                    pair[1].0.saturating_duration_since(pair[0].1),
                );
            }
            let seconds = Duration::from_secs_f64(cell.seconds);
            let mut handoff = Cell::new("handoff", subject, w, &handoffs, 0, seconds);
            handoff.per_second = cell.per_second;
            self.cells.push(cell);
            if !handoffs.is_empty() {
                self.cells.push(handoff);
            }
            self.progress.inc(1);
        }
        Ok(())
    }

    /// `n` locks taken together and released, for every `n` of `sizes`, one worker on
    /// names of its own: etcd's `lock_all` (one transaction for every key, one token)
    /// against the same names taken one by one in name order (a join each, in turn).
    /// Workload `lock_all xN`; subjects `<subject> lock_all` and
    /// `<subject> one by one`.
    pub async fn lock_all(
        &mut self,
        subject: &str,
        locks: fencelock::etcd::EtcdLocker,
        sizes: &[usize],
    ) -> BoxResult<()> {
        for &n in sizes {
            let workload = format!("lock_all x{n}");
            let names: Arc<Vec<String>> = Arc::new(
                (0..n)
                    .map(|i| format!("bench-{}-all-{n}-{i:02}", self.run))
                    .collect(),
            );
            for together in [true, false] {
                let row = if together {
                    format!("{subject} lock_all")
                } else {
                    format!("{subject} one by one")
                };
                self.step(&format!("{row}, {n} names"));
                self.settle().await?;
                let (locks, names) = (locks.clone(), names.clone());
                let cell = drive(&workload, &row, 1, self.args.duration, move |_, _| {
                    let (locks, names) = (locks.clone(), names.clone());
                    async move {
                        let names: Vec<&str> = names.iter().map(String::as_str).collect();
                        if together {
                            let all = locks.lock_all(&names, &LockOptions::new()).await?;
                            release(all).await?;
                        } else {
                            let mut held = Vec::with_capacity(names.len());
                            for name in &names {
                                held.push(locks.lock(name, &LockOptions::new()).await?);
                            }
                            // Released at once, as lock_all's are.
                            let mut releases = tokio::task::JoinSet::new();
                            for guard in held {
                                releases.spawn(release(guard));
                            }
                            while let Some(released) = releases.join_next().await {
                                released.map_err(|err| err.to_string())??;
                            }
                        }
                        Ok(())
                    }
                })
                .await?;
                self.done(cell);
            }
        }
        Ok(())
    }

    /// lock + fenced PostgreSQL write + release, against lock + plain write + release.
    pub async fn fenced_write<B>(
        &mut self,
        subject: &str,
        locks: B,
        postgres: &str,
        tls: Option<&fencelock::TlsConfig>,
    ) -> BoxResult<()>
    where
        B: LockBackend + Clone + 'static,
    {
        let client = fencelock::postgres::connect(postgres, tls).await?;
        let resource = format!("bench-{}-{subject}", self.run);
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS bench_inventory (sku text PRIMARY KEY, available bigint); \
                 INSERT INTO bench_inventory VALUES ('{resource}', 1000000000) ON CONFLICT DO NOTHING;"
            ))
            .await?;
        Fence::new().ensure_schema(&client).await?;
        let client = Arc::new(tokio::sync::Mutex::new(client));
        for fenced in [false, true] {
            let workload = if fenced {
                "fenced write"
            } else {
                "plain write"
            };
            self.step(&format!("{subject} lock + {workload} + release"));
            let (l, c, r) = (locks.clone(), client.clone(), resource.clone());
            let cell = drive(workload, subject, 1, self.args.duration, move |_, _| {
                let (locks, client, resource) = (l.clone(), c.clone(), r.clone());
                async move {
                    let guard = locks.lock(&resource, &LockOptions::new()).await?;
                    let mut client = client.lock().await;
                    let update =
                        "UPDATE bench_inventory SET available = available - 1 WHERE sku = $1";
                    if fenced {
                        let tx = Fence::new()
                            .begin(&mut client, &resource, guard.token())
                            .await?;
                        tx.execute(update, &[&resource]).await?;
                        tx.commit().await?;
                    } else {
                        let tx = client.transaction().await?;
                        tx.execute(update, &[&resource]).await?;
                        tx.commit().await?;
                    }
                    drop(client);
                    release(guard).await?;
                    Ok(())
                }
            })
            .await?;
            self.done(cell);
        }
        Ok(())
    }

    /// One process takes `n` different locks at once, then releases them all, in waves
    /// (a worker taking a lock per item of a batch of work): lock cycles per second, each
    /// cycle timed from its wave's start to its release, and the write requests the
    /// server handled per cycle (`count_writes`), which group commit brings below the two
    /// of a lock taken alone.
    pub async fn waves<B, C, CF>(
        &mut self,
        subject: &str,
        locks: B,
        n: usize,
        count_writes: C,
    ) -> BoxResult<()>
    where
        B: LockBackend + Clone + 'static,
        C: Fn() -> CF,
        CF: std::future::Future<Output = BoxResult<f64>>,
    {
        self.step(&format!("{subject}: waves of {n} locks"));
        self.settle().await?;
        let before = count_writes().await?;
        let started = Instant::now();
        let mut histogram = super::stats::histogram()?;
        let mut cycles = 0u64;
        while cycles == 0 || started.elapsed() < self.args.duration {
            let began = Instant::now();
            let mut taking = tokio::task::JoinSet::new();
            for i in 0..n {
                let (locks, name) = (locks.clone(), format!("bench-{}-wave-{i}", self.run));
                taking.spawn(async move { locks.lock(&name, &LockOptions::new()).await });
            }
            let mut guards = Vec::with_capacity(n);
            while let Some(taken) = taking.join_next().await {
                guards.push(taken??);
            }
            let mut releasing = tokio::task::JoinSet::new();
            for guard in guards {
                releasing.spawn(async move {
                    release(guard).await?;
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(began.elapsed())
                });
            }
            while let Some(released) = releasing.join_next().await {
                super::stats::record(&mut histogram, released??);
                cycles += 1;
            }
        }
        let writes = count_writes().await? - before;
        let mut cell = Cell::new("waves", subject, n, &histogram, 0, started.elapsed());
        #[allow(clippy::cast_precision_loss)]
        let per_cycle = writes / cycles as f64;
        cell.writes_per_operation = Some(per_cycle);
        self.done(cell);
        Ok(())
    }

    /// Holds many locks on one client and counts what the servers receive to keep them.
    pub async fn renewal<B, C, CF>(
        &mut self,
        subject: &str,
        locks: B,
        count_requests: C,
        note: &str,
    ) -> BoxResult<()>
    where
        B: LockBackend + Clone + 'static,
        C: Fn() -> CF,
        CF: std::future::Future<Output = BoxResult<f64>>,
    {
        let n = self.plan.renewal_locks;
        self.step(&format!("{subject}: taking {n} locks"));
        let resident_before = resident_bytes();
        let options = LockOptions::new().with_ttl(Duration::from_secs(10));
        let mut guards = Vec::with_capacity(n);
        let mut pending = Vec::new();
        for i in 0..n {
            let (locks, options, name) = (
                locks.clone(),
                options.clone(),
                format!("bench-{}-held-{i}", self.run),
            );
            pending.push(tokio::spawn(
                async move { locks.lock(&name, &options).await },
            ));
            if pending.len() == 64 || i + 1 == n {
                for task in pending.drain(..) {
                    guards.push(task.await??);
                }
            }
        }
        let resident_held = resident_bytes();
        self.step(&format!(
            "{subject}: holding {n} locks for {:?}",
            self.plan.renewal_duration
        ));
        let before = count_requests().await?;
        let started = Instant::now();
        tokio::time::sleep(self.plan.renewal_duration).await;
        let requests = count_requests().await? - before;
        let seconds = started.elapsed().as_secs_f64();
        let held = guards.iter().filter(|g| g.is_held()).count();
        if held != n {
            // Why the first one went (told at once for a lock already lost).
            let why = match guards.iter().find(|g| !g.is_held()) {
                Some(lost) => tokio::time::timeout(Duration::from_secs(1), lost.lost())
                    .await
                    .map_or_else(|_| "not told".to_owned(), |reason| format!("{reason:?}")),
                None => String::new(),
            };
            return Err(format!(
                "{subject}: only {held} of {n} locks still held after the window (the first \
                 lost: {why})"
            )
            .into());
        }
        #[allow(clippy::cast_precision_loss)]
        let resident_bytes_per_lock = match (resident_before, resident_held) {
            (Some(before), Some(held)) if n > 0 => {
                Some(held.saturating_sub(before) as f64 / n as f64)
            }
            _ => None,
        };
        self.renewals.push(Renewal {
            subject: subject.to_owned(),
            locks: n,
            seconds,
            requests,
            requests_per_second: requests / seconds,
            resident_bytes_per_lock,
            note: note.to_owned(),
        });
        self.progress.inc(1);
        self.step(&format!("{subject}: releasing {n} locks"));
        for guard in guards {
            let _ = guard.release().await;
        }
        Ok(())
    }
}

/// Write requests (transactions, deletes, puts) etcd members handled, summed over the
/// endpoints' plaintext metrics URLs.
pub async fn etcd_writes(endpoints: Vec<String>) -> BoxResult<f64> {
    let mut total = 0.0;
    for endpoint in &endpoints {
        if endpoint.starts_with("https://") {
            return Err(format!("cannot read metrics over TLS from {endpoint}").into());
        }
        let metrics = fetch_metrics(endpoint).await?;
        for method in ["Txn", "DeleteRange", "Put"] {
            let method = format!("grpc_method=\"{method}\"");
            total += metric_sum(&metrics, "grpc_server_handled_total", &[&method]);
        }
    }
    Ok(total)
}

/// This process's resident memory (`VmRSS`), in bytes; `None` where `/proc` has no answer.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Releases, counting a lock found lost as a failed cycle.
pub(super) async fn release<G: LockGuard>(guard: G) -> BoxResult<()> {
    match guard.release().await? {
        fencelock::ReleaseOutcome::Released | fencelock::ReleaseOutcome::Unconfirmed => Ok(()),
        _ => Err("the lock was lost before its release".into()),
    }
}

/// Keep-alive messages etcd members received (summed over the endpoints' plaintext
/// metrics URLs); `None` where metrics cannot be read (TLS endpoints).
pub async fn etcd_keepalives(endpoints: Vec<String>) -> BoxResult<f64> {
    let mut total = 0.0;
    for endpoint in &endpoints {
        if endpoint.starts_with("https://") {
            return Err(format!("cannot read metrics over TLS from {endpoint}").into());
        }
        let metrics = fetch_metrics(endpoint).await?;
        total += metric_sum(
            &metrics,
            "grpc_server_msg_received_total",
            &["grpc_method=\"LeaseKeepAlive\""],
        );
    }
    Ok(total)
}

/// `EVALSHA` calls the Redis servers ran (summed over the lock client's connections).
pub async fn redis_evalsha(connections: Vec<redis::aio::ConnectionManager>) -> BoxResult<f64> {
    let mut total = 0.0;
    for mut conn in connections {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await?;
        let calls = info
            .lines()
            .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0);
        total += calls;
    }
    Ok(total)
}

/// A four-letter command's answer from the first server of a ZooKeeper connect string.
async fn zookeeper_four_letter(hosts: &str, command: &str) -> BoxResult<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = hosts.split(',').next().unwrap_or_default().trim();
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream.write_all(command.as_bytes()).await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    Ok(tokio::time::timeout(Duration::from_secs(5), exchange).await??)
}

/// `zookeeper 3.8.0`, from the server's `srvr` answer (the command must be whitelisted,
/// as on the local servers).
pub async fn zookeeper_version(hosts: &str) -> String {
    match zookeeper_four_letter(hosts, "srvr").await {
        Ok(answer) => answer
            .lines()
            .find_map(|line| line.strip_prefix("Zookeeper version: "))
            .map_or_else(
                || "zookeeper (no version in srvr)".into(),
                |v| format!("zookeeper {}", v.split(['-', ',']).next().unwrap_or(v)),
            ),
        Err(err) => format!("unknown: {err}"),
    }
}

/// Packets the first server of the connect string has received (`mntr`'s
/// `zk_packets_received`): what keeping the sessions alive costs it.
pub async fn zookeeper_packets(hosts: String) -> BoxResult<f64> {
    let answer = zookeeper_four_letter(&hosts, "mntr").await?;
    answer
        .lines()
        .find_map(|line| line.strip_prefix("zk_packets_received"))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .ok_or_else(|| "no zk_packets_received in mntr (is mntr whitelisted?)".into())
}
