//! The contenders in a lock's queue: every child of the lock's node whose name ends in a
//! ZooKeeper sequence number, whichever client created it, oldest first.
//!
//! Other clients share these paths: kazoo's `Lock("/fencelock/job")` and Curator's
//! `InterProcessMutex` on the same path queue beside fencelock's nodes. A node this side
//! cannot place would let it take the lock beside that node's holder, so nothing that
//! ends in a sequence number is ignored: names of recipes we know get their kind
//! (kazoo's and Curator's readers share with our readers), and any other one is an
//! **exclusive** contender (the safe guess). Recipes that keep their holders elsewhere
//! and cannot see fencelock's nodes at all (the semaphores of Curator and kazoo) make
//! the path unusable: the acquisition is refused with
//! [`LockError::IncompatibleRecipe`](crate::LockError::IncompatibleRecipe).
//!
//! # Order
//!
//! A sequential node's number is its parent's `cversion` when it was created, written by
//! the server as Java's `%010d` of a 32-bit signed integer: it counts every creation and
//! deletion of a child, so a busy lock passes 2^31 (about a billion lock cycles, twelve
//! days at a thousand handoffs a second) and the numbers turn negative
//! (`-2147483648`, then `-000000005`), then wrap to zero. Sorting the numbers as numbers
//! (or as strings, as kazoo and Curator do) then puts a new node *ahead* of the older
//! holder: a second holder. So contenders are ordered by their **age**, the parent's
//! `cversion` now (read with the children, in one answer) minus their number, modulo
//! 2^32: right across any wrap, as long as the oldest node in the queue is younger than
//! 2^32 child changes. (kazoo and Curator do not do this: at the wrap they can be granted
//! beside us; docs/zookeeper.md says so.)

use std::fmt;

/// What a contender's node is, as far as its name tells: which recipe made it.
///
/// fencelock's own nodes carry Curator's names (`_c_<uuid>-lock-`, `-__READ__`,
/// `-__WRIT__`), so the two cannot be told apart by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ContenderKind {
    /// A mutex contender: fencelock's lock or Curator's `InterProcessMutex` (`lock-`).
    Lock,
    /// A reader of a read-write lock, fencelock's or Curator's (`__READ__`).
    Reader,
    /// A writer of a read-write lock, fencelock's or Curator's (`__WRIT__`).
    Writer,
    /// kazoo's `Lock` or `WriteLock` (`<uuid hex>__lock__`).
    KazooLock,
    /// kazoo's `ReadLock` (`<uuid hex>__rlock__`).
    KazooReader,
    /// A name that ends in a sequence number but that none of these recipes writes
    /// (Curator's `LeaderLatch`, another client's recipe): treated as exclusive.
    Unknown,
}

impl ContenderKind {
    /// Whether a node of this kind lets readers hold beside it (it is a reader itself).
    #[must_use]
    pub fn shares_with_readers(self) -> bool {
        matches!(self, Self::Reader | Self::KazooReader)
    }

    /// A short name: `lock`, `reader`, `writer`, `kazoo-lock`, `kazoo-reader` or
    /// `unknown` (`fencelock locks` shows it).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lock => "lock",
            Self::Reader => "reader",
            Self::Writer => "writer",
            Self::KazooLock => "kazoo-lock",
            Self::KazooReader => "kazoo-reader",
            Self::Unknown => "unknown",
        }
    }

    /// The kind a name's part before its sequence number tells (longest marker first:
    /// `__rlock__` before `__lock__`).
    fn of_prefix(prefix: &str) -> Self {
        const MARKERS: [(&str, ContenderKind); 5] = [
            ("__rlock__", ContenderKind::KazooReader),
            ("__lock__", ContenderKind::KazooLock),
            ("__READ__", ContenderKind::Reader),
            ("__WRIT__", ContenderKind::Writer),
            ("lock-", ContenderKind::Lock),
        ];
        MARKERS
            .iter()
            .find(|(marker, _)| prefix.ends_with(marker))
            .map_or(Self::Unknown, |(_, kind)| *kind)
    }
}

