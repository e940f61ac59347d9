//! The events of the ledger. Each is one fact about one task; a task's state is their fold.
//!
//! These types are encoded with bincode inside the store's versioned envelope, where enum
//! variants are written by index: never reorder, remove or change a variant; add new ones at
//! the end only together with a new envelope version.

use serde::{Deserialize, Serialize};

use crate::ids::{PayloadHash, TaskId};
use crate::request::{AcceptedRequest, Identity};

/// The `by` of a `ResendAuthorized` recorded by a target's policy rather than by a person.
/// Operator names may not start with [`POLICY_PREFIX`]; the state, the decisions and the rule checker
/// all tell a policy's authorization from a person's by it.
pub const POLICY_RESEND_BY: &str = "policy:resend_when_absent";
pub const POLICY_PREFIX: &str = "policy:";
/// The `by` of a `ResendAuthorized` recorded because a lookup found nothing after the target's
/// declared `lookup.complete_after`: absence past that bound proves the attempt was not
/// performed.
pub const POLICY_COMPLETE_BY: &str = "policy:complete_after";
/// The `by` of a `TaskRetried` recorded because the task's target became available again
/// (its breaker closed) and the target's `breaker.retry_failed_within` asks for it.
pub const POLICY_BREAKER_CLOSED_BY: &str = "policy:breaker_closed";
/// The `by` of a `CompensationStarted` recorded because a later step of the task ended
/// rejected or failed: the steps before it that succeeded are undone, in reverse order.
pub const POLICY_SAGA_BY: &str = "policy:saga";

/// How many resends `resend_when_absent` authorizes per task unless configured otherwise.
pub const DEFAULT_MAX_POLICY_RESENDS: u32 = 1;

/// Milliseconds since the Unix epoch. The core never reads a clock; callers pass time in.
pub type Millis = u64;

/// Where a delivery came from: the Kafka coordinates of the request message, or
/// [`Source::front_door`] for a request submitted over HTTP.
// format: do not change
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Source {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl Source {
    /// The `topic` of a request submitted through the HTTP front door rather than a Kafka
    /// message: not a possible Kafka topic name (`:`), so it never names a real topic.
    pub const FRONT_DOOR: &'static str = "sendledger:front";

    /// The source of a request submitted through the front door; `number` tells one submission
    /// from another (in the timeline and the result), and is no offset of any topic.
    pub fn front_door(number: i64) -> Source {
        Source {
            topic: Source::FRONT_DOOR.into(),
            partition: 0,
            offset: number,
        }
    }

    /// Whether the source is a Kafka message, whose offset is recorded as processed.
    pub fn is_message(&self) -> bool {
        self.topic != Source::FRONT_DOOR
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}@{}", self.topic, self.partition, self.offset)
    }
}

/// Why an attempt certainly did not reach the remote.
// format: do not change
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NotSentCause {
    /// DNS, connect or TLS failure: nothing was written.
    Connect(String),
    /// 429, or 503 with `Retry-After`: the remote refused without acting.
    Throttled { status: u16 },
    /// A 5xx that the target's policy declares to mean "not performed".
    ServerError { status: u16 },
    /// This process could not write anything for a reason of its own: it ran out of a local
    /// resource (file descriptors), or (kafka mode) the attempt's send lease ended before its
    /// first byte, or its partition was revoked between its intent and its first byte. Not the
    /// remote's doing, so it does not use up the target's `max_attempts`.
    /// (Envelope version 2.)
    LocalResources(String),
    /// The request could not be built from the task: a template reads what the task does not
    /// have (a field of an earlier step's answer that was not kept, a step the configuration
    /// now names). Nothing was written. (Envelope version 8.)
    NotBuilt(String),
}

/// Why the outcome of an attempt is unknown: it may have reached the remote.
// format: do not change
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum UnknownCause {
    /// No response within the request timeout after the request was written.
    Timeout,
    /// Connection reset or closed after the request was written.
    ResetAfterWrite(String),
    /// A status that does not say whether the remote acted (408, 5xx, or a 409 set to reconcile).
    Status(u16),
    /// The process found the attempt's intent without an outcome at start-up.
    Recovery,
}

