//! sendledger's workspace integration and fault tests: one test binary, one module per area.

mod admin;
mod audit;
mod bench;
mod cli;
mod cluster;
mod console;
mod crash;
mod deploy;
mod docs;
mod effects;
mod engine;
mod engine_kill;
mod fuzz;
mod kafka;
mod ledger;
mod log;
mod scripts;
mod sim;
mod telemetry;
mod tls;

/// The seed of a randomized test: `SENDLEDGER_TEST_SEED` when set, else the given default.
/// Printed, so that a failure can be reproduced.
pub fn seed(default: u64) -> u64 {
    let seed = std::env::var("SENDLEDGER_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    eprintln!("seed = {seed} (set SENDLEDGER_TEST_SEED to reproduce)");
    seed
}
