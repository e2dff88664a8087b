//! A holder paused past its TTL (S2), for every backend: the unfenced read-modify-write
//! loses updates, the fenced one loses none and refuses the paused holder's write.

use super::{chaos, count, lost, row};

#[test]
fn a_paused_holder_loses_unfenced_updates_and_none_behind_the_fence() {
    let (rows, success) = chaos(&["--scenario", "S2"]);
    for backend in ["etcd", "redis", "redlock", "zookeeper"] {
        let r = row(&rows, "S2", backend);
        assert!(lost(r, "unfenced") >= 1, "no unfenced update lost: {r:#}");
        assert_eq!(lost(r, "fenced"), 0, "{r:#}");
        assert_eq!(count(r, "stale_accepted"), 0, "{r:#}");
        assert!(count(r, "stale_rejected") >= 1, "{r:#}");
        assert!(
            count(r, "lost_reported") >= 1,
            "the guard never reported the loss: {r:#}"
        );
    }
    assert!(success, "{rows:#?}");
}
