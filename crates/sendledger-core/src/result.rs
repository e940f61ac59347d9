//! The results of tasks as their requesters see them: one [`TaskResult`] per result-bearing
//! event (a terminal state, a manual review, a conflicting delivery, a rejected message),
//! projected from the log one event at a time by [`Projection`]. The Kafka crate publishes them on the
//! results topic (schema `schemas/task-result.schema.json`).
//!
//! A pure function of the log: a result built from the same events is the same result, byte
//! for byte once encoded, which is what makes a re-publication after a crash a harmless
//! duplicate.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::{Event, EventBody, Evidence, ReviewReason, Source};
use crate::ids::TaskId;
use crate::state::{Phase, State};

/// What happened to a task, as its requester sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultStatus {
    /// The side effect happened (confirmed by the response, a lookup or an operator).
    Succeeded,
    /// The remote refused it, or the request message was invalid; nothing happened.
    Rejected,
    /// It was never performed (attempts exhausted without reaching the remote, or an operator
    /// decided so).
    Failed,
    /// A person must decide; a later result follows.
    ManualReview,
    /// This delivery carried the identity of an existing task with a different payload; it was
    /// not executed. The existing task is unaffected.
    Conflict,
    /// A multi-step task: a step ended rejected or failed, and every step before it that
    /// succeeded and can be undone was undone (`steps` lists each).
    Compensated,
}

impl ResultStatus {
    /// The status as it is written in a result (`succeeded`, `manual_review`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ResultStatus::Succeeded => "succeeded",
            ResultStatus::Rejected => "rejected",
            ResultStatus::Failed => "failed",
            ResultStatus::ManualReview => "manual_review",
            ResultStatus::Conflict => "conflict",
            ResultStatus::Compensated => "compensated",
        }
    }

    /// Terminal statuses: at most one per task.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            ResultStatus::Succeeded
                | ResultStatus::Rejected
                | ResultStatus::Failed
                | ResultStatus::Compensated
        )
    }
}

/// The requests-topic message a result is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultSource {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl From<&Source> for ResultSource {
    fn from(s: &Source) -> Self {
        ResultSource {
            topic: s.topic.clone(),
            partition: s.partition,
            offset: s.offset,
        }
    }
}

/// What proves a success.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResultEvidence {
    /// The remote answered an attempt with this 2xx status.
    Response { http_status: u16 },
    /// Exactly one matching record was found at the remote by lookup.
    Lookup,
    /// An operator resolved a review.
    Operator { by: String, reason: String },
}

/// Why a task is in manual review, for machines (`reason` says it in words).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResultReview {
    /// Several remote records match the task (listed in `remote_ids`).
    MultipleMatches,
    /// The latest unknown attempt's observation window closed and the lookups found no record.
    DeadlinePassed { lookups: u32 },
    /// The window closed while the lookups themselves failed: whether a record exists is not
    /// known. Not evidence of absence.
    LookupsFailed { lookups: u32, last_error: String },
    /// The outcome is unknown and the target has no lookup.
    NoLookup,
    /// Kafka mode: two owners wrote different histories of the task from `task_seq` on; what
    /// the replaced one did (`reason` lists it) may include a request the kept one does not
    /// account for.
    DivergentHistory { task_seq: u32 },
    /// A multi-step task: the compensation of step `step` was refused by its remote.
    CompensationRefused { step: u32, http_status: u16 },
    /// A multi-step task: the compensation of step `step` could not be sent.
    CompensationNotSent { step: u32 },
    /// A multi-step task: the call of step `step` cannot be built; nothing was sent.
    StepNotBuilt { step: u32 },
}

