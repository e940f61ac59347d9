//! Pure decisions: given a task's state and one input, the events to record and the action to
//! take once they are durable.
//!
//! The caller (the task actor) appends the returned events, waits until they are durable, and
//! only then performs the action. Time (`Ctx::now`) and randomness (`Ctx::random`) come from the
//! caller, so every decision can be replayed in a test.

mod operator;
mod saga;
mod versions;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::event::{
    Event, EventBody, Evidence, Millis, NotSentCause, PlannedStep, ReviewReason, Source,
    UnknownCause, WaitReason, POLICY_COMPLETE_BY,
};
use crate::request::AcceptedRequest;
use crate::retry::{RetryClass, RetryPolicy};
use crate::saga::{Answer, Found};
use crate::state::{Phase, State};
use operator::{operator, retry};
use saga::{compensate_next, compensation_of, move_on, not_built, not_built_after_steps};
use versions::{record_version, waits_for_earlier};
pub use versions::{Versions, EARLIER_VERSION_RECHECK_MS};

/// How one target is driven: retries, reconciliation and idempotency keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Policy {
    pub retry: RetryPolicy,
    /// How to resolve unknown outcomes by lookup; `None` when the target has no lookup.
    pub reconcile: Option<ReconcilePolicy>,
    /// Set when the target honours an idempotency key: how long the remote remembers one.
    pub idempotency_ttl_ms: Option<u64>,
    /// A key is reused only while it has at least this long left to live, so a resend never
    /// reaches the remote after it forgot the key (clock skew, queueing, the request's time in
    /// flight).
    pub idempotency_ttl_margin_ms: u64,
    /// Where the task's attempts go once the target cannot take them and nothing of the task
    /// can exist at the target: every attempt so far proven not sent, and the target's attempts
    /// exhausted or its breaker open.
    #[serde(default)]
    pub fallback: Option<Fallback>,
}

/// A target's fallback: another configured target (with no fallback of its own) and its policy,
/// which drives the task's attempts there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fallback {
    pub target: String,
    pub policy: Box<Policy>,
}

pub use crate::event::{DEFAULT_MAX_POLICY_RESENDS, POLICY_PREFIX, POLICY_RESEND_BY};

/// How unknown outcomes are reconciled by asking the remote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcilePolicy {
    /// Delay between the unknown outcome and the first lookup.
    pub first_check_ms: u64,
    /// Delay between lookups that found nothing.
    pub check_interval_ms: u64,
    /// The observation window of each attempt whose outcome became unknown, counted from that
    /// outcome: after it, zero matches lead to manual review (or an authorized resend when
    /// `resend_when_absent`).
    pub deadline_ms: u64,
    /// Authorize a resend, recorded as an event, when the deadline passes with no record.
    pub resend_when_absent: bool,
    /// At most this many resends are authorized by the policy per task (`resend_when_absent`
    /// and `complete_after` together); after that, review.
    pub max_policy_resends: u32,
    /// The target declares its lookups complete after this long: a record an attempt created
    /// is visible to a lookup asked this long after the attempt's outcome became unknown. A
    /// lookup asked past it that finds nothing proves the attempt was not performed, and a
    /// resend is authorized (within `max_policy_resends`) without waiting for the deadline.
    #[serde(default)]
    pub complete_after_ms: Option<u64>,
}

/// What the caller supplies to a decision: the time, a random number, the policy of the task's
/// own target, and which targets cannot take an attempt now.
#[derive(Debug, Clone, Copy)]
pub struct Ctx<'a> {
    pub now: Millis,
    pub random: u64,
    pub policy: &'a Policy,
    /// The targets that cannot take an attempt now: a decision that would record an intent at
    /// one of them waits instead (`SendDeferred`), with no intent and no attempt spent, or goes
    /// to the fallback when it may.
    pub holds: &'a [Hold],
    /// What the engine knows of the other versions of the task's request.
    pub versions: Versions,
}

