//! Several locks at once (`lock_all`) among single locks: each key is its name's holder,
//! granted together with the others of its transaction.

use super::*;

impl Story {
    /// Acquisition `id` takes `names` together.
    fn multi(&mut self, id: u64, names: &[&str]) {
        self.events.push(Event::Multi {
            id,
            names: names.iter().map(|name| (*name).to_owned()).collect(),
        });
    }

    fn released_as(&mut self, id: u64, ms: u64, outcome: Outcome) {
        self.events.push(Event::Released {
            id,
            started: self.at(ms),
            ended: self.at(ms),
            outcome,
        });
    }

    fn check_with(&self, ended_ms: u64, operator: &Operator) -> Verdict {
        check(
            &self.history,
            &self.events,
            &[],
            self.at(0)..self.at(ended_ms),
            NS,
            operator,
            &self.clients,
        )
    }
}

/// Acquisition 1 holds x (key a-0, revision 2); acquisition 2 takes {y, x} in one
/// transaction at revision 3 (its y key at the head at once, its x key behind a-0);
/// acquisition 3 queues for y behind the multi's key (revision 4). Each test goes on from
/// revision 5.
fn queued_behind_a_hold() -> Story {
    let mut s = Story::new();
    s.put(2, "soak/x/a-0", &record(1), 0);
    s.grant(1, "soak/x/a-0", 2, 2, 1);
    s.multi(2, &["y", "x"]);
    s.put(3, "soak/x/m-0", &record(2), 2);
    s.put(3, "soak/y/m-0", &record(2), 2);
    s.put(4, "soak/y/b-0", &record(3), 3);
    s
}

#[test]
fn a_lock_all_waits_at_the_head_of_one_queue_for_the_other() {
    // a-0 is held for 7 s. The multi's y key is at the head from revision 3 and granted
    // only at 7 s, with its x key (admitted at 5): no stall, since the acquisition could
    // hold only then.
    let mut s = queued_behind_a_hold();
    s.released(1, 6990);
    s.client_delete(5, "soak/x/a-0", 7000);
    s.grant(2, "soak/x/m-0", 3, 5, 7010);
    s.grant(2, "soak/y/m-0", 3, 3, 7010);
    s.released(2, 7100);
    s.client_delete(6, "soak/x/m-0", 7101);
    s.client_delete(7, "soak/y/m-0", 7102);
    s.grant(3, "soak/y/b-0", 4, 7, 7110);
    s.released(3, 7200);
    s.client_delete(8, "soak/y/b-0", 7201);
    let verdict = s.check(8000);
    assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
    let checked: HashMap<&str, usize> = verdict.checked.iter().copied().collect();
    assert_eq!(checked.get("multi join"), Some(&1));
    assert_eq!(checked.get("multi grant"), Some(&1));
    assert_eq!(checked.get("progress of lock_all"), Some(&2));

    // Unaware that the keys were one acquisition's, the rule would call the y key a
    // stall: the adaptation is what lets it pass.
    s.events
        .retain(|event| !matches!(event, Event::Multi { .. }));
    assert_eq!(kinds(&s.check(8000)), ["progress"]);
}

#[test]
fn a_lock_all_granted_before_every_key_was_at_its_head_is_caught() {
    // Granted at once, the x key "admitted" at the join while a-0 held x.
    let mut s = queued_behind_a_hold();
    s.grant(2, "soak/x/m-0", 3, 3, 10);
    s.grant(2, "soak/y/m-0", 3, 3, 10);
    s.released(2, 100);
    s.client_delete(5, "soak/x/m-0", 101);
    s.client_delete(6, "soak/y/m-0", 102);
    s.grant(3, "soak/y/b-0", 4, 6, 110);
    s.released(3, 120);
    s.client_delete(7, "soak/y/b-0", 121);
    s.released(1, 6990);
    s.client_delete(8, "soak/x/a-0", 7000);
    let verdict = s.check(8000);
    assert_eq!(kinds(&verdict), ["exclusion"], "{:?}", verdict.violations);
    assert!(verdict.violations[0].contains("soak/x/m-0"));

    // A single lock granted while the multi's key was ahead of it, the same.
    let mut s = queued_behind_a_hold();
    s.grant(3, "soak/y/b-0", 4, 4, 10);
    s.released(3, 20);
    s.client_delete(5, "soak/y/b-0", 21);
    s.released(1, 6990);
    s.client_delete(6, "soak/x/a-0", 7000);
    s.grant(2, "soak/x/m-0", 3, 6, 7010);
    s.grant(2, "soak/y/m-0", 3, 3, 7010);
    s.released(2, 7100);
    s.client_delete(7, "soak/x/m-0", 7101);
    s.client_delete(8, "soak/y/m-0", 7102);
    let verdict = s.check(8000);
    assert_eq!(kinds(&verdict), ["exclusion"], "{:?}", verdict.violations);
    assert!(verdict.violations[0].contains("soak/y/b-0"));
}

