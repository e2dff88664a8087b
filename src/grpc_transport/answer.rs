//! A request's body on its way out, and an answer's body on its way in.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use http_body::{Body, Frame};
use tonic::Status;

use super::connection::InFlight;

/// Sends the whole of a unary request's `body` on `stream`, the last frame with the end
/// of the stream (tonic's encoder has it at once: one message). Awaited in the caller's
/// task: a streaming body would hold its caller until it ends, which is why the
/// transport carries unary requests only.
pub(super) async fn send_body(
    mut body: tonic::body::Body,
    stream: &mut SendStream<Bytes>,
) -> Result<(), Status> {
    let mut body = Pin::new(&mut body);
    // One frame is held back, to go out with the end of the stream.
    let mut held: Option<Bytes> = None;
    loop {
        match std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if let Some(before) = held.replace(data) {
                    stream.send_data(before, false).map_err(sent_in_part)?;
                }
            }
            None => {
                return stream
                    .send_data(held.unwrap_or_default(), true)
                    .map_err(sent_in_part);
            }
            Some(Err(status)) => {
                stream.send_reset(h2::Reason::CANCEL);
                return Err(status);
            }
        }
    }
}

/// A failure after the request's stream was opened: its fate is unknown.
fn sent_in_part(err: h2::Error) -> Status {
    super::lane::fate_unknown("transport error", &err)
}

/// An answer's body for tonic: the data as it comes (its flow-control window released
/// as it is read), then the trailers (gRPC's status). Keeps its request counted in
/// flight until read or dropped.
pub(super) struct Answer {
    stream: RecvStream,
    data_done: bool,
    in_flight: InFlight,
}

impl Answer {
    pub(super) fn new(stream: RecvStream, in_flight: InFlight) -> Self {
        Self {
            stream,
            data_done: false,
            in_flight,
        }
    }
}

/// A broken answer, in the words `etcd/call.rs` reads as a broken connection with the
/// request's fate unknown (as hyper's).
fn broken(err: &h2::Error) -> Status {
    let unavailable = super::lane::fate_unknown("h2 protocol error", err);
    Status::unknown(unavailable.message())
}

impl Body for Answer {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if !self.data_done {
            match self.stream.poll_data(cx) {
                Poll::Ready(Some(Ok(data))) => {
                    self.in_flight.heard();
                    // Released at once: tonic copies the data into its own buffer.
                    let _ = self.stream.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(Some(Err(err))) => {
                    if err.is_remote() && err.is_reset() {
                        self.in_flight.answered();
                    }
                    return Poll::Ready(Some(Err(broken(&err))));
                }
                Poll::Ready(None) => self.data_done = true,
                Poll::Pending => return Poll::Pending,
            }
        }
        match self.stream.poll_trailers(cx) {
            Poll::Ready(Ok(Some(trailers))) => {
                self.in_flight.answered();
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
            Poll::Ready(Ok(None)) => {
                self.in_flight.answered();
                Poll::Ready(None)
            }
            Poll::Ready(Err(err)) => {
                if err.is_remote() && err.is_reset() {
                    self.in_flight.answered();
                }
                Poll::Ready(Some(Err(broken(&err))))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
