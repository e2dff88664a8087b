//! fencelock beside the lock recipes already on ZooKeeper: Python's kazoo and Apache
//! Curator, run as real clients (`fencelock::testkit::LockPeer`) on the same paths.
//!
//! `the_docs_interop_table_is_measured` probes every pair of their recipe and ours in
//! both orders (they hold while we try, we hold while they try) and compares what it saw
//! with the table in docs/zookeeper.md, cell by cell. The loops run alternating critical
//! sections from both sides on one lock, each marked by a file created with `O_EXCL`:
//! a marker already there is two holders at once.

use std::time::Duration;

use fencelock::testkit::LockPeer;
use fencelock::zookeeper::{ZooKeeperGuard, ZooKeeperLocker};
use fencelock::{LockBackend, LockError, LockGuard, LockOptions, ReleaseOutcome};

use crate::support::{locker, namespace, shared};

/// How long a peer's `try` waits before it answers `blocked`.
const PEER_TRY: Duration = Duration::from_millis(400);
/// How long any one peer command may take.
const ANSWER: Duration = Duration::from_secs(30);

/// The patterns a kazoo exclusive lock needs to see every fencelock node.
const KAZOO_SEES_ALL: &str = "-lock- __READ__ __WRIT__";
/// The patterns a kazoo reader needs to see fencelock's exclusive nodes.
const KAZOO_READER_SEES: &str = "-lock- __WRIT__";

/// Which client runs the other recipe.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Client {
    Kazoo,
    Curator,
}

/// One row of the table: their recipe, as the docs name it and as the peer runs it.
struct Theirs {
    label: &'static str,
    client: Client,
    recipe: &'static str,
    patterns: &'static str,
    reader: bool,
}

const THEIRS: [Theirs; 11] = [
    Theirs {
        label: "kazoo `Lock`",
        client: Client::Kazoo,
        recipe: "lock",
        patterns: "",
        reader: false,
    },
    Theirs {
        label: "kazoo `Lock`, patterns for all",
        client: Client::Kazoo,
        recipe: "lock",
        patterns: KAZOO_SEES_ALL,
        reader: false,
    },
    Theirs {
        label: "kazoo `WriteLock`",
        client: Client::Kazoo,
        recipe: "write",
        patterns: "",
        reader: false,
    },
    Theirs {
        label: "kazoo `WriteLock`, patterns for all",
        client: Client::Kazoo,
        recipe: "write",
        patterns: KAZOO_SEES_ALL,
        reader: false,
    },
    Theirs {
        label: "kazoo `ReadLock`",
        client: Client::Kazoo,
        recipe: "read",
        patterns: "",
        reader: true,
    },
    Theirs {
        label: "kazoo `ReadLock`, patterns for writers",
        client: Client::Kazoo,
        recipe: "read",
        patterns: KAZOO_READER_SEES,
        reader: true,
    },
    Theirs {
        label: "kazoo `Semaphore`",
        client: Client::Kazoo,
        recipe: "semaphore",
        patterns: "",
        reader: false,
    },
    Theirs {
        label: "Curator `InterProcessMutex`",
        client: Client::Curator,
        recipe: "mutex",
        patterns: "",
        reader: false,
    },
    Theirs {
        label: "Curator `InterProcessReadWriteLock`, read",
        client: Client::Curator,
        recipe: "read",
        patterns: "",
        reader: true,
    },
    Theirs {
        label: "Curator `InterProcessReadWriteLock`, write",
        client: Client::Curator,
        recipe: "write",
        patterns: "",
        reader: false,
    },
    Theirs {
        label: "Curator `InterProcessSemaphoreV2`",
        client: Client::Curator,
        recipe: "semaphore",
        patterns: "",
        reader: false,
    },
];

/// Our side of a cell: the lock, or the read-write lock's reader or writer.
#[derive(Clone, Copy, Debug)]
enum Ours {
    Lock,
    Read,
    Write,
}

impl Ours {
    const ALL: [Ours; 3] = [Ours::Lock, Ours::Read, Ours::Write];

    async fn try_take(
        self,
        locks: &ZooKeeperLocker,
        name: &str,
    ) -> Result<Option<ZooKeeperGuard>, LockError> {
        let options = LockOptions::new();
        match self {
            Ours::Lock => locks.try_lock(name, &options).await,
            Ours::Read => locks.rwlock(name)?.try_read(&options).await,
            Ours::Write => locks.rwlock(name)?.try_write(&options).await,
        }
    }
}

/// What one probe saw of one side.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Saw {
    Waited,
    Granted,
    Refused,
}

/// The table's words for what both probes of a cell saw.
fn cell(we: Saw, they: Saw, both_read: bool) -> &'static str {
    match (we, they) {
        (Saw::Refused, Saw::Waited) => "we refuse the path; they wait",
        (Saw::Refused, _) => "we refuse the path; they do not wait",
        (Saw::Waited, Saw::Waited) => "both ways",
        (Saw::Waited, _) => "one way: we wait",
        (Saw::Granted, Saw::Waited) => "one way: they wait",
        _ if both_read => "shared (readers)",
        _ => "not at all",
    }
}

async fn peer(client: Client, hosts: &str) -> LockPeer {
    match client {
        Client::Kazoo => LockPeer::kazoo(hosts).await.expect("start the kazoo peer"),
        Client::Curator => LockPeer::curator(hosts)
            .await
            .expect("start the Curator peer"),
    }
}

