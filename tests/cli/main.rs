//! Tests of the `fencelock` command line against real servers.

mod check_log;
mod run;
