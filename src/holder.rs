//! Who holds a lock: the record an acquisition leaves beside its key or node, so that an
//! operator can tell who holds a lock, since when and from where (`fencelock locks`).
//!
//! The record is one line of text, readable in `etcdctl get` and `zkCli.sh get`:
//!
//! ```text
//! fencelock-holder/1 host=host-a pid=4121 program=report.sh since=1764684131123 ttl=10000 label=nightly-2026-12-02
//! ```
//!
//! Values are percent-encoded (`%20` for a space); `since` is milliseconds since the Unix
//! epoch **by the holder's clock** (not the server's: another machine's clock may differ),
//! `ttl` the lock's TTL in milliseconds. Fields a reader does not know are skipped, so
//! later versions can add some. [`LockOptions::with_holder_info`](crate::LockOptions::with_holder_info)
//! `(false)` records nothing (the host, the program and the label can say more than a
//! service wants its lock service to know).

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The first word of a holder record, with its version.
const MAGIC: &str = "fencelock-holder/1";

/// The longest label accepted, in bytes.
pub const MAX_LABEL_LEN: usize = 256;

/// Who made an acquisition, as it recorded itself when it asked for the lock.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use fencelock::HolderInfo;
///
/// let line = "fencelock-holder/1 host=host-a pid=4121 program=report.sh since=1764684131123 ttl=10000 label=nightly%202";
/// let holder = HolderInfo::decode(line.as_bytes()).expect("a holder record");
/// assert_eq!((holder.host.as_str(), holder.pid), ("host-a", 4121));
/// assert_eq!(holder.label.as_deref(), Some("nightly 2"));
/// assert_eq!(holder.since, UNIX_EPOCH + Duration::from_millis(1_764_684_131_123));
/// assert_eq!(HolderInfo::decode(&holder.encode()), Some(holder));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// The holder's host name.
    pub host: String,
    /// The holder's process id.
    pub pid: u32,
    /// The holder's program (the file name it was started as), if recorded.
    pub program: Option<String>,
    /// When the acquisition asked for the lock, **by the holder's clock**. For a lock
    /// granted at once that is the grant; one that waited was granted later, when the
    /// contender ahead of it went (the lock services keep no time of their own for it).
    pub since: SystemTime,
    /// The lock's TTL (what it outlives a holder that stops renewing by).
    pub ttl: Duration,
    /// The label the holder gave (`LockOptions::with_holder_label`): a job id, a URL.
    pub label: Option<String>,
}

impl HolderInfo {
    /// This process, now: its host name, pid and program, with `ttl` and `label`;
    /// `program` replaces the file name this process was started as. (Acquisitions write
    /// [`encode_this_process`](Self::encode_this_process), which says the same.)
    #[cfg(test)]
    pub(crate) fn this_process(ttl: Duration, label: Option<&str>, program: Option<&str>) -> Self {
        let (host, started_as) = process_facts();
        Self {
            host: host.clone(),
            pid: std::process::id(),
            program: program.map(str::to_owned).or_else(|| started_as.clone()),
            since: SystemTime::now(),
            ttl,
            label: label.map(str::to_owned),
        }
    }

