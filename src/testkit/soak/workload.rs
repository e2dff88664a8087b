//! The soak's clients: each an [`EtcdLocker`] whose every member is behind a fault proxy
//! of its own, running several tasks that take locks, semaphore permits, read and write
//! locks, leadership and several locks at once (`lock_all`: 2 to 4 of the shared names,
//! in a random order) on a few shared names, hold them (a few milliseconds, or longer
//! than their lease, sampling `is_held()` and listening to `lost()`), and release or drop
//! them. Everything a task is told is recorded for the checker.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::checker::{Event, Grant, Outcome};
use super::rng::Rng;
use crate::etcd::{EtcdGuard, EtcdLocker, Leadership};
use crate::{
    LockBackend, LockError, LockGuard, LockOptions, LossReason, MultiGuard, ReleaseOutcome,
};

/// What the clients did, in counts.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) attempts: AtomicU64,
    pub(crate) grants: AtomicU64,
    pub(crate) busy: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) released: AtomicU64,
    pub(crate) not_held: AtomicU64,
    pub(crate) unconfirmed: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) losses: AtomicU64,
    /// Acquisitions of several locks at once (`lock_all`, `try_lock_all`), and their
    /// grants (also counted in `attempts` and `grants`).
    pub(crate) multi_attempts: AtomicU64,
    pub(crate) multi_grants: AtomicU64,
}