impl fmt::Display for ContenderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A recipe whose holders live where fencelock's queue cannot see them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Incompatible {
    /// Curator's `InterProcessSemaphoreV2` (and `InterProcessSemaphoreMutex`): its
    /// leases are children of `<path>/leases`, counted under a mutex in `<path>/locks`.
    CuratorSemaphore,
    /// kazoo's `Semaphore`: its leases are children named by a bare uuid (32 hex digits,
    /// no sequence number), guarded by a lock on the sibling `<path>-__lock__`.
    KazooSemaphore,
}

impl Incompatible {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::CuratorSemaphore => {
                "Curator's InterProcessSemaphoreV2 (children `leases` and `locks`)"
            }
            Self::KazooSemaphore => "kazoo's Semaphore (a lease named by a bare uuid)",
        }
    }

    fn of_child(child: &str) -> Option<Self> {
        if child == "leases" || child == "locks" {
            Some(Self::CuratorSemaphore)
        } else if child.len() == 32 && child.bytes().all(|b| b.is_ascii_hexdigit()) {
            Some(Self::KazooSemaphore)
        } else {
            None
        }
    }
}

/// One contender's node in a lock's queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Contender {
    /// The node's name (not its path).
    pub(crate) name: String,
    pub(crate) kind: ContenderKind,
    /// Child changes of the parent since it was created (see the module's "Order").
    age: u32,
}

/// The contenders among `children` of a parent whose `cversion` is `cversion` (both from
/// one answer), oldest (first in line) first; or the recipe that makes the path
/// unusable. Children without a sequence number are not contenders.
pub(crate) fn queue(children: Vec<String>, cversion: i32) -> Result<Vec<Contender>, Incompatible> {
    let mut contenders = Vec::with_capacity(children.len());
    for name in children {
        if let Some(recipe) = Incompatible::of_child(&name) {
            return Err(recipe);
        }
        // A reading whose prefix ends in a recipe's marker is the server's (after
        // `lock-` a negative number reads `lock--...`); otherwise the nearer one.
        let Some((kind, age)) = readings(&name)
            .map(|(prefix_len, sequence)| {
                let kind = ContenderKind::of_prefix(&name[..prefix_len]);
                (kind, age(cversion, sequence))
            })
            .min_by_key(|(kind, age)| (*kind == ContenderKind::Unknown, *age))
        else {
            continue;
        };
        contenders.push(Contender { name, kind, age });
    }
    contenders.sort_by(|a, b| b.age.cmp(&a.age).then_with(|| a.name.cmp(&b.name)));
    Ok(contenders)
}

/// How many child changes ago a node numbered `sequence` was created, the parent's
/// `cversion` being `cversion` now: the number is the `cversion` at the create, which
/// then went up by one, so a live child is at least 1 old.
fn age(cversion: i32, sequence: i32) -> u32 {
    cversion.wrapping_sub(sequence) as u32
}