#[test]
fn a_lock_all_not_made_in_one_transaction_is_caught() {
    // The keys made one by one (revisions 2 and 3), each granted with its own token.
    let mut s = Story::new();
    s.multi(1, &["x", "y"]);
    s.put(2, "soak/x/m-0", &record(1), 0);
    s.put(3, "soak/y/m-0", &record(1), 1);
    s.grant(1, "soak/x/m-0", 2, 2, 2);
    s.grant(1, "soak/y/m-0", 3, 3, 2);
    s.released(1, 10);
    s.client_delete(4, "soak/x/m-0", 11);
    s.client_delete(5, "soak/y/m-0", 12);
    let verdict = s.check(1000);
    assert_eq!(
        kinds(&verdict),
        ["multi join", "multi join", "multi grant"],
        "{:?}",
        verdict.violations
    );

    // One transaction, but a grant that holds only one of the names.
    let mut s = Story::new();
    s.multi(1, &["x", "y"]);
    s.put(2, "soak/x/m-0", &record(1), 0);
    s.put(2, "soak/y/m-0", &record(1), 0);
    s.grant(1, "soak/x/m-0", 2, 2, 2);
    s.released(1, 10);
    s.client_delete(3, "soak/x/m-0", 11);
    s.client_delete(4, "soak/y/m-0", 12);
    let verdict = s.check(1000);
    assert_eq!(kinds(&verdict), ["multi grant"], "{:?}", verdict.violations);
}

#[test]
fn a_lock_all_not_granted_once_every_key_is_at_its_head_is_caught() {
    // a-0 goes at 100 ms: from revision 5 both keys are at their heads, and the
    // acquisition waits on until its 8 s timeout removes them (a deadlock, or a lost
    // wakeup of its x key): both keys stalled their queues.
    let mut s = Story::new();
    s.put(2, "soak/x/a-0", &record(1), 0);
    s.grant(1, "soak/x/a-0", 2, 2, 1);
    s.multi(2, &["x", "y"]);
    s.put(3, "soak/x/m-0", &record(2), 2);
    s.put(3, "soak/y/m-0", &record(2), 2);
    s.released(1, 90);
    s.client_delete(5, "soak/x/a-0", 100);
    s.events.push(Event::Missed {
        id: 2,
        at: s.at(8000),
    });
    s.client_delete(6, "soak/x/m-0", 8001);
    s.client_delete(7, "soak/y/m-0", 8002);
    let verdict = s.check(9000);
    assert_eq!(
        kinds(&verdict),
        ["progress", "progress"],
        "{:?}",
        verdict.violations
    );
    assert!(verdict.violations[0].contains("with every key of its lock_all"));
}

#[test]
fn a_failed_lock_all_leaves_the_head_of_its_other_queues_soon() {
    // The multi's x key goes at 1 s (its wait timed out behind the long hold); its y key,
    // at the head all along, must follow within the bound of a key whose acquisition
    // returned (key left's 8 s: nobody waits on it), not stay to 9.5 s.
    let story = |y_gone: u64| {
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", &record(1), 0);
        s.grant(1, "soak/x/a-0", 2, 2, 1);
        s.multi(2, &["x", "y"]);
        s.put(3, "soak/x/m-0", &record(2), 2);
        s.put(3, "soak/y/m-0", &record(2), 2);
        s.events.push(Event::Missed {
            id: 2,
            at: s.at(1000),
        });
        s.client_delete(4, "soak/x/m-0", 1001);
        s.client_delete(5, "soak/y/m-0", y_gone);
        s.released(1, 9900);
        s.client_delete(6, "soak/x/a-0", 9901);
        s
    };
    let verdict = story(1002).check(10_000);
    assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
    let verdict = story(9500).check(10_000);
    assert_eq!(kinds(&verdict), ["key left"], "{:?}", verdict.violations);
    assert!(verdict.violations[0].contains("soak/y/m-0"));
}

#[test]
fn a_lock_all_told_a_key_was_deleted_is_checked_for_that_key() {
    // Waiting, the multi is told x's key was deleted (by the operator, at 5); its
    // cleanup then deletes the y key (the clients' own request): no violation, as long
    // as the failure names x. Naming y, the y key went by the clients' own request after
    // it was told: a foreign delete.
    let story = |named: &str| {
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", &record(1), 0);
        s.grant(1, "soak/x/a-0", 2, 2, 1);
        s.multi(2, &["x", "y"]);
        s.put(3, "soak/x/m-0", &record(2), 2);
        s.put(3, "soak/y/m-0", &record(2), 2);
        s.delete(5, "soak/x/m-0", 100);
        s.events.push(Event::Failed {
            id: 2,
            client: 0,
            name: "x,y".into(),
            at: s.at(110),
            error: format!("lease lost on lock {named:?}: key deleted"),
            key_deleted: true,
            deleted_lock: Some(named.to_owned()),
        });
        s.client_delete(6, "soak/y/m-0", 120);
        s.released(1, 200);
        s.client_delete(7, "soak/x/a-0", 201);
        s
    };
    let operator = Operator {
        revisions: vec![(5, Target::Key(b"soak/x/m-0".to_vec()))],
        ..Default::default()
    };
    let verdict = story("x").check_with(1000, &operator);
    assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
    let verdict = story("y").check_with(1000, &operator);
    assert_eq!(
        kinds(&verdict),
        ["foreign delete"],
        "{:?}",
        verdict.violations
    );
}

