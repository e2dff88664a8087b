//! The contract of [`LockBackend`] and [`LockGuard`], written once, as checks any backend
//! runs against its real server: fencelock's etcd, Redis, Redlock and PostgreSQL backends
//! do (`tests/*/conformance.rs`), and a backend of your own can too.
//!
//! Each check panics, like `assert!`, with a message that names the broken promise. Every
//! bound in them is a limit on a wait for an event; the only time let pass on purpose is
//! the 300 ms a waiting acquisition runs before it is dropped (the fault being injected).
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use fencelock::etcd::{EtcdGuard, EtcdLocker};
//! use fencelock::testkit::{EtcdCluster, conformance::Contract};
//!
//! let cluster = EtcdCluster::single().await?;
//! let mut clients = Vec::new();
//! for _ in 0..3 {
//!     clients.push(EtcdLocker::connect(cluster.config("contract")).await?);
//! }
//! let admin = cluster.client().await?;
//! Contract::new(clients)
//!     // How the server takes a lock away from its holder behind its back; a failure
//!     // here fails the check that follows (the lock is not reported lost).
//!     .with_take_away(move |guard: &EtcdGuard| {
//!         let (mut admin, lease) = (admin.clone(), guard.lease_id());
//!         Box::pin(async move {
//!             let _ = admin.lease_revoke(lease).await;
//!         })
//!     })
//!     .run_all()
//!     .await;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};

/// Takes a held lock away from its holder on the server (revokes its lease, deletes its
/// key, kills its connection), as an operator or a failure would.
pub type TakeAway<G> = Box<dyn Fn(&G) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// How long a promise may take to show: a lock freed by a release, a timeout, a loss.
const PROMPTLY: Duration = Duration::from_secs(5);

/// The contract, for one backend: at least two clients (three for the contention check
/// to mean much), each with connections of its own.
#[must_use]
pub struct Contract<B: LockBackend> {
    clients: Vec<Arc<B>>,
    take_away: Option<TakeAway<B::Guard>>,
    ttl: Duration,
    expires: bool,
    run: u32,
}

