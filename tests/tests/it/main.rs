//! sendledger's workspace integration and fault tests, one module per area. The harness they
//! share (brokers, relays, producing requests and reading results back, `sendledger run`
//! processes in a group) is the crate's library, `sendledger_tests`; the chaos soaks are a test
//! target of their own (`tests/soak/`).

mod admin;
mod audit;
mod bench;
mod cli;
mod cluster;
mod console;
mod copy_retention;
mod crash;
mod deploy;
mod docs;
mod effects;
mod engine;
mod engine_kill;
mod fallback;
mod front;
mod fuzz;
mod kafka;
mod layout;
mod ledger;
mod log;
mod lookup_budget;
mod migration;
mod operators;
mod outage;
mod paging;
mod placement;
mod retention;
mod retry;
mod saga;
mod scripts;
mod sim;
mod simulation;
mod snapshots;
mod telemetry;
mod tls;
mod versions;

pub use sendledger_tests::seed;

/// The `sendledger` command built for these tests.
pub const SENDLEDGER: &str = env!("CARGO_BIN_EXE_sendledger_cli");

/// The admin tests' service child (see `tests/src/bin/admin_child.rs`).
pub const ADMIN_CHILD: &str = env!("CARGO_BIN_EXE_admin_child");

/// A `sendledger` command line to run.
pub fn sendledger() -> std::process::Command {
    std::process::Command::new(SENDLEDGER)
}

/// `sendledger run --config FILE` with `env` added, up to its `ready` line (see
/// [`sendledger_tests::process::start_run`]).
pub fn start_run(
    config: &std::path::Path,
    env: &[(&str, String)],
) -> (std::process::Child, String) {
    sendledger_tests::process::start_run(SENDLEDGER, config, env)
}
