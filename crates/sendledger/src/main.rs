//! The `sendledger` command: parse arguments, wire the libraries, run.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod bench_effects;
mod bench_engine;

/// sendledger: a durable dispatcher for side effects that must happen once.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Measure a component and print one JSON object.
    Bench {
        #[command(subcommand)]
        what: bench::Bench,
    },
}

fn main() -> ExitCode {
    // Ledger files are created private to the owner (the ledger directory is 0700 as well).
    // SAFETY: umask only changes this process's file-creation mask; it cannot fail.
    unsafe { libc::umask(0o077) };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench { what } => bench::run(what),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
