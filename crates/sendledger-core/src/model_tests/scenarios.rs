//! Scenarios: one rule or one corner of the state machine each, step by step.

use super::*;

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
            asked_at: h.now,
            attempt: h.state.attempts,
            result: Ok(crate::saga::Found::from(vec![]))
        })
        .unwrap(),
        Action::WakeAt(h.now + 1_000)
    );
    assert_eq!(h.state.phase, Phase::Unknown);
    h.now += 1_000;
    assert_eq!(h.step(Input::Wake).unwrap(), Action::Lookup { attempt: 1 });
    h.step(Input::Lookup {
        asked_at: h.now,
        attempt: h.state.attempts,
        result: Ok(crate::saga::Found::from(vec!["r-1".into()])),
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
        asked_at: h.now,
        attempt: h.state.attempts,
        result: Ok(crate::saga::Found::from(vec!["a".into(), "b".into()])),
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
        asked_at: h.now,
        attempt: h.state.attempts,
        result: Ok(crate::saga::Found::from(vec![])),
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
            asked_at: h.now,
            attempt: h.state.attempts,
            result: Ok(crate::saga::Found::from(vec![])),
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
        steps: None,
    })
    .unwrap();
    for (amount, offset) in [("100.00", 1), ("100.01", 2)] {
        let again = Input::Deliver {
            request: with_amount(amount),
            source: source(offset),
            steps: None,
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
            answer: Default::default(),
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
            answer: Default::default(),
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
        let action = h
            .step(Input::Lookup {
                attempt: 1,
                asked_at: h.now,
                result: result.map(crate::saga::Found::from),
            })
            .unwrap();
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

fn breaker_open(until: u64) -> Hold {
    Hold {
        until,
        spread_ms: 0,
        reason: WaitReason::BreakerOpen {
            target: "payments".into(),
        },
    }
}

/// A task whose target's breaker is open waits before its intent: no attempt, one recorded
/// wait however often it finds the breaker still open, and its first attempt once it closes.
#[test]
fn an_open_breaker_defers_the_intent_without_spending_an_attempt() {
    let mut h = Harness::new(lookup_policy());
    h.hold = Some(breaker_open(h.now + 5_000));
    assert_eq!(
        h.step(deliver(5, 0)).unwrap(),
        Action::WakeAt(h.now + 5_000)
    );
    assert_eq!(h.names(), ["TaskAccepted", "SendDeferred"]);
    assert_eq!(h.state.phase, Phase::Accepted);
    assert_eq!(h.state.attempts, 0);
    let waiting = h.state.waiting.clone().expect("waiting");
    assert_eq!(waiting.until, h.now + 5_000);
    h.now += 5_000;
    h.hold = Some(breaker_open(h.now + 5_000));
    assert_eq!(h.step(Input::Wake).unwrap(), Action::WakeAt(h.now + 5_000));
    assert_eq!(h.log.len(), 2, "a wait is recorded once");
    h.now += 5_000;
    h.hold = None;
    assert!(matches!(
        h.step(Input::Wake).unwrap(),
        Action::Send { attempt: 1, .. }
    ));
    assert_eq!(h.state.waiting, None);
    // Refused: retried after backoff, and the breaker opening meanwhile costs no attempt.
    h.step(Input::Outcome {
        attempt: 1,
        outcome: AttemptOutcome::NotSent {
            cause: NotSentCause::Connect("refused".into()),
            retry_after_ms: None,
        },
    })
    .unwrap();
    h.now += 60_000;
    h.hold = Some(breaker_open(h.now + 1_000));
    for _ in 0..10 {
        h.step(Input::Wake).unwrap();
        h.now += 1_000;
        h.hold = Some(breaker_open(h.now + 1_000));
    }
    assert_eq!(h.state.attempts, 1);
    assert_eq!(h.state.phase, Phase::RetryWait);
    h.hold = None;
    assert!(matches!(
        h.step(Input::Wake).unwrap(),
        Action::Send { attempt: 2, .. }
    ));
    assert_eq!(
        h.names(),
        [
            "TaskAccepted",
            "SendDeferred",
            "SendIntended",
            "SendNotSent",
            "SendDeferred",
            "SendIntended"
        ]
    );
    assert!(check_task(&h.log, CheckConfig::default()).1.is_empty());
}

/// A resend authorized by the policy waits for an open breaker like any first attempt.
#[test]
fn an_authorized_resend_waits_for_the_breaker() {
    let mut policy = lookup_policy();
    policy.reconcile.as_mut().unwrap().resend_when_absent = true;
    let mut h = Harness::new(policy);
    h.step(deliver(5, 0)).unwrap();
    unknown_outcome(&mut h);
    h.now += 10_000;
    h.hold = Some(breaker_open(h.now + 3_000));
    assert_eq!(
        lookup(&mut h, Ok(vec![])),
        Action::WakeAt(h.now + 3_000),
        "authorized, then waits"
    );
    assert!(h.state.resend_authorized);
    assert_eq!(h.sends.len(), 1);
    h.now += 3_000;
    h.hold = None;
    assert!(matches!(
        h.step(Input::Wake).unwrap(),
        Action::Send { attempt: 2, .. }
    ));
    assert!(check_task(&h.log, CheckConfig::default()).1.is_empty());
}

/// With `complete_after`, a lookup asked past the bound that finds nothing proves the attempt
/// was not performed: a bounded resend follows, before the deadline. One asked earlier, or
/// finding a record, proves nothing of the kind.
#[test]
fn absence_past_complete_after_authorizes_one_resend() {
    let mut policy = lookup_policy();
    policy.reconcile.as_mut().unwrap().complete_after_ms = Some(3_000);
    let mut h = Harness::new(policy);
    h.step(deliver(5, 0)).unwrap();
    unknown_outcome(&mut h);
    h.now += 2_000;
    // Asked before the bound, answered after it: absence as of the asking proves nothing.
    let asked_at = h.now;
    h.now += 2_000;
    let action = h
        .step(Input::Lookup {
            attempt: 1,
            asked_at,
            result: Ok(crate::saga::Found::from(vec![])),
        })
        .unwrap();
    assert_eq!(action, Action::WakeAt(h.now + 1_000));
    assert_eq!(h.sends.len(), 1);
    h.now += 1_000;
    assert!(matches!(
        lookup(&mut h, Ok(vec![])),
        Action::Send { attempt: 2, .. }
    ));
    let authorized = h
        .log
        .iter()
        .find_map(|e| match &e.body {
            EventBody::ResendAuthorized { by, reason } => Some((by.clone(), reason.clone())),
            _ => None,
        })
        .unwrap();
    assert_eq!(authorized.0, crate::event::POLICY_COMPLETE_BY);
    assert!(authorized.1.contains("complete_after"), "{}", authorized.1);
    // The resend's outcome is unknown too: the policy's one resend is spent, so the deadline
    // and review hold again.
    unknown_outcome(&mut h);
    h.now += 10_000;
    lookup(&mut h, Ok(vec![]));
    assert_eq!(h.state.phase, Phase::ManualReview);
    assert_eq!(h.sends.len(), 2);
    let max_policy_resends = 1;
    assert!(check_task(
        &h.log,
        CheckConfig {
            key_ttl_ms: None,
            max_policy_resends
        }
    )
    .1
    .is_empty());
}

/// A class of "not sent" with a policy of its own: its attempts counted apart (and within the
/// target's in all), its backoff fixed; other classes keep the target's policy.
#[test]
fn a_class_of_not_sent_has_its_own_attempts_and_backoff() {
    use crate::retry::RetryClass;
    let mut policy = lookup_policy();
    policy.retry.max_attempts = 5;
    policy.retry.classes.insert(
        RetryClass::Connect,
        RetryPolicy {
            max_attempts: 2,
            initial_backoff_ms: 2_000,
            max_backoff_ms: 2_000,
            multiplier: 1.0,
            jitter: false,
            classes: Default::default(),
        },
    );
    let mut h = Harness::new(policy);
    h.step(deliver(5, 0)).unwrap();
    let not_sent = |h: &mut Harness, cause: NotSentCause| {
        let attempt = h.state.in_flight.unwrap();
        h.step(Input::Outcome {
            attempt,
            outcome: AttemptOutcome::NotSent {
                cause,
                retry_after_ms: None,
            },
        })
        .unwrap()
    };
    // Throttled: the target's policy (jittered, under its 100 ms ceiling).
    let Action::WakeAt(at) = not_sent(&mut h, NotSentCause::Throttled { status: 429 }) else {
        panic!("a retry");
    };
    assert!(at <= h.now + 100);
    h.now = at;
    h.step(Input::Wake).unwrap();
    // Connect: the class's fixed 2 s, then exhausted at its second.
    assert_eq!(
        not_sent(&mut h, NotSentCause::Connect("refused".into())),
        Action::WakeAt(h.now + 2_000)
    );
    h.now += 2_000;
    h.step(Input::Wake).unwrap();
    assert_eq!(h.state.attempts, 3);
    not_sent(&mut h, NotSentCause::Connect("refused".into()));
    assert_eq!(h.state.phase, Phase::Failed);
    let reason = h.state.failure.clone().unwrap();
    assert!(reason.contains("retry.connect.max_attempts"), "{reason}");
    assert!(check_task(&h.log, CheckConfig::default()).1.is_empty());
}
