//! Optimistic compare-and-set on a version column: mutual exclusion pushed down to the row.
//!
//! ```sql
//! UPDATE account SET balance = balance - 100, version = version + 1
//!  WHERE id = $2 AND version = $1     -- 0 rows: someone changed it first, retry
//! ```

use tokio_postgres::GenericClient;
use tokio_postgres::types::ToSql;

use super::FenceError;
use super::ident::Ident;

/// A table whose rows carry a `bigint` version, bumped by every write.
#[derive(Clone, Debug)]
pub struct VersionColumn {
    table: Ident,
    key: Ident,
    version: Ident,
}

impl VersionColumn {
    /// Names the table, its key column and its version column.
    pub fn new(table: &str, key_column: &str, version_column: &str) -> Result<Self, FenceError> {
        Ok(Self {
            table: Ident::parse(table)?,
            key: Ident::parse(key_column)?,
            version: Ident::parse(version_column)?,
        })
    }

    /// `UPDATE <table> SET <set>, <version> = <version> + 1 WHERE <key> = $2 AND
    /// <version> = $1`; returns the new version, or [`FenceError::VersionConflict`] with
    /// the version found (re-read and retry). `set` is the caller's SQL; its parameters are
    /// `$3`, `$4`, ... from `params`.
    pub async fn compare_and_set(
        &self,
        client: &impl GenericClient,
        set: &str,
        key: &(dyn ToSql + Sync),
        expected: i64,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<i64, FenceError> {
        let (table, key_col, version) = (self.table.sql(), self.key.sql(), self.version.sql());
        let sql = format!(
            "UPDATE {table} SET {set}, {version} = {version} + 1 \
             WHERE {key_col} = $2 AND {version} = $1 RETURNING {version}"
        );
        let mut all: Vec<&(dyn ToSql + Sync)> = vec![&expected, key];
        all.extend_from_slice(params);
        if let Some(row) = client.query_opt(&sql, &all).await? {
            return Ok(row.try_get(0)?);
        }
        let sql = format!("SELECT {version} FROM {table} WHERE {key_col} = $1");
        let current = client
            .query_opt(&sql, &[key])
            .await?
            .map(|row| row.try_get::<_, i64>(0))
            .transpose()?;
        Err(FenceError::VersionConflict {
            resource: format!("{key:?}"),
            expected,
            current,
        })
    }
}
