//! Scenario and property tests of the decision functions against the rules of DESIGN.md §2.

use proptest::prelude::*;

use crate::decide::{
    decide, Action, AttemptOutcome, Ctx, Input, OperatorResolution, Policy, ReconcilePolicy,
};
use crate::event::{Event, EventBody, Evidence, NotSentCause, ReviewReason, Source, UnknownCause};
use crate::request::{Limits, TaskRequest};
use crate::retry::RetryPolicy;
use crate::rules::check_task;
use crate::state::{fold, Phase, State};

/// A task driven through `decide`, its events kept as a log.
struct Harness {
    policy: Policy,
    log: Vec<Event>,
    state: State,
    now: u64,
    random: u64,
    sends: Vec<(u32, Option<String>)>,
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
        }
    }

    fn step(&mut self, input: Input) -> crate::Result<Action> {
        let ctx = Ctx {
            now: self.now,
            random: self.random,
            policy: &self.policy,
        };
        self.random = self
            .random
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let decision = decide(&self.state, input, ctx)?;
        let task_id = self
            .state
            .task_id
            .unwrap_or_else(|| request(0).accept(&Limits::default()).unwrap().task_id());
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
        } = &decision.action
        {
            // Rule 1 at the point of action: the intent of this very attempt was just recorded.
            assert_eq!(
                decision.events.last(),
                Some(&EventBody::SendIntended {
                    attempt: *attempt,
                    idempotency_key: idempotency_key.clone()
                })
            );
            self.sends.push((*attempt, idempotency_key.clone()));
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
        metadata: Default::default(),
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
    }
}

fn lookup_policy() -> Policy {
    Policy {
        retry: RetryPolicy {
            max_attempts: 3,
            initial_backoff_ms: 100,
            max_backoff_ms: 1_000,
            multiplier: 2.0,
        },
        reconcile: Some(ReconcilePolicy {
            first_check_ms: 500,
            check_interval_ms: 1_000,
            deadline_ms: 10_000,
            resend_when_absent: false,
        }),
        idempotency_ttl_ms: None,
    }
}

#[test]
fn unknown_is_reconciled_by_lookup_not_resent() {
    let mut h = Harness::new(lookup_policy());
    assert!(matches!(
        h.step(deliver(5, 0)).unwrap(),
        Action::Send { attempt: 1, .. }
    ));
    let wake = h
        .step(Input::Outcome {
            attempt: 1,
            outcome: AttemptOutcome::Unknown {
                cause: UnknownCause::Timeout,
            },
        })
        .unwrap();
    assert_eq!(wake, Action::WakeAt(h.now + 500));
    h.now += 500;
    assert_eq!(h.step(Input::Wake).unwrap(), Action::Lookup);
    // Zero matches before the deadline: still unknown, check again later.
    assert_eq!(
        h.step(Input::Lookup { result: Ok(vec![]) }).unwrap(),
        Action::WakeAt(h.now + 1_000)
    );
    assert_eq!(h.state.phase, Phase::Unknown);
    h.now += 1_000;
    assert_eq!(h.step(Input::Wake).unwrap(), Action::Lookup);
    h.step(Input::Lookup {
        result: Ok(vec!["r-1".into()]),
    })
    .unwrap();
    assert_eq!(h.state.phase, Phase::Succeeded);
    assert_eq!(h.state.remote_id.as_deref(), Some("r-1"));
    assert_eq!(h.state.evidence, Some(Evidence::Lookup));
    assert_eq!(h.sends.len(), 1, "never resent");
    assert_eq!(
        h.names(),
        [
            "TaskAccepted",
            "SendIntended",
            "SendUnknown",
            "LookupPerformed",
            "LookupPerformed",
            "Confirmed"
        ]
    );
    assert!(check_task(&h.log, None).1.is_empty());
}