/// The ways `name` can end in Java's `%010d` of an `i32`, as (length of the part before
/// the number, the number): ten digits (`0000000042`), a minus and nine digits
/// (`-000000042`), or a minus and ten digits (`-1500000000`, magnitude at least 10^9).
/// Ten digits after a `-` read both as a positive number after a name ending in `-`
/// (`lock-`) and as a negative one: a recipe's marker before the number tells them
/// apart, and for other names the age does (the wrong reading is far from the parent's
/// `cversion` except right at the wrap).
fn readings(name: &str) -> impl Iterator<Item = (usize, i32)> + '_ {
    let bytes = name.as_bytes();
    let digits = bytes
        .iter()
        .rev()
        .take_while(|b| b.is_ascii_digit())
        .count();
    let at = |from: usize| &name[from..];
    let end = bytes.len();
    let minus_before = |len: usize| end > len && bytes[end - len - 1] == b'-';
    let positive = (digits >= 10)
        .then(|| at(end - 10).parse::<i32>().ok())
        .flatten()
        .map(|n| (end - 10, n));
    let negative_nine = (digits == 9 && minus_before(9))
        .then(|| at(end - 10).parse::<i32>().ok())
        .flatten()
        .map(|n| (end - 10, n));
    let negative_ten = (digits == 10 && minus_before(10) && bytes[end - 10] != b'0')
        .then(|| at(end - 11).parse::<i32>().ok())
        .flatten()
        .map(|n| (end - 11, n));
    positive
        .into_iter()
        .chain(negative_nine)
        .chain(negative_ten)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(queue: &[Contender]) -> Vec<&str> {
        queue.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn every_sequential_child_is_a_contender_in_creation_order() {
        let children = [
            "_c_b-lock-0000000010",
            "stray",
            "4f2a9c__lock__0000000004",
            "_c_a-__READ__0000000002",
            "9e1f__rlock__0000000005",
            "_c_c-latch-0000000007",
            "_c_d-__WRIT__0000000008",
            "_c_e-lock-",
        ]
        .map(str::to_owned);
        let queued = queue(children.to_vec(), 11).expect("no semaphore");
        assert_eq!(
            names(&queued),
            [
                "_c_a-__READ__0000000002",
                "4f2a9c__lock__0000000004",
                "9e1f__rlock__0000000005",
                "_c_c-latch-0000000007",
                "_c_d-__WRIT__0000000008",
                "_c_b-lock-0000000010",
            ]
        );
        let kinds: Vec<_> = queued.iter().map(|c| c.kind).collect();
        assert_eq!(
            kinds,
            [
                ContenderKind::Reader,
                ContenderKind::KazooLock,
                ContenderKind::KazooReader,
                ContenderKind::Unknown,
                ContenderKind::Writer,
                ContenderKind::Lock,
            ]
        );
        assert!(queued[0].kind.shares_with_readers() && queued[2].kind.shares_with_readers());
        assert!(
            !queued[3].kind.shares_with_readers(),
            "unknown is exclusive"
        );
    }

    #[test]
    fn the_order_holds_across_the_sign_wrap_of_the_sequence() {
        // The holder was numbered just below 2^31, the next nodes just past it (negative,
        // by Java's %010d), and the parent's cversion is one past the newest.
        let children = [
            "_c_new-lock--2147483646",
            "_c_mid-lock--2147483648",
            "_c_old-lock-2147483646",
        ]
        .map(str::to_owned);
        let wrapped = queue(children.to_vec(), -2_147_483_645).expect("no semaphore");
        assert_eq!(
            names(&wrapped),
            [
                "_c_old-lock-2147483646",
                "_c_mid-lock--2147483648",
                "_c_new-lock--2147483646"
            ]
        );
        assert_eq!(wrapped.iter().map(|c| c.age).collect::<Vec<_>>(), [5, 3, 1]);
        assert!(wrapped.iter().all(|c| c.kind == ContenderKind::Lock));
        // ... and across the wrap back to zero.
        let children = ["_c_b-lock-0000000001", "_c_a-lock--000000002"].map(str::to_owned);
        assert_eq!(
            names(&queue(children.to_vec(), 3).expect("no semaphore")),
            ["_c_a-lock--000000002", "_c_b-lock-0000000001"]
        );
    }

    #[test]
    fn ten_digits_after_a_minus_are_read_by_their_age() {
        // `latch-1500000000` is latch- and 1,500,000,000 near that cversion, and latch
        // and -1,500,000,000 near its negative.
        let near_positive = queue(vec!["x-latch-1500000000".into()], 1_500_000_003).expect("ok");
        assert_eq!(near_positive[0].age, 3);
        let near_negative = queue(vec!["x-latch-1500000000".into()], -1_499_999_990).expect("ok");
        assert_eq!(near_negative[0].age, 10);
        assert!(
            readings("x-lock-0000000001").count() == 1,
            "no negative with a leading 0"
        );
    }

    #[test]
    fn semaphores_make_the_path_unusable() {
        assert_eq!(
            queue(vec!["leases".into(), "locks".into()], 2),
            Err(Incompatible::CuratorSemaphore)
        );
        assert_eq!(
            queue(vec!["0123456789abcdef0123456789abcdef".into()], 1),
            Err(Incompatible::KazooSemaphore)
        );
    }
}
