//! Lock names: what is accepted, and why.

use crate::LockError;

/// The longest lock name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 128;

/// Checks a lock name.
///
/// Names are 1 to [`MAX_NAME_LEN`] ASCII characters from `A-Z a-z 0-9 - _ . : @ =`.
/// The slash is refused on purpose: etcd lock keys live under `<namespace>/<name>/`, so a
/// name `a` would otherwise share its key range with every lock named `a/...` and wait
/// behind their holders.
pub fn validate_name(name: &str) -> Result<(), LockError> {
    let reason = if name.is_empty() {
        Some("it is empty")
    } else if name.len() > MAX_NAME_LEN {
        Some("it is longer than 128 bytes")
    } else if name.contains('/') {
        Some("it contains '/', which would make it overlap other locks' key ranges")
    } else if !name.bytes().all(is_name_byte) {
        Some("only ASCII letters, digits and - _ . : @ = are allowed")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(LockError::InvalidName {
            name: shorten(name),
            reason,
        }),
        None => Ok(()),
    }
}

/// The names of a multi-lock acquisition, checked, sorted and each once: at least one,
/// at most `max`.
pub(crate) fn distinct_names(names: &[&str], max: usize) -> Result<Vec<String>, LockError> {
    for name in names {
        validate_name(name)?;
    }
    let mut distinct: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
    distinct.sort();
    distinct.dedup();
    if distinct.is_empty() || distinct.len() > max {
        return Err(LockError::InvalidOption {
            option: "names",
            reason: format!(
                "{} distinct lock names: between 1 and {max} are taken together",
                distinct.len()
            ),
        });
    }
    Ok(distinct)
}

/// Input as it may appear in a message: long input is cut (a 5,000-character name would
/// otherwise fill a terminal), with how much was left out.
pub(crate) fn shorten(input: &str) -> String {
    const KEEP: usize = 64;
    if input.chars().count() <= KEEP {
        return input.to_owned();
    }
    let kept: String = input.chars().take(KEEP).collect();
    format!("{kept}... ({} bytes in all)", input.len())
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'@' | b'=')
}

#[cfg(test)]
mod tests {
    #[test]
    fn long_names_are_cut_in_errors() {
        let long = "x".repeat(5000);
        let err = super::validate_name(&long).expect_err("too long");
        let message = err.to_string();
        assert!(message.len() < 200, "{message}");
        assert!(message.contains("5000 bytes in all"), "{message}");
    }

    use super::*;

    #[test]
    fn accepts_ordinary_names() {
        for name in ["orders", "sku:42", "job.nightly-report", "a", "tenant@eu=1"] {
            assert!(validate_name(name).is_ok(), "{name}");
        }
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN)).is_ok());
    }

    #[test]
    fn refuses_bad_names_with_a_reason() {
        for name in ["", "a/b", "with space", "tab\t", "ünïcode", "nul\0"] {
            let err = validate_name(name).expect_err(name);
            assert!(err.is_invalid_input(), "{name}: {err}");
        }
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN + 1)).is_err());
    }
}
