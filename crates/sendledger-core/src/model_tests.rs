//! Scenario and property tests of the decision functions against the rules of `docs/rules.md`.

use proptest::prelude::*;

use crate::decide::{
    decide, Action, AttemptOutcome, Ctx, Input, OperatorResolution, Policy, ReconcilePolicy,
};
use crate::event::{Event, EventBody, Evidence, NotSentCause, ReviewReason, Source, UnknownCause};
use crate::request::{Limits, TaskRequest};
use crate::retry::RetryPolicy;
use crate::rules::{check_task, CheckConfig, Rule};
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
        payload_text: None,
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
            max_policy_resends: 1,
        }),
        idempotency_ttl_ms: None,
        idempotency_ttl_margin_ms: 0,
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
    assert_eq!(h.step(Input::Wake).unwrap(), Action::Lookup { attempt: 1 });
    // Zero matches before the deadline: still unknown, check again later.
    assert_eq!(
        h.step(Input::Lookup {
            attempt: h.state.attempts,
            result: Ok(vec![])
        })
        .unwrap(),
        Action::WakeAt(h.now + 1_000)
    );
    assert_eq!(h.state.phase, Phase::Unknown);
    h.now += 1_000;
    assert_eq!(h.step(Input::Wake).unwrap(), Action::Lookup { attempt: 1 });
    h.step(Input::Lookup {
        attempt: h.state.attempts,
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
    assert!(check_task(&h.log, CheckConfig::default()).1.is_empty());
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
        attempt: h.state.attempts,
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
    h.step(Input::Lookup {
        attempt: h.state.attempts,
        result: Ok(vec![]),
    })
    .unwrap();
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
    assert!(check_task(&h.log, CheckConfig::default()).1.is_empty());
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
    let action = h
        .step(Input::Lookup {
            attempt: h.state.attempts,
            result: Ok(vec![]),
        })
        .unwrap();
    assert!(matches!(action, Action::Send { attempt: 2, .. }));
    assert!(h.log.iter().any(|e| matches!(&e.body, EventBody::ResendAuthorized { by, .. } if by == "policy:resend_when_absent")));
    assert!(check_task(&h.log, CheckConfig::default()).1.is_empty());
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
    assert!(check_task(&h.log, CheckConfig::default()).1.is_empty());
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
    assert!(check_task(
        &h.log,
        CheckConfig {
            key_ttl_ms: Some(60_000),
            ..CheckConfig::default()
        }
    )
    .1
    .is_empty());
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
fn duplicates_past_the_limit_record_nothing_and_conflicts_still_do() {
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
    let settled = h.log.len();
    let limit = crate::decide::MAX_RECORDED_DUPLICATES as i64;
    for offset in 1..=limit + 50 {
        assert_eq!(h.step(deliver(5, offset)).unwrap(), Action::None);
    }
    let recorded = &h.log[settled..];
    assert_eq!(recorded.len() as i64, limit);
    assert!(recorded
        .iter()
        .all(|e| matches!(e.body, EventBody::DuplicateDelivery { .. })));
    assert_eq!(h.state.duplicates, crate::decide::MAX_RECORDED_DUPLICATES);
    // A different payload under the identity is still recorded: its requester learns of it.
    h.step(deliver(6, limit + 51)).unwrap();
    assert_eq!(h.names().last(), Some(&"RequestConflict"));
    assert_eq!(h.sends.len(), 1);
    assert!(check_task(&h.log, CheckConfig::default()).1.is_empty());
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
    let (_, violations) = check_task(&h.log, CheckConfig::default());
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
    StaleLookup,
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
        1 => Just(Step::StaleLookup),
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
        0u32..3,
        0u64..2_000,
    )
        .prop_map(
            |(
                max_attempts,
                lookup,
                resend_when_absent,
                idempotency_ttl_ms,
                max_policy_resends,
                idempotency_ttl_margin_ms,
            )| Policy {
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
                    max_policy_resends,
                }),
                idempotency_ttl_ms,
                idempotency_ttl_margin_ms,
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
            attempt: h.state.attempts,
            result: Ok((0..matches).map(|i| format!("m{i}")).collect()),
        },
        Step::StaleLookup => Input::Lookup {
            attempt: h.state.attempts.wrapping_sub(1),
            result: Ok(vec!["stale".into()]),
        },
        Step::LookupFailed => Input::Lookup {
            attempt: h.state.attempts,
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
        "LookupsFailed",
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
        let max_policy_resends = policy.reconcile.as_ref().map_or(0, |r| r.max_policy_resends);
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
        let (state, violations) = check_task(&h.log, CheckConfig { key_ttl_ms: ttl, max_policy_resends });
        prop_assert!(violations.is_empty(), "{:?}\n{:#?}", violations, h.log);
        prop_assert_eq!(state, h.state);
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
        attempt: h.state.attempts,
        result,
    })
    .unwrap()
}

