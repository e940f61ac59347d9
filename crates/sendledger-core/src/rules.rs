//! The rules of `docs/rules.md`, checked over a task's recorded events. Used by `audit` and by
//! the property tests of the decision functions.

use serde::Serialize;

use crate::event::{Event, EventBody, Evidence, ReviewReason};
use crate::event::{DEFAULT_MAX_POLICY_RESENDS, POLICY_PREFIX};
use crate::saga::{CompensationOutcome, Leg, StepOutcome};
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
    /// Rule 5: nothing happens to a task after its terminal state, except a retry that starts
    /// a new version: one terminal result per task version.
    TerminalIsFinal,
    /// The task's events start with its acceptance, sequence numbers are contiguous from 0,
    /// and attempts are numbered 1, 2, 3...
    Sequence,
    /// Rule 4: a target's policy authorizes a bounded number of resends per task, each only
    /// after a lookup that found nothing when the latest attempt's window had closed.
    PolicyResendLimit,
    /// A task is retried (`TaskRetried`, a new version) only once failed, and only when none
    /// of its attempts may have reached the remote: every one was proven not sent.
    RetryOnlyNotSent,
    /// A task's attempts move to a target other than its own (its first `SendIntendedAt` there)
    /// only while every earlier attempt of the task was proven not sent: nothing of the task can
    /// exist at the target it leaves.
    FallbackOnlyOnProof,
    /// A multi-step task compensates only a step that succeeded (the record its
    /// `CompensationStarted` undoes is the step's, or a duplicate an operator ordered undone
    /// from among the records the step's lookup found), by the saga's policy only once a
    /// later step ended rejected or failed, and by an operator only on an order to undo the
    /// whole task.
    CompensationOnlyForSuccess,
    /// At most one compensation per step: a step's compensation is not started again while
    /// one is underway or after one was done.
    CompensationOncePerStep,
    /// Compensations go in reverse order of their steps, one at a time: none starts while
    /// another is underway or refused, nor (by the policy) while a later step that succeeded
    /// still owes its own.
    CompensationsInReverseOrder,
    /// No step goes forward once a multi-step task owes compensation: every attempt after a
    /// step ended rejected or failed belongs to a compensation that was started. (The fold
    /// never moves a task from a compensation back to a step, so this is the one way a step
    /// could go forward.)
    NoForwardAfterCompensation,
    /// The versions of a request run one at a time, in order: a task's `RequestVersion` is
    /// recorded once, in its acceptance's write, under the task id of its identity and
    /// version, after a lower version; and (checked across tasks by the ledger's audit) a
    /// version records its first intent only once the version before it settled, which then
    /// records no intent again.
    VersionsInOrder,
}

impl Rule {
    pub fn name(self) -> &'static str {
        match self {
            Rule::IntentBeforeAttempt => "intent-before-attempt",
            Rule::NoBlindResend => "no-blind-resend",
            Rule::UnknownNotFailed => "unknown-not-failed",
            Rule::TerminalIsFinal => "terminal-is-final",
            Rule::Sequence => "sequence",
            Rule::PolicyResendLimit => "policy-resend-limit",
            Rule::RetryOnlyNotSent => "retry-only-not-sent",
            Rule::FallbackOnlyOnProof => "fallback-only-on-proof",
            Rule::CompensationOnlyForSuccess => "compensation-only-for-success",
            Rule::CompensationOncePerStep => "compensation-once-per-step",
            Rule::CompensationsInReverseOrder => "compensations-in-reverse-order",
            Rule::NoForwardAfterCompensation => "no-forward-after-compensation",
            Rule::VersionsInOrder => "versions-in-order",
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

/// What the checker knows of the targets' configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckConfig {
    /// When known: how long after the key's first use a same-key resend may come.
    pub key_ttl_ms: Option<u64>,
    /// The most resends a target's policy may authorize per task (the highest
    /// `lookup.max_policy_resends` of the configured targets).
    pub max_policy_resends: u32,
}

impl Default for CheckConfig {
    fn default() -> Self {
        CheckConfig {
            key_ttl_ms: None,
            max_policy_resends: DEFAULT_MAX_POLICY_RESENDS,
        }
    }
}

/// Checks one task's events (in task order) against the rules and returns its state and every
/// violation found.
pub fn check_task<'a>(
    events: impl IntoIterator<Item = &'a Event>,
    config: CheckConfig,
) -> (State, Vec<Violation>) {
    let mut check = TaskCheck::new(config);
    let mut violations = Vec::new();
    for event in events {
        check.push(event, &mut violations);
    }
    (check.state, violations)
}

