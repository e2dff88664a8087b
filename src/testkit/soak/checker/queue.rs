//! Who may hold beside whom, written again from the design (§3, `kind.rs`'s
//! documentation) rather than taken from the library; and when the history first lets a
//! key through.

use std::collections::BTreeSet;

use super::model::Life;

/// Who may hold beside whom, from the key's value (the design's rule, §3 and `kind.rs`'s
/// documentation): `None` for a key that excludes everyone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Share {
    Exclusive,
    Reader,
    Permits(usize),
}

pub(super) fn share(value: &[u8]) -> Share {
    // A marker may be followed by the holder's record on a line of its own.
    let value = if value.starts_with(b"fencelock:") {
        value.split(|b| *b == b'\n').next().unwrap_or(value)
    } else {
        value
    };
    if value == b"fencelock:read" {
        return Share::Reader;
    }
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.strip_prefix("fencelock:permit/"))
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .map_or(Share::Exclusive, Share::Permits)
}

pub(super) fn admits(mine: Share, ahead: &[Share]) -> bool {
    match mine {
        Share::Exclusive => ahead.is_empty(),
        Share::Reader => ahead.iter().all(|s| *s == Share::Reader),
        Share::Permits(n) => ahead.len() < n && ahead.iter().all(|s| *s == Share::Permits(n)),
    }
}

/// The first revision at which `life`'s key is admitted by the keys ahead of it.
pub(super) fn first_admission(life: &Life, peers: &[usize], lives: &[Life]) -> Option<i64> {
    let ahead: Vec<&Life> = peers
        .iter()
        .map(|i| &lives[*i])
        .filter(|other| other.created < life.created)
        .collect();
    let mut moments: BTreeSet<i64> = ahead
        .iter()
        .filter_map(|other| other.deleted.map(|(d, _)| d))
        .filter(|d| *d > life.created)
        .collect();
    moments.insert(life.created);
    let mine = share(&life.value);
    moments.into_iter().find(|revision| {
        life.alive_at(*revision) && {
            let shares: Vec<Share> = ahead
                .iter()
                .filter(|other| other.alive_at(*revision))
                .map(|other| share(&other.value))
                .collect();
            admits(mine, &shares)
        }
    })
}
