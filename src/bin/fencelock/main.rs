//! `fencelock`: the command-line tool. `fencelock bench` runs the head-to-head benchmark
//! of every lock backend on local servers it starts itself (or on given endpoints);
//! `fencelock run` runs a command while holding a lock.

mod bench;
mod chaos;
mod endpoints;
mod locks;
mod metrics_listen;
mod run;
mod security;
mod service;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Distributed locks with fencing tokens: benchmarks and tools.
#[derive(Debug, Parser)]
#[command(name = "fencelock", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Benchmark every lock backend through the same trait, beside the raw ceilings.
    Bench(bench::BenchArgs),
    /// Run a command while holding a lock (etcd, Redis, Redlock or ZooKeeper); it is killed
    /// before the lock can pass on.
    Run(run::RunArgs),
    /// Show who holds which etcd lock (token, lease, TTL left) and who waits behind them.
    Locks(locks::LocksArgs),
    /// Check a log of critical sections (JSON lines) for overlapping holders, stale
    /// writes accepted or rejected, and tokens out of grant order.
    CheckLog(chaos::CheckLogArgs),
    /// Run the failure scenarios S1-S8 (docs/chaos.md) against every backend and count
    /// what broke.
    Chaos(chaos::ChaosArgs),
    /// One chaos client (started by `fencelock chaos`).
    #[command(hide = true)]
    ChaosWorker(chaos::worker::WorkerArgs),
    /// The watchdog of `fencelock run` (started by it): kills the command's process group
    /// if `fencelock run` dies.
    #[command(hide = true)]
    RunWatchdog,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::RunWatchdog = cli.command {
        // Before any runtime thread exists: it is a plain blocking loop.
        return run::watchdog();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("fencelock: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let command = match cli.command {
        // `run` forwards signals to its command instead of stopping at Ctrl-C.
        Command::Run(args) => return runtime.block_on(run::run(args)),
        Command::CheckLog(args) => return chaos::check_log(&args),
        Command::Locks(args) => return runtime.block_on(locks::locks(args)),
        Command::ChaosWorker(args) => return runtime.block_on(chaos::worker::work(args)),
        command => command,
    };
    let outcome = runtime.block_on(async {
        let work = async {
            match command {
                Command::Chaos(args) => chaos::chaos(args).await,
                Command::Bench(args) => bench::run(args).await,
                _ => Ok(true),
            }
        };
        // Ctrl-C drops the work: every server and worker it started is stopped by its
        // handle.
        tokio::select! {
            result = work => Some(result),
            _ = tokio::signal::ctrl_c() => None,
        }
    });
    match outcome {
        Some(Ok(true)) => ExitCode::SUCCESS,
        Some(Ok(false)) => ExitCode::FAILURE,
        Some(Err(err)) => {
            eprintln!("fencelock: {err}");
            ExitCode::FAILURE
        }
        None => {
            eprintln!("fencelock: interrupted; local servers stopped");
            ExitCode::from(130)
        }
    }
}
