//! `cargo xtask`: developer workflows. `cargo xtask bench` runs the kernel SMC team's
//! benchmarks with SMC beside TCP; `cargo xtask soak` is issue 10's soak and load run (see
//! docs/benchmarks.md).

mod bench;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(about = "Developer workflows for the smc-userspace workspace")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// SMC beside TCP: bw, lat, pp, crr and ablation suites (docs/benchmarks.md).
    Bench(bench::BenchArgs),
    /// Soak and load, SMC beside TCP: short-lived client processes, idle connections, dumps
    /// every second and a drip-feeding attacker; fails on growth, errors or slow dumps.
    Soak(bench::soak::SoakArgs),
}

fn main() -> ExitCode {
    // Before any thread exists, so every thread inherits the blocked signals.
    if let Err(e) = bench::install_signal_handler() {
        eprintln!("xtask: {e:#}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    let _guard = bench::Guard;
    let r = match cli.cmd {
        Cmd::Bench(args) => bench::run(args),
        Cmd::Soak(args) => bench::soak::run(args),
    };
    if bench::interrupted() {
        // The signal thread is stopping the children and exits the process with 128 + the
        // signal; what failed here failed because of that.
        loop {
            std::thread::park();
        }
    }
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
