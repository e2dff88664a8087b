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
//! timeout. [`PING_GAP_HUNDREDTHS`] asks for 0.35 of it, a tenth of the timeout to spare
//! for a ping sent or handled late (the leader sends its pings under its own monitor,
//! which its other work also takes). In steady state a proof reaches four beats back
//! (0.4 of the timeout), which leaves a further 0.05 less the answer's round trip.
//!
//! What the rule does not cover (docs/zookeeper.md says the same):
//!
//! - **A stale leader.** A leader cut off from its followers while they see it gone at
//!   once (an asymmetric failure) goes on answering `sync`s until `syncLimit` ticks pass
//!   without its followers, while they may elect a new leader that starts every session's
//!   expiry afresh and never hears of the touches the old one got. A holder whose server
//!   is that old leader (or a follower still on it) then believes it holds the lock after
//!   the new leader may have expired its session. In a symmetric partition both sides
//!   need `syncLimit` ticks to notice, and the deadline's lag (0.35-0.4 of the timeout,
//!   at least 0.7 of a tick) covers an overlap shorter than that.
//! - **Observers fed by an observer master** (`observerMasterPort`): their touches reach
//!   the leader through a follower's own ping reply, two ping periods, not one.
//! - **A timeout lowered on reconnection.** A member with a smaller `maxSessionTimeout`
//!   than the one that granted the session clamps it on reconnection; the deadline keeps
//!   the timeout first granted.
//! - **A ping late by more than a tenth of the timeout** (above): the leader's expiry can
//!   then come before the deadline by that lateness, if the follower is cut off at that
//!   moment.
use std::collections::VecDeque;
use std::time::Duration;

use crate::lease_clock::ClockInstant;

/// Heartbeats per session timeout, send to send. Ten: the deadline an answered heartbeat
/// sets comes from the beat four back (the gap, 0.35 of the timeout, plus that beat's
/// round trip fit in four intervals while answers take under 0.05 of it), so it lies 0.6
/// of the timeout past the last answered heartbeat's sending, and five heartbeats in a
/// row may go unanswered before the lock is reported lost. A coarser grid tolerates
/// fewer; a finer one costs more `sync`s.
const BEATS_PER_TIMEOUT: u32 = 10;

/// How far apart, at least, an earlier heartbeat's answer and a later heartbeat's sending
/// must be for the later one's `sync` to prove the earlier one's touch reached the leader,
/// in hundredths of the timeout (see the module docs).
const PING_GAP_HUNDREDTHS: u32 = 35;

/// The interval between heartbeats (send to send) for a session timeout.
pub(crate) fn interval(timeout: Duration) -> Duration {
    timeout / BEATS_PER_TIMEOUT
}

/// The least time a healthy lock has left, for a session `timeout`: half of it. In
/// steady state an answer proves the beat four back (0.4 of the timeout), so the
/// deadline lies 0.6 of the timeout past the last answered beat's sending, and the next
/// answer comes a beat (a tenth) later: the time left swings between 0.6 and 0.5 of the
/// timeout, less an answer's round trip.
pub(crate) fn healthy_floor(timeout: Duration) -> Duration {
    // The beats an answer proves back: the fewest that span the ping gap (four).
    let beats_back = (PING_GAP_HUNDREDTHS * BEATS_PER_TIMEOUT).div_ceil(100);
    timeout.saturating_sub(interval(timeout) * (beats_back + 1))
}

/// The smallest gap between an earlier heartbeat's answer and a later heartbeat's
/// sending for a session timeout; see [`PING_GAP_HUNDREDTHS`].
pub(crate) fn ping_gap(timeout: Duration) -> Duration {
    timeout * PING_GAP_HUNDREDTHS / 100
}

/// The heartbeats answered lately: when each was sent and when its answer came.
#[derive(Debug)]
pub(crate) struct Answered {
    timeout: Duration,
    recent: VecDeque<(ClockInstant, ClockInstant)>,
    /// The send time of the latest heartbeat proven so far (at first, when the session
    /// was asked for: the leader created it after that).
    proven: ClockInstant,
}

/// How many answered heartbeats are kept: enough to find one the gap back when every beat
/// is answered (four back) or a few are retried at once.
const KEPT: usize = 12;

