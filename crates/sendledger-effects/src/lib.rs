//! sendledger-effects: the side-effect layer. It sends one attempt of a task to its target and
//! classifies what happened by **what it proves**, and it asks a remote which records it holds
//! for a task (lookup), so unknown outcomes can be reconciled.
//!
//! # Classification (`docs/classification.md`)
//!
//! | what happened | outcome |
//! |---|---|
//! | DNS failure, connect refused or timed out, connection failed before any request byte was written | `NotSent{Connect}`; out of file descriptors (`EMFILE`, `ENFILE`): `NotSent{LocalResources}` |
//! | kafka mode: the attempt's send lease ([`Sending::first_byte_by`]) passed before its first byte was written (the write is refused at the connection) | `NotSent{LocalResources}`, the cause starting `send lease expired` |
//! | https: TLS handshake failed (unknown CA, wrong host name, expired certificate, no common protocol, the remote does not speak TLS) or not complete within `connect_timeout` | `NotSent{Connect}`, the cause starting `tls handshake with` |
//! | 429, or 503 with `Retry-After` | `NotSent{Throttled}` with `retry_after_ms` (at most 1 hour, or `retry.max_backoff` when longer) |
//! | 2xx | `Succeeded` with the id at `response_id_pointer` (empty when absent: a 2xx proves the effect, the id is informational) |
//! | 4xx other than 408/429 (409 unless `on_409 = "reconcile"`) | `Rejected` |
//! | request written, then timeout / reset / unreadable answer; 408; 5xx; 1xx/3xx; 409 with `on_409 = "reconcile"` | `Unknown` |
//! | 5xx with `on_5xx = "not_sent"` | `NotSent{ServerError}` |
//!
//! "Written" is observed at the connection: every TCP stream is wrapped so that the bytes the
//! kernel accepted are counted, and the count is read only after the connection's task has
//! been stopped. Over https the wrapper sits on the plaintext side of the TLS stream, put in
//! place once the handshake completed: the handshake's own bytes carry no request and are not
//! counted, and any plaintext handed to rustls counts as written (see `conn.rs` and
//! `docs/classification.md`). Error strings are never used to guess it.
//!
//! # Invariants
//! - An attempt never returns an error: it ends in exactly one
//!   [`sendledger_core::decide::AttemptOutcome`].
//! - Nothing that could have reached the remote is reported as `NotSent`.
//! - Header values are secrets: never logged, never in outcomes or errors (remote-supplied text
//!   is scrubbed of them and of their significant parts, such as the token after `Bearer `),
//!   redacted in `Debug`.
//! - A lookup finds only its own task's records: a target whose lookup URL does not tell
//!   tasks apart (see `Target::from_config`) is refused.
//! - A lookup counts against its target's limits (or `lookup.limits`) like an attempt, and no
//!   lookup is sent to a target before the `Retry-After` of its latest throttled lookup.
//!
//! # Layout
//! - `config.rs`: target configuration as written (serde), before validation;
//! - `target/`: [`Target`] and [`Targets`] (`mod.rs`, with the HTTP request that attempts and
//!   lookups share), one file per concern: `build.rs` builds and validates a target from its
//!   configuration, `attempt.rs` performs an attempt and classifies its ending, `lookup.rs`
//!   asks the remote for a task's records and matches them against the task, `redact.rs` keeps
//!   header values out of logs, outcomes, errors and `Debug`, `sagas.rs` checks multi-step
//!   tasks' steps against the targets;
//! - `classify.rs`: what an answer proves, as one pure function;
//! - `conn.rs`: HTTP/1.1 exchanges that know whether any request byte was written, and the
//!   connection pool; `resolve.rs`: name lookups, each on a thread of its own; `tls.rs`: TLS
//!   client settings, checked at load;
//! - `template.rs`: `{field}` templates for URLs and body fields;
//! - `limit.rs`: per-target limits (`max_in_flight`, `rate_limit`) of attempts and lookups
//!   together, or of lookups alone (`lookup.limits`);
//! - `breaker.rs`: the per-target circuit breaker, whose admission a task asks for before it
//!   records an intent;
//! - `error.rs`: [`Error`].
//!
//! # Dependencies
//! The core crate (for the outcome and policy types), tokio, hyper, rustls (with the ring
//! provider and the webpki roots; never OpenSSL) and serde. Never the ledger
//! (RocksDB), Kafka or the actors: this crate performs I/O to remotes and nothing else, and
//! holds no state beyond idle connections, the name lookups under way and each target's
//! breaker (what the latest attempts proved about the remote's health).

mod breaker;
mod classify;
mod config;
mod conn;
mod error;
mod limit;
pub mod metric_definitions;
mod resolve;
mod target;
mod template;
mod tls;

pub use breaker::{BreakerState, BreakerView};
pub use config::{
    BreakerConfig, ConflictPolicy, CreatedAfterConfig, HeaderValueConfig, IdempotencyConfig,
    LookupConfig, LookupLimitsConfig, PagingConfig, RetryClassConfig, RetryConfig, SagaConfig,
    SagaStepConfig, ServerErrorPolicy, TargetConfig, TimeFormat, TlsConfig,
};
pub use error::{Error, Result};
pub use limit::{Limiter, SendSlot};
pub use sendledger_core::decide::{AttemptOutcome, Sending};
pub use target::{Held, Target, Targets};
