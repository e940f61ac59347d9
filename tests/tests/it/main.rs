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
mod crash;
mod deploy;
mod docs;
mod effects;
mod engine;
mod engine_kill;
mod fuzz;
mod kafka;
mod layout;
mod ledger;
mod log;
mod scripts;
mod sim;
mod telemetry;
mod tls;

pub use sendledger_tests::seed;