#[test]
fn several_matches_or_deadline_go_to_review() {
    let mut h = Harness::new(lookup_policy());
    h.step(deliver(5, 0)).unwrap();
    h.step(Input::Outcome {
        attempt: 1,
        outcome: AttemptOutcome::Unknown {
            cause: UnknownCause::Status(502),
        },
    })
    .unwrap();
    h.step(Input::Lookup {
        result: Ok(vec!["a".into(), "b".into()]),
    })
    .unwrap();
    assert_eq!(h.state.phase, Phase::ManualReview);
    assert_eq!(
        h.state.review_reason,
        Some(ReviewReason::MultipleMatches {
            remote_ids: vec!["a".into(), "b".into()]
        })
    );

    let mut h = Harness::new(lookup_policy());
    h.step(deliver(5, 0)).unwrap();
    h.step(Input::Outcome {
        attempt: 1,
        outcome: AttemptOutcome::Unknown {
            cause: UnknownCause::Timeout,
        },
    })
    .unwrap();
    h.now += 10_000;
    h.step(Input::Lookup { result: Ok(vec![]) }).unwrap();
    assert_eq!(
        h.state.review_reason,
        Some(ReviewReason::DeadlinePassed { lookups: 1 })
    );
    // An operator may authorize a resend; it is recorded before the attempt, which follows at
    // the task's next wake (the task is unknown again, so a resumed engine sends it too).
    let action = h
        .step(Input::Operator(OperatorResolution::Resend {
            by: "ana".into(),
            reason: "remote confirmed by phone".into(),
        }))
        .unwrap();
    assert_eq!(action, Action::WakeAt(h.now));
    assert_eq!(h.state.phase, Phase::Unknown);
    let again = h.step(Input::Operator(OperatorResolution::Resend {
        by: "ana".into(),
        reason: "twice".into(),
    }));
    assert!(again.is_err(), "a second authorization is refused");
    let action = h.step(Input::Recover).unwrap();
    assert_eq!(action, Action::WakeAt(h.now));
    let action = h.step(Input::Wake).unwrap();
    assert!(matches!(action, Action::Send { attempt: 2, .. }));
    assert_eq!(
        h.names()[h.log.len() - 2..],
        ["ResendAuthorized", "SendIntended"]
    );
    assert!(check_task(&h.log, None).1.is_empty());
}

#[test]
fn resend_when_absent_policy_is_recorded() {
    let mut policy = lookup_policy();
    policy.reconcile.as_mut().unwrap().resend_when_absent = true;
    let mut h = Harness::new(policy);
    h.step(deliver(5, 0)).unwrap();
    h.step(Input::Outcome {
        attempt: 1,
        outcome: AttemptOutcome::Unknown {
            cause: UnknownCause::Timeout,
        },
    })
    .unwrap();
    h.now += 20_000;
    let action = h.step(Input::Lookup { result: Ok(vec![]) }).unwrap();
    assert!(matches!(action, Action::Send { attempt: 2, .. }));
    assert!(h.log.iter().any(|e| matches!(&e.body, EventBody::ResendAuthorized { by, .. } if by == "policy:resend_when_absent")));
    assert!(check_task(&h.log, None).1.is_empty());
}

#[test]
fn not_sent_retries_until_exhausted_then_fails() {
    let mut h = Harness::new(lookup_policy());
    h.step(deliver(5, 0)).unwrap();
    for attempt in 1..=3 {
        let outcome = AttemptOutcome::NotSent {
            cause: NotSentCause::Throttled { status: 429 },
            retry_after_ms: Some(2_000),
        };
        let action = h.step(Input::Outcome { attempt, outcome }).unwrap();
        if attempt < 3 {
            let Action::WakeAt(at) = action else {
                panic!("expected a retry, got {action:?}")
            };
            assert!(at >= h.now + 2_000, "Retry-After honoured");
            // Too early: no send.
            h.now = at - 1;
            assert_eq!(h.step(Input::Wake).unwrap(), Action::WakeAt(at));
            h.now = at;
            assert!(matches!(h.step(Input::Wake).unwrap(), Action::Send { .. }));
        }
    }
    assert_eq!(h.state.phase, Phase::Failed);
    assert_eq!(h.sends.len(), 3);
    assert!(check_task(&h.log, None).1.is_empty());
}

