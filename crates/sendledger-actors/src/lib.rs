//! sendledger-actors: the engine that drives tasks, built on actix.
//!
//! - [`task::TaskActor`]: one per active task. It rebuilds its state by folding its events,
//!   is the only writer of its events, asks the pure `decide` of the core crate what to do,
//!   appends the decided events and waits until they are durable, and only then acts (sends an
//!   attempt, schedules a timer, asks for a lookup). It passivates as soon as it is idle.
//! - [`registry::Registry`]: routes every message to the task's actor, spawning it on demand
//!   and bounding how many are alive; it is what makes one writer per task true.
//! - [`timers::Timers`]: wakes tasks whose retry or check is due; timers live in the ledger,
//!   so they survive restarts.
//! - [`reconciler::Reconciler`]: runs lookups for tasks whose outcome is unknown, with bounded
//!   concurrency, and hands the evidence to the task actor.
//! - [`closed_breakers::ClosedBreakers`]: retries a target's failed tasks when its breaker
//!   closes again, for targets that ask for it.
//! - [`messages`]: what they send each other; an actor that sends one kind of message holds
//!   a `Recipient` of it, so the task actor does not know the actors it talks to.
//! - [`engine::Engine`]: the handle library users and the service start, submit to, and stop.
//! - [`watchers`]: who waits for a task to change (the front door's waits), woken by the
//!   task's actor after each durable append.
//! - [`versions`]: what keeps the versions of a request in order, one at a time.
//!
//! This crate depends on the core and the store crates only: never on Kafka, never on HTTP.
//! It owns the seam it needs to reach remotes, the [`remote::Remote`] trait; the adapters that
//! implement it over HTTP and that hand Kafka messages to the [`Engine`] live where the service
//! is wired (`sendledger-node`). It records metrics through the `metrics` facade only, under
//! the names in [`metric_definitions`] (the service installs the exporter).
//!
//! Invariants: a task's actor is the only writer of its events, and acts only once what it
//! decided is durable; RocksDB is never called on an executor thread (reads go through the
//! ledger's blocking pool, writes through its journal).

pub mod closed_breakers;
pub mod engine;
pub mod error;
pub mod messages;
pub mod metric_definitions;
pub mod ownership;
pub mod reconciler;
pub mod registry;
pub mod remote;
pub mod task;
pub mod timers;
pub mod versions;
pub mod watchers;

pub use engine::{Engine, EngineConfig, ReviewItem};
pub use error::{Error, Result};
pub use messages::Reply;
pub use ownership::Ownership;
pub use remote::{LookupError, Remote, Slot, TargetHealth, Unavailable};

/// Milliseconds since the Unix epoch, the engine's one clock.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
