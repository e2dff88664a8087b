//! Tests of fenced storage and the advisory-lock backend against a real PostgreSQL, and
//! the end-to-end stale-holder story with etcd and Redis. Each test starts its own server
//! from a cached `initdb` template.

mod support;

mod advisory_heartbeat;
mod advisory_lock;
mod cancel_then_reuse;
mod commit_unknown;
mod concurrent_writers;
mod conformance;
mod connection_runtime_ended;
mod grant_after_long_wait;
mod idempotency;
mod invalid_input;
mod same_token;
mod search_path;
mod server_version;
mod single_statement;
mod stale_holder;
mod stale_token;
mod transaction_ended;
mod version_cas;
mod wait_timeout_covers_connecting;
mod wait_timeout_frees_at_once;
