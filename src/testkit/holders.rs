//! What the multi-lock tests check in process: who holds which lock right now, and each
//! lock's tokens over all clients.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::FencingToken;

/// Who holds what, checked by every holder of a fixed set of lock names: no name held
/// twice at once, and each name's tokens strictly increasing over all clients (a holder
/// enters after the previous one left, so its grant came later).
#[derive(Debug)]
pub struct Holders {
    now: HashMap<String, AtomicBool>,
    last: Mutex<HashMap<String, FencingToken>>,
}

impl Holders {
    /// Nobody holds any of `names` yet.
    #[must_use]
    pub fn new(names: &[&str]) -> Self {
        Self {
            now: names
                .iter()
                .map(|name| ((*name).to_owned(), AtomicBool::new(false)))
                .collect(),
            last: Mutex::default(),
        }
    }

    /// A client was granted `name` with `token`.
    ///
    /// # Panics
    ///
    /// If someone else holds `name` now, if `token` is not above every earlier grant's
    /// of `name`, or if `name` is not one of the names given to [`new`](Self::new).
    pub fn enter(&self, name: &str, token: FencingToken) {
        assert!(
            !self.held(name).swap(true, Ordering::SeqCst),
            "{name} held twice at once"
        );
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(previous) = last.insert(name.to_owned(), token) {
            assert!(token > previous, "{name}: token {token} after {previous}");
        }
    }

    /// The client holding `name` is about to release it.
    pub fn leave(&self, name: &str) {
        self.held(name).store(false, Ordering::SeqCst);
    }

    fn held(&self, name: &str) -> &AtomicBool {
        self.now
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not one of the names watched"))
    }
}

/// The next pseudo-random subset of `names` (never empty), sometimes reversed: a small
/// deterministic generator, so each `seed` gives a schedule that repeats.
pub fn random_set<'a>(seed: &mut u64, names: &[&'a str]) -> Vec<&'a str> {
    *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    let mut set: Vec<&str> = names
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            let bit = u32::try_from(i + 20).unwrap_or(0) % 64;
            seed.rotate_right(bit) & 1 == 1
        })
        .map(|(_, name)| *name)
        .collect();
    if set.is_empty() {
        if let Some(name) = names.get(3 % names.len().max(1)) {
            set.push(name);
        }
    }
    if *seed & 1 == 1 {
        set.reverse();
    }
    set
}
