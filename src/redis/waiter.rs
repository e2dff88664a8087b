//! A waiting acquisition's registration in its lock's waiters' set: what makes a release
//! publish (`scripts.rs`: `REGISTER`, `RELEASE`, `ACQUIRE`, `LOCK_ALL`; issue 38).
//!
//! The order that keeps every waiter woken: the waiter subscribes (armed before the
//! attempt: `acquire.rs`), then a refused attempt registers it in the same server-side
//! step as it finds the lock held, so a release either comes before that step (and the
//! waiter finds the lock free) or sees the registration and publishes.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::node::Waiter;
use super::owner::owner_value;

/// How long a waiter's registration lasts on the server: a lock's waiter refreshes it on
/// a refused attempt once it is `max_wait_sleep` old, and between that attempt and the
/// observation of the one after come at most a sleep (`max_wait_sleep` and its 20 %
/// jitter) and two requests (each within the request timeout): 2.2 sleeps and 2
/// requests. Three sleeps and two requests cover that, so a live waiter is never
/// unregistered by expiry. If something still outlasts it (a stalled server), the release
/// publishes to no one and the waiter wakes from its bounded sleep: a lost message costs
/// one sleep, as it always did.
/// (Saturating: neither setting has an upper bound.)
fn lease(max_wait_sleep: Duration, request_timeout: Duration) -> Duration {
    max_wait_sleep
        .saturating_mul(3)
        .saturating_add(request_timeout.saturating_mul(2))
}

/// One acquisition's registration state.
#[derive(Clone, Debug, Default)]
pub(crate) struct Registration {
    /// Our id in the set, drawn at the first attempt made while subscribed (not the
    /// owner value: the set is readable by anyone who reads keys).
    id: Option<Arc<str>>,
    /// When the last attempt that registered us was sent (the registration reached the
    /// server later): refreshed once this is `max_wait_sleep` old.
    at: Option<Instant>,
    /// Whether the set may hold our id: set before an attempt that may register (its
    /// answer may be lost), cleared when someone else takes over unregistering it.
    maybe: bool,
    /// Several locks: the one (index in the set) whose waiters' set the last refusal
    /// registered us in (a set's refusal registers in one held lock's set: the next
    /// refusal that registers elsewhere leaves it).
    on: Option<usize>,
}

impl Registration {
    /// What the next attempt tells the server, made while subscribed. `in_script`: the
    /// attempt is one script that registers on every refusal (it costs no extra
    /// request) and unregisters at the grant: a semaphore's of several permits, several
    /// locks taken together. A lock's refusal registers (a request of its own) only when
    /// the registration is due.
    pub(crate) fn attempt(
        &mut self,
        max_wait_sleep: Duration,
        request_timeout: Duration,
        in_script: bool,
    ) -> (Arc<str>, Duration, bool, Option<usize>) {
        let register = in_script || self.at.is_none_or(|at| at.elapsed() >= max_wait_sleep);
        self.maybe |= register;
        let id = self.id.get_or_insert_with(owner_value).clone();
        (
            id,
            lease(max_wait_sleep, request_timeout),
            register,
            self.on,
        )
    }

    /// The attempt sent at `sent` registered us (several locks: with lock `on`).
    pub(crate) fn registered(&mut self, sent: Instant, on: Option<usize>) {
        self.at = Some(sent);
        self.on = on;
    }

    /// An attempt failed without an answer (a restart may have emptied the set): the
    /// next refusal registers again.
    pub(crate) fn unsure(&mut self) {
        self.at = None;
    }

    /// The id the guard of a lock (one slot) unregisters with its release; `None` for a
    /// grant made `in_script` (see [`attempt`](Self::attempt)), which unregistered it
    /// already. Ours to unregister until [`handed`](Self::handed).
    pub(crate) fn for_guard(&self, in_script: bool) -> Option<Arc<str>> {
        self.id.clone().filter(|_| self.maybe && !in_script)
    }

    /// The grant's guard exists: the id is no longer ours to unregister (the guard's
    /// release does it, or the granting script did).
    pub(crate) fn handed(&mut self) {
        self.maybe = false;
    }

    /// The id to unregister when the acquisition ends without a guard, if it may be in
    /// the set.
    pub(crate) fn take_for_cleanup(&mut self) -> Option<Arc<str>> {
        self.id.take().filter(|_| self.maybe)
    }
}

/// `attempt`'s answer as the node takes it.
pub(crate) fn waiter(parts: &(Arc<str>, Duration, bool, Option<usize>)) -> Waiter<'_> {
    Waiter {
        id: &parts.0,
        lease: parts.1,
        register: parts.2,
        previous: parts.3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_registers_again_only_when_due_a_script_always() {
        let sleep = Duration::from_secs(60);
        let mut lock = Registration::default();
        assert!(lock.attempt(sleep, Duration::from_secs(1), false).2);
        lock.registered(Instant::now(), None);
        assert!(!lock.attempt(sleep, Duration::from_secs(1), false).2);
        lock.unsure();
        assert!(lock.attempt(sleep, Duration::from_secs(1), false).2);
        let mut semaphore = Registration::default();
        semaphore.registered(Instant::now(), None);
        assert!(semaphore.attempt(sleep, Duration::from_secs(1), true).2);
        assert_eq!(
            semaphore.for_guard(true),
            None,
            "the script unregistered it"
        );
        semaphore.handed();
        assert_eq!(semaphore.take_for_cleanup(), None);
        // A lock's guard gets the id; until it exists, a cleanup would unregister it.
        assert!(lock.for_guard(false).is_some());
        assert!(lock.clone().take_for_cleanup().is_some());
        lock.handed();
        assert_eq!(lock.take_for_cleanup(), None);
    }

    #[test]
    fn a_set_tells_the_next_attempt_which_set_it_registered_in() {
        let (sleep, request) = (Duration::from_secs(60), Duration::from_secs(1));
        let mut set = Registration::default();
        assert_eq!(set.attempt(sleep, request, true).3, None);
        set.registered(Instant::now(), Some(2));
        assert_eq!(set.attempt(sleep, request, true).3, Some(2));
        // An answer lost: still possibly there (and maybe elsewhere: that one expires).
        set.unsure();
        assert_eq!(set.attempt(sleep, request, true).3, Some(2));
        set.registered(Instant::now(), Some(0));
        assert_eq!(set.attempt(sleep, request, true).3, Some(0));
    }

    #[test]
    fn the_lease_outlasts_the_longest_stretch_between_attempts() {
        let (sleep, request) = (Duration::from_secs(2), Duration::from_secs(1));
        // Refreshed once a sleep old; then a jittered sleep and two requests at most.
        assert!(lease(sleep, request) > sleep + sleep.mul_f64(1.2) + request * 2);
        // Settings without an upper bound do not overflow it.
        assert_eq!(lease(Duration::MAX, request), Duration::MAX);
    }
}