/// Why a task waits before it records an attempt's intent: nothing is sent, no attempt is
/// spent, and the wait ends by a timer.
// format: do not change
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitReason {
    /// The target's circuit breaker is open, or probing whether the remote is back: no attempt
    /// goes to the target until a probe succeeds. (Envelope version 3.)
    BreakerOpen { target: String },
    /// An earlier version of the task's request is not settled yet: a version starts only
    /// once the one before it is. (Envelope version 10.)
    EarlierVersion { version: u32, task_id: TaskId },
}

impl std::fmt::Display for WaitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitReason::BreakerOpen { target } => {
                write!(f, "the circuit breaker of target {target} is open")
            }
            WaitReason::EarlierVersion { version, task_id } => {
                write!(
                    f,
                    "version {version} of the request (task {task_id}) is not settled"
                )
            }
        }
    }
}

/// What proves that a task succeeded.
// format: do not change
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Evidence {
    /// The remote answered the attempt with a 2xx.
    Response { status: u16 },
    /// Exactly one matching record was found by lookup.
    Lookup,
    /// An operator resolved the review.
    Operator { by: String, reason: String },
}

/// Why a task needs a person.
// format: do not change
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReviewReason {
    /// More than one remote record matches the task: a duplicate exists at the remote.
    MultipleMatches { remote_ids: Vec<String> },
    /// The observation deadline of the latest unknown attempt passed and the lookups found no
    /// record.
    DeadlinePassed { lookups: u32 },
    /// The outcome is unknown and the target has no lookup to reconcile with.
    NoLookup,
    /// The observation deadline passed while the lookups themselves failed: nothing is known
    /// about the remote record, which is not evidence that it is absent. (Envelope version 2.)
    LookupsFailed {
        /// Lookups that completed (found nothing) in the task's life.
        lookups: u32,
        last_error: String,
    },
    /// Kafka mode: the log of record holds two different histories of the task from event
    /// `task_seq` on, written by two owners that each believed the partition theirs. The task
    /// is rebuilt from the later one; `replaced` lists the other's events (name and summary),
    /// which may include a request sent that the kept history does not account for.
    /// (Envelope version 6.)
    DivergentHistory {
        task_seq: u32,
        replaced: Vec<String>,
    },
    /// The remote of step `step`'s compensation refused it: the step's record still exists.
    /// (Envelope version 7.)
    CompensationRefused {
        step: u32,
        name: String,
        status: u16,
        detail: String,
    },
    /// Every attempt of step `step`'s compensation was proven not sent and its attempts ran
    /// out: the step's record still exists. (Envelope version 7.)
    CompensationNotSent {
        step: u32,
        name: String,
        reason: String,
    },
    /// The call of step `step`, after steps that succeeded, could not be built (`reason`):
    /// nothing was sent. A person fixes the configuration and authorizes a resend, or undoes
    /// the task. (Envelope version 8.)
    StepNotBuilt {
        step: u32,
        name: String,
        reason: String,
    },
}

impl std::fmt::Display for ReviewReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReviewReason::MultipleMatches { remote_ids } => {
                write!(
                    f,
                    "{} remote records match: {}",
                    remote_ids.len(),
                    remote_ids.join(", ")
                )
            }
            ReviewReason::DeadlinePassed { lookups } => {
                write!(
                    f,
                    "no remote record found by the deadline ({lookups} lookups)"
                )
            }
            ReviewReason::NoLookup => write!(f, "outcome unknown and the target has no lookup"),
            ReviewReason::LookupsFailed {
                lookups,
                last_error,
            } => write!(
                f,
                "lookups failed until the deadline, so whether a remote record exists is not \
                 known (last error: {last_error}; {lookups} lookups completed)"
            ),
            ReviewReason::DivergentHistory { task_seq, replaced } => write!(
                f,
                "two owners wrote different histories of this task from event {task_seq} on; \
                 it was rebuilt from the later, and the other's events are not accounted for: \
                 {}",
                replaced.join("; ")
            ),
            ReviewReason::CompensationRefused {
                name,
                status,
                detail,
                ..
            } => write!(
                f,
                "the compensation of step {name} was refused with HTTP {status} ({detail}); \
                 the step's record still exists"
            ),
            ReviewReason::CompensationNotSent { name, reason, .. } => write!(
                f,
                "the compensation of step {name} could not be sent ({reason}); the step's \
                 record still exists"
            ),
            ReviewReason::StepNotBuilt { name, reason, .. } => write!(
                f,
                "the call of step {name} cannot be built ({reason}); nothing was sent and the \
                 steps before it succeeded: fix the configuration and authorize a resend, or \
                 undo the task (resolve as compensated)"
            ),
        }
    }
}

