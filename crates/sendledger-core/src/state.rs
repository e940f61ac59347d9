//! A task's state: the pure fold of its events.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::event::{
    Event, EventBody, Evidence, Millis, NotSentCause, PreviousVersion, ReviewReason, Source,
    WaitReason,
};
use crate::ids::{PayloadHash, TaskId};
use crate::request::AcceptedRequest;
use crate::retry::RetryClass;
use crate::saga::{Compensation, CompensationOutcome, Leg, Saga, StepOutcome};

/// Where a task is in the state machine (`docs/rules.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Phase {
    /// No event yet.
    New,
    /// Accepted, no attempt intended yet.
    Accepted,
    /// An attempt's intent is durable and its outcome is not recorded.
    Sending,
    /// The last attempt certainly did not reach the remote; a retry is scheduled.
    RetryWait,
    /// An attempt may have reached the remote; reconciling.
    Unknown,
    /// A person must decide.
    ManualReview,
    Succeeded,
    Rejected,
    Failed,
    /// A multi-step task: a step ended rejected or failed, and the compensation of a step
    /// before it is owed; it begins at once.
    Compensating,
    /// A multi-step task whose failure was compensated: every step before the one that ended
    /// rejected or failed that could be undone was undone.
    Compensated,
}

impl Phase {
    /// Every phase a task can be in (all but `new`), in state-machine order.
    pub const ALL: [Phase; 10] = [
        Phase::Accepted,
        Phase::Sending,
        Phase::RetryWait,
        Phase::Unknown,
        Phase::ManualReview,
        Phase::Succeeded,
        Phase::Rejected,
        Phase::Failed,
        Phase::Compensating,
        Phase::Compensated,
    ];

    /// The phase of a name as [`Phase::name`] writes it.
    pub fn parse(name: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| p.name() == name)
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Phase::Succeeded | Phase::Rejected | Phase::Failed | Phase::Compensated
        )
    }

    /// Whether a task in this phase has something to do without new input, so that a restart
    /// or a take-over resumes it (`Input::Recover`): a multi-step task between two legs
    /// (`accepted`, `compensating`) included.
    pub fn resumable(self) -> bool {
        matches!(
            self,
            Phase::Accepted
                | Phase::Sending
                | Phase::RetryWait
                | Phase::Unknown
                | Phase::Compensating
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Phase::New => "new",
            Phase::Accepted => "accepted",
            Phase::Sending => "sending",
            Phase::RetryWait => "retry_wait",
            Phase::Unknown => "unknown",
            Phase::ManualReview => "manual_review",
            Phase::Succeeded => "succeeded",
            Phase::Rejected => "rejected",
            Phase::Failed => "failed",
            Phase::Compensating => "compensating",
            Phase::Compensated => "compensated",
        }
    }
}

