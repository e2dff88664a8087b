//! Reading what a statement did, without trusting the server's values blindly.

use mysql_async::prelude::{FromValue, Queryable};
use mysql_async::{DriverError, Row, Value};

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
    let result = q.exec_iter(sql, params).await?;
    let rows = result.affected_rows();
    result.drop_result().await?;
    Ok(rows)
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
    match row.take_opt::<T, usize>(0) {
        Some(Ok(value)) => Ok(Some(value)),
        Some(Err(err)) => Err(DriverError::FromValue { value: err.0 }.into()),
        None => Err(DriverError::FromRow { row }.into()),
    }
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
