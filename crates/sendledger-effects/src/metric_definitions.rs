//! The metrics this crate records (see `sendledger_core::metric`). Recorded through these
//! constants only.

use sendledger_core::metric::MetricDefinition as M;

pub const TARGET_STATE: &str = "sendledger_target_state";
pub const TARGET_TRANSITIONS_TOTAL: &str = "sendledger_target_transitions_total";

pub const DEFINITIONS: &[M] = &[
    M::gauge(
        TARGET_STATE,
        "State of each target's circuit breaker, by target: 0 closed, 1 open (tasks wait before their intent), 2 half-open (probing).",
    ),
    M::counter(
        TARGET_TRANSITIONS_TOTAL,
        "Circuit breaker transitions, by target and the state entered (open, half_open, closed).",
    ),
];