/// Each unknown attempt gets the whole observation window, and the policy authorizes at most
/// `max_policy_resends` resends: an attempt authorized by the policy that is unknown again is
/// not resent at its first empty lookup (that shrank the window to `first_check`).
#[test]
fn each_unknown_attempt_has_its_own_window_and_policy_resends_are_bounded() {
    let mut policy = lookup_policy();
    policy.reconcile.as_mut().unwrap().resend_when_absent = true;
    let mut h = Harness::new(policy);
    h.step(deliver(5, 0)).unwrap();
    unknown_outcome(&mut h);
    h.now += 10_000;
    assert!(matches!(
        lookup(&mut h, Ok(vec![])),
        Action::Send { attempt: 2, .. }
    ));
    unknown_outcome(&mut h);
    // The first check of attempt 2, long after attempt 1's deadline: keep observing.
    h.now += 500;
    assert_eq!(lookup(&mut h, Ok(vec![])), Action::WakeAt(h.now + 1_000));
    assert_eq!(h.sends.len(), 2);
    // Attempt 2's own deadline: the one allowed policy resend is used, so a person decides.
    h.now += 9_500;
    assert_eq!(lookup(&mut h, Ok(vec![])), Action::None);
    assert_eq!(h.state.phase, Phase::ManualReview);
    assert_eq!(
        h.state.review_reason,
        Some(ReviewReason::DeadlinePassed { lookups: 3 })
    );
    assert_eq!(h.sends.len(), 2);
    assert!(check_task(&h.log, CheckConfig::default()).1.is_empty());
}

#[test]
fn the_checker_catches_a_policy_resend_over_the_limit() {
    let mut policy = lookup_policy();
    let reconcile = policy.reconcile.as_mut().unwrap();
    reconcile.resend_when_absent = true;
    reconcile.max_policy_resends = 2;
    let mut h = Harness::new(policy);
    h.step(deliver(5, 0)).unwrap();
    for attempt in 2..=3 {
        unknown_outcome(&mut h);
        h.now += 10_000;
        assert!(
            matches!(lookup(&mut h, Ok(vec![])), Action::Send { attempt: a, .. } if a == attempt)
        );
    }
    let allowed = CheckConfig {
        max_policy_resends: 2,
        ..CheckConfig::default()
    };
    assert!(check_task(&h.log, allowed).1.is_empty());
    let (_, violations) = check_task(&h.log, CheckConfig::default());
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_eq!(violations[0].rule, Rule::PolicyResendLimit);
    assert!(violations[0]
        .detail
        .contains("policy resend 2 where at most 1"));

    // A policy resend that no final empty lookup preceded is a violation too.
    let mut h = Harness::new(lookup_policy());
    h.step(deliver(5, 0)).unwrap();
    unknown_outcome(&mut h);
    lookup(&mut h, Ok(vec![]));
    let task_id = h.state.task_id.unwrap();
    h.log.push(Event {
        lsn: 99,
        task_id,
        task_seq: h.state.next_seq,
        at: h.now,
        body: EventBody::ResendAuthorized {
            by: crate::decide::POLICY_RESEND_BY.into(),
            reason: "early".into(),
        },
    });
    let (_, violations) = check_task(&h.log, CheckConfig::default());
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_eq!(violations[0].rule, Rule::PolicyResendLimit);
}

/// A lookup result belongs to the attempt it was issued for: one issued before a later attempt
/// is ignored, whatever it says.
#[test]
fn a_lookup_result_for_an_earlier_attempt_is_ignored() {
    let mut policy = lookup_policy();
    policy.reconcile.as_mut().unwrap().resend_when_absent = true;
    let mut h = Harness::new(policy);
    h.step(deliver(5, 0)).unwrap();
    unknown_outcome(&mut h);
    h.now += 10_000;
    lookup(&mut h, Ok(vec![]));
    unknown_outcome(&mut h);
    let events = h.log.len();
    for result in [Ok(vec![]), Ok(vec!["r-1".into()]), Err("503".into())] {
        h.now += 20_000;
        let action = h.step(Input::Lookup { attempt: 1, result }).unwrap();
        assert_eq!(action, Action::None);
        assert_eq!(h.log.len(), events, "nothing recorded for a stale lookup");
    }
    assert_eq!(h.state.phase, Phase::Unknown);
}