/// Everything sendledger knows about one task, derived from its events alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub task_id: Option<TaskId>,
    pub request: Option<AcceptedRequest>,
    pub payload_hash: Option<PayloadHash>,
    /// The delivery that created the task (its input partition decides its owner).
    pub source: Option<Source>,
    pub phase: Phase,
    /// Number of events folded; the next event's `task_seq`.
    pub next_seq: u32,
    /// When the first attempt was intended: nothing of this task can exist remotely before it.
    pub first_intent_at: Option<Millis>,
    /// Highest attempt number intended so far.
    pub attempts: u32,
    /// The attempt whose intent is durable and whose outcome is not recorded.
    pub in_flight: Option<u32>,
    /// When the next retry may start (RetryWait).
    pub retry_at: Option<Millis>,
    /// Some attempt may have reached the remote and nothing confirmed or settled it.
    pub unresolved_unknown: bool,
    /// When the latest attempt's outcome became unknown: its observation deadline counts from
    /// here (each unknown attempt has its own window).
    pub unknown_since: Option<Millis>,
    /// Resends authorized by the target's policy (not by a person) so far.
    pub policy_resends: u32,
    /// A resend after an unknown was authorized and not yet used by an attempt that may
    /// have reached the remote.
    pub resend_authorized: bool,
    /// The idempotency key of the latest attempt, and when it was first used.
    pub idempotency_key: Option<String>,
    pub key_since: Option<Millis>,
    /// Attempts not sent because this process ran out of a local resource; they do not count
    /// against the target's `max_attempts`.
    pub local_not_sent: u32,
    /// Attempts not sent, by class of reason (what per-class retry policies count).
    pub not_sent_by_class: BTreeMap<RetryClass, u32>,
    /// How many distinct idempotency keys the task has used.
    pub key_generation: u32,
    pub lookups: u32,
    pub next_check_at: Option<Millis>,
    pub last_matches: Vec<String>,
    pub remote_id: Option<String>,
    pub evidence: Option<Evidence>,
    pub review_reason: Option<ReviewReason>,
    pub rejection: Option<(u16, String)>,
    pub failure: Option<String>,
    pub duplicates: u32,
    pub conflicts: u32,
    pub last_at: Millis,
    /// Set while the task waits before its next intent (`SendDeferred`), until that intent.
    pub waiting: Option<Waiting>,
    /// When the task entered its current phase.
    pub phase_since: Millis,
    /// The task's version: 1, plus one per `TaskRetried`. Each version has at most one
    /// terminal result, and a later version's supersedes an earlier one's.
    pub version: u32,
    /// Attempts intended before the current attempt budget began (a new version, or the move
    /// to the fallback target): the target's `max_attempts` counts the budget's own.
    pub attempts_before_budget: u32,
    /// The target the current version's attempts go to when it is not the task's own: its
    /// fallback, from the first `SendIntendedAt` of the version on.
    pub fallback_target: Option<String>,
    /// Attempts whose outcome became unknown, in the task's whole life: a task with one cannot
    /// be retried (it needs reconciliation or a person).
    pub unknowns: u32,
    /// Why the last attempt not sent was not sent.
    pub last_not_sent: Option<FailureKind>,
    /// Why the task failed, as a kind (for the index and bulk retries).
    pub failure_kind: Option<FailureKind>,
    /// A multi-step task's steps; `None` for a one-step task. The per-attempt fields above
    /// are about the current leg (a step, or the compensation of one).
    pub saga: Option<Saga>,
    /// The task's events up to its terminal result were removed by retention: what is known of
    /// it is what [`crate::Retained`] keeps (not its payload: it cannot be retried).
    pub pruned: bool,
    /// Of a removed task, how many events what was kept stands for: events from this sequence
    /// number on were recorded after the removal (a duplicate delivery), and retention removes
    /// them in turn.
    pub pruned_events: u32,
    /// Of a task whose request names a version (`RequestVersion`): the identity's version
    /// accepted before it, which must be settled before this one sends.
    pub previous_version: Option<PreviousVersion>,
}

/// Why a task failed, as a kind that lists and bulk operations select by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// Attempts exhausted on connection failures (DNS, refused, connect timeout, TLS).
    Connect,
    /// Attempts exhausted on 429, or 503 with `Retry-After`.
    Throttled,
    /// Attempts exhausted on 5xx answers the target declares `not_sent`.
    ServerError,
    /// Attempts exhausted on this process's own resources (or send lease).
    LocalResources,
    /// An operator resolved a review as failed.
    Operator,
}

impl FailureKind {
    // format: do not change (the codes are on disk, in the task index)
    pub const ALL: [FailureKind; 5] = [
        FailureKind::Connect,
        FailureKind::Throttled,
        FailureKind::ServerError,
        FailureKind::LocalResources,
        FailureKind::Operator,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FailureKind::Connect => "connect",
            FailureKind::Throttled => "throttled",
            FailureKind::ServerError => "server_error",
            FailureKind::LocalResources => "local_resources",
            FailureKind::Operator => "operator",
        }
    }

    pub fn parse(name: &str) -> Option<FailureKind> {
        FailureKind::ALL.into_iter().find(|k| k.name() == name)
    }

    fn of(cause: &NotSentCause) -> FailureKind {
        match cause {
            NotSentCause::Connect(_) => FailureKind::Connect,
            NotSentCause::Throttled { .. } => FailureKind::Throttled,
            NotSentCause::ServerError { .. } => FailureKind::ServerError,
            NotSentCause::LocalResources(_) | NotSentCause::NotBuilt(_) => {
                FailureKind::LocalResources
            }
        }
    }
}

/// A wait before an intent, as its `SendDeferred` recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Waiting {
    /// When the wait began.
    pub since: Millis,
    /// When the task first looks again (it may find the target still unavailable and wait on
    /// without recording it again).
    pub until: Millis,
    pub reason: WaitReason,
}

