//! The article's single-statement fence: the token lives in the data row itself.
//!
//! ```sql
//! UPDATE inventory SET available = available - 1, last_token = $1
//!  WHERE sku = $2 AND (last_token IS NULL OR last_token < $1)
//!                                         -- 0 rows: a newer holder wrote first
//! ```
//!
//! A NULL token column means no token has been seen yet: the first fenced write takes it.

use tokio_postgres::GenericClient;
use tokio_postgres::types::ToSql;

use super::FenceError;
use super::fence::to_bigint;
use super::ident::Ident;
use crate::FencingToken;

/// A table whose rows carry the token of their last writer in a column.
///
/// ```no_run
/// use fencelock::postgres::TokenColumn;
/// use fencelock::FencingToken;
///
/// # async fn run(client: &tokio_postgres::Client) -> Result<(), fencelock::postgres::FenceError> {
/// let inventory = TokenColumn::new("inventory", "sku", "last_token")?;
/// // UPDATE "inventory" SET available = available - 1, "last_token" = $1
/// //  WHERE "sku" = $2 AND ("last_token" IS NULL OR "last_token" < $1)
/// inventory
///     .update(client, "available = available - 1", &"SKU-1", FencingToken::new(42), &[])
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct TokenColumn {
    table: Ident,
    key: Ident,
    token: Ident,
}

impl TokenColumn {
    /// Names the table, its key column and its token column (a `bigint`, which may be
    /// NULL on rows no fenced write has touched yet).
    pub fn new(table: &str, key_column: &str, token_column: &str) -> Result<Self, FenceError> {
        Ok(Self {
            table: Ident::parse(table)?,
            key: Ident::parse(key_column)?,
            token: Ident::parse(token_column)?,
        })
    }

    /// `UPDATE <table> SET <set>, <token> = $1 WHERE <key> = $2 AND (<token> IS NULL OR
    /// <token> < $1)`.
    ///
    /// `set` is the caller's own SQL (never user input); its parameters are `$3`, `$4`, ...
    /// from `params`. Strictly newer tokens only: the token is the last writer's, so an
    /// equal one would be a repeat. A NULL token (a row no fenced write has touched)
    /// has seen no token: any token writes it. Returns the rows updated; with none, tells a stale
    /// token ([`FenceError::Stale`], with the stored token) from a missing row
    /// ([`FenceError::NotFound`]).
    #[tracing::instrument(skip_all, fields(table = self.table.sql(), token = %token))]
    pub async fn update(
        &self,
        client: &impl GenericClient,
        set: &str,
        key: &(dyn ToSql + Sync),
        token: FencingToken,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, FenceError> {
        let (table, key_col, token_col) = (self.table.sql(), self.key.sql(), self.token.sql());
        let sql = format!(
            "UPDATE {table} SET {set}, {token_col} = $1 \
             WHERE {key_col} = $2 AND ({token_col} IS NULL OR {token_col} < $1)"
        );
        let value = to_bigint(token)?;
        let mut all: Vec<&(dyn ToSql + Sync)> = vec![&value, key];
        all.extend_from_slice(params);
        let updated = client.execute(&sql, &all).await?;
        if updated > 0 {
            return Ok(updated);
        }
        let sql = format!("SELECT {token_col} FROM {table} WHERE {key_col} = $1");
        let resource = format!("{key:?}");
        match client.query_opt(&sql, &[key]).await? {
            Some(row) => Err(FenceError::Stale {
                resource,
                presented: token,
                // NULL only if another writer set it back to NULL in between.
                current: FencingToken::new(
                    row.try_get::<_, Option<i64>>(0)?
                        .and_then(|stored| u64::try_from(stored).ok())
                        .unwrap_or(0),
                ),
            }),
            None => Err(FenceError::NotFound { resource }),
        }
    }
}
