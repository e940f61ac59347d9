//! sendledger, the command: configuration, wiring of the libraries into the service, and the
//! operator, demo and benchmark commands. The binary (`main.rs`) only calls [`cli::main`]; the
//! library exists so the workspace tests can drive the same code.
//!
//! Operations: [`admin`] is the admin HTTP endpoint (metrics, health, task timelines, manual
//! review) and installs the process's metrics recorder; the libraries only record through the
//! `metrics` facade. `sendledger review` works through that endpoint, or on a stopped ledger.
//!
//! Wiring: [`wiring`] holds the adapters between the libraries (the effects crate's targets as
//! the engine's remote, the engine as the Kafka consumer's request sink), so that the engine
//! depends on neither Kafka nor HTTP.
//!
//! This crate may depend on every other sendledger crate; none depends on it.

pub mod admin;
mod bench;
mod bench_audit;
mod bench_cluster;
mod bench_effects;
mod bench_engine;
pub mod bench_fuzz;
mod bench_kafka;
mod bench_process;
pub mod cli;
pub mod config;
pub mod console;
mod demo;
mod ops;
mod produce;
mod review;
mod serve;
pub mod service;
pub mod telemetry;
pub mod timeline;
pub mod wiring;