impl Ctx<'_> {
    fn hold_of(&self, target: &str) -> Option<&Hold> {
        self.holds.iter().find(|h| h.target() == target)
    }
}

/// Why and until when a target takes no attempt (its circuit breaker is open).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// When the target may take attempts again, at the earliest.
    pub until: Millis,
    /// Waiting tasks look again at `until` plus a random part of this, so they do not all
    /// come back at once.
    pub spread_ms: u64,
    pub reason: WaitReason,
}

impl Hold {
    /// The target that takes no attempt.
    pub fn target(&self) -> &str {
        match &self.reason {
            WaitReason::BreakerOpen { target } => target,
            // Not a target's hold: the engine never makes one of it.
            WaitReason::EarlierVersion { .. } => "",
        }
    }
}

/// How one attempt is sent, besides its request: what the engine tells the effects layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sending {
    /// The trace context a target that takes one (`propagate_trace`) receives as
    /// `traceparent`: the attempt's span, or the task's own context.
    pub trace: Option<crate::TraceParent>,
    /// Kafka mode's send lease: no byte of the request may be written after this instant; the
    /// attempt ends `NotSent` instead.
    pub first_byte_by: Option<std::time::Instant>,
}

/// The result of one attempt, as classified by the effects layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// Certainly not performed; may be retried (no earlier than `retry_after_ms`).
    NotSent {
        cause: NotSentCause,
        retry_after_ms: Option<u64>,
    },
    Succeeded {
        remote_id: String,
        status: u16,
        /// The fields of the answer that later steps' templates read (a multi-step task's).
        answer: Answer,
    },
    Rejected {
        status: u16,
        detail: String,
    },
    /// May have been performed.
    Unknown {
        cause: UnknownCause,
    },
}

/// What an operator decides about a task in manual review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorResolution {
    Succeeded {
        remote_id: String,
        by: String,
        reason: String,
    },
    Failed {
        by: String,
        reason: String,
    },
    Resend {
        by: String,
        reason: String,
    },
    Note {
        by: String,
        text: String,
    },
    /// Retry a failed task whose every attempt was proven not sent: a new version of it.
    Retry {
        by: String,
        reason: String,
    },
    /// Undo records of a multi-step task in review at a step: `duplicates` (records the step's
    /// lookup found besides `record`, the step's own), and with `whole_task` every step that
    /// succeeded. Without `record`, the step in review is taken as not done (as `Failed`) and
    /// the steps before it are undone.
    Compensate {
        record: Option<String>,
        duplicates: Vec<String>,
        whole_task: bool,
        by: String,
        reason: String,
    },
}

/// Something that happened to a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A request was delivered (first time or again). The only delivery that records no event
    /// is a duplicate past [`MAX_RECORDED_DUPLICATES`].
    Deliver {
        request: AcceptedRequest,
        source: Source,
        /// The steps of the saga the request's target names, when it names one: recorded
        /// with the task's acceptance (a redelivery ignores them).
        steps: Option<Vec<PlannedStep>>,
    },
    /// An attempt ended.
    Outcome {
        attempt: u32,
        outcome: AttemptOutcome,
    },
    /// A lookup ended: the matching remote ids, or why the lookup itself failed. `attempt` is
    /// the task's latest attempt when the lookup was issued: a result issued before a later
    /// attempt says nothing about that attempt and is ignored. `asked_at` is when the lookup
    /// was sent: what it found holds as of then.
    Lookup {
        attempt: u32,
        asked_at: Millis,
        result: std::result::Result<Found, String>,
    },
    /// A timer of the task is due (retry or check).
    Wake,
    /// The process started and found the task not terminal.
    Recover,
    Operator(OperatorResolution),
    /// An operator's decision under a named credential: decided as [`Input::Operator`], and
    /// recorded after an `OperatorCredential` naming the operator (the resolution's `by`) and
    /// the credential's id.
    OperatorWith {
        resolution: OperatorResolution,
        credential: String,
    },
    /// The task's target became available again (its breaker closed) and the target asks
    /// for its failed tasks to be retried then: a retry recorded by the policy
    /// ([`crate::event::POLICY_BREAKER_CLOSED_BY`]), refused as an operator's would be.
    RetryOnClose {
        reason: String,
    },
    /// Kafka mode: the restore of the task's partition found two different histories of the
    /// task in the log from `task_seq` on, and rebuilt it from the later; `replaced` describes
    /// the other's events. Unless every replaced event is harmless (a redelivery, a conflict,
    /// a note, a wait), a person must check the remote: the task goes to review, even from a
    /// terminal state, since the replaced history may have sent a request.
    Diverged {
        task_seq: u32,
        replaced: Vec<Event>,
    },
    /// A requests-topic message that is not a valid request, recorded as the only event of
    /// its own task (`TaskId::for_rejected_input`). A second delivery of it records nothing.
    Reject {
        source: Source,
        reason: String,
        raw: Vec<u8>,
    },
}