impl Tally {
    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Where the clients' events go.
#[derive(Debug, Default)]
pub(crate) struct Journal {
    events: Mutex<Vec<Event>>,
    next_id: AtomicU64,
}

impl Journal {
    fn push(&self, event: Event) {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(event);
    }

    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn snapshot(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// A primitive the workload takes.
#[derive(Clone, Copy, Debug)]
enum Primitive {
    Lock,
    Permit,
    Read,
    Write,
    Leader,
    /// Several locks at once: this name and 1 to 3 others (`lock_all`).
    Multi,
}

/// A grant of any primitive.
enum Held {
    Guard(EtcdGuard),
    Leader(Leadership),
    Multi(MultiGuard<EtcdGuard>),
}

impl Held {
    /// The guard of every lock held (one but for a `lock_all`).
    fn guards(&self) -> &[EtcdGuard] {
        match self {
            Self::Guard(guard) => std::slice::from_ref(guard),
            Self::Leader(leadership) => std::slice::from_ref(leadership.guard()),
            Self::Multi(multi) => multi.guards(),
        }
    }

    /// What the application would ask: the multi guard's own answer for a `lock_all`.
    fn is_held(&self) -> bool {
        match self {
            Self::Multi(multi) => multi.is_held(),
            _ => self.guards().iter().all(LockGuard::is_held),
        }
    }

    /// Resolves when the grant may be lost: why, and for a `lock_all` the key of the lock
    /// its guard names (`lost_which`).
    async fn lost(&self) -> (Option<String>, LossReason) {
        match self {
            Self::Guard(guard) => (None, guard.lost().await),
            Self::Leader(leadership) => (None, leadership.lost().await),
            Self::Multi(multi) => {
                let (name, reason) = multi.lost_which().await;
                let key = multi
                    .guards()
                    .iter()
                    .find(|guard| guard.name() == name)
                    .map(|guard| guard.key().to_owned());
                (key, reason)
            }
        }
    }

    async fn release(self) -> Result<ReleaseOutcome, LockError> {
        match self {
            Self::Guard(guard) => guard.release().await,
            Self::Leader(leadership) => leadership.resign().await,
            Self::Multi(multi) => multi.release().await,
        }
    }
}

/// What every acquisition of one client needs.
#[derive(Clone)]
pub(crate) struct Client {
    pub(crate) client: usize,
    pub(crate) locker: EtcdLocker,
    pub(crate) journal: Arc<Journal>,
    pub(crate) tally: Arc<Tally>,
}

/// How many acquisitions of one name a task makes at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Crowd {
    /// One.
    Alone,
    /// A few, of any primitive: joins and releases of one name meet in one session's
    /// batcher (two joins of one name must never share a transaction).
    Few(usize),
    /// A long queue of plain locks on one name, held briefly: many waiters, each
    /// watching its predecessor, and handoffs in quick succession.
    Queue(usize),
}

/// One task of client `client`: acquisitions until `stop` turns true; now and then
/// several of one name at once on the client's one locker.
pub(crate) async fn task(
    client: Client,
    names: Arc<Vec<String>>,
    mut rng: Rng,
    stop: watch::Receiver<bool>,
) {
    let mut round = 0;
    let mut name = names[rng.index(names.len())].clone();
    while !*stop.borrow() {
        // Half the time the same name again, as most clients take one lock over and
        // over: a name the session freed is then soon asked for again (a freed name
        // reused while a late request about it is still on its way shows).
        if rng.chance(50) {
            name = names[rng.index(names.len())].clone();
        }
        let crowd = match rng.weighted(&[70, 18, 12]) {
            0 => Crowd::Alone,
            1 => Crowd::Few(2 + rng.index(3)),
            _ => Crowd::Queue(8 + rng.index(9)),
        };
        match crowd {
            Crowd::Alone => one(&client, &name, &names, &mut rng, false, None).await,
            Crowd::Few(n) | Crowd::Queue(n) => {
                round += 1;
                let queue = matches!(crowd, Crowd::Queue(_));
                // One TTL for the crowd: its acquisitions share one renewed session, so
                // that their joins and releases of one name meet in one batcher.
                let ttl = ttl(&mut rng);
                // Half the queues on a name nobody used before: no watch of it lingers,
                // so the first waiter opens it while the others' joins are still on their
                // way, and handoffs are dispatched before some of them subscribe (a
                // subscriber must then read its place again, never trust its join's read).
                let name = if queue && rng.chance(50) {
                    format!("{name}-q{:x}", rng.next_u64())
                } else {
                    name.clone()
                };
                let mut rngs: Vec<Rng> = (0..n as u64).map(|i| rng.fork(round * 64 + i)).collect();
                futures_util::future::join_all(
                    rngs.iter_mut()
                        .map(|r| one(&client, &name, &names, r, queue, Some(ttl))),
                )
                .await;
            }
        }
    }
}

/// One acquisition of `name` (a plain, briefly held lock if `queue`; of the crowd's TTL,
/// renewed, if in a crowd; with others of `pool` if it takes several locks), its hold and
/// its release or drop, all journalled.
async fn one(
    client: &Client,
    name: &str,
    pool: &[String],
    rng: &mut Rng,
    queue: bool,
    crowd_ttl: Option<Duration>,
) {
    let Client {
        client,
        locker,
        journal,
        tally,
    } = client;
    let client = *client;
    let primitive = if queue {
        Primitive::Lock
    } else {
        [
            Primitive::Lock,
            Primitive::Permit,
            Primitive::Read,
            Primitive::Write,
            Primitive::Leader,
            Primitive::Multi,
        ][rng.weighted(&[32, 12, 12, 12, 12, 20])]
    };
    // Several locks: this one and others of the pool (overlapping every other client's
    // names), in a random order (the library sorts them: the order given must not
    // matter).
    let names = match primitive {
        Primitive::Multi => several(name, pool, rng),
        _ => vec![name.to_owned()],
    };
    let ttl = crowd_ttl.unwrap_or_else(|| ttl(rng));
    let wait = if queue {
        Duration::from_secs(8)
    } else {
        [
            Duration::from_millis(300),
            Duration::from_secs(1),
            Duration::from_secs(8),
        ][rng.weighted(&[40, 40, 20])]
    };
    // The acquisition's id rides in its key (the holder record's label, an election's
    // value): the checker tells whose key each key in the history is, granted or not.
    let id = journal.id();
    // (Drawn only outside a crowd, as before: the schedule of a seed stays the same.)
    let renewal = crowd_ttl.is_some() || !rng.chance(5);
    let options = LockOptions::new()
        .with_ttl(ttl)
        .with_wait_timeout(wait)
        // (A lock without renewal has a session of its own.)
        .with_renewal(renewal)
        .with_holder_label(label(id));
    let try_only = !queue && rng.chance(20);
    Tally::add(&tally.attempts);
    journal.push(Event::Started {
        id,
        client,
        at: Instant::now(),
        what: format!(
            "{primitive:?} of {} ({}, ttl {ttl:?}{})",
            names.join(","),
            if try_only {
                "try".to_owned()
            } else {
                format!("wait {wait:?}")
            },
            match (crowd_ttl.is_some(), renewal) {
                (true, _) => ", in a crowd",
                (false, true) => "",
                (false, false) => ", no renewal",
            },
        ),
    });
    if let Primitive::Multi = primitive {
        Tally::add(&tally.multi_attempts);
        journal.push(Event::Multi {
            id,
            names: names.clone(),
        });
    }
    let acquired = acquire(locker, &names, primitive, try_only, &options, id).await;
    let held = match acquired {
        Ok(Some(held)) => held,
        Ok(None) => {
            Tally::add(&tally.busy);
            journal.push(Event::Missed {
                id,
                at: Instant::now(),
            });
            return;
        }
        Err(err) if err.is_wait_timeout() => {
            Tally::add(&tally.timeouts);
            journal.push(Event::Missed {
                id,
                at: Instant::now(),
            });
            return;
        }
        Err(err) => {
            tracing::debug!(%err, "soak acquisition failed");
            Tally::add(&tally.errors);
            let key_deleted = matches!(
                err,
                LockError::LeaseLost {
                    reason: LossReason::KeyDeleted,
                    ..
                }
            );
            // Which lock's key a `lock_all` was told was deleted (the error names it).
            let deleted_lock = match &err {
                LockError::LeaseLost {
                    lock,
                    reason: LossReason::KeyDeleted,
                } if matches!(primitive, Primitive::Multi) => lock.clone(),
                _ => None,
            };
            journal.push(Event::Failed {
                id,
                client,
                name: label_of(&names),
                at: Instant::now(),
                error: err.to_string(),
                key_deleted,
                deleted_lock,
            });
            // A failing member or path: do not spin.
            tokio::time::sleep(Duration::from_millis(50)).await;
            return;
        }
    };
    Tally::add(&tally.grants);
    if let Held::Multi(_) = held {
        Tally::add(&tally.multi_grants);
    }
    // A grant per lock: a `lock_all`'s keys are each its name's holder (each with its
    // own admitted revision), told at one moment.
    let at = Instant::now();
    for guard in held.guards() {
        journal.push(Event::Grant(Grant {
            id,
            client,
            key: guard.key().to_owned(),
            token: guard.token().as_revision(),
            admitted: guard.admitted_revision(),
            ttl,
            at,
        }));
    }
    let hold = match rng.weighted(&[70, 25, 5]) {
        _ if queue => rng.millis(0, 20),
        0 => rng.millis(0, 20),
        1 => rng.millis(50, 500),
        // Well past the lease: renewal must carry it (or a lock without renewal must
        // learn its lease ran out), and a holder whose key is deleted meanwhile has
        // time to show whether it noticed (the holding check's bound is a TTL).
        _ => ttl.mul_f64(2.5) + rng.millis(0, 2000),
    };
    hold_for(id, &held, hold, journal, tally).await;
    let started = Instant::now();
    if rng.chance(85) {
        // What the guard believed just before: a guard that knew itself lost (its key
        // gone, or its lease run out by the local clock) says NotHeld whatever its delete
        // then finds, and that delete may be the one that removes the key.
        let believed_held = held.is_held();
        let outcome = match held.release().await {
            Ok(ReleaseOutcome::Released) => {
                Tally::add(&tally.released);
                Outcome::Released
            }
            Ok(ReleaseOutcome::Unconfirmed) => {
                Tally::add(&tally.unconfirmed);
                Outcome::Unconfirmed
            }
            Ok(_) => {
                Tally::add(&tally.not_held);
                if believed_held {
                    Outcome::NotHeld
                } else {
                    Outcome::KnownLost
                }
            }
            Err(_) => Outcome::Failed,
        };
        journal.push(Event::Released {
            id,
            started,
            ended: Instant::now(),
            outcome,
        });
    } else {
        Tally::add(&tally.dropped);
        drop(held);
        journal.push(Event::Released {
            id,
            started,
            ended: Instant::now(),
            outcome: Outcome::Dropped,
        });
    }
}

/// `name` and 1 to 3 other names of `pool` (2 to 4 in all, as many as the pool has), in
/// a random order.
fn several(name: &str, pool: &[String], rng: &mut Rng) -> Vec<String> {
    let mut others: Vec<&String> = pool.iter().filter(|other| *other != name).collect();
    let wanted = (1 + rng.index(3)).min(others.len());
    let mut names = vec![name.to_owned()];
    for _ in 0..wanted {
        names.push(others.swap_remove(rng.index(others.len())).clone());
    }
    // Fisher-Yates: the name of the crowd is not always first.
    for i in (1..names.len()).rev() {
        names.swap(i, rng.index(i + 1));
    }
    names
}

/// What the library calls an acquisition of `names` in its errors: the names sorted,
/// joined by commas (one name: itself).
fn label_of(names: &[String]) -> String {
    let mut sorted: Vec<&str> = names.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    sorted.join(",")
}

/// Takes `names` (one, but for [`Primitive::Multi`]) as `primitive`.
async fn acquire(
    locker: &EtcdLocker,
    names: &[String],
    primitive: Primitive,
    try_only: bool,
    options: &LockOptions,
    id: u64,
) -> Result<Option<Held>, LockError> {
    let guard = |g: EtcdGuard| Held::Guard(g);
    let name = names.first().map_or("", String::as_str);
    match primitive {
        Primitive::Multi => {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            if try_only {
                Ok(locker.try_lock_all(&names, options).await?.map(Held::Multi))
            } else {
                Ok(Some(Held::Multi(locker.lock_all(&names, options).await?)))
            }
        }
        Primitive::Lock if try_only => Ok(locker.try_lock(name, options).await?.map(guard)),
        Primitive::Lock => Ok(Some(guard(locker.lock(name, options).await?))),
        Primitive::Permit => {
            let semaphore = locker.semaphore(name, 2)?;
            if try_only {
                Ok(semaphore.try_acquire(options).await?.map(guard))
            } else {
                Ok(Some(guard(semaphore.acquire(options).await?)))
            }
        }
        Primitive::Read | Primitive::Write => {
            let rw = locker.rwlock(name)?;
            let reading = matches!(primitive, Primitive::Read);
            match (reading, try_only) {
                (true, true) => Ok(rw.try_read(options).await?.map(guard)),
                (true, false) => Ok(Some(guard(rw.read(options).await?))),
                (false, true) => Ok(rw.try_write(options).await?.map(guard)),
                (false, false) => Ok(Some(guard(rw.write(options).await?))),
            }
        }
        Primitive::Leader => {
            let election = locker.election(name)?;
            Ok(Some(Held::Leader(
                election.campaign(label(id), options).await?,
            )))
        }
    }
}

/// A lock's TTL: 2 s or 3 s, so that acquisitions of one client use two renewed
/// sessions.
fn ttl(rng: &mut Rng) -> Duration {
    Duration::from_secs(if rng.chance(60) { 2 } else { 3 })
}

/// The label (and an election's value) of acquisition `id`: what the checker finds it
/// by in a key's value.
pub(crate) fn label(id: u64) -> String {
    format!("soak-acquisition-{id}")
}

/// Holds for `hold`, sampling `is_held()` every 50 ms (so before and after every fault
/// that lands meanwhile) until the guard is let go, and listening to `lost()`: a guard
/// that heard of its loss is still sampled, since `is_held()` must say false from then on.
async fn hold_for(id: u64, held: &Held, hold: Duration, journal: &Journal, tally: &Tally) {
    let until = Instant::now() + hold;
    let lost = held.lost();
    tokio::pin!(lost);
    let mut heard = false;
    loop {
        journal.push(Event::Held {
            id,
            at: Instant::now(),
            held: held.is_held(),
        });
        let now = Instant::now();
        if now >= until {
            return;
        }
        let step = (until - now).min(Duration::from_millis(50));
        if heard {
            // Held on to (as a careless client would) until its time is up.
            tokio::time::sleep(step).await;
            continue;
        }
        tokio::select! {
            () = tokio::time::sleep(step) => {}
            (key, reason) = &mut lost => {
                heard = true;
                Tally::add(&tally.losses);
                journal.push(Event::Lost { id, at: Instant::now(), reason, key });
            }
        }
    }
}
