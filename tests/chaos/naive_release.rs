//! Sections longer than the TTL without renewal (S3): the naive release deletes the next
//! owner's lock; the library's Redis and Redlock releases never do.

use super::{chaos, count, row};

#[test]
fn only_the_naive_release_deletes_another_owners_lock() {
    let (rows, success) = chaos(&["--scenario", "S3", "--backends", "redis,redlock"]);
    let naive = row(&rows, "S3", "naive redis");
    assert!(count(naive, "foreign_deletes") >= 1, "{naive:#}");
    for backend in ["redis", "redlock"] {
        let r = row(&rows, "S3", backend);
        assert_eq!(count(r, "foreign_deletes"), 0, "{r:#}");
        assert_eq!(count(r, "stale_accepted"), 0, "{r:#}");
    }
    assert!(success, "{rows:#?}");
}
