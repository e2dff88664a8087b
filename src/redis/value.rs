//! What a Redis lock key's value holds: the owner value, then, after a line break, the
//! holder record (`HolderInfo`, the etcd key's record line), unless the acquisition
//! records none (`with_holder_info(false)`, or an older fencelock): then the bare owner.
//!
//! ```text
//! 0f3c9a...e1<32 hex digits>\nfencelock-holder/1 host=host-a pid=4121 ... ttl=10000
//! ```
//!
//! The owner value is exactly [`OWNER_LEN`] hex digits, so "does this value belong to
//! owner `o`" is exact: the value is `o` itself, or starts with `o` and the line break.
//! A value of another owner cannot pass (its first 32 bytes differ), nor can one that
//! merely starts with `o`'s digits and goes on (byte 33 is not a line break): a looser
//! compare here would be two holders, or a lock never released. The scripts compare
//! that way on the server ([`owns_lua`]); the client keeps only the owner, never the
//! record (100,000 held locks keep no 100 bytes each).

use crate::HolderInfo;

/// The length of an owner value (128 bits, hex).
pub(crate) const OWNER_LEN: usize = 32;

/// The Lua function every owner-comparing script starts with: `owns(value, owner)` is
/// true when the key's `value` (a `GET` reply: `false` for no key) belongs to `owner`:
/// the bare owner (no record), or the owner, a line break and the record. A fencelock
/// owner is exactly [`OWNER_LEN`] bytes, so byte `OWNER_LEN + 1` being the line break and
/// the first `OWNER_LEN` bytes being `owner` decide it unambiguously; an `owner` of
/// another length (an operator's typo) matches only a value equal to it. The bare case
/// is compared first and the byte before the substring: neither allocates.
pub(crate) fn owns_lua() -> String {
    format!(
        r"
local function owns(value, owner)
  return {}
end
",
        owns_expression("value", "owner")
    )
}

/// [`owns_lua`]'s test as one Lua expression on the variables `value` and `owner`, for
/// a script on the lock cycle's path that inlines it (`scripts.rs`, `RELEASE`: a
/// function defined in a script is a closure made on every call).
pub(crate) fn owns_expression(value: &str, owner: &str) -> String {
    format!(
        "{value} == {owner} or (type({value}) == 'string' and \
         string.byte({value}, {delimiter}) == 10 and string.sub({value}, 1, {len}) == {owner})",
        len = OWNER_LEN,
        delimiter = OWNER_LEN + 1
    )
}

/// The value an acquisition writes: `owner`, then `\n` and the `record` if there is one.
/// The record's own buffer becomes the value (the owner moved in front of it: the
/// record is made with room to spare), one allocation and copy less per acquisition.
pub(crate) fn lock_value(owner: &str, record: Option<Vec<u8>>) -> Vec<u8> {
    debug_assert_eq!(
        owner.len(),
        OWNER_LEN,
        "the compare relies on the owner's length"
    );
    let Some(mut value) = record else {
        return owner.as_bytes().to_vec();
    };
    // Moved up by the owner's length and the line break, then the owner written in
    // front: two copies within the buffer (`splice` from an iterator went byte by byte).
    let (record_len, front) = (value.len(), owner.len() + 1);
    value.resize(record_len + front, 0);
    value.copy_within(..record_len, front);
    if let Some(head) = value.get_mut(..front) {
        head[..owner.len()].copy_from_slice(owner.as_bytes());
        head[owner.len()] = b'\n';
    }
    value
}

/// Puts a new `owner` at the start of `value` (made by [`lock_value`] with another owner
/// of the same length), keeping the record after it.
pub(crate) fn set_owner(value: &mut [u8], owner: &str) {
    value[..OWNER_LEN].copy_from_slice(&owner.as_bytes()[..OWNER_LEN]);
}

/// A key's value read back: its owner (all of it up to the first line break; lossy
/// UTF-8) and its holder record, if it carries one.
pub(crate) fn parse(value: &[u8]) -> (String, Option<HolderInfo>) {
    match value.iter().position(|b| *b == b'\n') {
        Some(end) => (
            String::from_utf8_lossy(&value[..end]).into_owned(),
            HolderInfo::decode(&value[end + 1..]),
        ),
        None => (String::from_utf8_lossy(value).into_owned(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const OWNER: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn a_value_reads_back_as_its_owner_and_record() {
        let record = HolderInfo {
            host: "host-a".into(),
            pid: 4121,
            program: Some("report.sh".into()),
            since: std::time::UNIX_EPOCH + Duration::from_millis(1_764_684_131_123),
            ttl: Duration::from_secs(10),
            label: Some("job\n7".into()),
        };
        let value = lock_value(OWNER, Some(record.encode()));
        assert_eq!(parse(&value), (OWNER.to_owned(), Some(record.clone())));
        assert_eq!(parse(OWNER.as_bytes()), (OWNER.to_owned(), None));
        assert_eq!(lock_value(OWNER, None), OWNER.as_bytes());
        let other = "fedcba9876543210fedcba9876543210";
        let mut moved = value.clone();
        set_owner(&mut moved, other);
        assert_eq!(moved, lock_value(other, Some(record.encode())));
    }
}