/// One step of a multi-step task as planned when the task was accepted: the target that
/// performs it and, when it can be undone, the target that undoes it.
// format: do not change
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedStep {
    pub name: String,
    pub target: String,
    pub compensate: Option<String>,
}

/// A settled task whose history was removed: its identity, payload hash and result.
// format: do not change (stored in the ledger's `retained` column family, with bincode; add
// fields only under a new envelope version). Read back as [`EventBody::Pruned`]; what it is
// made from and what it announces: [`crate::retention`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retained {
    pub identity: Identity,
    pub target: String,
    pub payload_hash: PayloadHash,
    /// How the task ended.
    pub status: Ended,
    pub remote_id: Option<String>,
    /// The target holding `remote_id` when it is not `target` (a fallback).
    pub remote_target: Option<String>,
    /// Why it did not succeed, in words.
    pub reason: Option<String>,
    /// The remote's status of a refused request.
    pub http_status: Option<u16>,
    pub attempts: u32,
    pub version: u32,
    /// The `task_seq`, LSN and time of the event whose result the task ended with: the
    /// re-announced result keeps its event id.
    pub result_seq: u32,
    pub result_lsn: u64,
    pub result_at: Millis,
    /// How many events the removed history had: the task's next `task_seq`.
    pub events: u32,
    /// When the task entered its terminal phase.
    pub settled_at: Millis,
    /// The version of the task's request (0 when it named none). Absent from the entries
    /// written before versions, which read as 0.
    pub request_version: u32,
}

/// The terminal status a [`Retained`] task ended with.
// format: do not change (variant order is the encoding)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ended {
    Succeeded,
    Rejected,
    Failed,
    Compensated,
}

