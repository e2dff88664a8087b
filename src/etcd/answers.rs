//! The clients that read etcd's answers, with a limit of ours on their size.
//!
//! gRPC's default limit on a decoded answer is 4 MiB, and an answer above it fails on the
//! client *after* the server applied the request. A batch of joins (`batch.rs`) carries
//! every member's read of its queue: 64 locks with 150 kB of keys ahead each made a 9.6 MB
//! answer, and every member failed with its fate unknown, which retires the session,
//! although nothing went wrong (`tests/etcd/large_batch_answer.rs`). A prefix delete of
//! many long keys is one watch event list, as large. etcd itself sends answers of any size
//! up to 2 GiB (`v3rpc/grpc.go`: `grpc.MaxSendMsgSize(math.MaxInt32)`; what bounds
//! requests, `--max-request-bytes`, does not bound answers), so the client must be the one
//! that accepts them: up to [`MAX_ANSWER_BYTES`]. Beyond that the old rule still holds
//! (an unreadable answer leaves its requests' fate unknown) and is safe, only wasteful.

use etcd_client::{Client, KvClient, WatchClient};

/// The largest answer fencelock reads: 64 MiB (a batch of 128 joins with 512 kB of keys
/// ahead each, or a queue of about 500,000 waiters).
pub(crate) const MAX_ANSWER_BYTES: usize = 64 << 20;

/// `client`'s key-value client, reading answers up to [`MAX_ANSWER_BYTES`].
pub(crate) fn kv(client: &Client) -> KvClient {
    client
        .kv_client()
        .max_decoding_message_size(MAX_ANSWER_BYTES)
}

/// `client`'s watch client, reading answers up to [`MAX_ANSWER_BYTES`].
pub(crate) fn watch(client: &Client) -> WatchClient {
    client
        .watch_client()
        .max_decoding_message_size(MAX_ANSWER_BYTES)
}
