//! The side-effect seam: how the engine reaches remotes. The service implements it with the
//! effects crate's HTTP client (`sendledger_node::wiring::HttpRemote`), tests with fakes; the
//! engine knows nothing about HTTP.

use sendledger_core::decide::{AttemptOutcome, Sending};
use sendledger_core::event::Millis;
use sendledger_core::saga::Call;
use sendledger_core::{BoxFuture, PlannedStep, Policy, RetryClass, TraceParent};

/// Why a lookup told nothing: no evidence either way. Its message is what the task records
/// about it (`ReviewReason::LookupsFailed { last_error }` when the window closes on it), so it
/// must never contain a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct LookupError {
    message: String,
    transient: bool,
    retry_after: Option<std::time::Duration>,
}

impl LookupError {
    /// `transient`: asking again may answer (no answer, a 5xx); otherwise the lookup fails the
    /// same way until its configuration or the remote changes (no lookup configured, a request
    /// that cannot be built, an answer of the wrong shape).
    pub fn new(message: impl Into<String>, transient: bool) -> LookupError {
        LookupError {
            message: message.into(),
            transient,
            retry_after: None,
        }
    }

    /// The remote asked for no lookup before this long (`Retry-After` on a 429, or a 503).
    pub fn with_retry_after(mut self, retry_after: Option<std::time::Duration>) -> LookupError {
        self.retry_after = retry_after;
        self
    }

    pub fn retry_after(&self) -> Option<std::time::Duration> {
        self.retry_after
    }

    /// Whether asking again may answer. Either way the task asks again at its next check until
    /// its observation deadline; this says whether an operator must act meanwhile.
    pub fn is_transient(&self) -> bool {
        self.transient
    }
}

/// Room to send one attempt, taken before its intent is recorded and handed to the attempt
/// (which may carry what the remote prepared for it: a connection opened, the breaker's
/// admission). Dropping it unused frees the room.
pub type Slot = Box<dyn std::any::Any + Send>;

/// Why a target takes no attempt now: its circuit breaker is open. The task records no intent
/// and looks again after `wait` (plus a random part of `spread`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unavailable {
    pub wait: std::time::Duration,
    pub spread: std::time::Duration,
}

/// A target's circuit breaker as people see it (`/healthz`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetHealth {
    pub target: String,
    /// `closed`, `open` or `half_open`.
    pub state: &'static str,
    /// Open: how long until it probes.
    pub probing_in_ms: Option<u64>,
    /// How many times it opened since the process started.
    pub opened: u64,
    /// When it closes again, the target's tasks that failed within this long before (every
    /// attempt proven not sent by the remote) are retried; `None`: they are not.
    pub retry_failed_within: Option<std::time::Duration>,
}

pub trait Remote: Send + Sync + 'static {
    /// The decision policy of a configured target (with its fallback's, when it has one);
    /// `None` when the target is unknown.
    fn policy(&self, target: &str) -> Option<Policy>;

    /// The steps of the saga `name`, when a request's target names a multi-step task rather
    /// than a target. None by default.
    fn steps(&self, _name: &str) -> Option<Vec<PlannedStep>> {
        None
    }

    /// Waits for room to send one attempt to `target` (its limits on attempts in flight and
    /// per second), or says that the target takes none now (its breaker is open). A task takes
    /// it before it records the attempt's intent. Unlimited unless the remote says otherwise.
    /// `retry_of`: the class of "not sent" this attempt retries, whose own timeout may apply.
    fn reserve(
        &self,
        _target: &str,
        _retry_of: Option<RetryClass>,
    ) -> BoxFuture<Result<Slot, Unavailable>> {
        Box::pin(std::future::ready(Ok(Box::new(()) as Slot)))
    }

    /// Performs one attempt of the request at `target` (the request's own, or its fallback), in
    /// the room `reserve` gave it, and classifies what it proves. Must always complete (bounded
    /// by the target's timeouts), and must write no byte of the request after
    /// `sending.first_byte_by` (ending `NotSent` instead).
    fn attempt(
        &self,
        target: &str,
        call: Call<'_>,
        attempt: u32,
        idempotency_key: Option<&str>,
        sending: Sending,
        slot: Option<Slot>,
    ) -> BoxFuture<AttemptOutcome>;

    /// The circuit breaker of each target that has one.
    fn target_health(&self) -> Vec<TargetHealth> {
        Vec::new()
    }

    /// What a lookup of the request at `target` asks, for people to see (the review console):
    /// the rendered lookup URL, or why it cannot be built. `None`: no lookup configured.
    fn lookup_url(&self, _target: &str, _call: Call<'_>) -> Option<Result<String, String>> {
        None
    }

    /// Asks the remote of `target` (where the task's attempts went) which records match the
    /// request, created no earlier than `since` (with the fields later steps read of the one
    /// found, when one is). `Err` means the lookup itself failed: no evidence either way. `trace` is the context a remote that takes one receives, as for
    /// attempts.
    fn lookup(
        &self,
        target: &str,
        call: Call<'_>,
        since: Millis,
        trace: Option<TraceParent>,
    ) -> BoxFuture<Result<sendledger_core::saga::Found, LookupError>>;
}
