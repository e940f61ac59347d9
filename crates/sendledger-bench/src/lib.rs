//! sendledger's benchmarks, fuzzer and simulation, out of the product: the `sendledger-bench`
//! command (`sendledger-bench <what>`, one JSON object on stdout), [`fuzz`], the mutational
//! fuzzer of every input boundary that the cargo-fuzz targets in `fuzz/` and the workspace
//! tests share, and [`simulation`], kafka mode under deterministic simulation. Timings live here, never in pass/fail tests. What each benchmark measures and how to
//! read it: `docs/benchmarks/README.md`.
//!
//! A benchmark that needs a service or a remote in a process of its own starts the `sendledger`
//! executable built beside this one ([`process::sendledger_exe`]). This crate may depend on
//! every other sendledger crate; only the tests and the fuzz targets depend on it.

use std::process::ExitCode;

use clap::Parser;

mod audit;
mod cluster;
mod effects;
mod engine;
mod front;
pub mod fuzz;
mod kafka;
mod ledger;
pub mod process;
mod restore;
mod retention;
pub mod simulation;

/// sendledger-bench: measurements of sendledger's components, each printed as one JSON object.
#[derive(Parser)]
#[command(version, about)]
enum Bench {
    /// Durable appends per second: group commit with many appenders versus one fsync per append.
    Ledger(ledger::LedgerArgs),
    /// Attempts per second through the effects layer against the simulated remote, and the
    /// simulated remote's own capacity.
    Effects(effects::EffectsArgs),
    /// Tasks per second through the whole engine against the simulated remote.
    Engine(engine::EngineArgs),
    /// Events per second through `sendledger audit` on a generated ledger, and its peak memory.
    Audit(audit::AuditArgs),
    /// Tasks per second end to end through Kafka (embedded cluster): ingest, engine, publisher,
    /// until every result is read back from the results topic.
    Kafka(kafka::KafkaArgs),
    /// Tasks per second through the HTTP front door (POST with `Prefer: wait`, many
    /// connections), latency from POST to result, the service's peak memory; optionally beside
    /// the Kafka path in the same run.
    Front(front::FrontArgs),
    /// Kafka mode against local mode on one instance, same requests, same brokers (which must
    /// support transactions), and the restore of the kafka-mode log on an empty disk.
    Cluster(cluster::ClusterArgs),
    /// A kafka-mode take-over's restore of one partition on an empty disk, in events per
    /// second: whole, and read, decoded and applied apart (brokers with transactions).
    Restore(restore::RestoreArgs),
    /// Many tasks through the engine with retention removing settled histories as it goes:
    /// the ledger's size, memory and start-up time over time, and redeliveries of early
    /// requests answered from what retention kept.
    Retention(retention::RetentionArgs),
    /// Inputs per second through every input boundary (request, stored event, event record,
    /// configuration, review body) with generated inputs; counts panics and saves their inputs.
    Fuzz(fuzz::FuzzArgs),
    /// Kafka mode under deterministic simulation, one run per seed: the schedules run, and
    /// every seed that broke a rule (replay one with `--seeds N..N+1`). Exits non-zero when
    /// one did.
    Simulate(simulation::SimulateArgs),
}

/// Runs the benchmark named on the command line and returns the process's exit code.
pub fn main() -> ExitCode {
    sendledger_node::runtime::no_transparent_huge_pages();
    let bench = Bench::parse();
    // Only what goes wrong, on stderr (`RUST_LOG` for more): stdout is the report. The
    // simulation's faults make the product log every failure it rides out: none by default.
    let quiet = if matches!(bench, Bench::Simulate(_)) {
        "off"
    } else {
        "warn"
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| quiet.into()),
        )
        .init();
    let result = match bench {
        Bench::Ledger(args) => ledger::run(args),
        Bench::Effects(args) => effects::run(args),
        Bench::Engine(args) => engine::run(args),
        Bench::Audit(args) => audit::run(args),
        Bench::Kafka(args) => kafka::run(args),
        Bench::Front(args) => front::run(args),
        Bench::Cluster(args) => cluster::run(args),
        Bench::Restore(args) => restore::run(args),
        Bench::Retention(args) => retention::run(args),
        Bench::Fuzz(args) => fuzz::run(args),
        Bench::Simulate(args) => simulation::command::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
