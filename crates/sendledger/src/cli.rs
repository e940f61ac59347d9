//! The command line: every subcommand and the process-wide setup (umask, logging, exit codes).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::{bench, demo, ops};

/// sendledger: a durable dispatcher for side effects that must happen once.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The whole pipeline on embedded defaults against a fault-injecting remote, ending in an
    /// audit; exits non-zero if any invariant fails.
    Demo(demo::DemoArgs),
    /// A task's timeline, one line per event.
    Inspect(ops::InspectArgs),
    /// Replay the whole ledger (or, with --from-kafka, the events topic) and check every rule;
    /// exits 0 when clean, 2 on any violation, 1 when the audit could not run.
    Audit(ops::AuditArgs),
    /// Measure a component and print one JSON object.
    Bench {
        #[command(subcommand)]
        what: bench::Bench,
    },
}

/// Runs the command line of this process and returns its exit code.
pub fn main() -> ExitCode {
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
        Command::Demo(args) => demo::run(args),
        Command::Inspect(args) => ops::inspect(args).map(|()| true),
        Command::Audit(args) => ops::audit(args),
        Command::Bench { what } => bench::run(what).map(|()| true),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