/// Lookups that failed until the deadline are not evidence of absence: the review says they
/// failed (with the last error), and the policy does not authorize a resend on them.
#[test]
fn lookups_failing_until_the_deadline_say_so() {
    let mut policy = lookup_policy();
    policy.reconcile.as_mut().unwrap().resend_when_absent = true;
    let mut h = Harness::new(policy);
    h.step(deliver(5, 0)).unwrap();
    unknown_outcome(&mut h);
    h.now += 500;
    assert_eq!(
        lookup(&mut h, Err("connection refused".into())),
        Action::WakeAt(h.now + 1_000)
    );
    h.now += 10_000;
    assert_eq!(
        lookup(&mut h, Err("503 from the lookup".into())),
        Action::None
    );
    assert_eq!(h.state.phase, Phase::ManualReview);
    let reason = h.state.review_reason.clone().unwrap();
    assert_eq!(
        reason,
        ReviewReason::LookupsFailed {
            lookups: 0,
            last_error: "503 from the lookup".into()
        }
    );
    assert!(reason.to_string().contains("lookups failed"), "{reason}");
    assert!(!reason.to_string().contains("no remote record found"));
    assert_eq!(h.sends.len(), 1, "no resend on failed lookups");
}

/// A same-key resend happens only while the key has more than the margin left to live.
#[test]
fn same_key_resend_stops_short_of_the_key_ttl() {
    let mut policy = lookup_policy();
    policy.idempotency_ttl_ms = Some(60_000);
    policy.idempotency_ttl_margin_ms = 5_000;
    policy.retry.max_attempts = 5;
    for (wait, resends) in [(54_000, true), (55_000, false), (59_999, false)] {
        let mut h = Harness::new(policy.clone());
        h.step(deliver(5, 0)).unwrap();
        h.now += wait;
        let action = unknown_outcome(&mut h);
        match action {
            Action::WakeAt(at) => {
                h.now = at;
                let action = h.step(Input::Wake).unwrap();
                assert_eq!(
                    matches!(action, Action::Send { .. }),
                    resends,
                    "{wait}: {action:?}"
                );
            }
            other => panic!("{wait}: {other:?}"),
        }
        if resends {
            assert_eq!(h.sends[0].1, h.sends[1].1);
        } else {
            assert_eq!(h.sends.len(), 1, "{wait}: resent after the key's margin");
        }
    }
}

#[test]
fn operators_cannot_sign_as_the_policy() {
    let mut h = Harness::new(lookup_policy());
    h.step(deliver(5, 0)).unwrap();
    unknown_outcome(&mut h);
    h.now += 10_000;
    lookup(&mut h, Ok(vec![]));
    assert_eq!(h.state.phase, Phase::ManualReview);
    let err = h
        .step(Input::Operator(OperatorResolution::Resend {
            by: "policy:resend_when_absent".into(),
            reason: "me".into(),
        }))
        .unwrap_err();
    assert!(err.to_string().contains("reserved"), "{err}");
    assert_eq!(h.state.phase, Phase::ManualReview);
}

#[test]
fn a_rejected_input_is_recorded_once() {
    let source = Source {
        topic: "requests".into(),
        partition: 3,
        offset: 17,
    };
    let reject = || Input::Reject {
        source: source.clone(),
        reason: "bad".into(),
        raw: vec![b'x'; 10_000],
    };
    let mut h = Harness::new(lookup_policy());
    h.step(reject()).unwrap();
    h.step(reject()).unwrap();
    assert_eq!(h.names(), ["InputRejected"]);
    let EventBody::InputRejected { raw, .. } = &h.log[0].body else {
        unreachable!()
    };
    assert_eq!(raw.len(), crate::decide::REJECTED_RAW_KEEP);
    assert_eq!(h.state.phase, Phase::Rejected);
}

/// Running out of file descriptors is this process's trouble: such attempts are retried with
/// backoff and do not use up the target's attempts.
#[test]
fn local_resource_exhaustion_does_not_use_up_attempts() {
    let mut h = Harness::new(lookup_policy());
    h.step(deliver(5, 0)).unwrap();
    let local = || AttemptOutcome::NotSent {
        cause: NotSentCause::LocalResources("out of file descriptors".into()),
        retry_after_ms: None,
    };
    for attempt in 1..=5 {
        let action = h
            .step(Input::Outcome {
                attempt,
                outcome: local(),
            })
            .unwrap();
        let Action::WakeAt(at) = action else {
            panic!("attempt {attempt}: {action:?}")
        };
        h.now = at;
        assert!(matches!(h.step(Input::Wake).unwrap(), Action::Send { .. }));
    }
    // Three attempts that reached the network (max_attempts = 3) still end it.
    for attempt in 6..=8 {
        let outcome = AttemptOutcome::NotSent {
            cause: NotSentCause::Connect("refused".into()),
            retry_after_ms: None,
        };
        if let Action::WakeAt(at) = h.step(Input::Outcome { attempt, outcome }).unwrap() {
            h.now = at;
            h.step(Input::Wake).unwrap();
        }
    }
    assert_eq!(h.state.phase, Phase::Failed);
    assert_eq!(h.state.local_not_sent, 5);
    assert!(h.state.failure.as_deref().unwrap().contains("3 attempts"));
    assert!(check_task(&h.log, CheckConfig::default()).1.is_empty());
}
