//! Redlock with one master's clock jumping ahead (libfaketime): two clients hold the lock
//! at once. The test passes when the failure is observed, documenting the limit.

use super::{chaos, count, row};

#[test]
fn a_clock_jump_on_one_master_lets_redlock_grant_twice() {
    let (rows, success) = chaos(&["--scenario", "S5", "--backends", "redlock"]);
    let s5 = row(&rows, "S5", "redlock");
    assert!(count(s5, "overlapping") >= 1, "no double grant: {s5:#}");
    assert!(success, "{rows:#?}");
}
