//! Tests of the etcd backend against real etcd processes, one behaviour per module.
//!
//! Each test starts its own etcd (about 50 ms with the harness's fast Raft timing), so
//! tests that kill, pause, revoke or compact cannot disturb each other.

mod support;

mod auth;
mod auth_changed_jwt;
mod auth_token_expiry;
mod cancel_safety;
mod close;
mod compaction_while_waiting;
mod conformance;
mod contended_cells;
mod cut_off_waiter;
mod election;
mod fifo_order;
mod future_sizes;
mod group_commit;
mod guarded_txn;
mod harness;
mod inspect;
mod invalid_input;
mod keepalive_task_stopped;
mod key_deleted;
mod key_names;
mod large_batch_answer;
mod late_delete;
mod late_join;
mod late_lease_grant;
mod leader_failover;
mod lease_revoked;
mod local_expiry;
mod lock_all;
mod lock_all_faults;
mod many_waiters;
mod many_watches_reopened;
mod member_down;
mod mixed_primitives;
mod mutual_exclusion;
mod own_transport;
mod prefix_delete;
mod refused_release;
mod release_all;
mod release_all_answer_lost;
mod release_all_dropped;
mod release_all_not_held;
mod release_all_refused;
mod release_answer_lost;
mod retry_after_timeout;
mod round_trips;
mod rwlock;
mod semaphore;
mod session_dies_while_waiting;
mod shared_session;
mod try_lock;
mod ttl_from_grant;
mod unreachable;
mod watch_refused;
mod watch_refused_while_held;
mod watch_stream_lost;
mod watch_task_stopped;
mod watch_task_turns;
