//! What a key in a lock's queue stands for, and who may hold the lock beside whom.
//!
//! Every primitive (mutex, semaphore permit, reader, writer, election candidate) queues
//! under the same prefix `<namespace>/<name>/`, ordered by create revision, and so do Go's
//! `concurrency.Mutex`, `etcdctl lock` and etcd's Lock RPC (keys `<prefix><lease id>`,
//! empty value). One name may therefore be used by several primitives at once, by mistake
//! or during a migration. Rather than trust every client to use one primitive per name,
//! each key says what it is in its value, and every waiter treats a key it does not
//! recognise as its own kind as exclusive:
//!
//! - a mutex, a writer and a candidate are admitted only when no key at all is ahead;
//! - a reader is admitted when every key ahead is a reader;
//! - a permit of an N-permit semaphore is admitted when fewer than N keys are ahead and
//!   every one of them is a permit of an N-permit semaphore.
//!
//! Whatever the mix, no holder's promise is broken: a mutex holder is alone, readers share
//! only with readers, a semaphore never has more than N holders. A name used by two
//! primitives simply serialises them.
//!
//! After the marker, a key fencelock wrote may carry its holder record (`holder.rs`) on a
//! line of its own: `fencelock:read\n<record>`, and for a mutex `\n<record>` (its marker
//! is empty, as Go's). Only the marker says what a key stands for. An older fencelock
//! reads such a value as a candidate's (exclusive): mixed versions serialise, never share
//! wrongly.

use crate::LockError;

/// Values that start with this are fencelock's markers; election values may not.
pub(crate) const RESERVED_PREFIX: &[u8] = b"fencelock:";

/// The value of a reader's key.
pub(crate) const READER: &[u8] = b"fencelock:read";
/// The value of a writer's key.
pub(crate) const WRITER: &[u8] = b"fencelock:write";
const PERMIT_PREFIX: &str = "fencelock:permit/";

/// The primitive an acquisition belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A lock: alone. Its key's value is empty, as Go's `concurrency.Mutex` writes it.
    Mutex,
    /// The writing side of a read-write lock: alone.
    Writer,
    /// The reading side of a read-write lock: shares with readers only.
    Reader,
    /// One of `permits` permits of a semaphore: shares with permits of the same semaphore.
    Permit {
        /// How many holders at once.
        permits: usize,
    },
    /// An election candidate: alone (the leader); the value is what it proclaims.
    Candidate {
        /// The candidate's value.
        value: Vec<u8>,
    },
}

impl Kind {
    /// What this kind's key holds, with `record` (a holder record) after its marker;
    /// a candidate's value is its own, with no record.
    pub(crate) fn value_with(&self, record: Option<Vec<u8>>) -> Vec<u8> {
        let mut value = self.value();
        if let (Some(record), false) = (record, matches!(self, Self::Candidate { .. })) {
            value.push(b'\n');
            value.extend(record);
        }
        value
    }

    /// What this kind's key holds (its marker alone).
    pub(crate) fn value(&self) -> Vec<u8> {
        match self {
            Self::Mutex => Vec::new(),
            Self::Writer => WRITER.to_vec(),
            Self::Reader => READER.to_vec(),
            Self::Permit { permits } => format!("{PERMIT_PREFIX}{permits}").into_bytes(),
            Self::Candidate { value } => value.clone(),
        }
    }

    /// What a key holding `value` stands for (the inverse of [`Kind::value_with`]); a
    /// value fencelock did not write is a candidate's: it excludes everyone.
    pub(crate) fn from_value(value: &[u8]) -> Self {
        let value = marker(value);
        if value.is_empty() {
            return Self::Mutex;
        }
        if value == READER {
            return Self::Reader;
        }
        if value == WRITER {
            return Self::Writer;
        }
        let permits = std::str::from_utf8(value)
            .ok()
            .and_then(|v| v.strip_prefix(PERMIT_PREFIX))
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| *n > 0);
        match permits {
            Some(permits) => Self::Permit { permits },
            None => Self::Candidate {
                value: value.to_vec(),
            },
        }
    }

    /// How many holders of this kind may share the lock (1: alone).
    pub(crate) fn holders(&self) -> usize {
        match self {
            Self::Permit { permits } => *permits,
            // Readers share with any number of readers.
            Self::Reader => usize::MAX,
            Self::Mutex | Self::Writer | Self::Candidate { .. } => 1,
        }
    }

    /// Whether a key holding `value` is one this kind may hold the lock beside.
    pub(crate) fn shares_with(&self, value: &[u8]) -> bool {
        let value = marker(value);
        match self {
            Self::Reader => value == READER,
            Self::Permit { .. } => value == self.value().as_slice(),
            Self::Mutex | Self::Writer | Self::Candidate { .. } => false,
        }
    }

    /// Whether a key of this kind is admitted with the keys ahead of it, given as values
    /// (any order).
    pub(crate) fn admitted<'a>(&self, ahead: impl ExactSizeIterator<Item = &'a [u8]>) -> bool {
        let count = ahead.len();
        count < self.holders() && { ahead }.all(|value| self.shares_with(value))
    }
}