/// How much of a rejected message's raw bytes the ledger keeps.
pub const REJECTED_RAW_KEEP: usize = 4096;

/// How many redeliveries of a known request a task records as `DuplicateDelivery` events.
/// Later ones record nothing: the caller still counts and drops them (and stores their offsets
/// as processed), but the task's history, and what replaying it costs, stays bounded however
/// often a producer repeats itself. A duplicate of a settled task re-announces its result only
/// while it is recorded: past the limit the requester has had that result, under the same
/// event id, at least this many times already.
pub const MAX_RECORDED_DUPLICATES: u32 = 100;

/// What the caller does once the decision's events are durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    None,
    /// Send this attempt now, to `target` (the task's own, or its fallback).
    Send {
        attempt: u32,
        idempotency_key: Option<String>,
        target: String,
    },
    /// Wake the task (deliver [`Input::Wake`]) at this time.
    WakeAt(Millis),
    /// Decide again at once, as at a wake: a multi-step task moved on to its next leg (a step,
    /// or a compensation), whose call the next decision makes with that leg's own target and
    /// policy. No timer: should the process stop first, recovery resumes the leg the same way.
    Continue,
    /// Ask the remote for records matching the task, about this attempt (the latest).
    Lookup {
        attempt: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub events: Vec<EventBody>,
    pub action: Action,
}

impl Decision {
    fn nothing() -> Decision {
        Decision {
            events: Vec::new(),
            action: Action::None,
        }
    }
}