impl Default for State {
    fn default() -> Self {
        State {
            task_id: None,
            request: None,
            payload_hash: None,
            source: None,
            phase: Phase::New,
            next_seq: 0,
            first_intent_at: None,
            attempts: 0,
            in_flight: None,
            retry_at: None,
            unresolved_unknown: false,
            unknown_since: None,
            policy_resends: 0,
            resend_authorized: false,
            idempotency_key: None,
            key_since: None,
            local_not_sent: 0,
            not_sent_by_class: BTreeMap::new(),
            key_generation: 0,
            lookups: 0,
            next_check_at: None,
            last_matches: Vec::new(),
            remote_id: None,
            evidence: None,
            review_reason: None,
            rejection: None,
            failure: None,
            duplicates: 0,
            conflicts: 0,
            last_at: 0,
            waiting: None,
            phase_since: 0,
            version: 1,
            attempts_before_budget: 0,
            fallback_target: None,
            unknowns: 0,
            last_not_sent: None,
            failure_kind: None,
            saga: None,
            pruned: false,
            pruned_events: 0,
            previous_version: None,
        }
    }
}

/// The state of a task after the given events, in order.
pub fn fold<'a>(events: impl IntoIterator<Item = &'a Event>) -> State {
    let mut state = State::default();
    for event in events {
        state.apply(event.task_id, event.at, &event.body);
    }
    state
}

impl State {
    /// Applies one event. Total: any sequence folds to some state; whether the sequence obeyed
    /// the rules is the business of [`crate::rules`].
    pub fn apply(&mut self, task_id: TaskId, at: Millis, body: &EventBody) {
        self.task_id.get_or_insert(task_id);
        self.next_seq += 1;
        self.last_at = at;
        let before = self.phase;
        self.fold_body(at, body);
        if self.phase != before {
            self.phase_since = at;
        }
    }

