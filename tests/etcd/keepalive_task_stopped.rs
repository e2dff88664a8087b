//! A session's keep-alive task that stops renews nothing and reports nothing. Here it
//! panics: a metrics recorder that panics when a renewal is counted (a recorder's bug,
//! or any bug of the task's own). The session's locks must be reported lost at once
//! (`Unrenewed`), not left to guards whose `lost()` waits for ever while the lease runs
//! out on the server.

use fencelock::metrics::names::RENEWALS;
use fencelock::testkit::{PanicsOnCounter, lost_at_first_renewal};

use crate::support::{etcd, locker, namespace};

#[test]
fn a_keep_alive_task_that_dies_reports_the_sessions_locks_lost() {
    // One thread: the keep-alive task runs where the recorder is installed (a local
    // recorder is the thread's, and a current-thread runtime polls every task on the
    // thread that blocks on it).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    metrics::with_local_recorder(&PanicsOnCounter(RENEWALS), || {
        runtime.block_on(async {
            let cluster = etcd().await;
            let locks = locker(&cluster, &namespace("keepalive-task-stopped")).await;
            // Renewed after 2 s: that renewal's count kills the task, well before the
            // lease's time runs out by the client's clock. Without the report, the loss
            // would be heard only from the server once the lease has expired there (the
            // key's deletion), with another reason.
            lost_at_first_renewal(&locks, "job").await;
        });
    });
}