impl Answered {
    /// For a session asked for at `opened`, with `timeout` granted.
    pub(crate) fn new(timeout: Duration, opened: ClockInstant) -> Self {
        Self {
            timeout,
            recent: VecDeque::with_capacity(KEPT),
            proven: opened,
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
        let earlier = self
            .recent
            .iter()
            .rev()
            .find(|&&(_, earlier_answer)| earlier_answer + gap <= sent)
            .map(|&(earlier_sent, _)| earlier_sent);
        if let Some(earlier_sent) = earlier {
            self.proven = self.proven.max(earlier_sent);
        }
        let proven = earlier.map(|earlier_sent| earlier_sent + self.timeout);
        if self.recent.len() == KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back((sent, answered));
        proven
    }

    /// The interval between heartbeats (send to send).
    pub(crate) fn interval(&self) -> Duration {
        interval(self.timeout)
    }

    /// When the heartbeat after the one sent at `last_sent` goes out: an interval after
    /// it (send to send), unless an answered heartbeat newer than the latest proven one
    /// becomes provable (its answer plus [`ping_gap`]) within the interval after that;
    /// then at that moment, so that its proof does not wait for the next beat of the grid.
    /// It matters when answers are few: right after the session opened, or after a
    /// reconnection, when the deadline may be near. (In steady state the beat four back is
    /// provable before the grid's next beat, and the grid is kept.)
    pub(crate) fn next_send(&self, last_sent: ClockInstant) -> ClockInstant {
        let every = interval(self.timeout);
        let grid = last_sent + every;
        let provable = self
            .recent
            .iter()
            .find(|&&(sent, _)| sent > self.proven)
            .map(|&(_, answered)| answered + ping_gap(self.timeout));
        match provable {
            Some(at) if at > grid && at < grid + every => at,
            _ => grid,
        }
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
        let mut answered = Answered::new(TIMEOUT, at(0));
        assert_eq!(answered.confirm(at(0), at(5)), None);
    }

    #[test]
    fn an_answer_proves_the_heartbeat_a_ping_period_before_it() {
        let mut answered = Answered::new(TIMEOUT, at(0));
        // Beats every tenth of the timeout (100 ms), each answered in 5 ms.
        assert_eq!(answered.confirm(at(0), at(5)), None);
        assert_eq!(answered.confirm(at(100), at(105)), None);
        assert_eq!(answered.confirm(at(200), at(205)), None);
        // 295 ms after the first answer: no ping need have come in between.
        assert_eq!(answered.confirm(at(300), at(305)), None);
        // 395 ms after it (>= 350 ms): the first one's touch reached the leader.
        assert_eq!(answered.confirm(at(400), at(405)), Some(at(1_000)));
        assert_eq!(answered.confirm(at(500), at(505)), Some(at(1_100)));
        // Just before the next answer (at 605), 495 ms are left: the healthy floor,
        // less the answer's 5 ms.
        assert_eq!(healthy_floor(TIMEOUT), Duration::from_millis(500));
    }

    #[test]
    fn the_latest_heartbeat_far_enough_back_counts() {
        let mut answered = Answered::new(TIMEOUT, at(0));
        answered.confirm(at(0), at(5));
        answered.confirm(at(100), at(105));
        answered.confirm(at(200), at(205));
        // Answered at 105 and 205: only 105 is 350 ms before 500.
        assert_eq!(answered.confirm(at(500), at(510)), Some(at(1_100)));
    }

    #[test]
    fn a_slow_answer_counts_from_when_it_came() {
        let mut answered = Answered::new(TIMEOUT, at(0));
        // Sent at 0, answered only at 250: its touch may have reached its server at 249.
        answered.confirm(at(0), at(250));
        assert_eq!(answered.confirm(at(500), at(505)), None);
        assert_eq!(answered.confirm(at(600), at(605)), Some(at(1_000)));
    }

    #[test]
    fn only_the_latest_answers_are_kept() {
        let mut answered = Answered::new(TIMEOUT, at(0));
        for i in 0..20 {
            answered.confirm(at(i * 10), at(i * 10 + 1));
        }
        assert_eq!(answered.recent.len(), KEPT);
    }

    #[test]
    fn the_grid_is_kept_in_steady_state() {
        let mut answered = Answered::new(TIMEOUT, at(0));
        for i in 0..6 {
            answered.confirm(at(i * 100), at(i * 100 + 5));
        }
        // The one of 200 is provable at 555, before the grid's 600: the grid holds, and
        // each answer proves the beat four back (0.6 of the timeout ahead).
        assert_eq!(answered.next_send(at(500)), at(600));
        assert_eq!(answered.confirm(at(600), at(605)), Some(at(1_200)));
        assert_eq!(answered.next_send(at(600)), at(700));
    }

    #[test]
    fn a_beat_is_moved_to_when_a_lone_answer_becomes_provable() {
        // A session asked for at 0: its first heartbeat sent at 50, answered at 60.
        let mut answered = Answered::new(TIMEOUT, at(0));
        answered.confirm(at(50), at(60));
        // It becomes provable at 410: the beats at 150 and 250 keep the grid ...
        assert_eq!(answered.next_send(at(50)), at(150));
        answered.confirm(at(150), at(155));
        assert_eq!(answered.next_send(at(150)), at(250));
        answered.confirm(at(250), at(255));
        // ... and the one due at 350 waits until 410, instead of proving it only at 450.
        assert_eq!(answered.next_send(at(250)), at(410));
        assert_eq!(answered.confirm(at(410), at(415)), Some(at(1_050)));
        // Then the grid again: the beat of 150 is provable at 505, before 510.
        assert_eq!(answered.next_send(at(410)), at(510));
    }

    #[test]
    fn after_a_reconnection_the_first_new_answer_is_proven_as_soon_as_it_can_be() {
        let mut answered = Answered::new(TIMEOUT, at(0));
        for i in 0..6 {
            answered.confirm(at(i * 100), at(i * 100 + 5));
        }
        // Silent from 505 on; reconnected, a heartbeat sent at 1_030 is answered at 1_040
        // (it proves the one of 500); the next ones go at 1_130 and 1_230 ...
        assert_eq!(answered.confirm(at(1_030), at(1_040)), Some(at(1_500)));
        assert_eq!(answered.next_send(at(1_030)), at(1_130));
        answered.confirm(at(1_130), at(1_135));
        answered.confirm(at(1_230), at(1_235));
        // ... and the one of 1_030 becomes provable at 1_390: the beat due at 1_330
        // waits until then.
        assert_eq!(answered.next_send(at(1_230)), at(1_390));
        assert_eq!(answered.confirm(at(1_390), at(1_395)), Some(at(2_030)));
    }

    #[test]
    fn a_ping_period_fits_in_the_gap() {
        // Timeouts are at least two ticks, pings go every half tick: a quarter of the
        // timeout at most, a tenth of it under the gap; and four beats span the gap with
        // room for their answers.
        for timeout in [200, 1_000, 4_000, 40_000].map(Duration::from_millis) {
            assert!(timeout / 4 + timeout / 10 <= ping_gap(timeout));
            assert!(4 * interval(timeout) > ping_gap(timeout));
        }
    }
}
