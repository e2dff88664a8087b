//! The reader's side of a read-write lock: admitted when only readers are ahead.
//!
//! Every key of a read-write lock holds its side (see `kind.rs`). A writer queues exactly
//! like a mutex waiter (any key ahead holds it back). A reader only waits for the nearest
//! key ahead of it that is *not* a reader (a writer, or any other primitive's key under the
//! same name: a mutex, a semaphore permit, Go's `etcdctl lock`), watching that key's
//! deletion; readers ahead of it do not hold it back. Since a writer waits for everyone
//! ahead, and readers queue behind a waiting writer, writers do not starve.

use etcd_client::{GetOptions, SortOrder, SortTarget};

use super::acquire::{Acquisition, Joined, Place, revision_of};
use super::kind::Kind;
use crate::{FencingToken, LockError};

impl Acquisition {
    /// Joins the queue as a reader: put my key and read every key ahead, with their
    /// sides, in the same revision; also returns that revision.
    pub(super) async fn enqueue_shared(
        &self,
        key: &str,
    ) -> Result<(FencingToken, Place, i64), LockError> {
        match self.join(key, newest_first()).await? {
            Joined::Now { token, read } => Ok((
                token,
                place_of_reader(token, read.kvs()),
                token.as_revision(),
            )),
            Joined::Earlier(token) => {
                let (place, revision) = self.reader_place(token).await?;
                Ok((token, place, revision))
            }
        }
    }

    /// Reads the keys up to mine and finds the nearest key ahead that is not a reader;
    /// and the revision it was read at. The wait is the mutex's (`wait_turn`, as a
    /// reader).
    pub(super) async fn reader_place(
        &self,
        token: FencingToken,
    ) -> Result<(Place, i64), LockError> {
        let read = self.read_up_to(token, newest_first()).await?;
        Ok((place_of_reader(token, read.kvs()), revision_of(&read)))
    }
}

/// Every key with its value (its side), newest first.
fn newest_first() -> GetOptions {
    GetOptions::new().with_sort(SortTarget::Create, SortOrder::Descend)
}

/// A reader's place from keys sorted newest first, none newer than mine.
fn place_of_reader(token: FencingToken, newest_first: &[etcd_client::KeyValue]) -> Place {
    let mine = newest_first
        .first()
        .is_some_and(|kv| FencingToken::from_revision(kv.create_revision()) == Some(token));
    if !mine {
        return Place::Gone;
    }
    let exclusive = newest_first
        .iter()
        .skip(1)
        .find(|kv| !Kind::Reader.shares_with(kv.value()));
    match exclusive {
        Some(key) => Place::Behind(key.key().to_vec()),
        None => Place::Head,
    }
}