#[test]
fn recovery_in_sending_reconciles() {
    let mut h = Harness::new(lookup_policy());
    h.step(deliver(5, 0)).unwrap();
    let rebuilt = fold(&h.log);
    assert_eq!(rebuilt.phase, Phase::Sending);
    h.state = rebuilt;
    h.step(Input::Recover).unwrap();
    assert!(matches!(
        h.log.last().unwrap().body,
        EventBody::SendUnknown {
            attempt: 1,
            cause: UnknownCause::Recovery
        }
    ));
    assert_eq!(h.sends.len(), 1);
}

#[test]
fn idempotent_target_resends_with_the_same_key() {
    let mut policy = lookup_policy();
    policy.idempotency_ttl_ms = Some(60_000);
    let mut h = Harness::new(policy);
    h.step(deliver(5, 0)).unwrap();
    let action = h
        .step(Input::Outcome {
            attempt: 1,
            outcome: AttemptOutcome::Unknown {
                cause: UnknownCause::Timeout,
            },
        })
        .unwrap();
    let Action::WakeAt(at) = action else {
        panic!("{action:?}")
    };
    h.now = at;
    h.step(Input::Wake).unwrap();
    assert_eq!(h.sends.len(), 2);
    assert_eq!(h.sends[0].1, h.sends[1].1, "same key");
    assert!(check_task(&h.log, Some(60_000)).1.is_empty());
}