    /// The record of this process, made now, encoded: what
    /// `this_process(ttl, label, program).encode()` gives, without building the
    /// `HolderInfo` first. The host, pid and program (when not replaced) are encoded once
    /// per process: every acquisition writes a record, and the hot path pays only for the
    /// times and the label.
    #[cfg_attr(
        not(any(feature = "zookeeper", feature = "etcd", feature = "redis")),
        allow(dead_code)
    )]
    pub(crate) fn encode_this_process(
        ttl: Duration,
        label: Option<&str>,
        program: Option<&str>,
    ) -> Vec<u8> {
        // Encoded once, with the pid it was encoded for: a child after fork inherits the
        // cache but not the pid, and encodes its own facts each time (no lock on the
        // acquisition's path).
        static FACTS: std::sync::OnceLock<(u32, String)> = std::sync::OnceLock::new();
        let (host, started_as) = process_facts();
        let pid = std::process::id();
        let encode = |program: Option<&str>| {
            let mut facts = String::from(MAGIC);
            field(&mut facts, "host", host);
            let _ = write!(facts, " pid={pid}");
            if let Some(program) = program {
                field(&mut facts, "program", program);
            }
            facts
        };
        // Room for the record and for the 33 bytes of owner value a Redis lock key puts
        // in front of it in the same buffer (`redis/value.rs`).
        let mut line = String::with_capacity(160);
        match program {
            Some(program) => line.push_str(&encode(Some(program))),
            None => match FACTS.get_or_init(|| (pid, encode(started_as.as_deref()))) {
                (cached, facts) if *cached == pid => line.push_str(facts),
                _ => line.push_str(&encode(started_as.as_deref())),
            },
        }
        // As `u64`: formatting a `u128` (what `as_millis` gives) took 160 instructions
        // more per acquisition. Milliseconds fit a `u64` for 584 million years.
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, millis);
        let _ = write!(line, " since={since} ttl={}", millis(ttl));
        if let Some(label) = label {
            field(&mut line, "label", label);
        }
        line.into_bytes()
    }

    /// The record's line (see the module docs).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut line = String::with_capacity(96);
        line.push_str(MAGIC);
        field(&mut line, "host", &self.host);
        let _ = write!(line, " pid={}", self.pid);
        if let Some(program) = &self.program {
            field(&mut line, "program", program);
        }
        let since = self
            .since
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let _ = write!(line, " since={since} ttl={}", self.ttl.as_millis());
        if let Some(label) = &self.label {
            field(&mut line, "label", label);
        }
        line.into_bytes()
    }

    /// The record in `bytes`, if they are one (`None` for another client's data: kazoo's
    /// identifier, Curator's address, an election's value).
    #[must_use]
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut words = text.split(' ');
        if words.next()? != MAGIC {
            return None;
        }
        let (mut host, mut pid, mut program, mut since, mut ttl, mut label) =
            (None, None, None, None, None, None);
        for word in words {
            let Some((key, value)) = word.split_once('=') else {
                continue;
            };
            let value = percent_decode(value)?;
            match key {
                "host" => host = Some(value),
                "pid" => pid = value.parse().ok(),
                "program" => program = Some(value),
                "since" => since = value.parse().ok().map(Duration::from_millis),
                "ttl" => ttl = value.parse().ok().map(Duration::from_millis),
                "label" => label = Some(value),
                _ => {}
            }
        }
        Some(Self {
            host: host?,
            pid: pid?,
            program,
            since: UNIX_EPOCH + since?,
            ttl: ttl?,
            label,
        })
    }

    /// One line for operators: `since 2026-12-02T14:02:11Z (3m 2s ago, holder's clock)
    /// on host-a pid 4121 report.sh label nightly` (`now` by this machine's clock).
    #[must_use]
    pub fn describe(&self, now: SystemTime) -> String {
        let since = self.since.duration_since(UNIX_EPOCH).unwrap_or_default();
        let ago = now.duration_since(self.since).map_or_else(
            |_| "in the future by this machine's clock".to_owned(),
            |ago| format!("{} ago", short(ago)),
        );
        let mut line = format!(
            "since {} ({ago}, holder's clock) on {} pid {}",
            rfc3339(since.as_secs()),
            self.host,
            self.pid
        );
        if let Some(program) = &self.program {
            let _ = write!(line, " {program}");
        }
        if let Some(label) = &self.label {
            let _ = write!(line, " label {label}");
        }
        line
    }
}

fn field(line: &mut String, key: &str, value: &str) {
    let _ = write!(line, " {key}=");
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._:@/+,".contains(&byte) {
            line.push(char::from(byte));
        } else {
            let _ = write!(line, "%{byte:02X}");
        }
    }
}

