//! The client's one watch stream, as the watch task uses it: a request waiting for room on
//! the stream keeps reading the stream's answers meanwhile.
//!
//! Why: a stream's answers and requests are bound together on the server. etcd's
//! `recvLoop` hands each creation's answer to `sendLoop` through a channel of 16
//! (`etcdserver/api/v3rpc/watch.go`, `ctrlStreamBufLen`, 3.4 to 3.6), and `sendLoop`
//! blocks in gRPC's `Send` once the client's HTTP/2 window for the stream is full of
//! answers it has not read (2 MiB, hyper's default, which tonic and etcd-client keep).
//! Then `recvLoop` stops reading requests, the client's send window and etcd-client's
//! request channel (100) fill, and a request's send waits for good. A task that reads
//! answers only between its requests then never reads again, and no deletion reaches a
//! holder or a waiter of the client any more: with 20,000 lock watches, asked for as
//! their grants aged or all again after the stream broke
//! (`tests/etcd/many_watches_reopened.rs`). Reading while a send waits keeps `sendLoop`
//! going; what is read is kept here, in order, and handed out before anything newer.

use std::collections::VecDeque;

use etcd_client::{WatchOptions, WatchRequestSender, WatchResponse, WatchResponseStream};

/// What reading the stream gives: an answer, its end (`Ok(None)`), or its failure.
pub(crate) type Read = Result<Option<WatchResponse>, etcd_client::Error>;

/// An open watch stream; see the module docs.
pub(crate) struct WatchStream {
    sender: WatchRequestSender,
    responses: WatchResponseStream,
    /// Read while a request waited, not handed out yet (oldest first).
    inbox: VecDeque<Read>,
    /// The stream's end or failure has been read: nothing more comes from it.
    ended: bool,
}

impl WatchStream {
    pub(crate) fn new(stream: etcd_client::WatchStream) -> Self {
        let (sender, responses) = stream.split();
        Self {
            sender,
            responses,
            inbox: VecDeque::new(),
            ended: false,
        }
    }

    /// Asks for a watch of `prefix` on the stream.
    ///
    /// Fails once the stream's end has been read: nothing sent on it would be answered.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped before it resolves, the request was not sent (etcd-client
    /// hands it to a tokio channel, whose `send` is cancel safe), and the answers read
    /// meanwhile are kept.
    pub(crate) async fn watch(
        &mut self,
        prefix: Vec<u8>,
        options: WatchOptions,
    ) -> Result<(), etcd_client::Error> {
        let send = self.sender.watch(prefix, Some(options));
        read_while(send, &mut self.responses, &mut self.inbox, &mut self.ended).await
    }

    /// Cancels watch `id` on the stream.
    ///
    /// # Cancel safety
    ///
    /// As [`Self::watch`].
    pub(crate) async fn cancel(&mut self, id: i64) -> Result<(), etcd_client::Error> {
        let send = self.sender.cancel(id);
        read_while(send, &mut self.responses, &mut self.inbox, &mut self.ended).await
    }

    /// How many answers were read while requests waited and are not handed out yet.
    pub(crate) fn kept(&self) -> usize {
        self.inbox.len()
    }

    /// The oldest answer read while a request waited, if any.
    pub(crate) fn take_kept(&mut self) -> Option<Read> {
        self.inbox.pop_front()
    }

    /// The next answer: one kept while a request waited, else one read now. After the
    /// stream's end, its end again.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an answer is taken only by the call that returns it (tonic's
    /// `Streaming` keeps a message being read in itself).
    pub(crate) async fn next(&mut self) -> Read {
        if let Some(read) = self.inbox.pop_front() {
            return read;
        }
        if self.ended {
            return Ok(None);
        }
        let read = self.responses.message().await;
        self.ended = !matches!(read, Ok(Some(_)));
        read
    }
}

fn stream_ended() -> etcd_client::Error {
    etcd_client::Error::WatchError("the watch stream ended".into())
}

/// Awaits `send`, reading the stream's answers into `inbox` meanwhile; fails once the
/// stream ends, with its own error if it failed (nothing sent on it would be answered).
async fn read_while(
    send: impl Future<Output = Result<(), etcd_client::Error>>,
    responses: &mut WatchResponseStream,
    inbox: &mut VecDeque<Read>,
    ended: &mut bool,
) -> Result<(), etcd_client::Error> {
    if *ended {
        return Err(stream_ended());
    }
    tokio::pin!(send);
    loop {
        tokio::select! {
            // A send with room goes at once; reading is for when it has to wait.
            biased;
            sent = &mut send => return sent,
            read = responses.message() => match read {
                Ok(Some(response)) => inbox.push_back(Ok(Some(response))),
                Ok(None) => {
                    *ended = true;
                    return Err(stream_ended());
                }
                Err(err) => {
                    *ended = true;
                    return Err(err);
                }
            },
        }
    }
}
