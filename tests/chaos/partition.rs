//! A holder cut off from Redis (S6, through the harness's fault proxy) and the holder
//! killed outright (S1): the guard reports the loss before anyone else is granted the
//! lock, and the fence refuses the cut-off holder's write.

use super::{chaos, count, row};

#[test]
fn a_cut_off_or_killed_redis_holder_is_safe_behind_the_fence() {
    let (rows, success) = chaos(&["--scenario", "S1,S6", "--backends", "redis,redlock"]);
    for backend in ["redis", "redlock"] {
        let s1 = row(&rows, "S1", backend);
        assert_eq!(count(s1, "overlapping"), 0, "{s1:#}");
        let s6 = row(&rows, "S6", backend);
        assert_eq!(count(s6, "stale_accepted"), 0, "{s6:#}");
        assert!(count(s6, "stale_rejected") >= 1, "{s6:#}");
        assert_eq!(
            s6["as_expected"], true,
            "lost reported after the next grant: {s6:#}"
        );
    }
    assert!(success, "{rows:#?}");
}
