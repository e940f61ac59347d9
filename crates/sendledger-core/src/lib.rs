//! sendledger-core: the domain model of sendledger.
//!
//! Task identity, its textual address and ids, validated requests (payload numbers kept as
//! written), the events of the ledger, the task [`State`] as a pure [`fold`] of events, the
//! decision functions that say what a task does next, the result each event announces to the
//! requester ([`TaskResult`], projected from the log), the retry math, the rule checker that
//! audits an event sequence, the audit's report and per-task accounting shared by every
//! replay, what an operator may record to resolve a review ([`ResolveBody`]), and
//! [`sanitize_reason`], through which any input quoted in a reason passes.
//!
//! This crate must never depend on RocksDB, Kafka, an async runtime, a clock or a source of
//! randomness: time and random numbers are passed in. Everything here is deterministic, so
//! rebuilding an actor, `inspect` and `audit` all reach the same answer from the same events.

pub mod access;
pub mod audit;
pub mod canonical;
pub mod decide;
pub mod error;
pub mod event;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod ids;
pub mod metric;
pub mod reason;
pub mod request;
pub mod result;
pub mod retention;
pub mod retry;
pub mod review;
pub mod rules;
pub mod saga;
pub mod state;
pub mod trace;

#[cfg(test)]
mod model_tests;

pub use decide::{
    decide, Action, Ctx, Decision, Hold, Input, OperatorResolution, Policy, ReconcilePolicy,
    Sending, Versions,
};
pub use error::{Error, Result};
pub use event::{
    Event, EventBody, Evidence, NewEvent, NotSentCause, PlannedStep, PreviousVersion, Retained,
    ReviewReason, Source, UnknownCause, WaitReason,
};
pub use ids::{PayloadHash, TaskId};
pub use reason::sanitize_reason;
pub use request::{AcceptedRequest, Identity, Limits, TaskRequest};
pub use result::{ResultStatus, TaskResult};
pub use retry::{RetryClass, RetryPolicy};
pub use review::ResolveBody;
pub use rules::{check_task, CheckConfig, Rule, TaskCheck, Violation};
pub use state::{fold, FailureKind, Phase, State};
pub use trace::TraceParent;

/// A boxed future that may move between threads. The seams other crates implement (the
/// engine's remote, the consumer's request sink) return it, so they name no async runtime;
/// it is a std type, and this crate still runs nothing.
pub type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;