impl From<&ReviewReason> for ResultReview {
    fn from(reason: &ReviewReason) -> Self {
        match reason {
            ReviewReason::MultipleMatches { .. } => ResultReview::MultipleMatches,
            ReviewReason::DeadlinePassed { lookups } => {
                ResultReview::DeadlinePassed { lookups: *lookups }
            }
            ReviewReason::LookupsFailed {
                lookups,
                last_error,
            } => ResultReview::LookupsFailed {
                lookups: *lookups,
                last_error: last_error.clone(),
            },
            ReviewReason::NoLookup => ResultReview::NoLookup,
            ReviewReason::DivergentHistory { task_seq, .. } => ResultReview::DivergentHistory {
                task_seq: *task_seq,
            },
            ReviewReason::CompensationRefused { step, status, .. } => {
                ResultReview::CompensationRefused {
                    step: *step,
                    http_status: *status,
                }
            }
            ReviewReason::CompensationNotSent { step, .. } => {
                ResultReview::CompensationNotSent { step: *step }
            }
            ReviewReason::StepNotBuilt { step, .. } => ResultReview::StepNotBuilt { step: *step },
        }
    }
}

/// One result of one task on the results topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskResult {
    /// `<task_id>:<task_seq>` of the event this result announces; also the `sendledger-event-id`
    /// header. A re-announcement carries the same id: consumers dedupe by it.
    pub event_id: String,
    pub task_id: String,
    pub status: ResultStatus,
    /// The task identity; null only for a rejected message that did not carry one.
    pub tenant: Option<String>,
    pub operation: Option<String>,
    pub request_key: Option<String>,
    pub target: Option<String>,
    /// The remote's id of the record the side effect created (succeeded only).
    pub remote_id: Option<String>,
    /// The target whose remote holds `remote_id` (or, in review, `remote_ids`): the task's
    /// own `target`, or its fallback when the task's attempts moved there. Results written
    /// before fallbacks existed have none: their records are at `target`.
    #[serde(default)]
    pub remote_target: Option<String>,
    pub evidence: Option<ResultEvidence>,
    /// Why the task did not succeed, in words.
    pub reason: Option<String>,
    /// Why the task needs a person (manual_review only).
    pub review: Option<ResultReview>,
    /// The remote's answer to a refused request.
    pub detail: Option<String>,
    /// The remote's HTTP status of a refused request.
    pub http_status: Option<u16>,
    /// Remote records found by lookup that match the task (manual review).
    pub remote_ids: Vec<String>,
    /// Attempts intended so far.
    pub attempts: u32,
    /// The version of the task this result is about: 1, plus one per retry of the failed task.
    /// A result of a higher version supersedes every result of a lower one (a retried task's
    /// `failed` result is followed by its new version's result). Results written before
    /// versions existed read as version 1.
    #[serde(default = "first_version")]
    pub version: u32,
    /// The version the request named (0 when it named none): each version of a request is a
    /// task of its own, with its own result (`docs/rules.md`, Task versions). Results written
    /// before request versions existed read as 0.
    #[serde(default)]
    pub request_version: u32,
    /// The requests-topic message: the one that created the task, or the conflicting or
    /// invalid one.
    pub source: Option<ResultSource>,
    /// A multi-step task's steps: each one's outcome and remote id, and its compensation.
    /// Absent for a one-step task.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<crate::saga::Step>,
    /// Log position of the announced event.
    pub lsn: u64,
    /// When the announced event was recorded, milliseconds since the Unix epoch.
    pub at: u64,
}

fn first_version() -> u32 {
    1
}

/// The stable id of an event: `<task_id>:<task_seq>`. It names the event wherever it is
/// recorded (a ledger's LSN is that ledger's own, and in kafka mode a task's events are
/// recorded by whichever instance owns its partition), and a task has one event per sequence
/// number.
pub fn event_id(task_id: TaskId, task_seq: u32) -> String {
    format!("{task_id}:{task_seq}")
}

/// One task's results, projected one event at a time: fed the task's events in task order, each
/// exactly once, it gives the key of the task's records and the result each event announces. Each
/// event costs the same however long the history before it is, so publishing a task's `N`
/// events costs `O(N)`.
#[derive(Debug, Clone, Default)]
pub struct Projection {
    /// The task's state after the events applied so far.
    state: State,
    /// The result of the latest result-bearing event: what a duplicate delivery re-announces.
    announced: Option<TaskResult>,
}

