//! Tests of the `fencelock` command line against real servers.

mod run;
