//! Generated input sequences: no sequence breaks a rule, and the generator reaches every
//! corner the rules are about.

use proptest::prelude::*;

use super::*;
use crate::decide::Fallback;

const FALLBACK: &str = "backup";

/// One abstract step of the property test.
#[derive(Debug, Clone)]
pub(super) enum Step {
    Deliver {
        same_payload: bool,
    },
    NotSent {
        retry_after_ms: Option<u64>,
    },
    Succeeded,
    /// Refused by the remote, or (`built: false`) not even built from the task.
    Rejected {
        built: bool,
    },
    Unknown,
    StaleOutcome,
    Lookup {
        matches: u8,
    },
    LookupFailed,
    StaleLookup,
    Wake,
    Crash,
    Review(u8),
    Advance(u64),
    /// The target's breaker opens (for this many ms) or, with `None`, closes.
    Breaker(Option<u64>),
    /// The same for the fallback target's.
    FallbackBreaker(Option<u64>),
    /// An operator retries the task (a new version, if it failed with nothing sent).
    Retry,
    /// The target's breaker closed and it retries its failed tasks.
    RetryOnClose,
}

pub(super) fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => any::<bool>().prop_map(|same_payload| Step::Deliver { same_payload }),
        1 => proptest::option::of(0u64..5_000).prop_map(|retry_after_ms| Step::NotSent { retry_after_ms }),
        1 => Just(Step::Succeeded),
        1 => prop_oneof![4 => Just(true), 1 => Just(false)].prop_map(|built| Step::Rejected { built }),
        2 => Just(Step::Unknown),
        1 => Just(Step::StaleOutcome),
        1 => (0u8..4).prop_map(|matches| Step::Lookup { matches }),
        1 => Just(Step::LookupFailed),
        1 => Just(Step::StaleLookup),
        3 => Just(Step::Wake),
        1 => Just(Step::Crash),
        1 => (0u8..7).prop_map(Step::Review),
        1 => (0u64..20_000).prop_map(Step::Advance),
        1 => proptest::option::of(0u64..10_000).prop_map(Step::Breaker),
        1 => proptest::option::of(0u64..10_000).prop_map(Step::FallbackBreaker),
        1 => Just(Step::Retry),
        1 => Just(Step::RetryOnClose),
    ]
}

pub(super) fn policy() -> impl Strategy<Value = Policy> {
    (
        1u32..5,
        any::<bool>(),
        any::<bool>(),
        proptest::option::of(1_000u64..30_000),
        0u32..3,
        0u64..2_000,
        proptest::option::of(0u64..12_000),
        proptest::option::of((1u32..4, any::<bool>())),
        proptest::option::of(1u32..4),
    )
        .prop_map(
            |(
                max_attempts,
                lookup,
                resend_when_absent,
                idempotency_ttl_ms,
                max_policy_resends,
                idempotency_ttl_margin_ms,
                complete_after_ms,
                connect_class,
                fallback_attempts,
            )| {
                let reconcile = lookup.then_some(ReconcilePolicy {
                    first_check_ms: 100,
                    check_interval_ms: 1_000,
                    deadline_ms: 15_000,
                    resend_when_absent,
                    max_policy_resends,
                    complete_after_ms,
                });
                Policy {
                    retry: RetryPolicy {
                        max_attempts,
                        initial_backoff_ms: 50,
                        max_backoff_ms: 2_000,
                        multiplier: 2.0,
                        jitter: true,
                        classes: connect_class
                            .map(|(max_attempts, jitter)| {
                                let fixed = RetryPolicy {
                                    max_attempts,
                                    initial_backoff_ms: 300,
                                    max_backoff_ms: 300,
                                    multiplier: 1.0,
                                    jitter,
                                    classes: Default::default(),
                                };
                                (crate::retry::RetryClass::Connect, fixed)
                            })
                            .into_iter()
                            .collect(),
                    },
                    reconcile: reconcile.clone(),
                    idempotency_ttl_ms,
                    idempotency_ttl_margin_ms,
                    fallback: fallback_attempts.map(|max_attempts| Fallback {
                        target: FALLBACK.into(),
                        policy: Box::new(Policy {
                            retry: RetryPolicy {
                                max_attempts,
                                initial_backoff_ms: 200,
                                max_backoff_ms: 200,
                                multiplier: 1.0,
                                ..RetryPolicy::default()
                            },
                            reconcile,
                            ..Policy::default()
                        }),
                    }),
                }
            },
        )
}