    fn fold_body(&mut self, at: Millis, body: &EventBody) {
        match body {
            EventBody::TaskAccepted {
                request,
                payload_hash,
                source,
            } => {
                if self.request.is_none() {
                    self.request = Some(request.clone());
                    self.payload_hash = Some(*payload_hash);
                    self.source = Some(source.clone());
                    self.phase = Phase::Accepted;
                }
            }
            EventBody::DuplicateDelivery { .. } => self.duplicates += 1,
            EventBody::RequestConflict { .. } => self.conflicts += 1,
            EventBody::RequestVersion { version, previous } => {
                if let Some(request) = &mut self.request {
                    request.version = *version;
                }
                self.previous_version = *previous;
            }
            EventBody::SendIntended {
                attempt,
                idempotency_key,
            } => self.intended(at, *attempt, idempotency_key),
            EventBody::SendNotSent {
                retry_at, cause, ..
            } => {
                self.in_flight = None;
                if matches!(cause, NotSentCause::LocalResources(_)) {
                    self.local_not_sent += 1;
                }
                if let Some(class) = RetryClass::of(cause) {
                    *self.not_sent_by_class.entry(class).or_default() += 1;
                }
                self.last_not_sent = Some(FailureKind::of(cause));
                self.retry_at = Some(*retry_at);
                self.phase = if self.unresolved_unknown {
                    Phase::Unknown
                } else {
                    Phase::RetryWait
                };
            }
            EventBody::SendUnknown { .. } => {
                self.unknowns += 1;
                self.in_flight = None;
                self.resend_authorized = false;
                self.unresolved_unknown = true;
                self.unknown_since = Some(at);
                self.phase = Phase::Unknown;
            }
            EventBody::Confirmed {
                remote_id,
                evidence,
            } => {
                self.in_flight = None;
                self.remote_id = Some(remote_id.clone());
                self.evidence = Some(evidence.clone());
                self.confirmed(remote_id);
            }
            EventBody::Rejected { status, detail } => {
                self.in_flight = None;
                self.rejection = Some((*status, detail.clone()));
                self.refused(*status, detail);
            }
            EventBody::LookupPerformed {
                matches,
                next_check_at,
            } => {
                self.lookups += 1;
                self.last_matches = matches.clone();
                self.next_check_at = *next_check_at;
            }
            EventBody::ManualReviewRequired { reason } => {
                self.review_reason = Some(reason.clone());
                self.next_check_at = None;
                self.phase = Phase::ManualReview;
            }
            EventBody::ResendAuthorized { by, .. } => {
                self.resend_authorized = true;
                if by.starts_with(crate::event::POLICY_PREFIX) {
                    self.policy_resends += 1;
                }
                // An operator's authorization ends the review: the task is unknown again, with
                // its next attempt allowed (sent at its next wake, or when the engine resumes it).
                if self.phase == Phase::ManualReview {
                    self.phase = Phase::Unknown;
                }
            }
            EventBody::Failed { reason } => {
                self.failure_kind = Some(match (self.phase, self.last_not_sent) {
                    (Phase::ManualReview, _) | (_, None) => FailureKind::Operator,
                    (_, Some(kind)) => kind,
                });
                self.in_flight = None;
                self.failure = Some(reason.clone());
                self.failed(reason);
            }
            EventBody::OperatorNote { .. } | EventBody::OperatorCredential { .. } => {}
            EventBody::Pruned { retained } => {
                if self.request.is_none() {
                    self.seed(retained);
                }
            }
            EventBody::SendDeferred { until, reason } => {
                self.waiting = Some(Waiting {
                    since: at,
                    until: *until,
                    reason: reason.clone(),
                });
            }
            EventBody::TaskRetried { .. } => {
                if self.phase == Phase::Failed {
                    self.version += 1;
                    self.attempts_before_budget = self.attempts;
                    self.local_not_sent = 0;
                    self.not_sent_by_class.clear();
                    self.failure = None;
                    self.failure_kind = None;
                    self.fallback_target = None;
                    self.retry_at = Some(at);
                    self.phase = Phase::RetryWait;
                }
            }
            EventBody::SendIntendedAt {
                attempt,
                idempotency_key,
                target,
            } => {
                if self.fallback_target.as_ref() != Some(target) {
                    // The fallback's own attempt budget begins.
                    self.fallback_target = Some(target.clone());
                    self.attempts_before_budget = attempt.saturating_sub(1);
                    self.local_not_sent = 0;
                    self.not_sent_by_class.clear();
                }
                self.intended(at, *attempt, idempotency_key);
            }
            EventBody::InputRejected { source, reason, .. } => {
                if self.request.is_none() && self.phase == Phase::New {
                    self.source = Some(source.clone());
                    self.rejection = Some((0, reason.clone()));
                    self.phase = Phase::Rejected;
                }
            }
            EventBody::StepsPlanned { steps } => {
                if self.saga.is_none() && self.phase == Phase::Accepted && self.attempts == 0 {
                    self.saga = Some(Saga::planned(steps));
                }
            }
            EventBody::CompensationStarted {
                step,
                remote_id,
                by,
                ..
            } => {
                let Some(saga) = &mut self.saga else {
                    return;
                };
                let Some(s) = saga.steps.get_mut(*step as usize) else {
                    return;
                };
                let duplicate = (s.duplicates.iter_mut())
                    .find(|c| c.outcome == CompensationOutcome::Owed && c.undoes == *remote_id);
                match duplicate {
                    Some(c) => c.outcome = CompensationOutcome::Underway,
                    None => {
                        s.compensation = Some(Compensation {
                            undoes: remote_id.clone(),
                            by: by.clone(),
                            outcome: CompensationOutcome::Underway,
                        });
                        saga.compensating = true;
                    }
                }
                saga.leg = Leg::Compensation(*step);
                self.begin_leg();
            }
            EventBody::CompensationOrdered {
                step,
                record,
                duplicates,
                whole_task,
                by,
                reason,
            } => {
                let Some(saga) = &mut self.saga else {
                    return;
                };
                if saga.leg != Leg::Step(*step) {
                    return;
                }
                let Some(s) = saga.step_mut() else {
                    return;
                };
                s.outcome = StepOutcome::Succeeded {
                    remote_id: record.clone(),
                };
                s.duplicates = (duplicates.iter())
                    .map(|id| Compensation {
                        undoes: id.clone(),
                        by: by.clone(),
                        outcome: CompensationOutcome::Owed,
                    })
                    .collect();
                if *whole_task {
                    saga.compensating = true;
                    saga.ordered_by = Some((by.clone(), reason.clone()));
                }
                self.in_flight = None;
                self.remote_id = Some(record.clone());
                self.evidence = Some(Evidence::Operator {
                    by: by.clone(),
                    reason: reason.clone(),
                });
                self.after_compensation();
            }
            EventBody::StepAnswer { fields } => {
                if let Some(step) = (self.saga.as_mut())
                    .filter(|s| matches!(s.leg, Leg::Step(_)))
                    .and_then(Saga::step_mut)
                {
                    step.answer = fields.clone();
                }
            }
        }
    }

