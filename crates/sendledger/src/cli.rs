//! The command line: every subcommand and the process-wide setup (umask, logging, exit codes).

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::commands::{
    audit, check_broker, demo, inspect, offsets, produce, review, run, sim_remote, tasks,
};

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
    Run(run::RunArgs),
    /// The whole pipeline on embedded defaults against a fault-injecting remote, ending in an
    /// audit; exits non-zero if any invariant fails.
    Demo(demo::DemoArgs),
    /// Send JSON request lines (stdin or a file) to the requests topic, keyed by identity.
    Produce(produce::ProduceArgs),
    /// Start the simulated third-party remote (seeded faults, ground-truth stats).
    SimRemote(sim_remote::SimRemoteArgs),
    /// A task's timeline, one line per event.
    Inspect(inspect::InspectArgs),
    /// Replay the whole ledger (or, with --from-kafka, the events topic) and check every rule;
    /// exits 0 when clean, 2 on any violation, 1 when the audit could not run.
    Audit(audit::AuditArgs),
    /// List and resolve tasks in manual review, on a running service (--admin URL) or on a
    /// stopped ledger (--data DIR).
    Review(review::ReviewArgs),
    /// List tasks by phase, target, failure kind and time, and retry failed tasks none of
    /// whose attempts reached the remote (one, or in bulk), on a running service (--admin URL)
    /// or a stopped ledger (--data DIR).
    Tasks(tasks::TasksArgs),
    /// Check that the brokers keep the transactional promises kafka mode relies on (fencing
    /// aborts the previous writer's open transaction, ...); exits 0 when they keep every one its
    /// guarantees stand on, 2 when one is broken, 1 when the check could not run.
    CheckBroker(check_broker::CheckBrokerArgs),
    /// Processed-offset markers of the requests topic.
    Offsets {
        #[command(subcommand)]
        what: OffsetsCommand,
    },
}

#[derive(Subcommand)]
enum OffsetsCommand {
    /// Forget a partition's processed offsets (stopped ledger): for a requests topic that was
    /// deleted and recreated, which the service refuses to consume until this is done.
    Reset(offsets::OffsetsResetArgs),
}

/// Logs go to stderr at `RUST_LOG`'s level (`default_level` without it). Escape codes only
/// reach a terminal: a file, a pipe or a log collector gets plain text, or JSON lines.
///
/// With `traces_url`, sendledger's spans are also exported there over OTLP (whatever the log
/// level: the exporter has its own filter); the returned exporter must be kept until the
/// process ends, and dropped outside an async runtime, which exports what is left.
fn init_logging(
    format: LogFormat,
    default_level: &str,
    traces_url: Option<&str>,
) -> Option<sendledger_node::telemetry::Exporter> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_level.into());
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt.with_ansi(colour).boxed(),
        LogFormat::Json => fmt.json().with_ansi(false).boxed(),
    };
    let (otlp, exporter, failure) = match traces_url.map(sendledger_node::telemetry::otlp_layer) {
        Some(Ok((layer, exporter))) => (Some(layer), Some(exporter), None),
        Some(Err(e)) => (None, None, Some(e)),
        None => (None, None, None),
    };
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(otlp)
        .init();
    match (failure, traces_url) {
        (Some(e), _) => tracing::error!(error = %e, "traces are not exported"),
        (None, Some(url)) => tracing::info!(%url, "exporting traces over OTLP"),
        (None, None) => {}
    }
    exporter
}

/// Where `run` exports its traces, if anywhere. A configuration that does not load is
/// reported by `run` itself.
fn traces_url(command: &Command) -> Option<String> {
    match command {
        Command::Run(args) => run::config_of(args).ok()?.telemetry.traces_url(),
        _ => None,
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
    sendledger_node::runtime::no_transparent_huge_pages();
    let cli = Cli::parse();
    // The service logs what it does; the other commands only what goes wrong.
    let default_level = match cli.command {
        Command::Run(_) | Command::SimRemote(_) => "info",
        _ => "warn",
    };
    let exporter = init_logging(
        cli.log_format,
        default_level,
        traces_url(&cli.command).as_deref(),
    );
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Produce(args) => produce::produce(args),
        Command::SimRemote(args) => sim_remote::sim_remote(args),
        Command::Demo(args) => demo::run(args),
        Command::Inspect(args) => inspect::inspect(args).map(|()| true),
        Command::Audit(args) => audit::audit(args),
        Command::CheckBroker(args) => check_broker::check_broker(args),
        Command::Review(args) => review::run(args).map(|()| true),
        Command::Tasks(args) => tasks::run(args).map(|()| true),
        Command::Offsets {
            what: OffsetsCommand::Reset(args),
        } => offsets::offsets_reset(args).map(|()| true),
    };
    // The spans still buffered are exported now, after the runtime is gone.
    drop(exporter);
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
