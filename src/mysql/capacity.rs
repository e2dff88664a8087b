//! How large a token a column can hold exactly.
//!
//! Outside strict SQL mode MariaDB and MySQL store an out-of-range number as the nearest
//! value the column can hold, with a warning only: a token of 5,000,000,000 written into an
//! `INT UNSIGNED` column becomes 4,294,967,295, and from then on every token above that,
//! stale or not, passes a `last_token < ?` guard. So a token column is read from
//! `information_schema` and a token it cannot hold is refused before anything is written.

use mysql_async::Value;
use mysql_async::prelude::Queryable;

use super::FenceError;
use super::abandoned::{condemn_queryable, nonce, proven_error};
use super::ident::Ident;
use super::rows::proven_row5;

/// What a token column can hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Capacity {
    /// The largest token it holds exactly (0: none, not a number column).
    pub(crate) max: u64,
    /// The column as the server declares it (`int(10) unsigned`), for messages.
    pub(crate) column_type: String,
}

impl Capacity {
    /// From `information_schema.COLUMNS`: `DATA_TYPE`, `COLUMN_TYPE`,
    /// `NUMERIC_PRECISION`, `NUMERIC_SCALE`. Integers by their width and sign, `DECIMAL`
    /// by its integer digits; anything else (floating point, which rounds large
    /// integers; text) holds none.
    pub(crate) fn of(
        data_type: &str,
        column_type: &str,
        precision: Option<u64>,
        scale: Option<u64>,
    ) -> Self {
        let unsigned = column_type.to_ascii_lowercase().contains("unsigned");
        let bits = match data_type.to_ascii_lowercase().as_str() {
            "tinyint" => Some(8),
            "smallint" => Some(16),
            "mediumint" => Some(24),
            "int" | "integer" => Some(32),
            "bigint" => Some(64),
            _ => None,
        };
        let max = match (bits, data_type.eq_ignore_ascii_case("decimal")) {
            (Some(bits), _) if unsigned => u64::MAX >> (64 - bits),
            (Some(bits), _) => u64::MAX >> (65 - bits),
            (None, true) => {
                let digits = precision.unwrap_or(0).saturating_sub(scale.unwrap_or(0));
                u32::try_from(digits)
                    .ok()
                    .and_then(|digits| 10u64.checked_pow(digits))
                    .map_or(u64::MAX, |limit| limit - 1)
            }
            (None, false) => 0,
        };
        Self {
            max,
            column_type: column_type.to_owned(),
        }
    }
}

/// The capacity of `column` of `table` (its database: the connection's current one if
/// the name has none), or `None` if there is no such column (the write that follows then
/// fails with the server's own error).
pub(crate) async fn read(
    conn: &mut impl Queryable,
    table: &Ident,
    column: &Ident,
) -> Result<Option<Capacity>, FenceError> {
    Ok(read_at(conn, table, column).await?.1)
}

/// Where a statement resolves a table: the server (`@@hostname`, `@@port`) and the
/// database (the table's own, else `DATABASE()`), as bytes. An expression with one `?`:
/// the table's database, or NULL ([`database_param`]). Evaluated inside a statement, it
/// names the place that statement reads or writes: `DATABASE()` and an unqualified table
/// name are resolved in the same context (a statement mysql_async prepared before a `USE`
/// keeps the database it was prepared in, for both), and behind a proxy it is the server
/// that runs the statement.
pub(crate) const PLACE: &str =
    "CAST(CONCAT_WS(':', @@hostname, @@port, COALESCE(?, DATABASE())) AS BINARY)";

/// [`PLACE`]'s parameter for `table`.
pub(crate) fn database_param(table: &Ident) -> Value {
    table.parts().0.map_or(Value::NULL, Value::from)
}

/// `DATA_TYPE`, `COLUMN_TYPE`, `NUMERIC_PRECISION`, `NUMERIC_SCALE` of the column (NULL
/// if there is none) and [`PLACE`] (the nonce after them is checked, not returned).
type ColumnRow = (
    Option<String>,
    Option<String>,
    Option<u64>,
    Option<u64>,
    Vec<u8>,
);

/// [`read`], and the [`PLACE`] it was read at (always: a row comes whether the column
/// exists or not).
pub(crate) async fn read_at(
    conn: &mut impl Queryable,
    table: &Ident,
    column: &Ident,
) -> Result<(Vec<u8>, Option<Capacity>), FenceError> {
    let sql = format!(
        "SELECT c.DATA_TYPE, c.COLUMN_TYPE, c.NUMERIC_PRECISION, c.NUMERIC_SCALE, {PLACE}, ? \
         FROM (SELECT 1) AS one LEFT JOIN information_schema.COLUMNS AS c \
           ON c.TABLE_SCHEMA = COALESCE(?, DATABASE()) AND c.TABLE_NAME = ? \
           AND c.COLUMN_NAME = ?"
    );
    let proof = nonce();
    let params = vec![
        database_param(table),
        Value::UInt(proof),
        database_param(table),
        Value::from(table.parts().1),
        Value::from(column.parts().1),
    ];
    let row: Option<ColumnRow> = match proven_row5(conn, &sql, params, proof).await {
        Ok(row) => row,
        Err(err) => return Err(proven_error(conn, err).await),
    };
    // A LEFT JOIN from one row always answers one: none, or one without the nonce, is
    // another statement's answer (the connection lags).
    let Some((data_type, column_type, precision, scale, place)) = row else {
        return Err(condemn_queryable(conn));
    };
    let capacity = data_type
        .zip(column_type)
        .map(|(data_type, column_type)| Capacity::of(&data_type, &column_type, precision, scale));
    Ok((place, capacity))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn max(data_type: &str, column_type: &str) -> u64 {
        Capacity::of(data_type, column_type, None, None).max
    }

    #[test]
    fn integers_hold_what_their_width_and_sign_allow() {
        assert_eq!(max("bigint", "bigint unsigned"), u64::MAX);
        assert_eq!(max("bigint", "bigint(20) unsigned"), u64::MAX);
        assert_eq!(max("bigint", "bigint(20)"), i64::MAX as u64);
        assert_eq!(max("int", "int(10) unsigned"), u64::from(u32::MAX));
        assert_eq!(max("int", "int(11)"), i32::MAX as u64);
        assert_eq!(max("tinyint", "tinyint(3) unsigned"), 255);
        assert_eq!(max("mediumint", "mediumint(8)"), 8_388_607);
    }

    #[test]
    fn decimals_hold_their_integer_digits_and_the_rest_none() {
        let decimal = |p, s| Capacity::of("decimal", "decimal", Some(p), Some(s)).max;
        assert_eq!(decimal(20, 0), u64::MAX);
        assert_eq!(decimal(10, 0), 9_999_999_999);
        assert_eq!(decimal(12, 2), 9_999_999_999);
        assert_eq!(max("double", "double"), 0);
        assert_eq!(max("varchar", "varchar(32)"), 0);
    }
}