/// One fact about a task. `docs/rules.md` lists them and when each is recorded.
// format: do not change (variant order is the encoding)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventBody {
    TaskAccepted {
        request: AcceptedRequest,
        payload_hash: PayloadHash,
        source: Source,
    },
    DuplicateDelivery {
        source: Source,
    },
    RequestConflict {
        source: Source,
        payload_hash: PayloadHash,
    },
    SendIntended {
        attempt: u32,
        idempotency_key: Option<String>,
    },
    SendNotSent {
        attempt: u32,
        cause: NotSentCause,
        retry_at: Millis,
    },
    SendUnknown {
        attempt: u32,
        cause: UnknownCause,
    },
    Confirmed {
        remote_id: String,
        evidence: Evidence,
    },
    Rejected {
        status: u16,
        detail: String,
    },
    LookupPerformed {
        matches: Vec<String>,
        next_check_at: Option<Millis>,
    },
    ManualReviewRequired {
        reason: ReviewReason,
    },
    ResendAuthorized {
        by: String,
        reason: String,
    },
    Failed {
        reason: String,
    },
    OperatorNote {
        who: String,
        text: String,
    },
    /// A requests-topic message that is not a valid request, recorded under
    /// `TaskId::for_rejected_input` so its rejected result is published and its offset counts
    /// as processed. `raw` keeps at most the first 4 KiB of the message.
    InputRejected {
        source: Source,
        reason: String,
        /// The message's bytes. Text in human-readable formats (invalid UTF-8 replaced, so
        /// not read back exactly), bytes in binary ones.
        #[serde(with = "raw_text")]
        raw: Vec<u8>,
    },
    /// The task was about to record an attempt's intent and waits instead: its target cannot
    /// take one now. Recorded when a wait begins (once per wait, however often the task finds
    /// the target still unavailable); the next intent ends it. `until` is when the task first
    /// looks again. (Envelope version 3.)
    SendDeferred {
        until: Millis,
        reason: WaitReason,
    },
    /// A failed task whose every attempt was proven not sent starts a new version: its next
    /// attempt follows at once, with the target's attempt budget counted afresh, and its next
    /// terminal result supersedes the failed one. `by` is the operator, or the target's policy
    /// (`policy:...`). (Envelope version 4.)
    TaskRetried {
        by: String,
        reason: String,
    },
    /// The intent of an attempt at a target other than the task's own: its fallback. Like
    /// `SendIntended` (which is always at the task's own target), durable before the attempt's
    /// first byte. Recorded only while every earlier attempt of the task is proven not sent, so
    /// nothing of the task can exist at the target it leaves. (Envelope version 5.)
    SendIntendedAt {
        attempt: u32,
        idempotency_key: Option<String>,
        target: String,
    },
    /// The task is a multi-step one (its `target` names a saga): its steps as configured when
    /// it was accepted, recorded in the same write as `TaskAccepted`. Its attempts go to one
    /// step at a time, the next once the one before is confirmed. (Envelope version 7.)
    StepsPlanned {
        steps: Vec<PlannedStep>,
    },
    /// The compensation of step `step` begins: the next attempts go to the step's
    /// compensating target and undo `remote_id`, the record the step made. `by` is the saga's
    /// policy ([`POLICY_SAGA_BY`]: a later step ended rejected or failed) or an operator.
    /// (Envelope version 7.)
    CompensationStarted {
        step: u32,
        remote_id: String,
        by: String,
        reason: String,
    },
    /// An operator resolved the review of step `step` by ordering records undone: `record`
    /// is the step's own (the step succeeded with it); each of `duplicates`, records the
    /// step's lookup found besides it, is undone by the step's compensating target before
    /// the task goes on; with `whole_task`, every step that succeeded is then undone in
    /// reverse order, this one included, and the task ends compensated. Each undo begins with
    /// its own `CompensationStarted`. (Envelope version 8.)
    CompensationOrdered {
        step: u32,
        record: String,
        duplicates: Vec<String>,
        whole_task: bool,
        by: String,
        reason: String,
    },
    /// The fields of the current step's answer that later calls' templates read
    /// (`{steps.NAME.response./pointer}`): from its 2xx answer, or from the one record its
    /// lookup found. Recorded with the step's `Confirmed`, just before it. (Envelope version
    /// 8.)
    StepAnswer {
        fields: std::collections::BTreeMap<String, String>,
    },
    /// The credential an operator's decision was made under, recorded in the same write as
    /// the decision's events, just before them: `operator` is the name the credential belongs
    /// to (and the decision's `by`), `credential` its id (see `docs/access.md`). Absent from
    /// decisions made on a stopped ledger's files and from those under no named credential.
    /// (Envelope version 9.)
    OperatorCredential {
        operator: String,
        credential: String,
    },
    /// Never in a log: what a ledger reads, at `task_seq` 0, in place of a settled task's
    /// events that retention removed (see [`crate::retention`]). Its task goes on from there as
    /// it would have from the removed events: a duplicate is answered with the result they
    /// ended with, another payload is a conflict.
    Pruned {
        retained: Box<Retained>,
    },
    /// The task's request names version `version` (above 0) of its identity: recorded in the
    /// same write as `TaskAccepted`, just after it (and its `StepsPlanned`). `previous` is the
    /// identity's latest version accepted before it, if any: this task sends nothing until
    /// that one is settled. (Envelope version 10.)
    RequestVersion {
        version: u32,
        previous: Option<PreviousVersion>,
    },
}

/// A version of a request's identity accepted before another, and its task.
// format: do not change
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviousVersion {
    pub version: u32,
    pub task_id: TaskId,
}