impl<B> Contract<B>
where
    B: LockBackend + 'static,
{
    /// The contract for these clients of one backend, on one server (or cluster).
    ///
    /// # Panics
    ///
    /// With fewer than two clients: exclusion needs someone to exclude.
    pub fn new(clients: Vec<B>) -> Self {
        assert!(
            clients.len() >= 2,
            "the contract needs at least two clients"
        );
        static RUNS: AtomicU32 = AtomicU32::new(0);
        Self {
            clients: clients.into_iter().map(Arc::new).collect(),
            take_away: None,
            ttl: Duration::from_secs(2),
            expires: true,
            run: RUNS.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// How the server takes a lock away (without it, [`Contract::lost_when_taken_away`]
    /// is skipped by [`Contract::run_all`]).
    pub fn with_take_away(
        mut self,
        take_away: impl Fn(&B::Guard) -> Pin<Box<dyn Future<Output = ()> + Send>>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.take_away = Some(Box::new(take_away));
        self
    }

    /// The TTL of the locks the checks take (default 2 s; at least the backend's
    /// minimum).
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Whether a lock taken without renewal ends with its TTL (default: yes; no for
    /// PostgreSQL advisory locks, which live as long as their connection).
    pub fn with_expiry(mut self, expires: bool) -> Self {
        self.expires = expires;
        self
    }

    /// Runs every check, one after the other, each on lock names of its own.
    pub async fn run_all(&self) {
        self.exclusion_under_contention().await;
        self.tokens_increase_per_grant().await;
        self.try_lock_on_a_held_lock().await;
        self.wait_timeout_leaves_nothing_behind().await;
        self.dropped_acquisition_leaves_nothing_behind().await;
        if self.expires {
            self.late_release_is_not_held().await;
            self.section_ends_before_the_lock_passes_on().await;
        }
        if self.take_away.is_some() {
            self.lost_when_taken_away().await;
        }
    }

    fn name(&self, check: &str) -> String {
        format!("contract-{}-{check}", self.run)
    }

    fn options(&self) -> LockOptions {
        LockOptions::new().with_ttl(self.ttl)
    }

    /// Acquires within [`PROMPTLY`], or panics saying what was expected.
    async fn lock_promptly(&self, client: usize, name: &str, why: &str) -> B::Guard {
        let options = self.options().with_wait_timeout(PROMPTLY);
        match self.clients[client].lock(name, &options).await {
            Ok(guard) => guard,
            Err(err) => panic!("{why}: client {client} could not take {name:?}: {err}"),
        }
    }

    /// Clients take turns on one lock, each reading a counter, yielding, and writing it
    /// back incremented: no two hold it at once, and no increment is lost.
    pub async fn exclusion_under_contention(&self) {
        const ROUNDS: u64 = 5;
        let name = self.name("exclusion");
        let counter = Arc::new(AtomicU64::new(0));
        let inside = Arc::new(AtomicBool::new(false));
        let overlaps = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for client in &self.clients {
            let (client, name) = (client.clone(), name.clone());
            let (counter, inside, overlaps) = (counter.clone(), inside.clone(), overlaps.clone());
            let options = self.options().with_wait_timeout(Duration::from_secs(30));
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = client.lock(&name, &options).await?;
                    if inside.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    let seen = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(seen + 1, Ordering::SeqCst);
                    inside.store(false, Ordering::SeqCst);
                    if guard.release().await? != ReleaseOutcome::Released {
                        // A holder that no longer held the lock at its release: someone
                        // else may have been inside with it.
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Ok::<_, crate::LockError>(())
            }));
        }
        for task in tasks {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => panic!("exclusion: a client failed: {err}"),
                Err(err) => panic!("exclusion: a client panicked: {err}"),
            }
        }
        let expected = ROUNDS * self.clients.len() as u64;
        assert_eq!(
            overlaps.load(Ordering::SeqCst),
            0,
            "exclusion: two clients held {name:?} at once"
        );
        assert_eq!(
            counter.load(Ordering::SeqCst),
            expected,
            "exclusion: increments were lost"
        );
    }

    /// Every grant of a lock carries a token larger than every earlier grant's, whichever
    /// client it goes to.
    pub async fn tokens_increase_per_grant(&self) {
        let name = self.name("tokens");
        let mut last = None;
        for round in 0..3 * self.clients.len() {
            let client = round % self.clients.len();
            let guard = self.lock_promptly(client, &name, "tokens").await;
            let token = guard.token();
            if let Some(last) = last {
                assert!(
                    token > last,
                    "tokens: grant {round} got token {token}, not above the previous {last}"
                );
            }
            last = Some(token);
            assert_eq!(
                guard.release().await.ok(),
                Some(ReleaseOutcome::Released),
                "tokens: a release of a held lock must report Released"
            );
        }
    }

    /// `try_lock` on a held lock returns `None` at once (and takes nothing); once the lock
    /// is released, it takes it.
    pub async fn try_lock_on_a_held_lock(&self) {
        let name = self.name("try-lock");
        let held = self.lock_promptly(0, &name, "try_lock").await;
        let attempt =
            tokio::time::timeout(PROMPTLY, self.clients[1].try_lock(&name, &self.options()))
                .await
                .unwrap_or_else(|_| panic!("try_lock: did not return within {PROMPTLY:?}"));
        match attempt {
            Ok(None) => {}
            Ok(Some(guard)) => panic!(
                "try_lock: took {name:?} (token {}) while another client held it",
                guard.token()
            ),
            Err(err) => panic!("try_lock: failed instead of returning None: {err}"),
        }
        assert!(
            held.is_held(),
            "try_lock: the holder lost the lock to a miss"
        );
        let _ = held.release().await;
        match self.clients[1].try_lock(&name, &self.options()).await {
            Ok(Some(guard)) => {
                let _ = guard.release().await;
            }
            Ok(None) => panic!("try_lock: a released lock was not taken"),
            Err(err) => panic!("try_lock: a released lock was not taken: {err}"),
        }
    }

    /// A wait that times out returns `WaitTimeout` no earlier than the timeout, and
    /// leaves nothing that delays the next client once the holder releases.
    pub async fn wait_timeout_leaves_nothing_behind(&self) {
        let name = self.name("wait-timeout");
        let held = self.lock_promptly(0, &name, "wait timeout").await;
        let wait = Duration::from_millis(300);
        let started = Instant::now();
        let outcome = self.clients[1]
            .lock(&name, &self.options().with_wait_timeout(wait))
            .await;
        let waited = started.elapsed();
        match outcome {
            Err(err) if err.is_wait_timeout() => {}
            Err(err) => panic!("wait timeout: failed with another error: {err}"),
            Ok(guard) => panic!(
                "wait timeout: took {name:?} (token {}) while another client held it",
                guard.token()
            ),
        }
        assert!(
            waited >= wait && waited < wait + PROMPTLY,
            "wait timeout: returned after {waited:?} for a {wait:?} timeout"
        );
        let _ = held.release().await;
        let next = self
            .lock_promptly(self.clients.len() - 1, &name, "after a wait timed out")
            .await;
        let _ = next.release().await;
    }

    /// An acquisition dropped while it waits leaves nothing that delays the next client.
    pub async fn dropped_acquisition_leaves_nothing_behind(&self) {
        let name = self.name("dropped");
        let held = self.lock_promptly(0, &name, "dropped acquisition").await;
        // Dropped mid-wait, as a caller's own timeout or a cancelled task does.
        let options = self.options();
        let waiting = self.clients[1].lock(&name, &options);
        match tokio::time::timeout(Duration::from_millis(300), waiting).await {
            Err(_elapsed) => {}
            Ok(Ok(guard)) => panic!(
                "dropped acquisition: took {name:?} (token {}) while another client held it",
                guard.token()
            ),
            Ok(Err(err)) => panic!(
                "dropped acquisition: the wait for {name:?} failed early instead of waiting: {err}"
            ),
        }
        let _ = held.release().await;
        let next = self
            .lock_promptly(self.clients.len() - 1, &name, "after a dropped acquisition")
            .await;
        let _ = next.release().await;
    }

    /// A lock taken without renewal ends with its TTL: the guard reports the loss, the
    /// next client takes the lock with a larger token, and the late release says
    /// `NotHeld`.
    pub async fn late_release_is_not_held(&self) {
        let name = self.name("late-release");
        let options = self
            .options()
            .with_renewal(false)
            .with_wait_timeout(PROMPTLY);
        let late = match self.clients[0].lock(&name, &options).await {
            Ok(guard) => guard,
            Err(err) => panic!("late release: could not take {name:?}: {err}"),
        };
        tokio::time::timeout(self.ttl + PROMPTLY, late.lost())
            .await
            .unwrap_or_else(|_| panic!("late release: no loss reported after the TTL"));
        assert!(!late.is_held(), "late release: is_held() after the loss");
        let next = self.lock_promptly(1, &name, "after the TTL").await;
        assert!(
            next.token() > late.token(),
            "late release: the next grant's token is not above the expired one's"
        );
        assert_eq!(
            late.release().await.ok(),
            Some(ReleaseOutcome::NotHeld),
            "late release: releasing an expired lock must report NotHeld"
        );
        assert!(
            next.is_held(),
            "late release: the late release freed the next holder's lock"
        );
        let _ = next.release().await;
    }

    /// A critical section run with [`LockGuard::run`] on a lock that ends with its TTL
    /// (no renewal) is dropped before the next client is granted the lock, and `run`
    /// says it was cut short.
    pub async fn section_ends_before_the_lock_passes_on(&self) {
        /// Records when the section was dropped.
        struct Dropped(Arc<std::sync::Mutex<Option<Instant>>>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                *self
                    .0
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
            }
        }
        let name = self.name("scoped");
        let options = self
            .options()
            .with_renewal(false)
            .with_wait_timeout(PROMPTLY);
        let held = match self.clients[0].lock(&name, &options).await {
            Ok(guard) => guard,
            Err(err) => panic!("scoped section: could not take {name:?}: {err}"),
        };
        let dropped = Arc::new(std::sync::Mutex::new(None));
        let section = {
            let marker = Dropped(dropped.clone());
            async move {
                let _marker = marker;
                std::future::pending::<()>().await;
            }
        };
        let (cut, next) = tokio::join!(
            async {
                let cut = tokio::time::timeout(self.ttl + PROMPTLY, held.run(section)).await;
                (cut, Instant::now())
            },
            async {
                let options = self.options().with_wait_timeout(self.ttl + PROMPTLY);
                match self.clients[1].lock(&name, &options).await {
                    Ok(guard) => (guard, Instant::now()),
                    Err(err) => panic!("scoped section: the next client got no lock: {err}"),
                }
            }
        );
        let ((cut, _), (next, granted)) = (cut, next);
        match cut {
            Ok(Err(err)) if err.is_lost() => {}
            Ok(other) => panic!("scoped section: run() did not report the loss: {other:?}"),
            Err(_) => panic!("scoped section: run() went on past the lease"),
        }
        let dropped_at = dropped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .unwrap_or_else(|| panic!("scoped section: the section was never dropped"));
        assert!(
            dropped_at < granted,
            "scoped section: the section was dropped {:?} after the next grant",
            dropped_at - granted
        );
        let _ = held.release().await;
        let _ = next.release().await;
    }

    /// A lock taken away on the server: `lost()` resolves, `is_held()` turns false, the
    /// next client takes the lock, and the old holder's release says `NotHeld`.
    ///
    /// # Panics
    ///
    /// Without [`Contract::with_take_away`].
    pub async fn lost_when_taken_away(&self) {
        let Some(take_away) = &self.take_away else {
            panic!("lost when taken away: the contract has no take-away hook");
        };
        let name = self.name("taken-away");
        let held = self.lock_promptly(0, &name, "taken away").await;
        take_away(&held).await;
        tokio::time::timeout(PROMPTLY, held.lost())
            .await
            .unwrap_or_else(|_| panic!("taken away: lost() did not resolve within {PROMPTLY:?}"));
        assert!(!held.is_held(), "taken away: is_held() after the loss");
        let next = self
            .lock_promptly(1, &name, "after it was taken away")
            .await;
        assert_eq!(
            held.release().await.ok(),
            Some(ReleaseOutcome::NotHeld),
            "taken away: releasing a lock taken away must report NotHeld"
        );
        assert!(
            next.is_held(),
            "taken away: the old holder's release freed the next one's lock"
        );
        let _ = next.release().await;
    }
}

