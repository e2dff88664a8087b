//! etcd with fencing under every scenario that applies to it: no stale write accepted, no
//! token out of order, no fenced update lost; no second holder where only servers fail.

use super::{chaos, count, lost, row};

#[test]
fn etcd_with_fencing_survives_every_scenario() {
    let (rows, success) = chaos(&["--backends", "etcd"]);
    let scenarios: Vec<&str> = rows.iter().filter_map(|r| r["scenario"].as_str()).collect();
    assert_eq!(scenarios, ["S1", "S2", "S3", "S4", "S6", "S8"]);
    for r in &rows {
        assert_eq!(count(r, "stale_accepted"), 0, "{r:#}");
        assert_eq!(count(r, "token_inversions"), 0, "{r:#}");
        assert_eq!(lost(r, "fenced"), 0, "{r:#}");
        assert!(count(r, "sections") >= 3, "{r:#}");
    }
    // Server faults (leader killed, compaction) and a killed client: never two holders.
    for scenario in ["S1", "S4", "S8"] {
        assert_eq!(count(row(&rows, scenario, "etcd"), "overlapping"), 0);
    }
    // A paused or cut-off holder overlaps the next one; the fence refuses its write.
    for scenario in ["S2", "S6"] {
        let r = row(&rows, scenario, "etcd");
        assert!(count(r, "stale_rejected") >= 1, "{r:#}");
        assert_eq!(r["as_expected"], true, "{r:#}");
    }
    assert!(success, "{rows:#?}");
}
