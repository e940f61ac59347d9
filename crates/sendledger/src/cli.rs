//! The command line: every subcommand and the process-wide setup (umask, logging, exit codes).

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::{bench, demo, ops, produce, review, serve};

/// sendledger: a durable dispatcher for side effects that must happen once.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// How log lines on stderr are written: `text` for people, `json` (one object per line)
    /// for log collectors. Colours only when stderr is a terminal and NO_COLOR is unset.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t = LogFormat::Text,
        env = "SENDLEDGER_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
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

/// Logs go to stderr at `RUST_LOG`'s level (`default_level` without it). Escape codes only
/// reach a terminal: a file, a pipe or a log collector gets plain text, or JSON lines.
fn init_logging(format: LogFormat, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_level.into());
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(colour).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

/// Runs the command line of this process and returns its exit code.
pub fn main() -> ExitCode {
    // Ledger files are created private to the owner (the ledger directory is 0700 as well).
    // SAFETY: umask only changes this process's file-creation mask; it cannot fail.
    #[allow(unsafe_code)]
    unsafe {
        libc::umask(0o077)
    };
    let cli = Cli::parse();
    // The service logs what it does; the other commands only what goes wrong.
    let default_level = match cli.command {
        Command::Run(_) | Command::SimRemote(_) => "info",
        _ => "warn",
    };
    init_logging(cli.log_format, default_level);
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