/// [`check_task`] one event at a time, for replays that see a task's events interleaved with
/// other tasks' (the audit) and cannot hold them all.
#[derive(Debug, Clone)]
pub struct TaskCheck {
    state: State,
    config: CheckConfig,
    intent_lsn: u64,
    unknown_lsn: u64,
    lookup_lsn: u64,
    terminal_lsn: u64,
    /// The task's `RequestVersion` was checked.
    versioned: bool,
}

impl TaskCheck {
    pub fn new(config: CheckConfig) -> TaskCheck {
        TaskCheck {
            state: State::default(),
            config,
            intent_lsn: 0,
            unknown_lsn: 0,
            lookup_lsn: 0,
            terminal_lsn: 0,
            versioned: false,
        }
    }

    /// The task's state after the events pushed so far.
    pub fn state(&self) -> &State {
        &self.state
    }

    pub fn into_state(self) -> State {
        self.state
    }

    /// Checks the task's next event, adds what it breaks to `violations`, and folds it in.
    /// Each rule is checked on its own, in this order.
    pub fn push(&mut self, event: &Event, violations: &mut Vec<Violation>) {
        self.task_order(event, violations);
        self.terminal_is_final(event, violations);
        self.attempt_numbering(event, violations);
        self.intent_before_attempt(event, violations);
        self.no_blind_resend(event, violations);
        self.policy_resend_limit(event, violations);
        self.unknown_not_failed(event, violations);
        self.retry_only_not_sent(event, violations);
        self.fallback_only_on_proof(event, violations);
        self.compensations(event, violations);
        self.no_forward_after_compensation(event, violations);
        self.versions(event, violations);
        self.fold_in(event);
    }

    /// [`Rule::Sequence`]: task sequence numbers are contiguous from 0, and a task starts with
    /// its acceptance (or is one rejected message, alone).
    fn task_order(&self, event: &Event, out: &mut Vec<Violation>) {
        let (state, lsn) = (&self.state, event.lsn);
        if event.task_seq < state.next_seq {
            flag(
                out,
                Rule::Sequence,
                vec![lsn],
                format!(
                    "a second event at task_seq {} where {} was due: two histories of the task (two writers each wrote one)",
                    event.task_seq, state.next_seq
                ),
            );
        } else if event.task_seq > state.next_seq {
            flag(
                out,
                Rule::Sequence,
                vec![lsn],
                format!(
                    "task_seq {} where {} was due",
                    event.task_seq, state.next_seq
                ),
            );
        }
        let accepted = state.request.is_some();
        let problem = match &event.body {
            EventBody::TaskAccepted { .. } if accepted => "accepted twice".into(),
            EventBody::TaskAccepted { .. } => return,
            EventBody::InputRejected { .. } if state.next_seq > 0 => {
                "InputRejected is not the task's only event".into()
            }
            EventBody::InputRejected { .. } => return,
            EventBody::Pruned { .. } if state.next_seq > 0 || event.task_seq > 0 => {
                "Pruned is not where the task's history begins".into()
            }
            EventBody::Pruned { .. } => return,
            _ if !accepted => format!("{} before TaskAccepted", event.body.name()),
            _ => return,
        };
        flag(out, Rule::Sequence, vec![lsn], problem);
    }

    /// [`Rule::TerminalIsFinal`]: after a terminal state only redeliveries, conflicts, notes
    /// and (after a failure) a retry, which [`Rule::RetryOnlyNotSent`] checks.
    fn terminal_is_final(&self, event: &Event, out: &mut Vec<Violation>) {
        let state = &self.state;
        let allowed = match event.body {
            EventBody::DuplicateDelivery { .. }
            | EventBody::RequestConflict { .. }
            | EventBody::OperatorNote { .. }
            | EventBody::OperatorCredential { .. } => true,
            EventBody::TaskRetried { .. } => state.phase == Phase::Failed,
            // Kafka mode: two owners' histories were found in the log; what the replaced one
            // did may undo what the kept one settled.
            EventBody::ManualReviewRequired {
                reason: ReviewReason::DivergentHistory { .. },
            } => true,
            _ => false,
        };
        if state.phase.is_terminal() && !allowed {
            flag(
                out,
                Rule::TerminalIsFinal,
                vec![self.terminal_lsn, event.lsn],
                format!(
                    "{} after the task was {}",
                    event.body.name(),
                    state.phase.name()
                ),
            );
        }
    }

