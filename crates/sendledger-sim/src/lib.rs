//! sendledger-sim: a simulated third-party HTTP API with no idempotency, for the demo, the
//! fault tests and benchmarks.
//!
//! [`Sim`] is a real HTTP/1.1 server on a TCP socket, or over TLS (rustls) with a certificate
//! from its configuration, optionally requiring client certificates. `POST <create_path>` stores the JSON body
//! as a **new** record on every call and answers `201 {"id": ..., "created_at": ...}`;
//! `GET <lookup_path>?field=value&...` lists the records whose body fields equal the values
//! (a JSON array of `{"id", "created_at", "body"}`, or pages of it with `lookup_page_size`,
//! led to as [`LookupPaging`] says), optionally with a lookup lag; `GET <stats_path>` returns
//! [`Stats`]. Faults are injected deliberately and **seeded** ([`Faults`]): the same seed and
//! the same request order give the same faults. Lookups can be throttled too (429/503 with
//! `Retry-After`); each lookup received is kept with its time and status
//! ([`Sim::lookups_received`]), and [`Stats::peak_in_flight`] is the most requests worked on at
//! once. Outages are switched at run time:
//! [`Sim::set_offline`] closes the port (connections are refused) and opens it again.
//!
//! The records and counters are the ground truth that tests check: [`Stats::duplicates`] counts
//! identities with more than one record.
//!
//! Dependencies: tokio, hyper, rustls and serde only; never the ledger, Kafka or the effects crate (the
//! simulator must not share code with the client it judges). It never logs request headers.

mod config;
mod error;
mod listener;
mod lookup;
mod response;
mod server;
mod stats;
mod store;
#[cfg(test)]
mod testing;
mod tls;

pub use config::{Faults, LookupPaging, RequiredHeader, SimConfig, SimTlsConfig};
pub use error::{Error, Result};
pub use server::{LookupReceived, Sim};
pub use stats::Stats;
pub use store::Record;