impl Projection {
    /// The projection after `history`, a task's events in task order.
    pub fn of<'a>(history: impl IntoIterator<Item = &'a Event>) -> Projection {
        let mut projection = Projection::default();
        for event in history {
            projection.apply(event);
        }
        projection
    }

    /// The projection of a task whose events so far left it in `state`, with no result
    /// announced yet: what the writer of the task's next events, which holds its state,
    /// projects them from. (A duplicate delivery applied to it re-announces nothing.)
    pub fn from_state(state: State) -> Projection {
        Projection {
            state,
            announced: None,
        }
    }

    /// The task's trace context, once its accepted request is applied and if it carried one:
    /// what the task's published records carry as their `traceparent`.
    pub fn traceparent(&self) -> Option<crate::trace::TraceParent> {
        self.state.request.as_ref().and_then(|r| r.traceparent())
    }

    /// The result a duplicate delivery would re-announce: the latest terminal or review result.
    pub fn announced(&self) -> Option<&TaskResult> {
        self.announced.as_ref()
    }

    /// The task's state after the events applied so far.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The task's target, once its accepted request is applied.
    pub fn target(&self) -> Option<&str> {
        self.state.request.as_ref().map(|r| r.target.as_str())
    }

    /// The `task_seq` of the event to apply next.
    pub fn next_seq(&self) -> u32 {
        self.state.next_seq
    }

    /// Whether the task is in a terminal state (later events are rare: a duplicate delivery, an
    /// operator's note).
    pub fn settled(&self) -> bool {
        self.state.phase.is_terminal()
    }

    /// The key of the task's published records (on Kafka): its identity `tenant/operation/request_key` once
    /// accepted (the same key as its requests), else its task id.
    pub fn key(&self, task_id: TaskId) -> String {
        match &self.state.request {
            Some(request) => request.identity.to_string(),
            None => task_id.to_string(),
        }
    }

    /// Applies the task's next event; returns the result it announces, if any. A duplicate
    /// delivery of a task that has a terminal or review result re-announces that result, with
    /// the same event id.
    pub fn apply(&mut self, event: &Event) -> Option<TaskResult> {
        self.state.apply(event.task_id, event.at, &event.body);
        if let EventBody::Pruned { retained } = &event.body {
            self.announced = Some(retained.result(event.task_id));
            return None;
        }
        if let EventBody::DuplicateDelivery { .. } = event.body {
            let settled = self.state.phase.is_terminal() || self.state.phase == Phase::ManualReview;
            return self.announced.clone().filter(|_| settled);
        }
        let result = result_for(event, &self.state);
        if result.is_some() && announces_result(&event.body) {
            self.announced.clone_from(&result);
        }
        result
    }
}

/// A result's fields as every result of an accepted task has them, status `succeeded`.
fn base(event: &Event, state: &State) -> TaskResult {
    let request = state.request.as_ref();
    TaskResult {
        event_id: event_id(event.task_id, event.task_seq),
        task_id: event.task_id.to_string(),
        status: ResultStatus::Succeeded,
        tenant: request.map(|r| r.identity.tenant.clone()),
        operation: request.map(|r| r.identity.operation.clone()),
        request_key: request.map(|r| r.identity.request_key.clone()),
        target: request.map(|r| r.target.clone()),
        remote_id: None,
        remote_target: None,
        evidence: None,
        reason: None,
        review: None,
        detail: None,
        http_status: None,
        remote_ids: Vec::new(),
        attempts: state.attempts,
        version: state.version,
        request_version: request.map_or(0, |r| r.version),
        source: state.source.as_ref().map(ResultSource::from),
        steps: state
            .saga
            .as_ref()
            .map(|s| s.steps.clone())
            .unwrap_or_default(),
        lsn: event.lsn,
        at: event.at,
    }
}

