//! The hot paths that need no server: name and option validation, key and token encoding.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use fencelock::etcd::{lock_prefix, waiter_key};
use fencelock::{FencingToken, LockOptions, validate_name};

fn validation(c: &mut Criterion) {
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait_timeout(Duration::from_secs(30));
    c.bench_function("validate_name", |b| {
        b.iter(|| validate_name(black_box("inventory:sku-12345")))
    });
    c.bench_function("LockOptions::validate", |b| {
        b.iter(|| black_box(&options).validate(Duration::from_secs(1)))
    });
}

fn encoding(c: &mut Criterion) {
    c.bench_function("etcd lock key", |b| {
        b.iter(|| {
            let prefix = lock_prefix(black_box("fencelock"), black_box("inventory:sku-12345"));
            waiter_key(&prefix, black_box(0x694d_7f3c_2b1a), black_box(42))
        })
    });
    let token = FencingToken::new(1_234_567_890);
    c.bench_function("token to string", |b| {
        b.iter(|| black_box(token).to_string())
    });
    c.bench_function("token to json", |b| {
        b.iter(|| serde_json::to_string(&black_box(token)))
    });
}

criterion_group!(benches, validation, encoding);
criterion_main!(benches);
