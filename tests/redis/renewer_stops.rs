//! A renewal task that stops renews nothing and marks nothing expired. Here it panics:
//! a metrics recorder that panics when a renewal is counted (a recorder's bug, or any
//! bug of the task's own). Its locks must be reported lost at once (`Unrenewed`), not
//! left to guards that wait on a loss nobody reports while the keys expire on the
//! server; a lock taken after that is reported lost as soon as it is granted.

use std::time::Duration;

use fencelock::metrics::names::RENEWALS;
use fencelock::testkit::PanicsOnCounter;
use fencelock::{LockBackend, LockGuard, LockOptions, LossReason};

use crate::support::{locker, prefix, redis, within};

#[test]
fn a_renewal_task_that_dies_reports_its_locks_lost() {
    // One thread: the renewal task runs where the recorder is installed (a local
    // recorder is the thread's, and a current-thread runtime polls every task on the
    // thread that blocks on it).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    metrics::with_local_recorder(&PanicsOnCounter(RENEWALS), || {
        runtime.block_on(async {
            let server = redis().await;
            let locks = locker(&server, &prefix("renewer-stops")).await;
            // Renewed every 2 s: the first renewal kills the task. Lost only when its time
            // runs out, 6 s from now, if nobody reported the stop.
            let options = LockOptions::new().with_ttl(Duration::from_secs(6));
            let guard = locks.lock("job", &options).await.expect("lock");
            assert!(guard.is_held());
            let reason = within(Duration::from_secs(4), "the loss", guard.lost()).await;
            assert_eq!(reason, LossReason::Unrenewed);
            assert!(!guard.is_held());

            // Granted on the server (no one holds the key), but nobody would renew it.
            let late = locks.lock("later", &options).await.expect("lock");
            assert!(!late.is_held());
            let reason = within(Duration::from_secs(1), "the later loss", late.lost()).await;
            assert_eq!(reason, LossReason::Unrenewed);
        });
    });
}
