//! fencelock's own HTTP/2 transport for etcd's key-value requests.
//!
//! etcd-client sends every request through tonic's channel: tower's `Buffer` hands the
//! request to its worker task, and hyper's HTTP/2 client spawns a task per request to
//! await the answer (hyper 1.x `proto/h2/client.rs`, `H2ClientFuture`), so one request
//! crosses three tasks before its caller sees the answer. On a 2-core machine those
//! hand-offs were a fifth of an uncontended lock cycle's time (`docs/bench.md`, "The
//! client path at one and eight tasks"). This transport sends a request from the caller's
//! own task and awaits its answer there; only the connection's reads and writes run in
//! a task of their own (h2's connection driver).
//!
//! What it carries: **unary requests only** (etcd-client's `KvClient`: range, put,
//! delete, transaction), on **plaintext** endpoints of a client **without credentials**
//! (`EtcdConfig::with_own_transport`). Watches, lease keep-alives (streams), TLS and
//! authentication stay on tonic's channel, as does everything in a configuration this
//! transport does not serve.
//!
//! What it relies on:
//! - HTTP/2 (RFC 9113): a stream's request is handed to the server only once its HEADERS
//!   are written; h2 refuses to open a stream on a closed connection before queueing
//!   anything. So a request is reported as never sent ([`NOT_SENT`], read by
//!   `etcd/call.rs`'s `may_have_applied`) only when no connection could be made or h2
//!   refused to open its stream; any failure after that leaves its fate unknown, as
//!   tonic's "transport error" does.
//! - etcd serves key-value requests on every member (a follower forwards writes to the
//!   leader, and a linearizable read is confirmed with it, `etcdserver/v3_server.go`), so
//!   one connection to any member will do. Each client goes round the members in an
//!   order of its own, drawn at random (a fleet spreads over them, at the start and when
//!   leaving one; every member is tried once per round). The connection is left for
//!   one to the next member when it fails, when a member answers `Unavailable` (with
//!   require-leader: "etcdserver: no leader", cut off into a minority) or "too many
//!   requests" (its apply fell behind: a defragmentation, a stalled disk), and when a
//!   request on it is given up unanswered after 250 ms (or half the request timeout)
//!   with nothing at all heard on it for as long (a member alive but not serving, or a
//!   connection gone silent): the retry a timeout gets goes out on a new
//!   connection. A connect gets a share of the connect timeout per member, so one host
//!   that drops connects leaves time for the others.
//! - HTTP/2 PING while requests are in flight (every 10 s, 5 s to answer, as the tonic
//!   channel's keep-alive is configured) and once when a request is given up unanswered,
//!   never two within 6 s (etcd's `--grpc-keepalive-min-time` is 5 s; grpc-go answers
//!   pings more often than that with GOAWAY). While idle, TCP keep-alive (10 s, then 3
//!   probes 5 s apart) keeps a NAT or load balancer's flow and ends a connection whose
//!   peer is gone; HTTP/2 pings would count against an idle client (etcd permits none
//!   without streams).
//! - Errors after a request's stream opened carry only the error's kind, never text a
//!   server chose: `etcd/call.rs` reads some words as proof a request was never sent.

mod answer;
mod connection;
mod lane;

pub(crate) use lane::Lane;

/// The text that marks a request this transport never handed to a server (no connection,
/// or h2 refused to open its stream): `etcd/call.rs` reads it as proof the request was
/// not applied.
pub(crate) const NOT_SENT: &str = "fencelock transport: not sent";