/// Whether `value` is one fencelock wrote with a marker line (a mutex's is empty): then
/// what follows its first line break is a holder record. A candidate's value (anything
/// else) is taken whole.
fn has_marker_line(value: &[u8]) -> bool {
    value.starts_with(b"\n") || value.starts_with(RESERVED_PREFIX)
}

/// The marker of a key's value: its first line if fencelock wrote it, else all of it.
pub(crate) fn marker(value: &[u8]) -> &[u8] {
    if !has_marker_line(value) {
        return value;
    }
    value
        .iter()
        .position(|b| *b == b'\n')
        .map_or(value, |end| &value[..end])
}

/// The holder record after a marker line, if the key carries one.
pub(crate) fn holder(value: &[u8]) -> Option<crate::HolderInfo> {
    if !has_marker_line(value) {
        return None;
    }
    let end = value.iter().position(|b| *b == b'\n')?;
    crate::HolderInfo::decode(&value[end + 1..])
}

/// Refuses an election value that would pass for one of fencelock's markers (a candidate
/// proclaiming `fencelock:read` would otherwise look like a reader to readers).
pub(crate) fn check_candidate_value(value: &[u8]) -> Result<(), LockError> {
    if has_marker_line(value) {
        return Err(LockError::InvalidOption {
            option: "value",
            reason: "election values starting with \"fencelock:\" or a line break are reserved"
                .into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_kinds() -> Vec<Kind> {
        vec![
            Kind::Mutex,
            Kind::Writer,
            Kind::Reader,
            Kind::Permit { permits: 2 },
            Kind::Permit { permits: 3 },
            Kind::Candidate {
                value: b"host-a".to_vec(),
            },
        ]
    }

    #[test]
    fn only_readers_share_with_readers_and_permits_with_their_own_semaphore() {
        for holder in all_kinds() {
            for newcomer in all_kinds() {
                let value = holder.value();
                let admitted = newcomer.admitted([value.as_slice()].into_iter());
                let expected = matches!(
                    (&holder, &newcomer),
                    (Kind::Reader, Kind::Reader)
                        | (Kind::Permit { permits: 2 }, Kind::Permit { permits: 2 })
                        | (Kind::Permit { permits: 3 }, Kind::Permit { permits: 3 })
                );
                assert_eq!(admitted, expected, "{newcomer:?} behind {holder:?}");
            }
        }
    }

    #[test]
    fn every_kind_is_read_back_from_its_value() {
        for kind in all_kinds() {
            assert_eq!(Kind::from_value(&kind.value()), kind);
        }
        assert_eq!(
            Kind::from_value(b"fencelock:permit/x"),
            Kind::Candidate {
                value: b"fencelock:permit/x".to_vec()
            }
        );
    }

    /// A key that carries a holder record after its marker stands for, and shares with,
    /// exactly what its marker alone would.
    #[test]
    fn a_holder_record_changes_nothing_about_who_shares() {
        let record = crate::HolderInfo::this_process(
            std::time::Duration::from_secs(10),
            Some("job\n7"),
            None,
        )
        .encode();
        for holder in all_kinds() {
            let with = holder.value_with(Some(record.clone()));
            assert_eq!(Kind::from_value(&with), holder);
            for newcomer in all_kinds() {
                assert_eq!(
                    newcomer.admitted([with.as_slice()].into_iter()),
                    newcomer.admitted([holder.value().as_slice()].into_iter()),
                    "{newcomer:?} behind {holder:?} with a record"
                );
            }
            let expected = !matches!(holder, Kind::Candidate { .. });
            assert_eq!(super::holder(&with).is_some(), expected, "{holder:?}");
            if expected {
                assert_eq!(
                    super::holder(&with).and_then(|h| h.label),
                    Some("job\n7".to_owned())
                );
            }
        }
        // A candidate's value is taken whole, line breaks and all.
        let candidate = Kind::Candidate {
            value: b"a\nb".to_vec(),
        };
        assert_eq!(Kind::from_value(b"a\nb"), candidate);
        assert!(super::holder(b"a\nfencelock-holder/1 host=x").is_none());
        assert!(check_candidate_value(b"\nhost").is_err());
    }

    #[test]
    fn go_mutex_keys_exclude_everyone() {
        // etcdctl lock / concurrency.Mutex keys hold an empty value.
        for kind in all_kinds() {
            assert!(!kind.admitted([&b""[..]].into_iter()), "{kind:?}");
        }
    }

    #[test]
    fn a_semaphore_admits_fewer_than_n_ahead() {
        let permit = Kind::Permit { permits: 2 };
        let value = permit.value();
        assert!(permit.admitted(std::iter::empty::<&[u8]>()));
        assert!(permit.admitted([value.as_slice()].into_iter()));
        assert!(!permit.admitted([value.as_slice(), value.as_slice()].into_iter()));
    }

    #[test]
    fn reserved_values_are_refused_for_candidates() {
        assert!(check_candidate_value(b"fencelock:read").is_err());
        assert!(check_candidate_value(b"host-a:8080").is_ok());
        assert!(check_candidate_value(b"").is_ok());
    }
}