fn percent_decode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// This machine's host name and the file name this process was started as: read once
/// (an acquisition pays for neither a system call nor an allocation of them).
#[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
fn process_facts() -> &'static (String, Option<String>) {
    static FACTS: std::sync::OnceLock<(String, Option<String>)> = std::sync::OnceLock::new();
    FACTS.get_or_init(|| {
        let program = std::env::args_os().next().and_then(|arg0| {
            std::path::Path::new(&arg0)
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
        });
        (host_name(), program)
    })
}

/// This machine's host name (`gethostname`), or `unknown`.
#[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
fn host_name() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer we own.
    let ok = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) } == 0;
    let end = buffer.iter().position(|b| *b == 0).unwrap_or(buffer.len());
    if ok && end > 0 {
        String::from_utf8_lossy(&buffer[..end]).into_owned()
    } else {
        "unknown".to_owned()
    }
}

/// `3m 2s`, `4h 5m`, `2d 1h`: the two largest units.
fn short(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3_600 => format!("{}m {}s", s / 60, s % 60),
        3_600..86_400 => format!("{}h {}m", s / 3_600, s % 3_600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3_600),
    }
}

/// `2026-12-02T14:02:11Z` for seconds since the epoch (UTC, proleptic Gregorian).
fn rfc3339(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil from days (Howard Hinnant's algorithm), for days since 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_survives_its_line_whatever_its_label_holds() {
        let holder = HolderInfo {
            host: "host a".into(),
            pid: 7,
            program: Some("job=1%".into()),
            since: UNIX_EPOCH + Duration::from_millis(1_764_684_131_123),
            ttl: Duration::from_secs(10),
            label: Some("nightly run\nüber".into()),
        };
        let line = holder.encode();
        assert!(!line.contains(&b'\n'), "one line");
        assert_eq!(HolderInfo::decode(&line), Some(holder));
    }

    #[test]
    fn this_process_encodes_as_its_record_does() {
        let ttl = Duration::from_secs(10);
        for (label, program) in [
            (None, None),
            (Some("nightly 2"), None),
            (Some("x=y"), Some("report sh")),
        ] {
            let before = SystemTime::now();
            let fast = HolderInfo::decode(&HolderInfo::encode_this_process(ttl, label, program))
                .expect("a record");
            let slow = HolderInfo::this_process(ttl, label, program);
            assert!(fast.since <= slow.since && fast.since + Duration::from_millis(1) >= before);
            assert_eq!(
                HolderInfo {
                    since: slow.since,
                    ..fast
                },
                slow
            );
        }
    }

    #[test]
    fn other_clients_data_is_not_a_record() {
        for data in [
            &b""[..],
            b"kazoo-peer",
            b"127.0.0.1",
            b"fencelock-holder/1 host=a",
        ] {
            assert_eq!(HolderInfo::decode(data), None, "{data:?}");
        }
        // Fields a later version adds are skipped.
        let line = b"fencelock-holder/1 host=a pid=1 since=0 ttl=1000 zone=eu";
        assert!(HolderInfo::decode(line).is_some());
    }

    #[test]
    fn dates_and_ages_read_as_an_operator_expects() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_764_684_131), "2025-12-02T14:02:11Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(short(Duration::from_secs(182)), "3m 2s");
        assert_eq!(short(Duration::from_secs(90_061)), "1d 1h");
        let holder = HolderInfo {
            host: "host-a".into(),
            pid: 4121,
            program: Some("report.sh".into()),
            since: UNIX_EPOCH + Duration::from_secs(1_764_684_131),
            ttl: Duration::from_secs(10),
            label: Some("nightly".into()),
        };
        assert_eq!(
            holder.describe(holder.since + Duration::from_secs(182)),
            "since 2025-12-02T14:02:11Z (3m 2s ago, holder's clock) on host-a pid 4121 \
             report.sh label nightly"
        );
    }
}