/// The raw bytes of a rejected input: as text where a format is read by people (JSON), as
/// bytes (as derived) in the ledger's bincode.
mod raw_text {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(raw: &Vec<u8>, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.serialize_str(&String::from_utf8_lossy(raw))
        } else {
            raw.serialize(serializer)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        if deserializer.is_human_readable() {
            String::deserialize(deserializer).map(String::into_bytes)
        } else {
            Vec::deserialize(deserializer)
        }
    }
}

impl EventBody {
    /// A short stable name, used in timelines, metrics and the events topic.
    pub fn name(&self) -> &'static str {
        match self {
            EventBody::TaskAccepted { .. } => "TaskAccepted",
            EventBody::DuplicateDelivery { .. } => "DuplicateDelivery",
            EventBody::RequestConflict { .. } => "RequestConflict",
            EventBody::SendIntended { .. } => "SendIntended",
            EventBody::SendNotSent { .. } => "SendNotSent",
            EventBody::SendUnknown { .. } => "SendUnknown",
            EventBody::Confirmed { .. } => "Confirmed",
            EventBody::Rejected { .. } => "Rejected",
            EventBody::LookupPerformed { .. } => "LookupPerformed",
            EventBody::ManualReviewRequired { .. } => "ManualReviewRequired",
            EventBody::ResendAuthorized { .. } => "ResendAuthorized",
            EventBody::Failed { .. } => "Failed",
            EventBody::OperatorNote { .. } => "OperatorNote",
            EventBody::InputRejected { .. } => "InputRejected",
            EventBody::SendDeferred { .. } => "SendDeferred",
            EventBody::TaskRetried { .. } => "TaskRetried",
            EventBody::SendIntendedAt { .. } => "SendIntendedAt",
            EventBody::StepsPlanned { .. } => "StepsPlanned",
            EventBody::CompensationStarted { .. } => "CompensationStarted",
            EventBody::CompensationOrdered { .. } => "CompensationOrdered",
            EventBody::StepAnswer { .. } => "StepAnswer",
            EventBody::OperatorCredential { .. } => "OperatorCredential",
            EventBody::Pruned { .. } => "Pruned",
            EventBody::RequestVersion { .. } => "RequestVersion",
        }
    }

    /// The attempt number and idempotency key of an intent (`SendIntended`, or
    /// `SendIntendedAt` at another target), when the event is one.
    pub fn intent(&self) -> Option<(u32, &Option<String>)> {
        match self {
            EventBody::SendIntended {
                attempt,
                idempotency_key,
            }
            | EventBody::SendIntendedAt {
                attempt,
                idempotency_key,
                ..
            } => Some((*attempt, idempotency_key)),
            _ => None,
        }
    }

    /// The requests-topic delivery this event records, when it records one: once the event
    /// is durable, that message is processed.
    pub fn source(&self) -> Option<&Source> {
        match self {
            EventBody::TaskAccepted { source, .. }
            | EventBody::DuplicateDelivery { source }
            | EventBody::RequestConflict { source, .. }
            | EventBody::InputRejected { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl EventBody {
    /// The event's key fields in one line, for timelines read by a person on call.
    /// Times are shown relative to `at`, the event's own time.
    pub fn summary(&self, at: Millis) -> String {
        let after = |t: Millis| t.saturating_sub(at);
        match self {
            EventBody::TaskAccepted {
                request,
                payload_hash,
                source,
            } => format!(
                "{} target={} from {source} payload={}",
                request.identity,
                request.target,
                &payload_hash.to_string()[..12]
            ),
            EventBody::DuplicateDelivery { source } => format!("same request again from {source}"),
            EventBody::RequestConflict {
                source,
                payload_hash,
            } => {
                format!(
                    "different payload {} from {source}: rejected",
                    &payload_hash.to_string()[..12]
                )
            }
            EventBody::SendIntended {
                attempt,
                idempotency_key,
            } => match idempotency_key {
                Some(key) => format!("attempt {attempt} key={key}"),
                None => format!("attempt {attempt}"),
            },
            EventBody::SendNotSent {
                attempt,
                cause,
                retry_at,
            } => {
                format!(
                    "attempt {attempt} not sent ({cause:?}); retry in {} ms",
                    after(*retry_at)
                )
            }
            EventBody::SendUnknown { attempt, cause } => {
                format!("attempt {attempt} outcome unknown ({cause:?})")
            }
            EventBody::Confirmed {
                remote_id,
                evidence,
            } => format!("remote_id={remote_id} evidence={evidence:?}"),
            EventBody::Rejected { status, detail } => format!("status {status}: {detail}"),
            EventBody::LookupPerformed {
                matches,
                next_check_at,
            } => match next_check_at {
                Some(next) => format!(
                    "{} matches [{}]; next check in {} ms",
                    matches.len(),
                    matches.join(", "),
                    after(*next)
                ),
                None => format!("{} matches [{}]", matches.len(), matches.join(", ")),
            },
            EventBody::ManualReviewRequired { reason } => reason.to_string(),
            EventBody::ResendAuthorized { by, reason } => format!("by {by}: {reason}"),
            EventBody::Failed { reason } => reason.clone(),
            EventBody::OperatorNote { who, text } => format!("{who}: {text}"),
            EventBody::InputRejected {
                source,
                reason,
                raw,
            } => {
                format!("from {source}: {reason} ({} bytes kept)", raw.len())
            }
            EventBody::SendDeferred { until, reason } => {
                format!("waiting: {reason}; looks again in {} ms", after(*until))
            }
            EventBody::TaskRetried { by, reason } => format!("retried by {by}: {reason}"),
            EventBody::SendIntendedAt {
                attempt,
                idempotency_key,
                target,
            } => match idempotency_key {
                Some(key) => format!("attempt {attempt} at fallback {target} key={key}"),
                None => format!("attempt {attempt} at fallback {target}"),
            },
            EventBody::StepsPlanned { steps } => steps
                .iter()
                .map(|s| match &s.compensate {
                    Some(undo) => format!("{} at {} (undone at {undo})", s.name, s.target),
                    None => format!("{} at {}", s.name, s.target),
                })
                .collect::<Vec<_>>()
                .join(", "),
            EventBody::CompensationStarted {
                step,
                remote_id,
                by,
                reason,
            } => format!("undo step {step} (remote_id={remote_id}) by {by}: {reason}"),
            EventBody::CompensationOrdered {
                step,
                record,
                duplicates,
                whole_task,
                by,
                reason,
            } => {
                let mut undo = Vec::new();
                if !duplicates.is_empty() {
                    undo.push(format!("duplicates [{}]", duplicates.join(", ")));
                }
                if *whole_task {
                    undo.push("every step that succeeded".to_string());
                }
                format!(
                    "step {step} record={record}; undo {} by {by}: {reason}",
                    undo.join(", then ")
                )
            }
            EventBody::StepAnswer { fields } => fields
                .iter()
                .map(|(pointer, value)| format!("{pointer}={value}"))
                .collect::<Vec<_>>()
                .join(" "),
            EventBody::OperatorCredential {
                operator,
                credential,
            } => format!("{operator} under credential {credential}"),
            EventBody::Pruned { retained } => format!(
                "{} events removed by retention; the task ended {}{}",
                retained.events,
                retained.result_status().name(),
                retained
                    .remote_id
                    .as_ref()
                    .map_or(String::new(), |id| format!(" with remote_id={id}"))
            ),
            EventBody::RequestVersion { version, previous } => match previous {
                Some(p) => format!(
                    "version {version}, after version {} (task {})",
                    p.version, p.task_id
                ),
                None => format!("version {version}, the first of its identity"),
            },
        }
    }
}

/// An event before the journal has given it a log sequence number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewEvent {
    pub task_id: TaskId,
    /// Position in the task's own sequence, from 0, contiguous.
    pub task_seq: u32,
    pub at: Millis,
    pub body: EventBody,
}

/// An event in the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Global log sequence number, from 1, contiguous.
    pub lsn: u64,
    pub task_id: TaskId,
    pub task_seq: u32,
    pub at: Millis,
    pub body: EventBody,
}

impl NewEvent {
    pub fn with_lsn(self, lsn: u64) -> Event {
        Event {
            lsn,
            task_id: self.task_id,
            task_seq: self.task_seq,
            at: self.at,
            body: self.body,
        }
    }
}
