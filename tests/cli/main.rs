//! Tests of the `fencelock` command line against real servers.

mod check_log;
mod etcdctl_interop;
mod locks;
mod run;
mod run_blip;
mod run_cut_off;
mod run_dies_with_fencelock;
mod run_escapes;
mod run_key_deleted;
mod run_late_grant;
mod run_leftovers;
mod run_member_down;
mod run_metrics;
mod run_redis;
mod run_redis_blips;
mod run_sigchld_ignored;
mod run_signals_inherited;
mod run_start_failure;
mod run_stderr_stuck;
mod run_terminal;
mod run_tls;
mod run_watchdog_term;
mod run_zombie_leader;
mod run_zookeeper;
mod support;
mod usage;