/// Decides what a task does with an input. Inputs that no longer apply (an outcome for an
/// attempt that is not in flight, a lookup result after the task settled) yield no events.
/// Operator resolutions that do not apply are errors, so the operator learns why.
pub fn decide(state: &State, input: Input, ctx: Ctx<'_>) -> Result<Decision> {
    let mut d = Decision::nothing();
    // A task that moved to its fallback is driven by the fallback's policy.
    let ctx = match (&state.fallback_target, &ctx.policy.fallback) {
        (Some(at), Some(fallback)) if *at == fallback.target => Ctx {
            policy: &fallback.policy,
            ..ctx
        },
        _ => ctx,
    };
    match input {
        Input::Deliver {
            request,
            source,
            steps,
        } => deliver(state, request, source, steps, ctx, &mut d),
        Input::Outcome { attempt, outcome } => {
            if state.phase == Phase::Sending && state.in_flight == Some(attempt) {
                outcome_of(state, attempt, outcome, ctx, &mut d);
            }
        }
        Input::Lookup {
            attempt,
            asked_at,
            result,
        } => {
            if state.phase == Phase::Unknown
                && state.in_flight.is_none()
                && attempt == state.attempts
            {
                lookup_result(state, result, asked_at, ctx, &mut d);
            }
        }
        Input::Wake => wake(state, ctx, &mut d),
        Input::Recover => match state.phase {
            Phase::Sending => {
                let attempt = state.in_flight.unwrap_or(state.attempts);
                unknown(state, attempt, UnknownCause::Recovery, ctx, &mut d);
            }
            Phase::Accepted => intend(state, false, ctx, &mut d),
            Phase::Compensating => compensate_next(state, &mut d),
            Phase::RetryWait | Phase::Unknown => {
                let at = state.retry_at.or(state.next_check_at).unwrap_or(ctx.now);
                d.action = Action::WakeAt(at);
            }
            _ => {}
        },
        Input::Operator(resolution) => operator(state, resolution, None, ctx, &mut d)?,
        Input::OperatorWith {
            resolution,
            credential,
        } => operator(state, resolution, Some(credential), ctx, &mut d)?,
        Input::Diverged { task_seq, replaced } => {
            let reviewed = matches!(
                &state.review_reason,
                Some(ReviewReason::DivergentHistory { task_seq: at, .. }) if *at == task_seq
            ) && state.phase == Phase::ManualReview;
            // The log never held the task (it lost every event of it): its first event is
            // recorded again from the replaced history, so an acknowledged request is not
            // lost, and the rest is the evidence.
            let mut replaced = &replaced[..];
            if state.phase == Phase::New {
                match replaced.split_first() {
                    Some((first, rest))
                        if matches!(
                            first.body,
                            EventBody::TaskAccepted { .. } | EventBody::InputRejected { .. }
                        ) =>
                    {
                        d.events.push(first.body.clone());
                        replaced = rest;
                    }
                    _ => return Ok(d),
                }
            }
            let harmless = replaced.iter().all(|e| {
                matches!(
                    e.body,
                    EventBody::DuplicateDelivery { .. }
                        | EventBody::RequestConflict { .. }
                        | EventBody::OperatorNote { .. }
                        | EventBody::SendDeferred { .. }
                )
            });
            if !harmless && !reviewed {
                d.events.push(EventBody::ManualReviewRequired {
                    reason: ReviewReason::DivergentHistory {
                        task_seq,
                        replaced: replaced
                            .iter()
                            .map(|e| format!("{}: {}", e.body.name(), e.body.summary(e.at)))
                            .collect(),
                    },
                });
            }
        }
        Input::RetryOnClose { reason } => retry(
            state,
            crate::event::POLICY_BREAKER_CLOSED_BY.into(),
            reason,
            ctx,
            &mut d,
        )?,
        Input::Reject {
            source,
            reason,
            mut raw,
        } => {
            if state.phase == Phase::New {
                raw.truncate(REJECTED_RAW_KEEP);
                d.events.push(EventBody::InputRejected {
                    source,
                    reason,
                    raw,
                });
            }
        }
    }
    move_on(state, ctx, &mut d);
    Ok(d)
}

fn deliver(
    state: &State,
    request: AcceptedRequest,
    source: Source,
    steps: Option<Vec<PlannedStep>>,
    ctx: Ctx<'_>,
    d: &mut Decision,
) {
    let payload_hash = request.payload_hash();
    match state.payload_hash {
        None => {
            let version = request.version;
            d.events.push(EventBody::TaskAccepted {
                request,
                payload_hash,
                source,
            });
            if let Some(steps) = steps {
                d.events.push(EventBody::StepsPlanned { steps });
            }
            record_version(version, ctx, d);
            let mut after = state.clone();
            after.apply_all(ctx.now, &d.events);
            intend(&after, false, ctx, d);
        }
        Some(existing) if request.has_payload_hash(existing) => {
            if state.duplicates < MAX_RECORDED_DUPLICATES {
                d.events.push(EventBody::DuplicateDelivery { source });
            }
        }
        Some(_) => d.events.push(EventBody::RequestConflict {
            source,
            payload_hash,
        }),
    }
}

