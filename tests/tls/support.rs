//! Helpers shared by the TLS tests.

use std::future::Future;
use std::time::Duration;

use fencelock::LockError;
use tokio::time::Instant;

/// The connect timeout every test configuration uses.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs `connect`, which must fail, and checks it failed within the connect timeout (plus
/// a little for the process) with an error `kind` accepts; returns the error.
pub async fn refused<T: std::fmt::Debug>(
    case: &str,
    connect: impl Future<Output = Result<T, LockError>>,
    kind: impl Fn(&LockError) -> bool,
) -> LockError {
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(10), connect)
        .await
        .unwrap_or_else(|_| panic!("{case}: hung for 10 s"));
    let took = started.elapsed();
    let err = outcome.expect_err(case);
    assert!(kind(&err), "{case}: unexpected kind: {err:?}");
    assert!(
        took <= CONNECT_TIMEOUT + Duration::from_millis(500),
        "{case}: took {took:?}"
    );
    eprintln!("{case}: {err}");
    err
}
