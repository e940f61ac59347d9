//! The rules of DESIGN.md §2, checked over a task's recorded events. Used by `audit` and by
//! the property tests of the decision functions.

use serde::Serialize;

use crate::event::{Event, EventBody, Evidence};
use crate::state::{Phase, State};

/// A rule a task's events must obey.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Rule {
    /// Rule 1: every attempt outcome belongs to an attempt whose intent was recorded first.
    IntentBeforeAttempt,
    /// Rules 2 and 3: after an outcome that may have reached the remote, a new attempt needs
    /// the same idempotency key (within its TTL) or a recorded `ResendAuthorized`.
    NoBlindResend,
    /// Rule 4: an unknown outcome is never settled as failed without a person.
    UnknownNotFailed,
    /// Rule 5: nothing happens to a task after its terminal state.
    TerminalIsFinal,
    /// The task's events start with its acceptance, sequence numbers are contiguous from 0,
    /// and attempts are numbered 1, 2, 3...
    Sequence,
}

impl Rule {
    pub fn name(self) -> &'static str {
        match self {
            Rule::IntentBeforeAttempt => "intent-before-attempt",
            Rule::NoBlindResend => "no-blind-resend",
            Rule::UnknownNotFailed => "unknown-not-failed",
            Rule::TerminalIsFinal => "terminal-is-final",
            Rule::Sequence => "sequence",
        }
    }
}

/// One broken rule, naming the events that break it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub rule: Rule,
    pub lsns: Vec<u64>,
    pub detail: String,
}

/// Checks one task's events (in task order) against the rules and returns its state and every
/// violation found. `key_ttl_ms`, when known from the target's configuration, also bounds how
/// long a same-key resend may come after the key's first use.
pub fn check_task<'a>(
    events: impl IntoIterator<Item = &'a Event>,
    key_ttl_ms: Option<u64>,
) -> (State, Vec<Violation>) {
    let mut state = State::default();
    let mut violations = Vec::new();
    let mut intent_lsn = 0u64;
    let mut unknown_lsn = 0u64;
    let mut terminal_lsn = 0u64;
    let mut flag =
        |rule, lsns: Vec<u64>, detail: String| violations.push(Violation { rule, lsns, detail });
    for event in events {
        let lsn = event.lsn;
        if event.task_seq != state.next_seq {
            flag(
                Rule::Sequence,
                vec![lsn],
                format!(
                    "task_seq {} where {} was due",
                    event.task_seq, state.next_seq
                ),
            );
        }
        let accepted = state.request.is_some();
        match &event.body {
            EventBody::TaskAccepted { .. } if accepted => {
                flag(Rule::Sequence, vec![lsn], "accepted twice".into())
            }
            EventBody::TaskAccepted { .. } => {}
            EventBody::InputRejected { .. } if state.next_seq > 0 => flag(
                Rule::Sequence,
                vec![lsn],
                "InputRejected is not the task's only event".into(),
            ),
            EventBody::InputRejected { .. } => {}
            _ if !accepted => flag(
                Rule::Sequence,
                vec![lsn],
                format!("{} before TaskAccepted", event.body.name()),
            ),
            _ => {}
        }
        if state.phase.is_terminal()
            && !matches!(
                event.body,
                EventBody::DuplicateDelivery { .. }
                    | EventBody::RequestConflict { .. }
                    | EventBody::OperatorNote { .. }
            )
        {
            flag(
                Rule::TerminalIsFinal,
                vec![terminal_lsn, lsn],
                format!(
                    "{} after the task was {}",
                    event.body.name(),
                    state.phase.name()
                ),
            );
        }
        match &event.body {
            EventBody::SendIntended {
                attempt,
                idempotency_key,
            } => {
                if *attempt != state.attempts + 1 {
                    flag(
                        Rule::Sequence,
                        vec![lsn],
                        format!("attempt {attempt} after attempt {}", state.attempts),
                    );
                }
                if let Some(open) = state.in_flight {
                    flag(
                        Rule::IntentBeforeAttempt,
                        vec![intent_lsn, lsn],
                        format!("attempt {attempt} intended while attempt {open} had no outcome"),
                    );
                }
                if state.unresolved_unknown && !state.resend_authorized {
                    let same_key =
                        idempotency_key.is_some() && *idempotency_key == state.idempotency_key;
                    let in_ttl = match (key_ttl_ms, state.key_since) {
                        (Some(ttl), Some(since)) => event.at < since.saturating_add(ttl),
                        _ => true,
                    };
                    if !same_key {
                        flag(Rule::NoBlindResend, vec![unknown_lsn, lsn], format!("attempt {attempt} after an unknown outcome with neither the same idempotency key nor a ResendAuthorized"));
                    } else if !in_ttl {
                        flag(
                            Rule::NoBlindResend,
                            vec![unknown_lsn, lsn],
                            format!("attempt {attempt} reused the idempotency key after its TTL"),
                        );
                    }
                }
                intent_lsn = lsn;
            }
            EventBody::SendNotSent { attempt, .. } | EventBody::SendUnknown { attempt, .. }
                if state.in_flight != Some(*attempt) =>
            {
                flag(
                    Rule::IntentBeforeAttempt,
                    vec![lsn],
                    format!(
                        "{} for attempt {attempt}, which has no open intent",
                        event.body.name()
                    ),
                );
            }
            EventBody::Confirmed {
                evidence: Evidence::Response { .. },
                ..
            }
            | EventBody::Rejected { .. }
                if state.in_flight.is_none() =>
            {
                flag(
                    Rule::IntentBeforeAttempt,
                    vec![lsn],
                    format!(
                        "{} from a response with no attempt in flight",
                        event.body.name()
                    ),
                );
            }
            EventBody::Failed { .. }
                if state.unresolved_unknown && state.phase != Phase::ManualReview =>
            {
                flag(
                    Rule::UnknownNotFailed,
                    vec![unknown_lsn, lsn],
                    "failed while an attempt's outcome was unknown, without review".into(),
                );
            }
            _ => {}
        }
        if let EventBody::SendUnknown { .. } = event.body {
            if !state.unresolved_unknown {
                unknown_lsn = lsn;
            }
        }
        state.apply(event.task_id, event.at, &event.body);
        if state.phase.is_terminal() && terminal_lsn == 0 {
            terminal_lsn = lsn;
        }
    }
    (state, violations)
}
