//! SQL identifiers that are safe to splice into statements.

use super::FenceError;

/// A checked, quoted identifier: `name` or `schema.name`, each part made of ASCII letters,
/// digits and `_`, not starting with a digit, at most 63 bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ident(String);

impl Ident {
    pub(crate) fn parse(name: &str) -> Result<Self, FenceError> {
        let parts: Vec<&str> = name.split('.').collect();
        let ok = parts.len() <= 2
            && parts.iter().all(|part| {
                !part.is_empty()
                    && part.len() <= 63
                    && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    && !part.as_bytes()[0].is_ascii_digit()
            });
        if !ok {
            return Err(FenceError::InvalidIdentifier(name.to_owned()));
        }
        let quoted: Vec<String> = parts.iter().map(|p| format!("\"{p}\"")).collect();
        Ok(Self(quoted.join(".")))
    }

    /// An identifier written in this crate, already quoted.
    pub(crate) fn trusted(quoted: &str) -> Self {
        Self(quoted.to_owned())
    }

    /// The quoted form, ready for SQL.
    pub(crate) fn sql(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_plain_and_qualified_names() {
        assert_eq!(
            Ident::parse("fences").map(|i| i.0).ok(),
            Some("\"fences\"".into())
        );
        assert_eq!(
            Ident::parse("app.fences").map(|i| i.0).ok(),
            Some("\"app\".\"fences\"".into())
        );
    }

    #[test]
    fn refuses_anything_that_could_inject() {
        for bad in ["", "a;drop table x", "a\"b", "1abc", "a.b.c", "a b", "a-b"] {
            assert!(Ident::parse(bad).is_err(), "{bad}");
        }
    }
}