/// The result of a multi-step task whose failure was compensated: why, and each step.
fn compensated(event: &Event, state: &State) -> TaskResult {
    let mut r = base(event, state);
    let ended = r.steps.iter().find_map(|s| match &s.outcome {
        crate::saga::StepOutcome::Rejected {
            http_status,
            detail,
        } => Some(format!(
            "step {} was refused with HTTP {http_status} ({detail})",
            s.name
        )),
        crate::saga::StepOutcome::Failed { reason } => {
            Some(format!("step {} failed ({reason})", s.name))
        }
        _ => None,
    });
    let undone: Vec<&str> = r
        .steps
        .iter()
        .filter(|s| s.compensation.is_some())
        .map(|s| s.name.as_str())
        .collect();
    let reason = format!(
        "{}; undone: {}",
        ended.unwrap_or_else(|| "a step did not succeed".into()),
        undone.join(", ")
    );
    r.status = ResultStatus::Compensated;
    r.reason = Some(reason);
    r
}

fn announces_result(body: &EventBody) -> bool {
    matches!(
        body,
        EventBody::Confirmed { .. }
            | EventBody::Rejected { .. }
            | EventBody::Failed { .. }
            | EventBody::ManualReviewRequired { .. }
    )
}

/// The result `event` announces by itself, if any; `state` is its task's state after it.
fn result_for(event: &Event, state: &State) -> Option<TaskResult> {
    match &event.body {
        EventBody::InputRejected {
            source,
            reason,
            raw,
        } => {
            let (tenant, operation, request_key, target) = identity_from_raw(raw);
            Some(TaskResult {
                event_id: event_id(event.task_id, event.task_seq),
                task_id: event.task_id.to_string(),
                status: ResultStatus::Rejected,
                tenant,
                operation,
                request_key,
                target,
                remote_id: None,
                remote_target: None,
                evidence: None,
                reason: Some(reason.clone()),
                review: None,
                detail: None,
                http_status: None,
                remote_ids: Vec::new(),
                attempts: 0,
                version: 1,
                request_version: version_from_raw(raw),
                source: Some(source.into()),
                steps: Vec::new(),
                lsn: event.lsn,
                at: event.at,
            })
        }
        // A multi-step task's call that ended without ending the task announces nothing.
        EventBody::Confirmed { .. } | EventBody::Rejected { .. } | EventBody::Failed { .. }
            if state.saga.is_some() && !state.phase.is_terminal() =>
        {
            None
        }
        EventBody::Confirmed { .. } if state.phase == Phase::Compensated => {
            Some(compensated(event, state))
        }
        body @ (EventBody::Confirmed { .. }
        | EventBody::Rejected { .. }
        | EventBody::Failed { .. }
        | EventBody::ManualReviewRequired { .. }
        | EventBody::RequestConflict { .. }) => {
            let mut r = base(event, state);
            match body {
                EventBody::Confirmed {
                    remote_id,
                    evidence,
                } => {
                    r.remote_id = Some(remote_id.clone());
                    r.remote_target = state.target().map(str::to_string);
                    r.evidence = Some(match evidence {
                        Evidence::Response { status } => ResultEvidence::Response {
                            http_status: *status,
                        },
                        Evidence::Lookup => ResultEvidence::Lookup,
                        Evidence::Operator { by, reason } => ResultEvidence::Operator {
                            by: by.clone(),
                            reason: reason.clone(),
                        },
                    });
                }
                EventBody::Rejected { status, detail } => {
                    r.status = ResultStatus::Rejected;
                    r.reason = Some(format!("the remote refused the request with HTTP {status}"));
                    r.detail = Some(detail.clone());
                    r.http_status = Some(*status);
                }
                EventBody::Failed { reason } => {
                    r.status = ResultStatus::Failed;
                    r.reason = Some(reason.clone());
                }
                EventBody::ManualReviewRequired { reason } => {
                    r.status = ResultStatus::ManualReview;
                    r.reason = Some(reason.to_string());
                    r.review = Some(reason.into());
                    if let ReviewReason::MultipleMatches { remote_ids } = reason {
                        r.remote_ids = remote_ids.clone();
                        r.remote_target = state.target().map(str::to_string);
                    }
                }
                EventBody::RequestConflict { source, .. } => {
                    r.status = ResultStatus::Conflict;
                    r.reason = Some(format!(
                        "task {} already exists with this identity and a different payload; this \
                         delivery was not executed (send a new request_key for a new task)",
                        event.task_id
                    ));
                    r.source = Some(source.into());
                }
                _ => {}
            }
            Some(r)
        }
        _ => None,
    }
}