/// A task accepted before number tokens were kept verbatim stored `100.00` as `100.0`; the
/// same request delivered again is a duplicate, a different amount still a conflict.
#[test]
fn a_redelivery_of_a_request_stored_with_reprinted_numbers_is_a_duplicate() {
    let with_amount = |amount: &str| {
        let mut r = request(0);
        r.payload = serde_json::from_str(&format!(r#"{{"amount": {amount}}}"#)).unwrap();
        r.accept(&Limits::default()).unwrap()
    };
    let source = |offset| Source {
        topic: "requests".into(),
        partition: 0,
        offset,
    };
    let mut old = with_amount("100.00");
    old.payload = r#"{"amount":100.0}"#.into();
    let mut h = Harness::new(lookup_policy());
    h.step(Input::Deliver {
        request: old,
        source: source(0),
    })
    .unwrap();
    for (amount, offset) in [("100.00", 1), ("100.01", 2)] {
        let again = Input::Deliver {
            request: with_amount(amount),
            source: source(offset),
        };
        assert_eq!(h.step(again).unwrap(), Action::None);
    }
    assert_eq!(h.names()[2..], ["DuplicateDelivery", "RequestConflict"]);
}

#[test]
fn duplicates_and_conflicts_never_execute() {
    let mut h = Harness::new(lookup_policy());
    h.step(deliver(5, 0)).unwrap();
    h.step(Input::Outcome {
        attempt: 1,
        outcome: AttemptOutcome::Succeeded {
            remote_id: "r".into(),
            status: 201,
        },
    })
    .unwrap();
    assert_eq!(h.step(deliver(5, 9)).unwrap(), Action::None);
    assert_eq!(h.step(deliver(6, 10)).unwrap(), Action::None);
    assert_eq!(h.names()[3..], ["DuplicateDelivery", "RequestConflict"]);
    assert_eq!(h.state.phase, Phase::Succeeded);
    assert_eq!(h.sends.len(), 1);
    let err = h
        .step(Input::Operator(OperatorResolution::Resend {
            by: "x".into(),
            reason: "y".into(),
        }))
        .unwrap_err();
    assert!(
        err.to_string().contains("succeeded, not in manual review"),
        "{err}"
    );
}

#[test]
fn the_checker_catches_a_blind_resend() {
    let mut h = Harness::new(lookup_policy());
    h.step(deliver(5, 0)).unwrap();
    h.step(Input::Outcome {
        attempt: 1,
        outcome: AttemptOutcome::Unknown {
            cause: UnknownCause::Timeout,
        },
    })
    .unwrap();
    let task_id = h.state.task_id.unwrap();
    h.log.push(Event {
        lsn: 99,
        task_id,
        task_seq: h.state.next_seq,
        at: h.now,
        body: EventBody::SendIntended {
            attempt: 2,
            idempotency_key: None,
        },
    });
    let (_, violations) = check_task(&h.log, None);
    assert_eq!(violations.len(), 1);
    assert_eq!(violations[0].rule, crate::rules::Rule::NoBlindResend);
    assert_eq!(violations[0].lsns, vec![3, 99]);
}

/// One abstract step of the property test.
#[derive(Debug, Clone)]
enum Step {
    Deliver { same_payload: bool },
    NotSent { retry_after_ms: Option<u64> },
    Succeeded,
    Rejected,
    Unknown,
    StaleOutcome,
    Lookup { matches: u8 },
    LookupFailed,
    Wake,
    Crash,
    Review(u8),
    Advance(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => any::<bool>().prop_map(|same_payload| Step::Deliver { same_payload }),
        1 => proptest::option::of(0u64..5_000).prop_map(|retry_after_ms| Step::NotSent { retry_after_ms }),
        1 => Just(Step::Succeeded),
        1 => Just(Step::Rejected),
        2 => Just(Step::Unknown),
        1 => Just(Step::StaleOutcome),
        1 => (0u8..4).prop_map(|matches| Step::Lookup { matches }),
        1 => Just(Step::LookupFailed),
        3 => Just(Step::Wake),
        1 => Just(Step::Crash),
        1 => (0u8..4).prop_map(Step::Review),
        1 => (0u64..20_000).prop_map(Step::Advance),
    ]
}

fn policy() -> impl Strategy<Value = Policy> {
    (
        1u32..5,
        any::<bool>(),
        any::<bool>(),
        proptest::option::of(1_000u64..30_000),
    )
        .prop_map(
            |(max_attempts, lookup, resend_when_absent, idempotency_ttl_ms)| Policy {
                retry: RetryPolicy {
                    max_attempts,
                    initial_backoff_ms: 50,
                    max_backoff_ms: 2_000,
                    multiplier: 2.0,
                },
                reconcile: lookup.then_some(ReconcilePolicy {
                    first_check_ms: 100,
                    check_interval_ms: 1_000,
                    deadline_ms: 15_000,
                    resend_when_absent,
                }),
                idempotency_ttl_ms,
            },
        )
}

/// The input a step stands for, in the harness's current state (`None` for a pure clock step).
fn to_input(h: &mut Harness, s: Step, offset: &mut i64) -> Option<Input> {
    let attempt = h.state.in_flight.unwrap_or(h.state.attempts);
    Some(match s {
        Step::Deliver { same_payload } => {
            *offset += 1;
            deliver(if same_payload { 5 } else { 6 }, *offset)
        }
        Step::NotSent { retry_after_ms } => Input::Outcome {
            attempt,
            outcome: AttemptOutcome::NotSent {
                cause: NotSentCause::Connect("refused".into()),
                retry_after_ms,
            },
        },
        Step::Succeeded => Input::Outcome {
            attempt,
            outcome: AttemptOutcome::Succeeded {
                remote_id: format!("r{attempt}"),
                status: 201,
            },
        },
        Step::Rejected => Input::Outcome {
            attempt,
            outcome: AttemptOutcome::Rejected {
                status: 422,
                detail: "bad".into(),
            },
        },
        Step::Unknown => Input::Outcome {
            attempt,
            outcome: AttemptOutcome::Unknown {
                cause: UnknownCause::Timeout,
            },
        },
        Step::StaleOutcome => Input::Outcome {
            attempt: attempt.wrapping_sub(1),
            outcome: AttemptOutcome::Succeeded {
                remote_id: "stale".into(),
                status: 200,
            },
        },
        Step::Lookup { matches } => Input::Lookup {
            result: Ok((0..matches).map(|i| format!("m{i}")).collect()),
        },
        Step::LookupFailed => Input::Lookup {
            result: Err("503".into()),
        },
        Step::Wake => Input::Wake,
        Step::Crash => {
            h.state = fold(&h.log);
            Input::Recover
        }
        Step::Review(0) => Input::Operator(OperatorResolution::Succeeded {
            remote_id: "op".into(),
            by: "ana".into(),
            reason: "checked".into(),
        }),
        Step::Review(1) => Input::Operator(OperatorResolution::Failed {
            by: "ana".into(),
            reason: "checked".into(),
        }),
        Step::Review(2) => Input::Operator(OperatorResolution::Resend {
            by: "ana".into(),
            reason: "checked".into(),
        }),
        Step::Review(_) => Input::Operator(OperatorResolution::Note {
            by: "ana".into(),
            text: "looked".into(),
        }),
        Step::Advance(ms) => {
            h.now += ms;
            return None;
        }
    })
}

/// The generated inputs do reach every corner the rules are about; otherwise the property
/// above would pass vacuously.
#[test]
fn generated_inputs_reach_every_corner() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(proptest::test_runner::RngAlgorithm::ChaCha),
    );
    let strategy = (policy(), proptest::collection::vec(step(), 1..60));
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..2_000 {
        let (policy, steps) = strategy.new_tree(&mut runner).unwrap().current();
        let mut h = Harness::new(policy);
        h.step(deliver(5, 0)).unwrap();
        let mut offset = 1;
        for s in steps {
            if let Some(input) = to_input(&mut h, s, &mut offset) {
                let _ = h.step(input);
            }
        }
        seen.insert(format!("{:?}", h.state.phase));
        let mut unknown = false;
        for e in &h.log {
            match &e.body {
                EventBody::SendUnknown { .. } => unknown = true,
                EventBody::SendIntended {
                    idempotency_key: Some(_),
                    ..
                } if unknown => {
                    seen.insert("same-key resend".into());
                }
                EventBody::ResendAuthorized { by, .. } => {
                    seen.insert(format!("authorized by {by}"));
                }
                EventBody::Confirmed { evidence, .. } => {
                    seen.insert(format!("{evidence:?}"));
                }
                EventBody::RequestConflict { .. } => {
                    seen.insert("conflict".into());
                }
                EventBody::ManualReviewRequired { reason } => {
                    seen.insert(format!("{reason:?}").split(' ').next().unwrap().to_string());
                }
                _ => {}
            }
        }
    }
    for corner in [
        "Succeeded",
        "Rejected",
        "Failed",
        "ManualReview",
        "Unknown",
        "RetryWait",
        "same-key resend",
        "authorized by ana",
        "authorized by policy:resend_when_absent",
        "Lookup",
        "conflict",
        "MultipleMatches",
        "DeadlinePassed",
        "NoLookup",
    ] {
        assert!(
            seen.iter().any(|s| s.starts_with(corner)),
            "never reached {corner}: {seen:?}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// No interleaving of inputs makes the decisions break a rule, and the state the actor keeps
    /// incrementally is always the fold of the log.
    #[test]
    fn no_input_sequence_breaks_the_rules(policy in policy(), steps in proptest::collection::vec(step(), 1..60)) {
        let ttl = policy.idempotency_ttl_ms;
        let mut h = Harness::new(policy);
        h.step(deliver(5, 0)).unwrap();
        let mut offset = 1;
        for s in steps {
            let was_terminal = h.state.phase.is_terminal();
            let before = h.log.len();
            let Some(input) = to_input(&mut h, s, &mut offset) else { continue };
            let sends_before = h.sends.len();
            let _ = h.step(input);
            if was_terminal {
                prop_assert_eq!(h.sends.len(), sends_before, "a terminal task sent again");
                for e in &h.log[before..] {
                    prop_assert!(matches!(e.body, EventBody::DuplicateDelivery { .. } | EventBody::RequestConflict { .. } | EventBody::OperatorNote { .. }), "{:?} after terminal", e.body);
                }
            }
            prop_assert_eq!(&fold(&h.log), &h.state);
        }
        let (state, violations) = check_task(&h.log, ttl);
        prop_assert!(violations.is_empty(), "{:?}\n{:#?}", violations, h.log);
        prop_assert_eq!(state, h.state);
    }
}