    /// [`Rule::Sequence`]: attempts are numbered 1, 2, 3...
    fn attempt_numbering(&self, event: &Event, out: &mut Vec<Violation>) {
        let Some((attempt, _)) = event.body.intent() else {
            return;
        };
        if attempt != self.state.attempts + 1 {
            flag(
                out,
                Rule::Sequence,
                vec![event.lsn],
                format!("attempt {attempt} after attempt {}", self.state.attempts),
            );
        }
    }

    /// [`Rule::IntentBeforeAttempt`]: one attempt in flight at a time, and every outcome belongs
    /// to the attempt whose intent is open.
    fn intent_before_attempt(&self, event: &Event, out: &mut Vec<Violation>) {
        let (state, lsn) = (&self.state, event.lsn);
        match &event.body {
            EventBody::SendIntended { attempt, .. } | EventBody::SendIntendedAt { attempt, .. } => {
                if let Some(open) = state.in_flight {
                    flag(
                        out,
                        Rule::IntentBeforeAttempt,
                        vec![self.intent_lsn, lsn],
                        format!("attempt {attempt} intended while attempt {open} had no outcome"),
                    );
                }
            }
            EventBody::SendDeferred { .. } if state.in_flight.is_some() => {
                flag(
                    out,
                    Rule::IntentBeforeAttempt,
                    vec![self.intent_lsn, lsn],
                    "SendDeferred while an attempt had no outcome".into(),
                );
            }
            EventBody::SendNotSent { attempt, .. } | EventBody::SendUnknown { attempt, .. }
                if state.in_flight != Some(*attempt) =>
            {
                flag(
                    out,
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
                    out,
                    Rule::IntentBeforeAttempt,
                    vec![lsn],
                    format!(
                        "{} from a response with no attempt in flight",
                        event.body.name()
                    ),
                );
            }
            _ => {}
        }
    }

    /// [`Rule::NoBlindResend`]: after an unknown outcome, a new attempt reuses the idempotency
    /// key within its TTL, or follows a `ResendAuthorized`.
    fn no_blind_resend(&self, event: &Event, out: &mut Vec<Violation>) {
        let state = &self.state;
        let Some((attempt, idempotency_key)) = event.body.intent() else {
            return;
        };
        if !state.unresolved_unknown || state.resend_authorized {
            return;
        }
        // A key is a promise of the target that saw it: it says nothing at another.
        let same_target =
            matches!(event.body, EventBody::SendIntended { .. }) == state.fallback_target.is_none();
        let same_key =
            same_target && idempotency_key.is_some() && *idempotency_key == state.idempotency_key;
        let in_ttl = match (self.config.key_ttl_ms, state.key_since) {
            (Some(ttl), Some(since)) => event.at < since.saturating_add(ttl),
            _ => true,
        };
        let lsns = vec![self.unknown_lsn, event.lsn];
        if !same_key {
            flag(out, Rule::NoBlindResend, lsns, format!("attempt {attempt} after an unknown outcome with neither the same idempotency key nor a ResendAuthorized"));
        } else if !in_ttl {
            flag(
                out,
                Rule::NoBlindResend,
                lsns,
                format!("attempt {attempt} reused the idempotency key after its TTL"),
            );
        }
    }

    /// [`Rule::PolicyResendLimit`]: a target's policy authorizes a bounded number of resends,
    /// each only after a final lookup that found nothing after the latest unknown outcome.
    fn policy_resend_limit(&self, event: &Event, out: &mut Vec<Violation>) {
        let (state, lsn) = (&self.state, event.lsn);
        match &event.body {
            EventBody::ResendAuthorized { by, .. } if by.starts_with(POLICY_PREFIX) => {}
            _ => return,
        }
        if state.policy_resends >= self.config.max_policy_resends {
            flag(
                out,
                Rule::PolicyResendLimit,
                vec![lsn],
                format!(
                    "policy resend {} where at most {} are allowed",
                    state.policy_resends + 1,
                    self.config.max_policy_resends
                ),
            );
        }
        if state.phase != Phase::Unknown
            || state.in_flight.is_some()
            || state.next_check_at.is_some()
            || !state.last_matches.is_empty()
            || self.lookup_lsn < self.unknown_lsn
        {
            flag(
                out,
                Rule::PolicyResendLimit,
                vec![self.unknown_lsn, lsn],
                "policy resend without a final lookup that found nothing after the \
                 latest unknown outcome"
                    .into(),
            );
        }
    }