type RawIdentity = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// Best effort: the identity fields of an invalid message that is still a JSON object, so its
/// requester can correlate the rejection.
/// The version a rejected message named, when it named a valid one.
fn version_from_raw(raw: &[u8]) -> u32 {
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(raw) else {
        return 0;
    };
    map.get("version")
        .and_then(Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
        .unwrap_or(0)
}

fn identity_from_raw(raw: &[u8]) -> RawIdentity {
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(raw) else {
        return (None, None, None, None);
    };
    let field = |k: &str| map.get(k).and_then(Value::as_str).map(str::to_string);
    (
        field("tenant"),
        field("operation"),
        field("request_key"),
        field("target"),
    )
}

/// How many times `events` (any tasks', each task's in order) announce each result, by event
/// id, as the owners project them: the event that makes a result announces it once, and each
/// later delivery of its request announces it again under the same event id. What a reader of
/// the results topic may count against: no result is published more often than that.
pub fn announcements<'a>(
    events: impl IntoIterator<Item = &'a Event>,
) -> std::collections::BTreeMap<String, usize> {
    let mut projections: std::collections::BTreeMap<TaskId, Projection> = Default::default();
    let mut announced = std::collections::BTreeMap::new();
    for event in events {
        if let Some(result) = projections.entry(event.task_id).or_default().apply(event) {
            *announced.entry(result.event_id).or_insert(0) += 1;
        }
    }
    announced
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{accepted, history, src};
    use crate::ids::PayloadHash;

    /// What each event of a task's history announces, projected in order.
    fn results(history: &[Event]) -> Vec<Option<TaskResult>> {
        let mut projection = Projection::default();
        history.iter().map(|e| projection.apply(e)).collect()
    }

    /// What a task's writer gives the watchers of a task that ends (its state before the
    /// events, then the events) is what the publisher announces folding the whole history.
    #[test]
    fn a_projection_from_a_tasks_state_announces_what_its_history_does() {
        use crate::event::UnknownCause;
        let (task, acc) = accepted();
        let h = history(
            task,
            vec![
                acc,
                EventBody::SendIntended {
                    attempt: 1,
                    idempotency_key: None,
                },
                EventBody::SendUnknown {
                    attempt: 1,
                    cause: UnknownCause::Timeout,
                },
                EventBody::LookupPerformed {
                    matches: vec!["r-1".into()],
                    next_check_at: None,
                },
                EventBody::Confirmed {
                    remote_id: "r-1".into(),
                    evidence: Evidence::Lookup,
                },
            ],
        );
        let whole = results(&h);
        assert!(whole.last().unwrap().is_some(), "the last event announces");
        for k in 0..h.len() {
            let before = Projection::of(&h[..k]).state().clone();
            let mut projection = Projection::from_state(before);
            let rest: Vec<_> = h[k..].iter().map(|e| projection.apply(e)).collect();
            assert_eq!(rest, whole[k..], "from the state after {k} events");
        }
    }

    #[test]
    fn a_duplicate_after_success_re_announces_the_same_result() {
        let (task, acc) = accepted();
        let h = history(
            task,
            vec![
                acc,
                EventBody::SendIntended {
                    attempt: 1,
                    idempotency_key: None,
                },
                EventBody::Confirmed {
                    remote_id: "r-9".into(),
                    evidence: Evidence::Response { status: 201 },
                },
                EventBody::DuplicateDelivery { source: src(8) },
            ],
        );
        let mut results = results(&h);
        assert!(results[0].is_none());
        assert!(results[1].is_none());
        let first = results[2].take().unwrap();
        assert_eq!(first.status, ResultStatus::Succeeded);
        assert_eq!(
            first.event_id,
            format!("{task}:2"),
            "the id names the task and the event's sequence"
        );
        assert_eq!(first.remote_id.as_deref(), Some("r-9"));
        assert_eq!(first.attempts, 1);
        assert_eq!(first.source, Some(ResultSource::from(&src(7))));
        assert_eq!(Projection::of(&h).key(task), "acme/pay/k-1");
        let again = results[3].take().unwrap();
        assert_eq!(
            serde_json::to_vec(&again).unwrap(),
            serde_json::to_vec(&first).unwrap()
        );
    }

    #[test]
    fn a_duplicate_of_a_running_task_announces_nothing_and_a_conflict_names_its_source() {
        let (task, acc) = accepted();
        let h = history(
            task,
            vec![
                acc,
                EventBody::DuplicateDelivery { source: src(8) },
                EventBody::RequestConflict {
                    source: src(9),
                    payload_hash: PayloadHash([1; 32]),
                },
            ],
        );
        let mut results = results(&h);
        assert!(results[1].is_none());
        let c = results[2].take().unwrap();
        assert_eq!(c.status, ResultStatus::Conflict);
        assert_eq!(c.source, Some(ResultSource::from(&src(9))));
        assert_eq!(c.request_key.as_deref(), Some("k-1"));
    }

    /// A review after lookups that failed until the deadline says so, for people and machines,
    /// and never reads as "no record found".
    #[test]
    fn a_review_result_tells_failed_lookups_from_absent_records() {
        use crate::event::UnknownCause;
        let (task, acc) = accepted();
        let review = |reason| {
            let h = history(
                task,
                vec![
                    acc.clone(),
                    EventBody::SendIntended {
                        attempt: 1,
                        idempotency_key: None,
                    },
                    EventBody::SendUnknown {
                        attempt: 1,
                        cause: UnknownCause::Timeout,
                    },
                    EventBody::ManualReviewRequired { reason },
                ],
            );
            results(&h).pop().flatten().unwrap()
        };
        let failed = review(ReviewReason::LookupsFailed {
            lookups: 0,
            last_error: "lookup answered 503".into(),
        });
        assert_eq!(failed.status, ResultStatus::ManualReview);
        let json = serde_json::to_value(&failed).unwrap();
        assert_eq!(json["review"]["kind"], "lookups_failed");
        assert_eq!(json["review"]["last_error"], "lookup answered 503");
        let reason = failed.reason.unwrap();
        assert!(
            reason.contains("lookups failed") && reason.contains("503"),
            "{reason}"
        );
        assert!(!reason.contains("no remote record found"), "{reason}");
        let absent = review(ReviewReason::DeadlinePassed { lookups: 5 });
        let json = serde_json::to_value(&absent).unwrap();
        assert_eq!(
            json["review"],
            serde_json::json!({ "kind": "deadline_passed", "lookups": 5 })
        );
    }

    #[test]
    fn rejected_input_keeps_what_identity_it_has() {
        let task = TaskId::for_rejected_input("req", 0, 3);
        let h = history(
            task,
            vec![EventBody::InputRejected {
                source: src(3),
                reason: "invalid request JSON: missing field `target`".into(),
                raw: br#"{"tenant":"acme","request_key":"x"}"#.to_vec(),
            }],
        );
        let r = results(&h).pop().flatten().unwrap();
        assert_eq!(r.status, ResultStatus::Rejected);
        assert_eq!(r.tenant.as_deref(), Some("acme"));
        assert_eq!(r.operation, None);
        assert!(r.reason.unwrap().contains("target"));
        assert_eq!(Projection::of(&h).key(task), task.to_string());
    }
}