#[cfg(test)]
mod tests {
    //! The contract catches a backend that breaks it: an in-memory "lock" that grants
    //! everyone at once (pure logic, no server: it checks the checks).

    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::{FencingToken, LockError, LossReason};

    #[derive(Default)]
    struct GrantsEveryone(Arc<AtomicU64>);

    struct Granted(FencingToken);

    impl LockGuard for Granted {
        fn token(&self) -> FencingToken {
            self.0
        }
        fn name(&self) -> &str {
            "any"
        }
        async fn lost(&self) -> LossReason {
            std::future::pending().await
        }
        fn is_held(&self) -> bool {
            true
        }
        fn lease_remaining(&self) -> Option<Duration> {
            None
        }
        async fn release(self) -> Result<ReleaseOutcome, LockError> {
            Ok(ReleaseOutcome::Released)
        }
    }

    impl LockBackend for GrantsEveryone {
        type Guard = Granted;
        async fn lock(&self, _: &str, _: &LockOptions) -> Result<Granted, LockError> {
            let token = self.0.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(Granted(FencingToken::new(token)))
        }
        async fn try_lock(
            &self,
            name: &str,
            options: &LockOptions,
        ) -> Result<Option<Granted>, LockError> {
            self.lock(name, options).await.map(Some)
        }
    }

