//! sendledger's service as a library: what the `sendledger` command runs, and what the
//! workspace tests and the benchmarks drive directly.
//!
//! - [`config`]: the configuration file, its environment overrides and its validation.
//! - [`service`]: engine, Kafka ingest and outbox publisher on one ledger, started and stopped
//!   in the order that keeps every guarantee; [`runtime`]: the process they run in.
//! - [`wiring`]: the adapters between the libraries (the effects crate's targets as the
//!   engine's remote, the engine as the Kafka consumer's request sink, kafka mode's partition
//!   take-over), so that the engine depends on neither Kafka nor HTTP.
//! - [`admin`]: the admin HTTP endpoint (metrics, health, task timelines, manual review) and
//!   the process's metrics recorder; the other libraries only record through the `metrics`
//!   facade, and serves the review console; [`timeline`] is the JSON of a task.
//! - [`operators`]: the admin endpoint's named operators, their roles, tenant scopes and
//!   credentials; [`callers`]: the front door's callers and their tenants; [`credentials`]:
//!   the bearer tokens both hold; [`tls`]: the listeners' TLS settings.
//! - [`serve`]: the bounded accept loop of the HTTP listeners.
//! - [`retention`]: the loop that removes settled tasks' histories past `storage.retention`.
//! - [`front`]: the HTTP front door: tasks submitted with an `Idempotency-Key`.
//! - [`telemetry`]: the OTLP exporter of traces.
//! - [`demo`]: the whole pipeline on embedded defaults against a fault-injecting remote.
//! - [`error`]: what can go wrong, typed ([`Error`], [`ConfigError`]), each with its cause. The
//!   demo alone reports `anyhow` errors: it is a program that prints them, nothing matches on
//!   them.
//!
//! The design is in the repository's `docs/` (`docs/architecture.md` first). This crate may
//! depend on every sendledger library crate; only the `sendledger` binary, the benchmarks and
//! the tests depend on it.

pub mod admin;
pub mod callers;
pub mod config;
pub mod credentials;
pub mod demo;
pub mod error;
pub mod front;
pub mod metric_definitions;
pub mod operators;
pub mod retention;
pub mod runtime;
pub mod serve;
pub mod service;
pub mod telemetry;
pub mod timeline;
pub mod tls;
pub mod wiring;

pub use error::{ConfigError, Error, Result};
