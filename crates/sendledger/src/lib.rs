//! sendledger, the command: configuration, wiring of the libraries into the service, and the
//! operator, demo and benchmark commands. The binary (`main.rs`) only calls [`cli::main`]; the
//! library exists so the workspace tests can drive the same code.
//!
//! This crate may depend on every other sendledger crate; none depends on it.

mod bench;
mod bench_audit;
mod bench_effects;
mod bench_engine;
pub mod cli;
mod demo;
mod ops;