/// Records the intent of the next attempt and asks the caller to send it. `fresh_key` asks for
/// a new idempotency key even when the current one is still remembered by the remote.
///
/// The attempt goes to the task's fallback instead of its own target when the own target cannot
/// take it (attempts exhausted, or its breaker open) and every attempt so far was proven not
/// sent.
fn intend(state: &State, fresh_key: bool, ctx: Ctx<'_>, d: &mut Decision) {
    if waits_for_earlier(state, ctx, d) {
        return;
    }
    let own = state.target().unwrap_or_default().to_string();
    let own_hold = ctx.hold_of(&own);
    if let Some(fallback) = usable_fallback(state, ctx) {
        let exhausted = exhausted(state, ctx.policy).is_some();
        if own_hold.is_some() || exhausted {
            match ctx.hold_of(&fallback.target) {
                // Both wait: look again when the first may take an attempt.
                Some(hold) => {
                    let first = match own_hold {
                        Some(own) if !exhausted && own.until < hold.until => own,
                        _ => hold,
                    };
                    defer(state, first, ctx, d)
                }
                None => {
                    let ctx = Ctx {
                        policy: &fallback.policy,
                        ..ctx
                    };
                    intent(state, Some(&fallback.target), true, ctx, d);
                }
            }
            return;
        }
    }
    match own_hold {
        Some(hold) => defer(state, hold, ctx, d),
        None => intent(state, state.fallback_target.as_deref(), fresh_key, ctx, d),
    }
}

/// The intent of attempt `attempts + 1` at the task's own target (`at = None`) or at another.
fn intent(state: &State, at: Option<&str>, fresh_key: bool, ctx: Ctx<'_>, d: &mut Decision) {
    let attempt = state.attempts + 1;
    let idempotency_key = ctx.policy.idempotency_ttl_ms.map(|ttl| {
        match (
            &state.idempotency_key,
            key_alive(state, ctx.policy, ttl, ctx.now) && !fresh_key,
        ) {
            (Some(key), true) => key.clone(),
            _ => format!("{}-{}", task_id_hex(state), state.key_generation + 1),
        }
    });
    let target = match at {
        Some(target) => {
            d.events.push(EventBody::SendIntendedAt {
                attempt,
                idempotency_key: idempotency_key.clone(),
                target: target.to_string(),
            });
            target.to_string()
        }
        None => {
            d.events.push(EventBody::SendIntended {
                attempt,
                idempotency_key: idempotency_key.clone(),
            });
            state.target().unwrap_or_default().to_string()
        }
    };
    d.action = Action::Send {
        attempt,
        idempotency_key,
        target,
    };
}

/// The task's fallback, when its attempts may go there: it has not moved there yet and no
/// attempt of it may have reached a remote (every one proven not sent, in every version).
fn usable_fallback<'p>(state: &State, ctx: Ctx<'p>) -> Option<&'p Fallback> {
    ctx.policy
        .fallback
        .as_ref()
        .filter(|_| state.fallback_target.is_none() && state.unknowns == 0)
}

/// Why the current attempt budget allows no further attempt at the task's current target, if
/// it allows none: the target's `max_attempts` of attempts not sent (this process's own
/// failures aside), or the `max_attempts` of the class the last one was not sent for.
fn exhausted(state: &State, policy: &Policy) -> Option<String> {
    if state.unresolved_unknown {
        return None;
    }
    let counted = state
        .attempts
        .saturating_sub(state.attempts_before_budget + state.local_not_sent);
    if counted > 0 && counted >= policy.retry.max_attempts {
        return Some(format!(
            "attempts exhausted: {counted} attempts, none reached the remote"
        ));
    }
    let class = state.last_not_sent_class()?;
    let retry = policy.retry.classes.get(&class)?;
    let count = state.not_sent_by_class.get(&class).copied().unwrap_or(0);
    (count >= retry.max_attempts).then(|| {
        format!(
            "attempts exhausted: {count} attempts not sent for {} (the most retry.{}.max_attempts \
             allows), none reached the remote",
            class.name(),
            class.name()
        )
    })
}

/// Waits instead of intending: the target cannot take an attempt now. A wait is recorded when
/// it begins; finding the target still unavailable at the next look only moves the timer, so a
/// long outage costs each task one event, not one per look.
fn defer(state: &State, hold: &Hold, ctx: Ctx<'_>, d: &mut Decision) {
    let spread = match hold.spread_ms {
        0 => 0,
        s => ctx.random % s,
    };
    let until = hold.until.max(ctx.now).saturating_add(spread);
    if state.waiting.as_ref().map(|w| &w.reason) != Some(&hold.reason) {
        d.events.push(EventBody::SendDeferred {
            until,
            reason: hold.reason.clone(),
        });
    }
    d.action = Action::WakeAt(until);
}

