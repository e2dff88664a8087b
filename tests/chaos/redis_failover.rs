//! The Redis lock across a master failover with lost replication: the failure the lock
//! cannot survive is reproduced (the test passes when it is observed), and the strict
//! fence refuses the repeated tokens instead of accepting them.

use super::{chaos, count, row};

#[test]
fn failover_gives_a_second_holder_and_repeated_tokens_that_the_fence_refuses() {
    let (rows, success) = chaos(&["--scenario", "S4,S7", "--backends", "redis"]);
    let s4 = row(&rows, "S4", "redis");
    assert!(count(s4, "overlapping") >= 1, "no second holder: {s4:#}");
    let s7 = row(&rows, "S7", "redis");
    assert!(
        count(s7, "token_inversions") >= 1,
        "no repeated token: {s7:#}"
    );
    assert_eq!(count(s7, "stale_accepted"), 0, "{s7:#}");
    assert!(count(s7, "stale_rejected") >= 1, "{s7:#}");
    assert!(success, "{rows:#?}");
}
