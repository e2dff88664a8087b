//! SQL identifiers that are safe to splice into MariaDB/MySQL statements, and the keys
//! the helpers' own tables store.

use super::FenceError;

/// MariaDB's and MySQL's longest identifier (database, table, column), in characters.
const MAX_IDENT: usize = 64;

/// A checked, backtick-quoted identifier: `name` or `database.name`, each part made of
/// ASCII letters, digits and `_`, not starting with a digit, at most 64 bytes.
///
/// The server would accept more inside backticks (any character but NUL, a backtick
/// doubled); refusing everything else means no name can close the quote, and no name
/// depends on `ANSI_QUOTES` or on a trailing space being trimmed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ident {
    /// Backtick-quoted, ready for SQL.
    quoted: String,
    /// The database part, if any, and the name, unquoted.
    database: Option<String>,
    name: String,
}

impl Ident {
    pub(crate) fn parse(name: &str) -> Result<Self, FenceError> {
        let parts: Vec<&str> = name.split('.').collect();
        let ok = parts.len() <= 2
            && parts.iter().all(|part| {
                part.len() <= MAX_IDENT
                    && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    && part.bytes().next().is_some_and(|b| !b.is_ascii_digit())
            });
        if !ok {
            return Err(FenceError::InvalidIdentifier(name.to_owned()));
        }
        let quoted: Vec<String> = parts.iter().map(|p| format!("`{p}`")).collect();
        let (database, name) = match parts.as_slice() {
            [database, name] => (Some((*database).to_owned()), (*name).to_owned()),
            _ => (None, name.to_owned()),
        };
        Ok(Self {
            quoted: quoted.join("."),
            database,
            name,
        })
    }

    /// A plain name written in this crate (ASCII letters and `_`: nothing to check).
    pub(crate) fn trusted(name: &'static str) -> Self {
        Self {
            quoted: format!("`{name}`"),
            database: None,
            name: name.to_owned(),
        }
    }

    /// The quoted form, ready for SQL.
    pub(crate) fn sql(&self) -> &str {
        &self.quoted
    }

    /// The database (if named) and the name, unquoted (for `information_schema`).
    pub(crate) fn parts(&self) -> (Option<&str>, &str) {
        (self.database.as_deref(), &self.name)
    }
}

/// The longest resource name or idempotency key, in bytes: the helpers' tables keep them
/// in `VARBINARY(255)`, compared byte for byte (no collation folding case or trailing
/// spaces, so two different keys never share a row).
pub(crate) const MAX_KEY: usize = 255;

/// Refuses a key the helpers' tables could not store exactly: outside strict SQL mode the
/// server would silently cut it, and two keys would share a row.
pub(crate) fn check_key(key: &str) -> Result<(), FenceError> {
    let reason = if key.is_empty() {
        "empty".to_owned()
    } else if key.len() > MAX_KEY {
        format!("{} bytes, at most {MAX_KEY}", key.len())
    } else {
        return Ok(());
    };
    Err(FenceError::InvalidKey {
        key: key.to_owned(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_plain_and_qualified_names() {
        assert_eq!(
            Ident::parse("fences").map(|i| i.quoted).ok(),
            Some("`fences`".into())
        );
        assert_eq!(
            Ident::parse("app.fences").map(|i| i.quoted).ok(),
            Some("`app`.`fences`".into())
        );
        assert_eq!(
            Ident::parse("app.fences")
                .map(|i| i.parts() == (Some("app"), "fences"))
                .ok(),
            Some(true)
        );
        assert!(Ident::parse(&"a".repeat(64)).is_ok());
    }

    #[test]
    fn refuses_anything_that_could_inject() {
        let long = "a".repeat(65);
        for bad in [
            "",
            "a;drop table x",
            "a`b",
            "a\"b",
            "1abc",
            "a.b.c",
            "a b",
            "a-b",
            "a.",
            ".a",
            "fences ",
            "a\0b",
            "é",
            &long,
        ] {
            assert!(Ident::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn keys_must_fit_their_column() {
        assert!(check_key("SKU-1").is_ok());
        assert!(check_key(&"k".repeat(255)).is_ok());
        assert!(check_key("").is_err());
        assert!(check_key(&"k".repeat(256)).is_err());
    }
}