fn task_id_hex(state: &State) -> String {
    state
        .task_id
        .or_else(|| state.request.as_ref().map(|r| r.task_id()))
        .map(|id| id.to_string())
        .unwrap_or_default()
}

/// The current key has more than the margin left to live: a request sent now reaches a remote
/// that still remembers it.
fn key_alive(state: &State, policy: &Policy, ttl: u64, now: Millis) -> bool {
    matches!((&state.idempotency_key, state.key_since), (Some(_), Some(since))
        if now.saturating_add(policy.idempotency_ttl_margin_ms) < since.saturating_add(ttl))
}

/// After an unknown outcome the same key may be resent while the remote remembers it.
fn can_resend_same_key(state: &State, ctx: Ctx<'_>) -> bool {
    match ctx.policy.idempotency_ttl_ms {
        Some(ttl) => {
            key_alive(state, ctx.policy, ttl, ctx.now)
                && state.attempts.saturating_sub(state.attempts_before_budget)
                    < ctx.policy.retry.max_attempts
        }
        None => false,
    }
}

fn outcome_of(
    state: &State,
    attempt: u32,
    outcome: AttemptOutcome,
    ctx: Ctx<'_>,
    d: &mut Decision,
) {
    match outcome {
        AttemptOutcome::Succeeded {
            remote_id,
            status,
            answer,
        } => {
            keep_answer(state, answer, d);
            d.events.push(EventBody::Confirmed {
                remote_id,
                evidence: Evidence::Response { status },
            })
        }
        AttemptOutcome::Rejected { status: 0, detail } if not_built_after_steps(state) => {
            not_built(state, attempt, detail, ctx, d)
        }
        AttemptOutcome::Rejected { status, detail } => {
            let review =
                compensation_of(state).map(|(step, name)| EventBody::ManualReviewRequired {
                    reason: ReviewReason::CompensationRefused {
                        step,
                        name,
                        status,
                        detail: detail.clone(),
                    },
                });
            d.events.push(EventBody::Rejected { status, detail });
            d.events.extend(review);
        }
        AttemptOutcome::NotSent {
            cause,
            retry_after_ms,
        } => {
            // A class with a policy of its own counts its attempts and grows its backoff
            // with its own count; otherwise the target's policy, by the attempt's number in
            // its budget.
            let class = RetryClass::of(&cause);
            let own = class.filter(|c| ctx.policy.retry.classes.contains_key(c));
            let class_count = own.map_or(0, |c| {
                state.not_sent_by_class.get(&c).copied().unwrap_or(0) + 1
            });
            let delay = match own {
                Some(c) => ctx.policy.retry.for_class(Some(c)).backoff_ms(
                    class_count,
                    retry_after_ms,
                    ctx.random,
                ),
                None => ctx.policy.retry.backoff_ms(
                    attempt.saturating_sub(state.attempts_before_budget),
                    retry_after_ms,
                    ctx.random,
                ),
            };
            let retry_at = ctx.now.saturating_add(delay);
            d.events.push(EventBody::SendNotSent {
                attempt,
                cause,
                retry_at,
            });
            let mut after = state.clone();
            after.apply_all(ctx.now, &d.events);
            if state.unresolved_unknown {
                // An earlier attempt may have reached the remote: this one proves nothing about
                // it. Back to reconciling.
                next_for_unknown(&after, ctx, d, retry_at);
            } else if let Some(why) = exhausted(&after, ctx.policy) {
                if usable_fallback(&after, ctx).is_some() {
                    intend(&after, true, ctx, d);
                } else if let Some((step, name)) = compensation_of(state) {
                    // A compensation is owed: it is not given up without a person.
                    d.events.push(EventBody::ManualReviewRequired {
                        reason: ReviewReason::CompensationNotSent {
                            step,
                            name,
                            reason: why,
                        },
                    });
                } else {
                    d.events.push(EventBody::Failed { reason: why });
                }
            } else {
                d.action = Action::WakeAt(retry_at);
            }
        }
        AttemptOutcome::Unknown { cause } => unknown(state, attempt, cause, ctx, d),
    }
}

