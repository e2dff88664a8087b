//! One uncontended lock + release per iteration, for every backend, against local servers
//! this bench starts itself (on free loopback ports; stopped when it ends).

use criterion::{Criterion, criterion_group, criterion_main};
use fencelock::etcd::EtcdLocker;
use fencelock::postgres::PgAdvisoryLocker;
use fencelock::redis::{RedisConfig, RedisLocker, RedlockLocker};
use fencelock::testkit::{EtcdCluster, PostgresServer, RedisServer};
use fencelock::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};

fn cycle<B: LockBackend>(
    c: &mut Criterion,
    runtime: &tokio::runtime::Runtime,
    name: &str,
    locks: &B,
) {
    let options = LockOptions::new();
    c.bench_function(&format!("{name} lock+release"), |b| {
        b.to_async(runtime).iter(|| async {
            let guard = locks.lock("bench", &options).await.expect("lock");
            let outcome = guard.release().await.expect("release");
            assert_eq!(outcome, ReleaseOutcome::Released);
        })
    });
}

fn lock_cycles(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (etcd, redis, masters, postgres) = runtime.block_on(async {
        let etcd = EtcdCluster::single().await.expect("start etcd");
        let redis = RedisServer::start().await.expect("start redis");
        let mut masters = Vec::new();
        for _ in 0..3 {
            masters.push(RedisServer::start().await.expect("start redis"));
        }
        let postgres = PostgresServer::start().await.expect("start postgres");
        (etcd, redis, masters, postgres)
    });
    let (etcd_locks, redis_locks, redlock_locks, pg_locks) = runtime.block_on(async {
        let etcd_locks = EtcdLocker::connect(etcd.config("bench"))
            .await
            .expect("etcd");
        let redis_locks = RedisLocker::connect(redis.config("bench"))
            .await
            .expect("redis");
        let urls = masters.iter().map(RedisServer::url);
        let redlock_locks = RedlockLocker::connect(RedisConfig::masters(urls).with_prefix("bench"))
            .await
            .expect("redlock");
        let database = postgres.create_database().await.expect("database");
        let pg_locks = PgAdvisoryLocker::connect(&postgres.connection_string(&database))
            .await
            .expect("postgres");
        pg_locks.ensure_schema().await.expect("schema");
        (etcd_locks, redis_locks, redlock_locks, pg_locks)
    });
    cycle(c, &runtime, "etcd", &etcd_locks);
    cycle(c, &runtime, "redis", &redis_locks);
    cycle(c, &runtime, "redlock", &redlock_locks);
    cycle(c, &runtime, "postgres", &pg_locks);
    drop((etcd_locks, redis_locks, redlock_locks, pg_locks));
    drop((etcd, redis, masters, postgres));
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = lock_cycles
}
criterion_main!(benches);