    /// A multi-step task's call confirmed: a step's (the next step follows, or the task
    /// succeeded) or a compensation's (the next compensation follows, or the task is
    /// compensated). A one-step task succeeded.
    fn confirmed(&mut self, remote_id: &str) {
        let Some(saga) = &mut self.saga else {
            return self.settle(Phase::Succeeded);
        };
        match saga.leg {
            Leg::Step(n) => {
                if let Some(step) = saga.step_mut() {
                    step.outcome = StepOutcome::Succeeded {
                        remote_id: remote_id.to_string(),
                    };
                }
                if (n as usize) + 1 < saga.steps.len() {
                    saga.leg = Leg::Step(n + 1);
                    self.begin_leg();
                } else {
                    self.settle(Phase::Succeeded);
                }
            }
            Leg::Compensation(_) => {
                if let Some(c) = saga.compensation_mut() {
                    c.outcome = CompensationOutcome::Done {
                        remote_id: remote_id.to_string(),
                    };
                }
                self.after_compensation();
            }
        }
    }

    /// A call refused: a one-step task's, or a step's (its compensations follow when one is
    /// owed), or a compensation's (which a person must look at: review follows).
    fn refused(&mut self, status: u16, detail: &str) {
        let Some(saga) = &mut self.saga else {
            return self.settle(Phase::Rejected);
        };
        match saga.leg {
            Leg::Step(_) => {
                if let Some(step) = saga.step_mut() {
                    step.outcome = StepOutcome::Rejected {
                        http_status: status,
                        detail: detail.to_string(),
                    };
                }
                self.forward_ended(Phase::Rejected);
            }
            Leg::Compensation(_) => {
                if let Some(c) = saga.compensation_mut() {
                    c.outcome = CompensationOutcome::Refused {
                        http_status: status,
                        detail: detail.to_string(),
                    };
                }
                self.settle(Phase::ManualReview);
            }
        }
    }

    /// A call failed (never performed): a one-step task's or a step's as [`State::refused`];
    /// a compensation fails only by an operator's decision, which ends the task failed with
    /// the compensation undone, or, for a duplicate record, leaves the duplicate and goes on.
    fn failed(&mut self, reason: &str) {
        let Some(saga) = &mut self.saga else {
            return self.settle(Phase::Failed);
        };
        match saga.leg {
            Leg::Step(_) => {
                if let Some(step) = saga.step_mut() {
                    step.outcome = StepOutcome::Failed {
                        reason: reason.to_string(),
                    };
                }
                self.forward_ended(Phase::Failed);
            }
            Leg::Compensation(_) if saga.undoing_duplicate() => {
                if let Some(c) = saga.compensation_mut() {
                    c.outcome = CompensationOutcome::Abandoned {
                        reason: reason.to_string(),
                    };
                }
                self.after_compensation();
            }
            Leg::Compensation(_) => self.settle(Phase::Failed),
        }
    }

    /// A step ended without succeeding: compensation of the steps before it, when one is owed,
    /// else the task ends as the step did.
    fn forward_ended(&mut self, phase: Phase) {
        match &mut self.saga {
            Some(saga) if saga.owes_compensation() => {
                saga.compensating = true;
                self.settle(Phase::Compensating);
            }
            _ => self.settle(phase),
        }
    }

    /// What follows a compensation that ended, or an operator's order of some: the next
    /// compensation owed (duplicates first), else the end of the task's compensation
    /// (compensated), else, when only duplicates were undone, the step after theirs.
    fn after_compensation(&mut self) {
        let Some(saga) = &mut self.saga else {
            return;
        };
        if saga.next_duplicate().is_some() || saga.next_compensation().is_some() {
            return self.settle(Phase::Compensating);
        }
        if saga.compensating {
            return self.settle(Phase::Compensated);
        }
        let (Leg::Step(n) | Leg::Compensation(n)) = saga.leg;
        if (n as usize) + 1 < saga.steps.len() {
            saga.leg = Leg::Step(n + 1);
            self.begin_leg();
        } else {
            self.settle(Phase::Succeeded);
        }
    }

    /// A new leg of a multi-step task begins: its attempts start afresh (their budget, keys,
    /// lookups and window), while attempt numbers go on across the task.
    fn begin_leg(&mut self) {
        self.attempts_before_budget = self.attempts;
        self.first_intent_at = None;
        self.in_flight = None;
        self.retry_at = None;
        self.unresolved_unknown = false;
        self.unknown_since = None;
        self.policy_resends = 0;
        self.resend_authorized = false;
        self.idempotency_key = None;
        self.key_since = None;
        self.local_not_sent = 0;
        self.not_sent_by_class.clear();
        self.lookups = 0;
        self.next_check_at = None;
        self.last_matches.clear();
        self.review_reason = None;
        self.fallback_target = None;
        self.unknowns = 0;
        self.last_not_sent = None;
        self.waiting = None;
        self.phase = Phase::Accepted;
    }