    /// [`Rule::UnknownNotFailed`]: an unknown outcome is never settled as failed without a
    /// person.
    fn unknown_not_failed(&self, event: &Event, out: &mut Vec<Violation>) {
        let state = &self.state;
        if matches!(event.body, EventBody::Failed { .. })
            && state.unresolved_unknown
            && state.phase != Phase::ManualReview
        {
            flag(
                out,
                Rule::UnknownNotFailed,
                vec![self.unknown_lsn, event.lsn],
                "failed while an attempt's outcome was unknown, without review".into(),
            );
        }
    }

    /// [`Rule::RetryOnlyNotSent`]: a retry follows a failure none of whose attempts may have
    /// reached the remote.
    fn retry_only_not_sent(&self, event: &Event, out: &mut Vec<Violation>) {
        if !matches!(event.body, EventBody::TaskRetried { .. }) {
            return;
        }
        if let Err(why) = self.state.retryable() {
            flag(
                out,
                Rule::RetryOnlyNotSent,
                vec![self.unknown_lsn.max(self.terminal_lsn), event.lsn],
                format!(
                    "TaskRetried while the task was {}: {why}",
                    self.state.phase.name()
                ),
            );
        }
    }

    /// [`Rule::FallbackOnlyOnProof`]: a task moves its attempts to another target than its own
    /// only after attempts proven not sent.
    fn fallback_only_on_proof(&self, event: &Event, out: &mut Vec<Violation>) {
        let EventBody::SendIntendedAt {
            attempt, target, ..
        } = &event.body
        else {
            return;
        };
        // A later attempt at the same fallback is a retry or resend there, which the other
        // rules judge.
        let moves = self.state.fallback_target.as_ref() != Some(target);
        if moves && self.state.unknowns > 0 {
            flag(
                out,
                Rule::FallbackOnlyOnProof,
                vec![self.unknown_lsn, event.lsn],
                format!(
                    "attempt {attempt} at {target} after an attempt of the task may have \
                     reached a remote (its outcome was unknown)"
                ),
            );
        }
    }

    /// [`Rule::CompensationOnlyForSuccess`], [`Rule::CompensationOncePerStep`] and
    /// [`Rule::CompensationsInReverseOrder`], at each `CompensationStarted` and
    /// `CompensationOrdered`.
    fn compensations(&self, event: &Event, out: &mut Vec<Violation>) {
        let lsns = vec![event.lsn];
        if let EventBody::CompensationOrdered { duplicates, .. } = &event.body {
            let found = match &self.state.review_reason {
                Some(ReviewReason::MultipleMatches { remote_ids }) => remote_ids.as_slice(),
                _ => &[],
            };
            if let Some(id) = duplicates.iter().find(|id| !found.contains(id)) {
                let detail = format!("{id} ordered undone as a duplicate, and no lookup found it");
                flag(out, Rule::CompensationOnlyForSuccess, lsns, detail);
            }
            return;
        }
        let EventBody::CompensationStarted {
            step,
            remote_id,
            by,
            ..
        } = &event.body
        else {
            return;
        };
        let Some(saga) = &self.state.saga else {
            let detail = "CompensationStarted in a task that has no steps".into();
            return flag(out, Rule::CompensationOnlyForSuccess, lsns, detail);
        };
        let Some(s) = saga.steps.get(*step as usize) else {
            let detail = format!("CompensationStarted for step {step}, which is not planned");
            return flag(out, Rule::CompensationOnlyForSuccess, lsns, detail);
        };
        let open = saga
            .steps
            .iter()
            .find(|o| !std::ptr::eq(*o, s) && o.compensation_open());
        let duplicate = s.owed_duplicate(Some(remote_id)).is_some();
        if duplicate {
            if let Some(o) = open {
                let detail = format!(
                    "undo of a duplicate of step {} before the compensation of step {} was done",
                    s.name, o.name
                );
                flag(out, Rule::CompensationsInReverseOrder, lsns, detail);
            }
            return;
        }
        let done = match &s.outcome {
            StepOutcome::Succeeded { remote_id: id } => Some(id),
            _ => None,
        };
        if done.is_none() || s.compensate.is_none() {
            let detail = format!(
                "compensation of step {} ({}), which did not succeed or cannot be undone",
                s.name, s.target
            );
            flag(out, Rule::CompensationOnlyForSuccess, lsns.clone(), detail);
        } else if done != Some(remote_id) {
            let detail = format!(
                "the compensation of step {} undoes {remote_id}, which is neither the step's \
                 record nor a duplicate ordered undone",
                s.name
            );
            flag(out, Rule::CompensationOnlyForSuccess, lsns.clone(), detail);
        }
        let a_later_one_failed = saga.steps.iter().skip(*step as usize + 1).any(|s| {
            matches!(
                s.outcome,
                StepOutcome::Rejected { .. } | StepOutcome::Failed { .. }
            )
        });
        let ordered = saga.ordered_by.as_ref().is_some_and(|(o, _)| o == by);
        if by.starts_with(POLICY_PREFIX) && !a_later_one_failed {
            let detail = format!(
                "the policy compensated step {} while no later step ended rejected or failed",
                s.name
            );
            flag(out, Rule::CompensationOnlyForSuccess, lsns.clone(), detail);
        } else if !by.starts_with(POLICY_PREFIX) && !ordered {
            let detail = format!(
                "{by} compensated step {} without an order to undo the whole task",
                s.name
            );
            flag(out, Rule::CompensationOnlyForSuccess, lsns.clone(), detail);
        }
        if let Some(c) = &s.compensation {
            if !matches!(c.outcome, CompensationOutcome::Refused { .. }) {
                let detail = format!("a second compensation of step {}", s.name);
                flag(out, Rule::CompensationOncePerStep, lsns.clone(), detail);
            }
        }
        let later_owed =
            (saga.steps.iter().skip(*step as usize + 1)).find(|o| o.owes_compensation());
        let duplicate_owed = saga.steps.iter().find(|o| o.owed_duplicate(None).is_some());
        if let Some(o) = open.or(later_owed).or(duplicate_owed) {
            let detail = format!(
                "compensation of step {} before the compensation of step {} was done",
                s.name, o.name
            );
            flag(out, Rule::CompensationsInReverseOrder, lsns, detail);
        }
    }

