//! The command line: every subcommand and the process-wide setup (umask, logging, exit codes).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::{bench, demo, ops, produce, review, serve};

/// sendledger: a durable dispatcher for side effects that must happen once.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The service: consume requests from Kafka, perform them, publish results (stops cleanly
    /// on SIGINT/SIGTERM).
    Run(serve::RunArgs),
    /// The whole pipeline on embedded defaults against a fault-injecting remote, ending in an
    /// audit; exits non-zero if any invariant fails.
    Demo(demo::DemoArgs),
    /// Send JSON request lines (stdin or a file) to the requests topic, keyed by identity.
    Produce(produce::ProduceArgs),
    /// Start the simulated third-party remote (seeded faults, ground-truth stats).
    SimRemote(serve::SimRemoteArgs),
    /// A task's timeline, one line per event.
    Inspect(ops::InspectArgs),
    /// Replay the whole ledger (or, with --from-kafka, the events topic) and check every rule;
    /// exits 0 when clean, 2 on any violation, 1 when the audit could not run.
    Audit(ops::AuditArgs),
    /// List and resolve tasks in manual review, on a running service (--admin URL) or on a
    /// stopped ledger (--data DIR).
    Review(review::ReviewArgs),
    /// Processed-offset markers of the requests topic.
    Offsets {
        #[command(subcommand)]
        what: OffsetsCommand,
    },
    /// Measure a component and print one JSON object.
    Bench {
        #[command(subcommand)]
        what: bench::Bench,
    },
}

#[derive(Subcommand)]
enum OffsetsCommand {
    /// Forget a partition's processed offsets (stopped ledger): for a requests topic that was
    /// deleted and recreated, which the service refuses to consume until this is done.
    Reset(ops::OffsetsResetArgs),
}

/// Runs the command line of this process and returns its exit code.
pub fn main() -> ExitCode {
    // Ledger files are created private to the owner (the ledger directory is 0700 as well).
    // SAFETY: umask only changes this process's file-creation mask; it cannot fail.
    unsafe { libc::umask(0o077) };
    let cli = Cli::parse();
    // The service logs what it does; the other commands only what goes wrong.
    let default_level = match cli.command {
        Command::Run(_) | Command::SimRemote(_) => "info",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_level.into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Run(args) => serve::run(args),
        Command::Produce(args) => produce::produce(args),
        Command::SimRemote(args) => serve::sim_remote(args),
        Command::Demo(args) => demo::run(args),
        Command::Inspect(args) => ops::inspect(args).map(|()| true),
        Command::Audit(args) => ops::audit(args),
        Command::Review(args) => review::run(args).map(|()| true),
        Command::Offsets {
            what: OffsetsCommand::Reset(args),
        } => ops::offsets_reset(args).map(|()| true),
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