/// The input a step stands for, in the harness's current state (`None` for a pure clock step).
pub(super) fn to_input(h: &mut Harness, s: Step, offset: &mut i64) -> Option<Input> {
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
                answer: Default::default(),
            },
        },
        Step::Rejected { built } => Input::Outcome {
            attempt,
            outcome: AttemptOutcome::Rejected {
                status: if built { 422 } else { 0 },
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
                answer: Default::default(),
            },
        },
        Step::Lookup { matches } => Input::Lookup {
            asked_at: h.now,
            attempt: h.state.attempts,
            result: Ok(crate::saga::Found::from(
                (0..matches).map(|i| format!("m{i}")).collect::<Vec<_>>(),
            )),
        },
        Step::StaleLookup => Input::Lookup {
            asked_at: h.now,
            attempt: h.state.attempts.wrapping_sub(1),
            result: Ok(crate::saga::Found::from(vec!["stale".into()])),
        },
        Step::LookupFailed => Input::Lookup {
            asked_at: h.now,
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
        // Keep the first record a lookup found and undo the others (a saga's step only).
        Step::Review(4) => {
            let found = match &h.state.review_reason {
                Some(ReviewReason::MultipleMatches { remote_ids }) => remote_ids.clone(),
                _ => vec!["op".into(), "dup".into()],
            };
            Input::Operator(OperatorResolution::Compensate {
                record: found.first().cloned(),
                duplicates: found[1..].to_vec(),
                whole_task: false,
                by: "ana".into(),
                reason: "duplicates".into(),
            })
        }
        // Undo the whole task, the step in review done (5) or not (6).
        Step::Review(n @ (5 | 6)) => Input::Operator(OperatorResolution::Compensate {
            record: (n == 5).then(|| "op".into()),
            duplicates: Vec::new(),
            whole_task: true,
            by: "ana".into(),
            reason: "order cancelled".into(),
        }),
        Step::Review(_) => Input::Operator(OperatorResolution::Note {
            by: "ana".into(),
            text: "looked".into(),
        }),
        Step::Advance(ms) => {
            h.now += ms;
            return None;
        }
        Step::Breaker(open_for) => {
            h.hold = open_for.map(|ms| Hold {
                until: h.now + ms,
                spread_ms: 1_000,
                reason: WaitReason::BreakerOpen {
                    target: "payments".into(),
                },
            });
            Input::Wake
        }
        Step::FallbackBreaker(open_for) => {
            h.fallback_hold = open_for.map(|ms| Hold {
                until: h.now + ms,
                spread_ms: 1_000,
                reason: WaitReason::BreakerOpen {
                    target: FALLBACK.into(),
                },
            });
            Input::Wake
        }
        Step::RetryOnClose => Input::RetryOnClose {
            reason: "the breaker closed".into(),
        },
        Step::Retry => Input::Operator(OperatorResolution::Retry {
            by: "ana".into(),
            reason: "the remote is back".into(),
        }),
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
    for _ in 0..4_000 {
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
                EventBody::SendDeferred { .. } => {
                    seen.insert("waited".into());
                }
                EventBody::TaskRetried { by, .. } => {
                    seen.insert(format!("retried by {by}"));
                }
                EventBody::SendIntendedAt { .. } => {
                    seen.insert("fallback".into());
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
        "authorized by policy:complete_after",
        "waited",
        "retried by ana",
        "retried by policy:breaker_closed",
        "fallback",
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
            let was_retryable = h.state.retryable().is_ok();
            let (was_own, unknowns) = (h.state.fallback_target.is_none(), h.state.unknowns);
            let before = h.log.len();
            let Some(input) = to_input(&mut h, s, &mut offset) else { continue };
            let sends_before = h.sends.len();
            let _ = h.step(input);
            for (held, target) in [(&h.hold, "payments"), (&h.fallback_hold, FALLBACK)] {
                if held.is_some() {
                    prop_assert!(!h.sent_to[sends_before..].iter().any(|t| t == target), "sent to {} while its breaker was open", target);
                }
            }
            if was_own && h.sent_to[sends_before..].iter().any(|t| t == FALLBACK) {
                prop_assert_eq!(unknowns, 0, "moved to the fallback after an unknown outcome");
            }
            if was_terminal {
                prop_assert_eq!(h.sends.len(), sends_before, "a terminal task sent again");
                for e in &h.log[before..] {
                    let retry = matches!(e.body, EventBody::TaskRetried { .. }) && was_retryable;
                    prop_assert!(retry || matches!(e.body, EventBody::DuplicateDelivery { .. } | EventBody::RequestConflict { .. } | EventBody::OperatorNote { .. }), "{:?} after terminal", e.body);
                }
            }
            prop_assert_eq!(&fold(&h.log), &h.state);
        }
        let (state, violations) = check_task(&h.log, CheckConfig { key_ttl_ms: ttl, max_policy_resends });
        prop_assert!(violations.is_empty(), "{:?}\n{:#?}", violations, h.log);
        prop_assert_eq!(state, h.state);
    }
}
