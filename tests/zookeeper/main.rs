//! Tests of the ZooKeeper backend against real ZooKeeper servers (Debian's `zookeeper`
//! package on the JVM), one behaviour per module. Tests that do not break the server share
//! one standalone server (a JVM takes about a second to start); the others start their own.

mod support;

mod cancel_safety;
mod conformance;
mod cut_off_holder;
mod fault_soak;
mod follower_cut_off;
mod interop;
mod invalid_input;
mod leader_failover;
mod lock_all;
mod monitor_stopped;
mod protected_mode;
mod reconnect_keeps_lock;
mod rwlock;
mod token_is_czxid;