    fn intended(&mut self, at: Millis, attempt: u32, idempotency_key: &Option<String>) {
        self.attempts = attempt;
        self.first_intent_at.get_or_insert(at);
        self.in_flight = Some(attempt);
        self.retry_at = None;
        self.next_check_at = None;
        self.phase = Phase::Sending;
        self.waiting = None;
        if idempotency_key.is_some() && *idempotency_key != self.idempotency_key {
            self.key_since = Some(at);
            self.key_generation += 1;
        }
        self.idempotency_key = idempotency_key.clone();
    }

    /// The target the task's attempts go to now: its fallback once it moved there, else its
    /// own. A record the task created is at this target (a task moves to its fallback only
    /// while nothing of it can exist at its own).
    pub fn target(&self) -> Option<&str> {
        self.fallback_target.as_deref().or(self.own_target())
    }

    /// The target the current call is configured at, before any move to its fallback: a
    /// multi-step task's current leg's, else the request's. Its policy drives the task.
    pub fn own_target(&self) -> Option<&str> {
        match &self.saga {
            Some(saga) => saga.target(),
            None => self.request.as_ref().map(|r| r.target.as_str()),
        }
    }

    /// The current leg of a multi-step task.
    pub fn leg(&self) -> Option<Leg> {
        self.saga.as_ref().map(|s| s.leg)
    }

    /// The class of "not sent" the task's next attempt retries: set while it waits to retry an
    /// attempt that was not sent for a class of reason (not for this process's own).
    pub fn retry_of(&self) -> Option<RetryClass> {
        if self.phase != Phase::RetryWait {
            return None;
        }
        self.last_not_sent_class()
    }

    /// The class of reason the last attempt not sent was not sent for (none for this
    /// process's own).
    pub fn last_not_sent_class(&self) -> Option<RetryClass> {
        match self.last_not_sent? {
            FailureKind::Connect => Some(RetryClass::Connect),
            FailureKind::Throttled => Some(RetryClass::Throttled),
            FailureKind::ServerError => Some(RetryClass::ServerError),
            FailureKind::LocalResources | FailureKind::Operator => None,
        }
    }

    /// Whether the task can be retried now, and why not: only a failed task none of whose
    /// attempts may have reached the remote (every one proven not sent).
    pub fn retryable(&self) -> Result<(), &'static str> {
        if self.pruned {
            return Err("its history was removed by retention (its payload is not kept); submit it again as a new version of the request");
        }
        if self.saga.is_some() {
            return Err("a multi-step task is not retried: its failure was compensated or reviewed step by step");
        }
        match self.phase {
            Phase::Failed if self.unknowns > 0 => Err(
                "an attempt of this task may have reached the remote (its outcome was unknown), so it cannot be retried; it was reconciled or reviewed",
            ),
            Phase::Failed => Ok(()),
            Phase::Succeeded | Phase::Rejected | Phase::Compensated => {
                Err("the task did not fail")
            }
            _ => Err("the task is not failed: only a failed task can be retried"),
        }
    }

    /// The state a removed history left, as retention kept it.
    fn seed(&mut self, retained: &crate::Retained) {
        self.request = Some(AcceptedRequest {
            identity: retained.identity.clone(),
            target: retained.target.clone(),
            payload: String::new(),
            metadata: BTreeMap::new(),
            version: retained.request_version,
        });
        self.payload_hash = Some(retained.payload_hash);
        self.phase = retained.phase();
        self.next_seq = retained.events;
        self.attempts = retained.attempts;
        self.version = retained.version;
        self.remote_id.clone_from(&retained.remote_id);
        self.fallback_target.clone_from(&retained.remote_target);
        self.rejection = retained.http_status.map(|s| (s, String::new()));
        if self.phase == Phase::Failed {
            self.failure.clone_from(&retained.reason);
        }
        self.pruned = true;
        self.pruned_events = retained.events;
    }

    /// Whether the task's history was removed and events were recorded after it, which
    /// retention removes in turn.
    pub fn recorded_since_pruned(&self) -> bool {
        self.pruned && self.next_seq > self.pruned_events
    }

    fn settle(&mut self, phase: Phase) {
        self.phase = phase;
        self.waiting = None;
        self.unresolved_unknown = false;
        self.resend_authorized = false;
        self.retry_at = None;
        self.next_check_at = None;
    }
}
