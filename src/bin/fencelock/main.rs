//! `fencelock`: the command-line tool. `fencelock bench` runs the head-to-head benchmark
//! of every lock backend on local servers it starts itself (or on given endpoints).

mod bench;

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
    let outcome = runtime.block_on(async {
        let work = async {
            match cli.command {
                Command::Bench(args) => bench::run(args).await,
            }
        };
        // Ctrl-C drops the work: every server it started is stopped by its handle.
        tokio::select! {
            result = work => Some(result),
            _ = tokio::signal::ctrl_c() => None,
        }
    });
    match outcome {
        Some(Ok(())) => ExitCode::SUCCESS,
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
