//! From the log of critical sections to verdicts: overlapping holders, stale writes
//! accepted and rejected, tokens out of grant order.
//!
//! Overlaps are detected from the record, not assumed: every worker logs when its
//! critical section started and ended (by the machine's monotonic clock, shared by all
//! processes on it), the token it held, and what storage said to its fenced write.

use serde::{Deserialize, Serialize};

/// What storage answered to a critical section's fenced write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Write {
    /// Accepted; `order` is its place in storage's commit order (a sequence number drawn
    /// inside the fenced transaction, or any number that grows with commit order).
    Accepted { order: u64 },
    /// Refused: a newer token had been seen.
    Rejected,
    /// The write failed for another reason (storage unreachable...).
    Failed,
}

/// What releasing the lock at the end of a section did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Release {
    /// Our lock, deleted.
    Released,
    /// No longer ours; nothing deleted.
    NotHeld,
    /// Deleted a lock that was someone else's (the naive baseline's bug, S3).
    DeletedOther,
    /// The release failed (server unreachable...).
    Failed,
}

/// One critical section, as a worker logs it. Times are `CLOCK_MONOTONIC` nanoseconds,
/// one clock for every process on the machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Section {
    pub client: String,
    pub token: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub write: Write,
    /// Whether the unfenced variant of the write ran (it cannot be refused).
    #[serde(default)]
    pub unfenced_written: bool,
    /// When the guard reported the lock lost during the section, if it did.
    #[serde(default)]
    pub lost_ns: Option<u64>,
    #[serde(default)]
    pub release: Option<Release>,
}

/// The counts for one backend and scenario.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// Critical sections run.
    pub sections: usize,
    /// Sections that began while another client's section was still running: two
    /// holders at once.
    pub overlapping: usize,
    /// Fenced writes accepted with a token older than one accepted before them.
    pub stale_accepted: usize,
    /// Fenced writes refused as stale: the fence doing its job.
    pub stale_rejected: usize,
    /// Grants whose token is not larger than the previous grant's (in start order).
    pub token_inversions: usize,
    /// Releases that deleted another holder's lock.
    pub foreign_deletes: usize,
    /// Sections whose guard reported the lock lost before they ended.
    pub lost_reported: usize,
}

/// Checks the sections of one lock.
pub fn check(sections: &[Section]) -> Verdict {
    let mut by_start: Vec<&Section> = sections.iter().collect();
    by_start.sort_by_key(|s| (s.start_ns, s.end_ns));

    let mut overlapping = 0;
    let mut latest_end: Option<(u64, &str)> = None;
    for section in &by_start {
        if let Some((end, client)) = latest_end {
            if section.start_ns < end && client != section.client {
                overlapping += 1;
            }
        }
        if latest_end.is_none_or(|(end, _)| section.end_ns > end) {
            latest_end = Some((section.end_ns, &section.client));
        }
    }

    let token_inversions = by_start
        .windows(2)
        .filter(|pair| pair[1].token <= pair[0].token)
        .count();

    let mut accepted: Vec<(u64, u64)> = sections
        .iter()
        .filter_map(|s| match s.write {
            Write::Accepted { order } => Some((order, s.token)),
            _ => None,
        })
        .collect();
    accepted.sort_unstable();
    let mut newest = 0;
    let mut stale_accepted = 0;
    for (_, token) in accepted {
        if token < newest {
            stale_accepted += 1;
        }
        newest = newest.max(token);
    }

    Verdict {
        sections: sections.len(),
        overlapping,
        stale_accepted,
        stale_rejected: sections
            .iter()
            .filter(|s| s.write == Write::Rejected)
            .count(),
        token_inversions,
        foreign_deletes: sections
            .iter()
            .filter(|s| s.release == Some(Release::DeletedOther))
            .count(),
        lost_reported: sections.iter().filter(|s| s.lost_ns.is_some()).count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(client: &str, token: u64, start_ns: u64, end_ns: u64, write: Write) -> Section {
        Section {
            client: client.into(),
            token,
            start_ns,
            end_ns,
            write,
            unfenced_written: false,
            lost_ns: None,
            release: None,
        }
    }

    #[test]
    fn a_clean_run_has_nothing_to_report() {
        let log = [
            section("a", 10, 0, 10, Write::Accepted { order: 5 }),
            section("b", 12, 11, 20, Write::Accepted { order: 15 }),
            section("a", 15, 21, 30, Write::Accepted { order: 25 }),
        ];
        let verdict = check(&log);
        assert_eq!(
            verdict,
            Verdict {
                sections: 3,
                ..Verdict::default()
            }
        );
    }

    #[test]
    fn a_paused_holder_shows_as_an_overlap_and_its_write_as_rejected() {
        // A holds token 10, pauses past its lease; B gets 12 and writes; A resumes and
        // writes with 10: refused.
        let log = [
            section("a", 10, 0, 50, Write::Rejected),
            section("b", 12, 20, 30, Write::Accepted { order: 25 }),
        ];
        let verdict = check(&log);
        assert_eq!(verdict.overlapping, 1);
        assert_eq!(verdict.stale_rejected, 1);
        assert_eq!(verdict.stale_accepted, 0);
        assert_eq!(verdict.token_inversions, 0);
    }

    #[test]
    fn an_unfenced_store_accepting_the_stale_write_is_counted() {
        let log = [
            section("a", 10, 0, 50, Write::Accepted { order: 45 }),
            section("b", 12, 20, 30, Write::Accepted { order: 25 }),
        ];
        assert_eq!(check(&log).stale_accepted, 1);
    }

    #[test]
    fn a_repeated_or_older_token_in_grant_order_is_an_inversion() {
        // The Redis counter after a failover: the next grant repeats token 12.
        let log = [
            section("a", 12, 0, 10, Write::Accepted { order: 5 }),
            section("b", 12, 11, 20, Write::Rejected),
        ];
        let verdict = check(&log);
        assert_eq!(verdict.token_inversions, 1);
        assert_eq!(verdict.overlapping, 0);
    }
}
