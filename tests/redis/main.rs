//! Tests of the Redis and Redlock backends against real `redis-server` processes, one
//! behaviour per module. Each test starts its own servers (a few milliseconds each).

mod support;
mod turns;

mod bounded_wait;
mod cancel_safety;
mod command_conn_silent_loss;
mod conformance;
mod failover;
mod holder_record;
mod inspect;
mod invalid_input;
mod late_answer;
mod lock_all;
mod lock_all_all_or_nothing;
mod lock_all_bounds;
mod lock_all_cancel;
mod lock_all_registers_on_one;
mod lock_all_subscribes_at_once;
mod lock_all_wakes;
mod loss_during_renewal;
mod one_server_two_names;
mod publish_only_when_waited;
mod pubsub_reconnect_backoff;
mod pubsub_reconnects;
mod pubsub_silent_loss;
mod redlock;
mod redlock_lock_all;
mod redlock_refusal_undo;
mod redlock_slow_master;
mod redlock_slow_refusal;
mod release_not_owner;
mod renewal_slow_link;
mod renewal_traffic;
mod renewer_stops;
mod reregister_after_reconnect;
mod script_cache_flushed;
mod semaphore;
mod server_version;
mod sleep_never_past_expiry;
mod unsafe_server;
mod waiter_wakes_on_release;
mod waiting_through_trouble;
mod watchdog;