/// Acquisition 1 holds {x, y}; y's key is deleted at 50 ms (revision 4), `lost_which`
/// names `lost` at 60 ms, the release (NotHeld) begins at 100 ms and x's key goes at
/// 110 ms by a delete of the release whose answer was lost (not the clients' recorded
/// own), while the session's lease lives on (revision 6).
fn holding_two_and_losing_one(lost: &str) -> Story {
    let mut s = Story::new();
    s.multi(1, &["x", "y"]);
    s.put(2, "soak/x/m-0", &record(1), 0);
    s.put(2, "soak/y/m-0", &record(1), 0);
    s.grant(1, "soak/x/m-0", 2, 2, 1);
    s.grant(1, "soak/y/m-0", 2, 2, 1);
    s.delete(4, "soak/y/m-0", 50);
    s.events.push(Event::Lost {
        id: 1,
        at: s.at(60),
        reason: LossReason::KeyDeleted,
        key: Some(lost.to_owned()),
    });
    s.released_as(1, 100, Outcome::NotHeld);
    s.delete(5, "soak/x/m-0", 110);
    s.put(6, "soak/z/c-0", &record(2), 120);
    s.events.push(Event::Missed {
        id: 2,
        at: s.at(130),
    });
    s.client_delete(7, "soak/z/c-0", 140);
    s
}

#[test]
fn a_lock_all_that_lost_one_key_is_held_to_it_per_key() {
    let operator = Operator {
        revisions: vec![(4, Target::Key(b"soak/y/m-0".to_vec()))],
        ..Default::default()
    };
    // The operator deleted y's key; x's went by the release's own delete: fine (a single
    // lock's NotHeld release would have to account for x's key; several locks' cannot
    // tell which of their keys their own deletes removed).
    let verdict = holding_two_and_losing_one("soak/y/m-0").check_with(1000, &operator);
    assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
    // lost_which named x, whose key was still there: its deletion after is then one it
    // was told of, and nobody accounts for it.
    let verdict = holding_two_and_losing_one("soak/x/m-0").check_with(1000, &operator);
    assert_eq!(
        kinds(&verdict),
        ["foreign delete"],
        "{:?}",
        verdict.violations
    );
    assert!(verdict.violations[0].contains("soak/x/m-0"));
    // Nobody accounts for y's deletion (the lease lived on): while held, and before the
    // release began.
    let verdict = holding_two_and_losing_one("soak/y/m-0").check(1000);
    assert_eq!(
        kinds(&verdict),
        ["deletion", "foreign delete", "foreign delete"],
        "{:?}",
        verdict.violations
    );
}

#[test]
fn a_lock_all_saying_it_holds_after_a_key_went_is_caught() {
    let mut s = Story::new();
    s.multi(1, &["x", "y"]);
    s.put(2, "soak/x/m-0", &record(1), 0);
    s.put(2, "soak/y/m-0", &record(1), 0);
    s.grant(1, "soak/x/m-0", 2, 2, 1);
    s.grant(1, "soak/y/m-0", 2, 2, 1);
    s.delete(3, "soak/y/m-0", 100);
    s.events.push(Event::Held {
        id: 1,
        at: s.at(100 + 2000 + 1500 + 1),
        held: true,
    });
    s.released_as(1, 4000, Outcome::KnownLost);
    s.client_delete(4, "soak/x/m-0", 4001);
    let operator = Operator {
        revisions: vec![(3, Target::Key(b"soak/y/m-0".to_vec()))],
        ..Default::default()
    };
    let verdict = s.check_with(5000, &operator);
    assert_eq!(kinds(&verdict), ["holding"], "{:?}", verdict.violations);
    assert!(verdict.violations[0].contains("soak/y/m-0"));
}

#[test]
fn a_lock_all_retry_that_found_no_key_of_its_own_is_caught() {
    let failed = |s: &mut Story| {
        s.events.push(Event::Failed {
            id: 1,
            client: 0,
            name: "x,y".into(),
            at: s.at(500),
            error: format!(
                "etcd unavailable: {}; try again",
                super::super::multi::EARLIER_ATTEMPT
            ),
            key_deleted: false,
            deleted_lock: None,
        });
    };
    // An earlier attempt of it made its keys (at 100 ms): they are removed after.
    let mut s = Story::new();
    s.multi(1, &["x", "y"]);
    s.put(2, "soak/x/m-0", &record(1), 100);
    s.put(2, "soak/y/m-0", &record(1), 100);
    failed(&mut s);
    s.client_delete(3, "soak/x/m-0", 510);
    s.client_delete(4, "soak/y/m-0", 511);
    let verdict = s.check(1000);
    assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
    // No key of it anywhere: what stood was someone else's (a name given back early).
    let mut s = Story::new();
    s.multi(1, &["x", "y"]);
    failed(&mut s);
    assert_eq!(kinds(&s.check(1000)), ["multi retry"]);
}