fn unknown(state: &State, attempt: u32, cause: UnknownCause, ctx: Ctx<'_>, d: &mut Decision) {
    d.events.push(EventBody::SendUnknown { attempt, cause });
    let mut after = state.clone();
    after.apply_all(ctx.now, &d.events);
    let first_check = match &ctx.policy.reconcile {
        Some(r) => ctx.now.saturating_add(r.first_check_ms),
        None => ctx.now,
    };
    let resend_at = ctx.now.saturating_add(ctx.policy.retry.backoff_ms(
        attempt.saturating_sub(state.attempts_before_budget),
        None,
        ctx.random,
    ));
    next_for_unknown(
        &after,
        ctx,
        d,
        if can_resend_same_key(&after, ctx) {
            resend_at
        } else {
            first_check
        },
    );
}

/// The next step of a task whose outcome is unknown, as of `at`: a same-key resend or a lookup
/// when due, or manual review when neither is possible.
fn next_for_unknown(after: &State, ctx: Ctx<'_>, d: &mut Decision, at: Millis) {
    if after.resend_authorized || can_resend_same_key(after, ctx) || ctx.policy.reconcile.is_some()
    {
        d.action = Action::WakeAt(at);
    } else {
        d.events.push(EventBody::ManualReviewRequired {
            reason: ReviewReason::NoLookup,
        });
    }
}

/// Records the fields of a step's answer that later calls read, before its `Confirmed`: only
/// for a forward step, and only when there are some.
fn keep_answer(state: &State, answer: Answer, d: &mut Decision) {
    let at_step = matches!(state.leg(), Some(crate::saga::Leg::Step(_)));
    if at_step && !answer.is_empty() {
        d.events.push(EventBody::StepAnswer { fields: answer });
    }
}

fn lookup_result(
    state: &State,
    result: std::result::Result<Found, String>,
    asked_at: Millis,
    ctx: Ctx<'_>,
    d: &mut Decision,
) {
    let Some(policy) = &ctx.policy.reconcile else {
        return;
    };
    let deadline = state
        .unknown_since
        .unwrap_or(ctx.now)
        .saturating_add(policy.deadline_ms);
    let next_check = ctx.now.saturating_add(policy.check_interval_ms);
    let (result, answer) = match result {
        Ok(found) => (Ok(found.ids), found.answer),
        Err(e) => (Err(e), Answer::new()),
    };
    match result {
        Ok(matches) if matches.len() == 1 => {
            let remote_id = matches[0].clone();
            d.events.push(EventBody::LookupPerformed {
                matches,
                next_check_at: None,
            });
            keep_answer(state, answer, d);
            d.events.push(EventBody::Confirmed {
                remote_id,
                evidence: Evidence::Lookup,
            });
        }
        Ok(matches) if matches.len() > 1 => {
            let remote_ids = matches.clone();
            d.events.push(EventBody::LookupPerformed {
                matches,
                next_check_at: None,
            });
            d.events.push(EventBody::ManualReviewRequired {
                reason: ReviewReason::MultipleMatches { remote_ids },
            });
        }
        // The target declared its lookups complete after a bound, and this one was asked past
        // it: no record is proof that the attempt was not performed.
        Ok(_)
            if policy.complete_after_ms.is_some_and(|bound| {
                asked_at
                    >= state
                        .unknown_since
                        .unwrap_or(u64::MAX)
                        .saturating_add(bound)
            }) && state.policy_resends < policy.max_policy_resends =>
        {
            d.events.push(EventBody::LookupPerformed {
                matches: Vec::new(),
                next_check_at: None,
            });
            let why = format!(
                "no remote record in a lookup asked {} ms after attempt {}'s outcome became \
                 unknown, past the target's complete_after of {} ms: not performed",
                asked_at.saturating_sub(state.unknown_since.unwrap_or(asked_at)),
                state.attempts,
                policy.complete_after_ms.unwrap_or_default(),
            );
            policy_resend(state, policy, POLICY_COMPLETE_BY, why, ctx, d);
        }
        Ok(_) if ctx.now < deadline => {
            d.events.push(EventBody::LookupPerformed {
                matches: Vec::new(),
                next_check_at: Some(next_check),
            });
            d.action = Action::WakeAt(next_check);
        }
        Ok(_) => {
            d.events.push(EventBody::LookupPerformed {
                matches: Vec::new(),
                next_check_at: None,
            });
            if policy.resend_when_absent && state.policy_resends < policy.max_policy_resends {
                let why = format!(
                    "no remote record {} ms after attempt {}'s outcome became unknown",
                    policy.deadline_ms, state.attempts,
                );
                policy_resend(state, policy, POLICY_RESEND_BY, why, ctx, d);
            } else {
                d.events.push(EventBody::ManualReviewRequired {
                    reason: ReviewReason::DeadlinePassed {
                        lookups: state.lookups + 1,
                    },
                });
            }
        }
        // A failed lookup is no evidence either way: try again later, the deadline still holds.
        Err(_) if ctx.now < deadline => d.action = Action::WakeAt(next_check),
        // Nor is it evidence at the deadline: the review says the lookups failed (never "no
        // record found"), and no policy resend is authorized on it.
        Err(last_error) => d.events.push(EventBody::ManualReviewRequired {
            reason: ReviewReason::LookupsFailed {
                lookups: state.lookups,
                last_error,
            },
        }),
    }
}