/// They hold `name`: do we wait?
async fn we_probe(
    peer: &mut LockPeer,
    theirs: &Theirs,
    locks: &ZooKeeperLocker,
    path: &str,
    name: &str,
    ours: Ours,
) -> Saw {
    let hold = format!("hold {} {path} {}", theirs.recipe, theirs.patterns);
    assert_eq!(peer.ask(hold.trim(), ANSWER).await.expect("hold"), "held");
    let saw = match ours.try_take(locks, name).await {
        Ok(Some(guard)) => {
            assert_eq!(
                guard.release().await.expect("release"),
                ReleaseOutcome::Released
            );
            Saw::Granted
        }
        Ok(None) => Saw::Waited,
        Err(err) if err.is_incompatible_recipe() => Saw::Refused,
        Err(err) => panic!("{} held, our {ours:?} failed: {err}", theirs.label),
    };
    peer.ask("release", ANSWER).await.expect("release");
    saw
}

/// We hold `name`: do they wait?
async fn they_probe(
    peer: &mut LockPeer,
    theirs: &Theirs,
    locks: &ZooKeeperLocker,
    path: &str,
    name: &str,
    ours: Ours,
) -> Saw {
    let guard = ours
        .try_take(locks, name)
        .await
        .expect("our lock on a fresh path")
        .expect("granted on a fresh path");
    let try_ = format!(
        "try {} {path} {} {}",
        theirs.recipe,
        PEER_TRY.as_millis(),
        theirs.patterns
    );
    let saw = match peer.ask(try_.trim(), ANSWER).await.expect("try").as_str() {
        "got" => {
            peer.ask("release", ANSWER).await.expect("release");
            Saw::Granted
        }
        "blocked" => Saw::Waited,
        other => panic!("unexpected answer {other:?}"),
    };
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    saw
}

/// The docs' row for `label`: its cells, for our lock, reader and writer.
fn documented(docs: &str, label: &str) -> Option<Vec<String>> {
    let start = format!("| {label} |");
    let line = docs.lines().find(|line| line.starts_with(&start))?;
    Some(
        line[start.len()..]
            .split('|')
            .map(str::trim)
            .filter(|cell| !cell.is_empty())
            .map(str::to_owned)
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docs_interop_table_is_measured() {
    let cluster = shared();
    let ns = namespace("interop");
    let locks = locker(cluster, &ns).await;
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/zookeeper.md"))
        .expect("read docs/zookeeper.md");
    let mut kazoo = peer(Client::Kazoo, &cluster.connect_string()).await;
    let mut curator = peer(Client::Curator, &cluster.connect_string()).await;
    let mut wrong = Vec::new();
    for (row, theirs) in THEIRS.iter().enumerate() {
        let peer = match theirs.client {
            Client::Kazoo => &mut kazoo,
            Client::Curator => &mut curator,
        };
        let mut measured = Vec::new();
        for (column, ours) in Ours::ALL.into_iter().enumerate() {
            // Fresh paths for each probe: nothing left of one can sway the next.
            let (first, second) = (format!("r{row}c{column}a"), format!("r{row}c{column}b"));
            let we = we_probe(peer, theirs, &locks, &format!("{ns}/{first}"), &first, ours).await;
            let they = they_probe(
                peer,
                theirs,
                &locks,
                &format!("{ns}/{second}"),
                &second,
                ours,
            )
            .await;
            let both_read = theirs.reader && matches!(ours, Ours::Read);
            measured.push(cell(we, they, both_read).to_owned());
        }
        let docs_row = documented(&docs, theirs.label);
        if docs_row.as_ref() != Some(&measured) {
            wrong.push(format!(
                "docs: {docs_row:?}\nmeasured: | {} | {} |",
                theirs.label,
                measured.join(" | ")
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/zookeeper.md's interop table is wrong:\n{}",
        wrong.join("\n")
    );
}

/// Alternating critical sections of `theirs` and our lock on one name: none overlap.
async fn take_turns(client: Client, recipe: &str, patterns: &str) {
    const SECTIONS: usize = 60;
    const HOLD: Duration = Duration::from_millis(3);
    let cluster = shared();
    let ns = namespace("turns");
    let locks = locker(cluster, &ns).await;
    let mut peer = peer(client, &cluster.connect_string()).await;
    let marker = tempfile::NamedTempFile::new().expect("marker name");
    let marker_path = marker.path().to_owned();
    // The marker must not exist before the first section.
    marker.close().expect("remove the marker");
    let theirs = tokio::spawn({
        let command = format!(
            "loop {recipe} {ns}/turns {SECTIONS} {} {} {patterns}",
            marker_path.display(),
            HOLD.as_millis()
        );
        async move {
            let done = peer
                .ask(command.trim(), Duration::from_secs(120))
                .await
                .expect("the peer's loop");
            let words: Vec<usize> = done
                .split_whitespace()
                .skip(1)
                .map(|word| word.parse().expect("a count"))
                .collect();
            (words[0], words[1])
        }
    });
    let mut our_overlaps = 0;
    for _ in 0..SECTIONS {
        let guard = locks
            .lock("turns", &LockOptions::new())
            .await
            .expect("lock");
        let mine = match std::fs::File::create_new(&marker_path) {
            Ok(_) => true,
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
                our_overlaps += 1;
                false
            }
            Err(err) => panic!("marker: {err}"),
        };
        tokio::time::sleep(HOLD).await;
        if mine {
            std::fs::remove_file(&marker_path).expect("remove the marker");
        }
        assert_eq!(
            guard.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
    let (their_sections, their_overlaps) = theirs.await.expect("the peer's side");
    assert_eq!(their_sections, SECTIONS);
    assert_eq!(
        (our_overlaps, their_overlaps),
        (0, 0),
        "two holders at once: {our_overlaps} of our sections and {their_overlaps} of theirs \
         found the other's marker"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_lock_and_ours_take_turns() {
    take_turns(Client::Kazoo, "lock", KAZOO_SEES_ALL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_mutex_and_ours_take_turns() {
    take_turns(Client::Curator, "mutex", "").await;
}
