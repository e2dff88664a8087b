//! Reading what a statement did, without trusting the server's values blindly.

use mysql_async::prelude::{FromValue, Queryable};
use mysql_async::{DriverError, Row, Value};

/// What the OK packet answering a statement said.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Done {
    /// Rows affected: by default the rows a statement *changed*; with
    /// `CLIENT_FOUND_ROWS` (mysql_async's `client_found_rows=true`) the rows it *matched*.
    /// Every guarded statement of this module changes a column on each row it matches (a
    /// counter, a version, a strictly newer token), so both counts are equal and the
    /// answer does not depend on the flag.
    pub(crate) affected: u64,
    /// Warnings raised (outside strict SQL mode, a value cut to fit its column is a
    /// warning, not an error).
    pub(crate) warnings: u16,
    /// The packet's last-insert-id: the value of a `LAST_INSERT_ID(expr)` the statement
    /// evaluated, 0 if none.
    pub(crate) insert_id: u64,
}

/// Runs `sql` and returns what its OK packet said.
pub(crate) async fn done(
    q: &mut impl Queryable,
    sql: &str,
    params: Vec<Value>,
) -> Result<Done, mysql_async::Error> {
    let result = q.exec_iter(sql, params).await?;
    let done = Done {
        affected: result.affected_rows(),
        warnings: result.warnings(),
        insert_id: result.last_insert_id().unwrap_or(0),
    };
    result.drop_result().await?;
    Ok(done)
}

/// The first row `sql` returns (`None`: no row), its first four columns converted to
/// `A`, `B`, `C`, `D`; a value of another type is an error, not a panic (mysql_async's
/// tuple conversion panics).
pub(crate) async fn first_row4<A, B, C, D>(
    q: &mut impl Queryable,
    sql: &str,
    params: Vec<Value>,
) -> Result<Option<(A, B, C, D)>, mysql_async::Error>
where
    A: FromValue,
    B: FromValue,
    C: FromValue,
    D: FromValue,
{
    let row: Option<Row> = q.exec_first(sql, params).await?;
    let Some(mut row) = row else {
        return Ok(None);
    };
    Ok(Some((
        take(&mut row, 0)?,
        take(&mut row, 1)?,
        take(&mut row, 2)?,
        take(&mut row, 3)?,
    )))
}

/// Column `index` of `row`, converted to `T`, as an error (not a panic) if it cannot be.
fn take<T: FromValue>(row: &mut Row, index: usize) -> Result<T, mysql_async::Error> {
    match row.take_opt::<T, usize>(index) {
        Some(Ok(value)) => Ok(value),
        Some(Err(err)) => Err(DriverError::FromValue { value: err.0 }.into()),
        None => Err(DriverError::FromRow { row: row.clone() }.into()),
    }
}

/// The first row `sql` returns, if its last column is `nonce` (the statement's own answer:
/// see `abandoned.rs`): its first column converted to `T`. `None`: no row, or another
/// number in the last column (an answer to an earlier statement).
pub(crate) async fn proven_first<T: FromValue>(
    q: &mut impl Queryable,
    sql: &str,
    params: Vec<Value>,
    nonce: u64,
) -> Result<Option<T>, mysql_async::Error> {
    let row: Option<Row> = q.exec_first(sql, params).await?;
    let Some(mut row) = row else {
        return Ok(None);
    };
    let last = row.len().checked_sub(1);
    let carried = last
        .and_then(|i| row.as_ref(i).cloned())
        .and_then(|v| mysql_async::from_value_opt::<u64>(v).ok());
    if last == Some(0) || carried != Some(nonce) {
        return Ok(None);
    }
    take(&mut row, 0).map(Some)
}

/// [`proven_first`] for two columns before the nonce: `SELECT COUNT(*), MAX(col), ?`
/// gives one row whether the key exists or not.
pub(crate) async fn proven_pair<A: FromValue, B: FromValue>(
    q: &mut impl Queryable,
    sql: &str,
    params: Vec<Value>,
    nonce: u64,
) -> Result<Option<(A, B)>, mysql_async::Error> {
    let row: Option<Row> = q.exec_first(sql, params).await?;
    pair_carrying(row, nonce)
}

/// [`proven_pair`] over the text protocol (`sql` carries the nonce as a literal): a
/// statement of its own, never one mysql_async prepared and cached earlier.
pub(crate) async fn proven_text_pair<A: FromValue, B: FromValue>(
    q: &mut impl Queryable,
    sql: &str,
    nonce: u64,
) -> Result<Option<(A, B)>, mysql_async::Error> {
    let row: Option<Row> = q.query_first(sql).await?;
    pair_carrying(row, nonce)
}

/// The first two columns of `row`, if its third and last is `nonce`.
fn pair_carrying<A: FromValue, B: FromValue>(
    row: Option<Row>,
    nonce: u64,
) -> Result<Option<(A, B)>, mysql_async::Error> {
    let Some(mut row) = row else {
        return Ok(None);
    };
    let carried = row
        .as_ref(2)
        .cloned()
        .and_then(|v| mysql_async::from_value_opt::<u64>(v).ok());
    if row.len() != 3 || carried != Some(nonce) {
        return Ok(None);
    }
    Ok(Some((take(&mut row, 0)?, take(&mut row, 1)?)))
}

/// A key as a person reads it, for error messages: text as text, numbers as numbers.
pub(crate) fn describe(key: &Value) -> String {
    match key {
        Value::Bytes(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::Int(n) => n.to_string(),
        Value::UInt(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}
