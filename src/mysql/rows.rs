//! Reading what a statement did, without trusting the server's values blindly.

use mysql_async::prelude::{FromValue, Queryable};
use mysql_async::{DriverError, Row, Value};

/// Runs `sql` and returns the rows it affected and the warnings it raised (outside strict
/// SQL mode, a value cut to fit its column is a warning, not an error).
pub(crate) async fn affected_warned(
    q: &mut impl Queryable,
    sql: &str,
    params: Vec<Value>,
) -> Result<(u64, u16), mysql_async::Error> {
    let result = q.exec_iter(sql, params).await?;
    let done = (result.affected_rows(), result.warnings());
    result.drop_result().await?;
    Ok(done)
}

/// Runs `sql` and returns the rows it affected.
///
/// What "affected" counts depends on the connection: by default the rows a statement
/// *changed*; with `CLIENT_FOUND_ROWS` (mysql_async's `client_found_rows=true`) the rows
/// it *matched*. Every guarded statement of this module changes a column on each row it
/// matches (a counter, a version, a strictly newer token), so both counts are equal and
/// the answer does not depend on the flag.
pub(crate) async fn affected(
    q: &mut impl Queryable,
    sql: &str,
    params: Vec<Value>,
) -> Result<u64, mysql_async::Error> {
    affected_warned(q, sql, params).await.map(|(rows, _)| rows)
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

/// The first column of the first row `sql` returns (`None`: no row), converted to `T`
/// (an `Option<_>` for a nullable column); a value of another type is an error, not a
/// panic.
pub(crate) async fn first_column<T: FromValue>(
    q: &mut impl Queryable,
    sql: &str,
    params: Vec<Value>,
) -> Result<Option<T>, mysql_async::Error> {
    let row: Option<Row> = q.exec_first(sql, params).await?;
    let Some(mut row) = row else {
        return Ok(None);
    };
    take(&mut row, 0).map(Some)
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