    fn broken() -> Contract<GrantsEveryone> {
        let tokens = Arc::new(AtomicU64::new(0));
        Contract::new(vec![GrantsEveryone(tokens.clone()), GrantsEveryone(tokens)])
    }

    #[tokio::test]
    #[should_panic(expected = "try_lock: took")]
    async fn a_lock_that_grants_everyone_fails_the_try_lock_check() {
        broken().try_lock_on_a_held_lock().await;
    }

    #[tokio::test]
    #[should_panic(expected = "wait timeout: took")]
    async fn a_lock_that_grants_everyone_fails_the_wait_timeout_check() {
        broken().wait_timeout_leaves_nothing_behind().await;
    }

    #[tokio::test]
    #[should_panic(expected = "scoped section: run() went on past the lease")]
    async fn a_lock_that_never_ends_fails_the_scoped_section_check() {
        tokio::time::pause();
        broken()
            .with_ttl(Duration::from_millis(100))
            .section_ends_before_the_lock_passes_on()
            .await;
    }

    #[tokio::test]
    #[should_panic(expected = "late release: no loss reported")]
    async fn a_lock_that_never_expires_fails_the_late_release_check() {
        tokio::time::pause();
        broken()
            .with_ttl(Duration::from_millis(100))
            .late_release_is_not_held()
            .await;
    }
}
