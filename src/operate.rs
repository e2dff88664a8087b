//! What operators and token-checking services ask of a lock service beside locking: is
//! this token still current, and breaking a stuck holder.

use crate::FencingToken;

/// What a lock service says of a token at the moment it is asked (`check`).
///
/// A check is a moment, not a promise: the holder can lose the lock right after it is
/// answered `Current`, and a write sent on that answer can arrive after the next grant.
/// It narrows the window in which a stale holder's write gets through (Chubby's
/// `CheckSequencer` for services that cannot keep a fence row: an HTTP API, a message
/// consumer); only a fence in the storage itself closes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenCheck {
    /// The grant with this token holds the lock now.
    Current,
    /// Another grant holds the lock now, with token `by` (larger, unless the lock
    /// service's history went back: see `fencelock locks --newest-token`).
    Superseded {
        /// The token that holds now.
        by: FencingToken,
    },
    /// Nobody holds the lock now.
    Free,
}

impl TokenCheck {
    /// Whether the token holds the lock now.
    #[must_use]
    pub fn is_current(self) -> bool {
        self == Self::Current
    }
}

/// What breaking a holder did (`break_holder`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BreakOutcome {
    /// The holder with that token was removed: its guard learns it (`lost()`, with
    /// `LossReason::KeyDeleted`), and the next waiter is granted with a larger token, so
    /// fenced storage refuses the broken holder's late writes.
    Broken,
    /// No holder has that token (released, expired or broken already; or it is waiting,
    /// not holding): nothing was removed. `holder` is the token that holds now, if any.
    NotHolding {
        /// The token that holds now.
        holder: Option<FencingToken>,
    },
}
