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
use super::ident::Ident;
use super::rows::first_row4;

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
/// the name has none), or `None` if `information_schema` lists no such column (a fence
/// table then fails the write with the server's own error; `TokenColumn` refuses it).
pub(crate) async fn read(
    conn: &mut impl Queryable,
    table: &Ident,
    column: &Ident,
) -> Result<Option<Capacity>, FenceError> {
    read_in(conn, table.parts().0, table, column).await
}

/// [`read`] in `database` when it is given (else the table's own, else the connection's
/// current one).
pub(crate) async fn read_in(
    conn: &mut impl Queryable,
    database: Option<&str>,
    table: &Ident,
    column: &Ident,
) -> Result<Option<Capacity>, FenceError> {
    let (named, name) = table.parts();
    let sql = "SELECT DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE \
               FROM information_schema.COLUMNS \
               WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? \
                 AND COLUMN_NAME = ?";
    let params = vec![
        database.or(named).map_or(Value::NULL, Value::from),
        Value::from(name),
        Value::from(column.parts().1),
    ];
    let row: Option<(String, String, Option<u64>, Option<u64>)> =
        first_row4(conn, sql, params).await?;
    Ok(row.map(|(data_type, column_type, precision, scale)| {
        Capacity::of(&data_type, &column_type, precision, scale)
    }))
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
