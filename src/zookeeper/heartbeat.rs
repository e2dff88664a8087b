//! What an answered heartbeat proves about the session's expiry on the leader, without
//! I/O: the rule that moves a session's local deadline (`session.rs` sends the
//! heartbeats and applies it).
//!
//! Only the ensemble's **leader** expires sessions. A client talking to a follower is
//! known to the leader only through that follower: the follower notes the session as
//! touched by every request it gets, and reports what it noted in its reply to the
//! leader's next ping (`Learner.ping`, the touch table), which the leader sends each
//! follower every half tick (`Leader.lead`); the leader's expiry of the session is then
//! at least the time of that report plus the session timeout (rounded up to a tick,
//! `ExpiryQueue`). A read answered by a follower proves nothing about the leader: a
//! follower cut off from the leader answers reads for up to `syncLimit` ticks.
//!
//! So the heartbeat is a `sync`: a follower forwards it to the leader on its one ordered
//! connection to it and answers once the leader answered (a leader or a standalone
//! server answers it itself). When heartbeat *k*'s `sync` is answered, everything the
//! follower had written to the leader before forwarding it has reached the leader,
//! including its reply to every ping it had got by then. An earlier heartbeat *j*
//! touched the session on its server before it was answered; if a whole ping period
//! passed between *j*'s answer and *k*'s sending, a ping came in between, and its reply,
//! carrying *j*'s touch, reached the leader before *k* did. The leader's expiry is then
//! at least *j*'s send time plus the timeout: that is the new local deadline.
//!
//! Different connections are covered too: if *j* was answered on one connection and *k*
//! on a later one, the client reconnected in between, after *j*'s answer, and a
//! reconnection revalidates the session on the leader (`REVALIDATE`, which touches it
//! there) before it is established.
//!
//! The ping period is half a tick, and the server grants session timeouts of at least
//! two ticks (`minSessionTimeout`'s default, which an operator can lower: this rule
//! assumes it is not set below two ticks), so a ping period is at most a quarter of the
//! timeout. [`PING_GAP`] asks for 0.3 of it, a twentieth of the timeout to spare for a
//! ping sent or handled late.

use std::collections::VecDeque;
use std::time::Duration;

use crate::lease_clock::ClockInstant;

/// Heartbeats per session timeout, send to send. Six: the deadline a confirmed heartbeat
/// sets comes from one two beats earlier (a ping period must lie between), so it lies
/// about two thirds of the timeout ahead; with a beat every sixth of the timeout, two
/// heartbeats in a row may go unanswered before the lock is reported lost.
const BEATS_PER_TIMEOUT: u32 = 6;

/// How far apart, at least, an earlier heartbeat's answer and a later heartbeat's sending
/// must be for the later one's `sync` to prove the earlier one's touch reached the leader,
/// in tenths of the timeout (see the module docs).
const PING_GAP_TENTHS: u32 = 3;

/// The interval between heartbeats (send to send) for a session timeout.
pub(crate) fn interval(timeout: Duration) -> Duration {
    timeout / BEATS_PER_TIMEOUT
}

/// The smallest gap between an earlier heartbeat's answer and a later heartbeat's
/// sending for a session timeout; see [`PING_GAP_TENTHS`].
pub(crate) fn ping_gap(timeout: Duration) -> Duration {
    timeout * PING_GAP_TENTHS / 10
}

/// The heartbeats answered lately: when each was sent and when its answer came.
#[derive(Debug)]
pub(crate) struct Answered {
    timeout: Duration,
    recent: VecDeque<(ClockInstant, ClockInstant)>,
}

/// How many answered heartbeats are kept: enough to find one a ping period back when
/// every beat is answered (two back) or a few are retried at once.
const KEPT: usize = 8;

impl Answered {
    pub(crate) fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            recent: VecDeque::with_capacity(KEPT),
        }
    }

    /// Heartbeat sent at `sent` was answered at `answered`: returns the local deadline
    /// that answer proves (the send time of the latest earlier heartbeat answered at
    /// least [`ping_gap`] before `sent`, plus the timeout), if any earlier heartbeat
    /// qualifies, and keeps this one for the next.
    pub(crate) fn confirm(
        &mut self,
        sent: ClockInstant,
        answered: ClockInstant,
    ) -> Option<ClockInstant> {
        let gap = ping_gap(self.timeout);
        let proven = self
            .recent
            .iter()
            .rev()
            .find(|&&(_, earlier_answer)| earlier_answer + gap <= sent)
            .map(|&(earlier_sent, _)| earlier_sent + self.timeout);
        if self.recent.len() == KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back((sent, answered));
        proven
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> ClockInstant {
        ClockInstant::from_duration(Duration::from_millis(ms))
    }

    const TIMEOUT: Duration = Duration::from_millis(1_000);

    #[test]
    fn the_first_answer_proves_nothing() {
        let mut answered = Answered::new(TIMEOUT);
        assert_eq!(answered.confirm(at(0), at(5)), None);
    }

    #[test]
    fn an_answer_proves_the_heartbeat_a_ping_period_before_it() {
        let mut answered = Answered::new(TIMEOUT);
        // Beats every sixth of the timeout (166 ms), each answered in 5 ms.
        assert_eq!(answered.confirm(at(0), at(5)), None);
        // 161 ms after the first answer: no ping need have come in between.
        assert_eq!(answered.confirm(at(166), at(171)), None);
        // 328 ms after it (>= 300 ms): the first one's touch reached the leader.
        assert_eq!(answered.confirm(at(333), at(338)), Some(at(1_000)));
        assert_eq!(answered.confirm(at(500), at(505)), Some(at(1_166)));
    }

    #[test]
    fn the_latest_heartbeat_far_enough_back_counts() {
        let mut answered = Answered::new(TIMEOUT);
        answered.confirm(at(0), at(5));
        answered.confirm(at(100), at(105));
        answered.confirm(at(200), at(205));
        // Answered at 105 and 205: only 105 is 300 ms before 450.
        assert_eq!(answered.confirm(at(450), at(460)), Some(at(1_100)));
    }

    #[test]
    fn a_slow_answer_counts_from_when_it_came() {
        let mut answered = Answered::new(TIMEOUT);
        // Sent at 0, answered only at 250: its touch may have reached its server at 249.
        answered.confirm(at(0), at(250));
        assert_eq!(answered.confirm(at(400), at(405)), None);
        assert_eq!(answered.confirm(at(550), at(555)), Some(at(1_000)));
    }

    #[test]
    fn only_the_latest_answers_are_kept() {
        let mut answered = Answered::new(TIMEOUT);
        for i in 0..20 {
            answered.confirm(at(i * 10), at(i * 10 + 1));
        }
        assert_eq!(answered.recent.len(), KEPT);
    }

    #[test]
    fn a_ping_period_fits_in_the_gap() {
        // Timeouts are at least two ticks, pings go every half tick: a quarter of the
        // timeout at most, under the gap; and two beats span the gap.
        for timeout in [200, 1_000, 4_000, 40_000].map(Duration::from_millis) {
            assert!(timeout / 4 < ping_gap(timeout));
            assert!(2 * interval(timeout) >= ping_gap(timeout));
        }
    }
}
