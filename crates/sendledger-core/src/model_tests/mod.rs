//! Scenario and property tests of the decision functions against the rules of `docs/rules.md`:
//! the harness that drives a task through `decide` here, the scenarios in [`scenarios`] and
//! [`retries`], the generated input sequences in [`properties`].

use crate::decide::{
    decide, Action, AttemptOutcome, Ctx, Hold, Input, OperatorResolution, Policy, ReconcilePolicy,
};
use crate::event::{
    Event, EventBody, Evidence, NotSentCause, ReviewReason, Source, UnknownCause, WaitReason,
};
use crate::request::{Limits, TaskRequest};
use crate::retry::RetryPolicy;
use crate::rules::{check_task, CheckConfig, Rule};
use crate::state::{fold, Phase, State};

mod diverged;
mod fallback;
mod properties;
mod retention;
mod retries;
mod sagas;
mod scenarios;
mod versions;

/// A task driven through `decide`, its events kept as a log.
struct Harness {
    policy: Policy,
    log: Vec<Event>,
    state: State,
    now: u64,
    random: u64,
    sends: Vec<(u32, Option<String>)>,
    /// The target of each send, in order.
    sent_to: Vec<String>,
    /// Set while the task's own target's breaker is open: decisions get it in `Ctx::holds`.
    hold: Option<Hold>,
    /// The same for its fallback.
    fallback_hold: Option<Hold>,
    /// The other versions of the task's request, as decisions get them in `Ctx::versions`.
    versions: crate::decide::Versions,
}

impl Harness {
    fn new(policy: Policy) -> Harness {
        Harness {
            policy,
            log: Vec::new(),
            state: State::default(),
            now: 1_000_000,
            random: 42,
            sends: Vec::new(),
            sent_to: Vec::new(),
            hold: None,
            fallback_hold: None,
            versions: Default::default(),
        }
    }

    fn step(&mut self, input: Input) -> crate::Result<Action> {
        let holds: Vec<Hold> = self
            .hold
            .iter()
            .chain(&self.fallback_hold)
            .cloned()
            .collect();
        let ctx = Ctx {
            now: self.now,
            random: self.random,
            policy: &self.policy,
            holds: &holds,
            versions: self.versions,
        };
        self.random = self
            .random
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let decision = decide(&self.state, input, ctx)?;
        // A new task's id is its request's (of its identity and version).
        let task_id = self
            .state
            .task_id
            .unwrap_or_else(|| match decision.events.first() {
                Some(EventBody::TaskAccepted { request, .. }) => request.task_id(),
                _ => request(0).accept(&Limits::default()).unwrap().task_id(),
            });
        for body in &decision.events {
            let event = Event {
                lsn: self.log.len() as u64 + 1,
                task_id,
                task_seq: self.state.next_seq,
                at: self.now,
                body: body.clone(),
            };
            self.state.apply(task_id, self.now, body);
            self.log.push(event);
        }
        if let Action::Send {
            attempt,
            idempotency_key,
            target,
        } = &decision.action
        {
            // Rule 1 at the point of action: the intent of this very attempt, at this very
            // target, was just recorded.
            let intent = if Some(target.as_str()) == self.state.own_target() {
                EventBody::SendIntended {
                    attempt: *attempt,
                    idempotency_key: idempotency_key.clone(),
                }
            } else {
                EventBody::SendIntendedAt {
                    attempt: *attempt,
                    idempotency_key: idempotency_key.clone(),
                    target: target.clone(),
                }
            };
            assert_eq!(decision.events.last(), Some(&intent));
            self.sends.push((*attempt, idempotency_key.clone()));
            self.sent_to.push(target.clone());
        }
        Ok(decision.action)
    }

    fn names(&self) -> Vec<&'static str> {
        self.log.iter().map(|e| e.body.name()).collect()
    }
}

fn request(amount: u64) -> TaskRequest {
    TaskRequest {
        tenant: "acme".into(),
        operation: "payment.create".into(),
        request_key: "ord-7".into(),
        target: "payments".into(),
        payload: serde_json::json!({ "amount": amount }),
        payload_text: None,
        metadata: Default::default(),
        version: 0,
    }
}

fn deliver(amount: u64, offset: i64) -> Input {
    Input::Deliver {
        request: request(amount).accept(&Limits::default()).unwrap(),
        source: Source {
            topic: "requests".into(),
            partition: 0,
            offset,
        },
        steps: None,
    }
}

fn lookup_policy() -> Policy {
    Policy {
        retry: RetryPolicy {
            max_attempts: 3,
            initial_backoff_ms: 100,
            max_backoff_ms: 1_000,
            multiplier: 2.0,
            ..RetryPolicy::default()
        },
        reconcile: Some(ReconcilePolicy {
            first_check_ms: 500,
            check_interval_ms: 1_000,
            deadline_ms: 10_000,
            resend_when_absent: false,
            max_policy_resends: 1,
            complete_after_ms: None,
        }),
        idempotency_ttl_ms: None,
        idempotency_ttl_margin_ms: 0,
        fallback: None,
    }
}

fn unknown_outcome(h: &mut Harness) -> Action {
    let attempt = h.state.in_flight.expect("an attempt in flight");
    h.step(Input::Outcome {
        attempt,
        outcome: AttemptOutcome::Unknown {
            cause: UnknownCause::Timeout,
        },
    })
    .unwrap()
}

fn lookup(h: &mut Harness, result: Result<Vec<String>, String>) -> Action {
    h.step(Input::Lookup {
        asked_at: h.now,
        attempt: h.state.attempts,
        result: result.map(crate::saga::Found::from),
    })
    .unwrap()
}
