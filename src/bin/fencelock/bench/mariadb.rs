//! The MariaDB rows: lock + fenced write + release against lock + plain write + release,
//! the same shape as the PostgreSQL rows (`Runner::fenced_write`), through
//! `fencelock::mysql`.

use std::sync::Arc;

use fencelock::mysql::Fence;
use fencelock::{LockBackend, LockGuard, LockOptions};
use mysql_async::TxOpts;
use mysql_async::prelude::Queryable;

use super::BoxResult;
use super::driver::drive;
use super::workloads::{Runner, release};

/// The workload names of the two rows (the PostgreSQL rows are "fenced write" and
/// "plain write").
pub const FENCED: &str = "fenced MariaDB";
/// See [`FENCED`].
pub const PLAIN: &str = "plain MariaDB";

impl Runner<'_> {
    /// lock + fenced MariaDB write + release, against lock + plain write + release, one
    /// client at a time (concurrency 1), on one connection.
    pub async fn fenced_write_mariadb<B>(
        &mut self,
        subject: &str,
        locks: B,
        url: &str,
    ) -> BoxResult<()>
    where
        B: LockBackend + Clone + 'static,
    {
        let mut conn = fencelock::mysql::connect(url, None).await?;
        let resource = format!("bench-{}-{subject}", self.run);
        conn.query_drop(
            "CREATE TABLE IF NOT EXISTS bench_inventory \
             (sku VARCHAR(255) PRIMARY KEY, available BIGINT) ENGINE=InnoDB",
        )
        .await?;
        conn.exec_drop(
            "INSERT IGNORE INTO bench_inventory VALUES (?, 1000000000)",
            (&resource,),
        )
        .await?;
        let fence = Arc::new(Fence::new());
        fence.ensure_schema(&mut conn).await?;
        let conn = Arc::new(tokio::sync::Mutex::new(conn));
        for fenced in [false, true] {
            let workload = if fenced { FENCED } else { PLAIN };
            self.step(&format!("{subject} lock + {workload} write + release"));
            let (l, c, r, f) = (locks.clone(), conn.clone(), resource.clone(), fence.clone());
            let cell = drive(workload, subject, 1, self.args.duration, move |_, _| {
                let (locks, conn, resource, fence) = (l.clone(), c.clone(), r.clone(), f.clone());
                async move {
                    let guard = locks.lock(&resource, &LockOptions::new()).await?;
                    let mut conn = conn.lock().await;
                    let update =
                        "UPDATE bench_inventory SET available = available - 1 WHERE sku = ?";
                    if fenced {
                        let mut tx = fence.begin(&mut conn, &resource, guard.token()).await?;
                        tx.exec_drop(update, (&resource,)).await?;
                        tx.commit().await?;
                    } else {
                        let mut tx = conn.start_transaction(TxOpts::default()).await?;
                        tx.exec_drop(update, (&resource,)).await?;
                        tx.commit().await?;
                    }
                    drop(conn);
                    release(guard).await?;
                    Ok(())
                }
            })
            .await?;
            self.done(cell);
        }
        Ok(())
    }
}