/// A resend authorized by the target's policy (`by`), after the lookup just recorded found
/// nothing, and the attempt it allows.
fn policy_resend(
    state: &State,
    policy: &ReconcilePolicy,
    by: &str,
    why: String,
    ctx: Ctx<'_>,
    d: &mut Decision,
) {
    d.events.push(EventBody::ResendAuthorized {
        by: by.into(),
        reason: format!(
            "{why} (policy resend {} of at most {})",
            state.policy_resends + 1,
            policy.max_policy_resends
        ),
    });
    let mut after = state.clone();
    after.apply_all(ctx.now, &d.events);
    intend(&after, false, ctx, d);
}

fn wake(state: &State, ctx: Ctx<'_>, d: &mut Decision) {
    match state.phase {
        Phase::Accepted => intend(state, false, ctx, d),
        Phase::Compensating => compensate_next(state, d),
        Phase::RetryWait => match state.retry_at {
            Some(at) if ctx.now < at => d.action = Action::WakeAt(at),
            _ => intend(state, false, ctx, d),
        },
        Phase::Unknown => {
            let due = state.retry_at.into_iter().chain(state.next_check_at).max();
            match due {
                Some(at) if ctx.now < at => d.action = Action::WakeAt(at),
                _ if state.resend_authorized => intend(state, false, ctx, d),
                _ if can_resend_same_key(state, ctx) => intend(state, false, ctx, d),
                _ if ctx.policy.reconcile.is_some() => {
                    d.action = Action::Lookup {
                        attempt: state.attempts,
                    }
                }
                _ => d.events.push(EventBody::ManualReviewRequired {
                    reason: ReviewReason::NoLookup,
                }),
            }
        }
        _ => {}
    }
}

impl State {
    /// Applies freshly decided events (not yet in the log) to a copy of the state.
    pub fn apply_all(&mut self, at: Millis, bodies: &[EventBody]) {
        let task_id = self.task_id.unwrap_or_else(|| {
            self.request
                .as_ref()
                .map(|r| r.task_id())
                .unwrap_or(crate::ids::TaskId([0; 16]))
        });
        for body in bodies {
            self.apply(task_id, at, body);
        }
    }
}