    /// [`Rule::NoForwardAfterCompensation`].
    fn no_forward_after_compensation(&self, event: &Event, out: &mut Vec<Violation>) {
        let state = &self.state;
        let Some(saga) = &state.saga else {
            return;
        };
        let owed = saga.compensating || state.phase == Phase::Compensating;
        let forward = matches!(saga.leg, Leg::Step(_));
        let attempt = event.body.intent().is_some();
        if owed && attempt && (forward || state.phase == Phase::Compensating) {
            let detail = format!(
                "{} while the task owed compensation and no compensation was started",
                event.body.name()
            );
            flag(
                out,
                Rule::NoForwardAfterCompensation,
                vec![event.lsn],
                detail,
            );
        }
    }

    /// [`Rule::VersionsInOrder`], within the task: its `RequestVersion`.
    fn versions(&self, event: &Event, out: &mut Vec<Violation>) {
        let EventBody::RequestVersion { version, previous } = &event.body else {
            return;
        };
        let Some(request) = &self.state.request else {
            // Rule::Sequence names it.
            return;
        };
        // TaskAccepted, and a multi-step task's StepsPlanned, come first.
        let due = 1 + u32::from(self.state.saga.is_some());
        let problem = if self.versioned {
            "RequestVersion recorded twice".to_string()
        } else if *version == 0 {
            "RequestVersion of version 0 (a request naming no version records none)".to_string()
        } else if self.state.next_seq != due {
            format!(
                "RequestVersion at task_seq {} rather than in the acceptance's write (task_seq {due})",
                self.state.next_seq
            )
        } else if event.task_id != request.identity.task_id_at(*version) {
            format!(
                "task {} holds version {version} of {}, whose task is {}",
                event.task_id,
                request.identity,
                request.identity.task_id_at(*version)
            )
        } else if let Some(p) = previous.filter(|p| p.version >= *version) {
            format!(
                "version {version} names version {} as the one before it",
                p.version
            )
        } else {
            return;
        };
        flag(out, Rule::VersionsInOrder, vec![event.lsn], problem);
    }

    /// Folds the checked event into the state and remembers the positions later rules name.
    fn fold_in(&mut self, event: &Event) {
        let lsn = event.lsn;
        match event.body {
            EventBody::SendIntended { .. } | EventBody::SendIntendedAt { .. } => {
                self.intent_lsn = lsn
            }
            EventBody::SendUnknown { .. } => self.unknown_lsn = lsn,
            EventBody::LookupPerformed { .. } => self.lookup_lsn = lsn,
            EventBody::RequestVersion { .. } => self.versioned = true,
            _ => {}
        }
        self.state.apply(event.task_id, event.at, &event.body);
        if !self.state.phase.is_terminal() {
            // A retry starts a new version, which may reach a terminal state of its own.
            self.terminal_lsn = 0;
        } else if self.terminal_lsn == 0 {
            self.terminal_lsn = lsn;
        }
    }
}

fn flag(out: &mut Vec<Violation>, rule: Rule, lsns: Vec<u64>, detail: String) {
    out.push(Violation { rule, lsns, detail });
}
