//! Multi-step tasks: scenarios of a three-step saga whose last step is refused, unknown
//! outcomes in steps and compensations, and generated input sequences over the saga that must
//! keep every rule.

use proptest::prelude::*;

use super::properties::{policy, step, to_input};
use super::*;
use crate::event::PlannedStep;
use crate::saga::{CompensationOutcome, Leg, StepOutcome};

/// reserve (undone by `release`), charge (undone by `refunds`), ship (not undone).
fn plan() -> Vec<PlannedStep> {
    let step = |name: &str, target: &str, undo: Option<&str>| PlannedStep {
        name: name.into(),
        target: target.into(),
        compensate: undo.map(Into::into),
    };
    vec![
        step("reserve", "stock", Some("release")),
        step("charge", "payments", Some("refunds")),
        step("ship", "shipments", None),
    ]
}

fn deliver_saga(offset: i64) -> Input {
    match deliver(5, offset) {
        Input::Deliver {
            request, source, ..
        } => Input::Deliver {
            request,
            source,
            steps: Some(plan()),
        },
        _ => unreachable!(),
    }
}

fn answer(h: &mut Harness, outcome: AttemptOutcome) -> Action {
    let attempt = h.state.in_flight.expect("an attempt in flight");
    h.step(Input::Outcome { attempt, outcome }).unwrap()
}

fn created(id: &str) -> AttemptOutcome {
    AttemptOutcome::Succeeded {
        remote_id: id.into(),
        status: 201,
        answer: Default::default(),
    }
}

fn refused() -> AttemptOutcome {
    AttemptOutcome::Rejected {
        status: 422,
        detail: "out of stock".into(),
    }
}

/// Runs the wake a decision asked for right away (the actor's timer would).
fn wake_now(h: &mut Harness, action: Action) -> Action {
    assert_eq!(action, Action::Continue, "the saga moves on at once");
    h.step(Input::Wake).unwrap()
}

fn sent_target(action: &Action) -> &str {
    match action {
        Action::Send { target, .. } => target,
        other => panic!("expected a send, got {other:?}"),
    }
}

/// A saga whose reservation and charge were created (`res-1`, `ch-1`) and whose shipment was
/// just refused; the action that decision asked for.
fn shipment_refused() -> (Harness, Action) {
    let mut h = Harness::new(lookup_policy());
    h.step(deliver_saga(0)).unwrap();
    let next = answer(&mut h, created("res-1"));
    wake_now(&mut h, next);
    let next = answer(&mut h, created("ch-1"));
    wake_now(&mut h, next);
    let next = answer(&mut h, refused());
    (h, next)
}

fn clean(h: &Harness) {
    let (state, violations) = check_task(&h.log, CheckConfig::default());
    assert!(violations.is_empty(), "{violations:?}\n{:#?}", h.log);
    assert_eq!(state, h.state);
}

#[test]
fn each_step_starts_once_the_one_before_is_confirmed_and_the_last_settles_the_task() {
    let mut h = Harness::new(lookup_policy());
    let first = h.step(deliver_saga(0)).unwrap();
    assert_eq!(sent_target(&first), "stock");
    assert_eq!(h.names(), ["TaskAccepted", "StepsPlanned", "SendIntended"]);
    let next = answer(&mut h, created("res-1"));
    assert_eq!(h.state.phase, Phase::Accepted);
    assert_eq!(h.state.leg(), Some(Leg::Step(1)));
    let charge = wake_now(&mut h, next);
    assert_eq!(sent_target(&charge), "payments");
    let next = answer(&mut h, created("ch-1"));
    let ship = wake_now(&mut h, next);
    assert_eq!(sent_target(&ship), "shipments");
    assert_eq!(answer(&mut h, created("sh-1")), Action::None);
    assert_eq!(h.state.phase, Phase::Succeeded);
    assert_eq!(h.state.remote_id.as_deref(), Some("sh-1"));
    assert_eq!(h.sends.iter().map(|s| s.0).collect::<Vec<_>>(), [1, 2, 3]);
    let ids = h.state.saga.as_ref().unwrap().step_records();
    assert_eq!(ids["reserve"].remote_id, "res-1");
    assert_eq!(ids["charge"].remote_id, "ch-1");
    clean(&h);
}

#[test]
fn a_refused_last_step_undoes_the_steps_before_it_in_reverse_order() {
    let (mut h, next) = shipment_refused();
    assert_eq!(h.state.phase, Phase::Compensating);
    let started = wake_now(&mut h, next);
    assert!(matches!(
        h.log.last().unwrap().body,
        EventBody::CompensationStarted { step: 1, ref remote_id, .. } if remote_id == "ch-1"
    ));
    let refund = wake_now(&mut h, started);
    assert_eq!(sent_target(&refund), "refunds");
    let next = answer(&mut h, created("rf-1"));
    assert_eq!(h.state.phase, Phase::Compensating);
    let started = wake_now(&mut h, next);
    let release = wake_now(&mut h, started);
    assert_eq!(sent_target(&release), "release");
    assert_eq!(
        h.state.saga.as_ref().unwrap().step_records()["reserve"].remote_id,
        "res-1",
        "the release's templates read the reservation it undoes"
    );
    assert_eq!(answer(&mut h, created("rl-1")), Action::None);
    assert_eq!(h.state.phase, Phase::Compensated);
    let saga = h.state.saga.as_ref().unwrap();
    for (n, undone_by) in [(0, "rl-1"), (1, "rf-1")] {
        assert_eq!(
            saga.steps[n].compensation.as_ref().unwrap().outcome,
            CompensationOutcome::Done {
                remote_id: undone_by.into()
            }
        );
    }
    assert!(matches!(
        saga.steps[2].outcome,
        StepOutcome::Rejected {
            http_status: 422,
            ..
        }
    ));
    clean(&h);
}

#[test]
fn a_refused_first_step_ends_the_task_rejected_with_nothing_to_undo() {
    let mut h = Harness::new(lookup_policy());
    h.step(deliver_saga(0)).unwrap();
    assert_eq!(answer(&mut h, refused()), Action::None);
    assert_eq!(h.state.phase, Phase::Rejected);
    clean(&h);
}

#[test]
fn an_unknown_compensation_is_looked_up_never_resent_and_a_refused_one_goes_to_review() {
    let (mut h, next) = shipment_refused();
    let started = wake_now(&mut h, next);
    wake_now(&mut h, started);
    let sends = h.sends.len();
    answer(
        &mut h,
        AttemptOutcome::Unknown {
            cause: UnknownCause::Timeout,
        },
    );
    h.now += 600;
    assert_eq!(h.step(Input::Wake).unwrap(), Action::Lookup { attempt: 4 });
    let next = lookup(&mut h, Ok(vec!["rf-9".into()]));
    assert_eq!(h.sends.len(), sends, "no resend of the refund");
    let started = wake_now(&mut h, next);
    wake_now(&mut h, started);
    answer(&mut h, refused());
    assert_eq!(h.state.phase, Phase::ManualReview);
    assert!(matches!(
        h.state.review_reason,
        Some(ReviewReason::CompensationRefused { step: 0, .. })
    ));
    // The operator undid the reservation by hand: the task is compensated.
    let done = h
        .step(Input::Operator(OperatorResolution::Succeeded {
            remote_id: "by-hand".into(),
            by: "ana".into(),
            reason: "released in the stock tool".into(),
        }))
        .unwrap();
    assert_eq!(done, Action::None);
    assert_eq!(h.state.phase, Phase::Compensated);
    clean(&h);
}

#[test]
fn a_compensation_whose_attempts_run_out_goes_to_review_not_to_failed() {
    let mut h = Harness::new(lookup_policy());
    h.step(deliver_saga(0)).unwrap();
    let next = answer(&mut h, created("res-1"));
    wake_now(&mut h, next);
    let next = answer(&mut h, refused());
    let started = wake_now(&mut h, next);
    wake_now(&mut h, started);
    for _ in 0..3 {
        let next = answer(
            &mut h,
            AttemptOutcome::NotSent {
                cause: NotSentCause::Connect("refused".into()),
                retry_after_ms: None,
            },
        );
        if let Action::WakeAt(at) = next {
            h.now = at;
            h.step(Input::Wake).unwrap();
        }
    }
    assert_eq!(h.state.phase, Phase::ManualReview);
    assert!(matches!(
        h.state.review_reason,
        Some(ReviewReason::CompensationNotSent { step: 0, .. })
    ));
    clean(&h);
}

#[test]
fn a_crash_between_legs_resumes_at_the_right_leg() {
    let mut h = Harness::new(lookup_policy());
    h.step(deliver_saga(0)).unwrap();
    answer(&mut h, created("res-1"));
    h.state = fold(&h.log);
    let charge = h.step(Input::Recover).unwrap();
    assert_eq!(sent_target(&charge), "payments");
    answer(&mut h, refused());
    h.state = fold(&h.log);
    let started = h.step(Input::Recover).unwrap();
    h.state = fold(&h.log);
    let release = h.step(Input::Recover).unwrap();
    assert_eq!(started, Action::Continue);
    assert_eq!(sent_target(&release), "release");
    clean(&h);
}

/// The fields of a step's answer that later calls read are recorded just before its
/// `Confirmed`, from its 2xx answer or from the one record its lookup found; later calls (the
/// next step, the step's own compensation) see them, a duplicate being undone does not.
#[test]
fn answer_fields_are_kept_from_the_answer_or_the_record_found_and_reach_later_calls() {
    let fields =
        |id: &str| crate::saga::Answer::from([("/reservation/id".to_string(), id.to_string())]);
    let mut h = Harness::new(lookup_policy());
    h.step(deliver_saga(0)).unwrap();
    let next = answer(
        &mut h,
        AttemptOutcome::Succeeded {
            remote_id: "res-1".into(),
            status: 201,
            answer: fields("rsv-7"),
        },
    );
    let names = h.names();
    assert_eq!(names[names.len() - 2..], ["StepAnswer", "Confirmed"]);
    wake_now(&mut h, next);
    let records = h.state.saga.as_ref().unwrap().step_records();
    assert_eq!(records["reserve"].answer, fields("rsv-7"));
    // The charge's answer is lost; the lookup finds its record, with the fields.
    answer_lost(&mut h);
    let next = h
        .step(Input::Lookup {
            attempt: h.state.attempts,
            asked_at: h.now,
            result: Ok(crate::saga::Found {
                ids: vec!["ch-1".into()],
                answer: fields("from-lookup"),
            }),
        })
        .unwrap();
    let names = h.names();
    assert_eq!(
        names[names.len() - 3..],
        ["LookupPerformed", "StepAnswer", "Confirmed"]
    );
    // The shipment is refused: each compensation reads its own step's answer.
    wake_now(&mut h, next);
    let next = answer(&mut h, refused());
    let started = wake_now(&mut h, next);
    let refund = wake_now(&mut h, started);
    assert_eq!(sent_target(&refund), "refunds");
    let records = h.state.saga.as_ref().unwrap().step_records();
    assert_eq!(records["charge"].answer, fields("from-lookup"));
    let next = answer(&mut h, created("rf-1"));
    let started = wake_now(&mut h, next);
    let release = wake_now(&mut h, started);
    assert_eq!(sent_target(&release), "release");
    let records = h.state.saga.as_ref().unwrap().step_records();
    assert_eq!(records["reserve"].answer, fields("rsv-7"));
    clean(&h);
}

/// A later step's call that cannot be built (a template reads a field the earlier step's
/// answer did not have) goes to review, nothing sent and nothing undone: a configuration
/// mistake is not a reason to refund and release. The operator fixes it and authorizes a
/// resend, or undoes the task.
#[test]
fn a_later_step_that_cannot_be_built_goes_to_review_not_to_compensation() {
    let not_built = || AttemptOutcome::Rejected {
        status: 0,
        detail: "step `reserve`'s answer has no string, number or boolean at `/x`".into(),
    };
    for resolution in ["resend", "compensated"] {
        let mut h = Harness::new(lookup_policy());
        h.step(deliver_saga(0)).unwrap();
        let next = answer(&mut h, created("res-1"));
        wake_now(&mut h, next);
        assert_eq!(answer(&mut h, not_built()), Action::None);
        assert_eq!(h.state.phase, Phase::ManualReview);
        assert!(matches!(
            &h.state.review_reason,
            Some(ReviewReason::StepNotBuilt { step: 1, name, .. }) if name == "charge"
        ));
        assert!(!h.state.saga.as_ref().unwrap().compensation_began());
        let input = match resolution {
            "resend" => OperatorResolution::Resend {
                by: "ana".into(),
                reason: "fixed the pointer".into(),
            },
            _ => OperatorResolution::Compensate {
                record: None,
                duplicates: Vec::new(),
                whole_task: true,
                by: "ana".into(),
                reason: "cancel".into(),
            },
        };
        let next = h.step(Input::Operator(input)).unwrap();
        let next = match next {
            Action::WakeAt(_) => h.step(Input::Wake).unwrap(),
            other => wake_now(&mut h, other),
        };
        let next = if next == Action::Continue {
            h.step(Input::Wake).unwrap()
        } else {
            next
        };
        let expected = if resolution == "resend" {
            "payments"
        } else {
            "release"
        };
        assert_eq!(sent_target(&next), expected, "{resolution}");
        clean(&h);
    }
}

/// A saga whose reservation was created (`res-1`) and whose charge, its answer lost, was
/// found twice by the lookup (`ch-1`, `ch-2`): in review.
fn charge_found_twice() -> Harness {
    let mut h = Harness::new(lookup_policy());
    h.step(deliver_saga(0)).unwrap();
    let next = answer(&mut h, created("res-1"));
    wake_now(&mut h, next);
    found_after_lost_answer(&mut h, &["ch-1", "ch-2"]);
    assert_eq!(h.state.phase, Phase::ManualReview);
    h
}

/// The answer of the attempt in flight is lost; the lookup that follows finds `ids`.
fn found_after_lost_answer(h: &mut Harness, ids: &[&str]) {
    answer_lost(h);
    lookup(h, Ok(ids.iter().map(|id| id.to_string()).collect()));
}

/// The answer of the attempt in flight is lost; the lookup is due.
fn answer_lost(h: &mut Harness) {
    answer(
        h,
        AttemptOutcome::Unknown {
            cause: UnknownCause::Timeout,
        },
    );
    h.now += 600;
    h.step(Input::Wake).unwrap();
}

fn order(record: Option<&str>, duplicates: &[&str], whole_task: bool) -> Input {
    Input::Operator(OperatorResolution::Compensate {
        record: record.map(Into::into),
        duplicates: duplicates.iter().map(|d| d.to_string()).collect(),
        whole_task,
        by: "ana".into(),
        reason: "ch-2 is a second charge of the same order".into(),
    })
}

#[test]
fn an_operator_keeps_one_record_the_lookup_found_undoes_the_other_and_the_task_goes_on() {
    let mut h = charge_found_twice();
    let next = h.step(order(Some("ch-1"), &["ch-2"], false)).unwrap();
    assert_eq!(h.state.phase, Phase::Compensating);
    let started = wake_now(&mut h, next);
    assert!(matches!(
        &h.log.last().unwrap().body,
        EventBody::CompensationStarted { step: 1, remote_id, by, .. } if remote_id == "ch-2" && by == "ana"
    ));
    let refund = wake_now(&mut h, started);
    assert_eq!(sent_target(&refund), "refunds");
    let ids = h.state.saga.as_ref().unwrap().step_records();
    assert_eq!(
        ids["charge"].remote_id, "ch-2",
        "the refund reads the duplicate it undoes"
    );
    // The refund's answer is lost too: looked up, never resent.
    let sends = h.sends.len();
    answer(
        &mut h,
        AttemptOutcome::Unknown {
            cause: UnknownCause::Timeout,
        },
    );
    h.now += 600;
    h.step(Input::Wake).unwrap();
    let next = lookup(&mut h, Ok(vec!["rf-2".into()]));
    assert_eq!(h.sends.len(), sends);
    // Then the shipment, with the kept charge.
    let ship = wake_now(&mut h, next);
    assert_eq!(sent_target(&ship), "shipments");
    assert_eq!(
        h.state.saga.as_ref().unwrap().step_records()["charge"].remote_id,
        "ch-1"
    );
    answer(&mut h, created("sh-1"));
    assert_eq!(h.state.phase, Phase::Succeeded);
    let charge = &h.state.saga.as_ref().unwrap().steps[1];
    assert_eq!(
        charge.outcome,
        StepOutcome::Succeeded {
            remote_id: "ch-1".into()
        }
    );
    assert_eq!(charge.compensation, None);
    assert_eq!(
        charge.duplicates[0].outcome,
        CompensationOutcome::Done {
            remote_id: "rf-2".into()
        }
    );
    clean(&h);
}

#[test]
fn a_duplicate_whose_undo_is_refused_goes_to_review_and_the_operator_may_leave_it() {
    let mut h = charge_found_twice();
    let next = h.step(order(Some("ch-1"), &["ch-2"], false)).unwrap();
    let started = wake_now(&mut h, next);
    wake_now(&mut h, started);
    answer(&mut h, refused());
    assert!(matches!(
        h.state.review_reason,
        Some(ReviewReason::CompensationRefused { step: 1, .. })
    ));
    let ship = h
        .step(Input::Operator(OperatorResolution::Failed {
            by: "ana".into(),
            reason: "the customer keeps both".into(),
        }))
        .unwrap();
    let ship = wake_now(&mut h, ship);
    assert_eq!(sent_target(&ship), "shipments");
    assert!(matches!(
        h.state.saga.as_ref().unwrap().steps[1].duplicates[0].outcome,
        CompensationOutcome::Abandoned { .. }
    ));
    clean(&h);
}

#[test]
fn an_operator_orders_the_whole_task_undone_last_step_first() {
    // The charge did happen (ch-1), with a duplicate: both charges and the reservation undone.
    let mut h = charge_found_twice();
    let mut next = h.step(order(Some("ch-1"), &["ch-2"], true)).unwrap();
    let mut undone = Vec::new();
    while h.state.phase == Phase::Compensating || next == Action::Continue {
        next = h.step(Input::Wake).unwrap();
        if let Action::Send { target, .. } = &next {
            let ids = h.state.saga.as_ref().unwrap().step_records();
            let step = h.state.saga.as_ref().unwrap().step().unwrap().name.clone();
            undone.push(format!("{target} {}", ids[&step].remote_id));
            next = answer(&mut h, created(&format!("u-{}", undone.len())));
        }
    }
    assert_eq!(
        undone,
        ["refunds ch-2", "refunds ch-1", "release res-1"],
        "the duplicate first, then the steps last first"
    );
    assert_eq!(h.state.phase, Phase::Compensated);
    assert!(h.log.iter().any(|e| matches!(
        &e.body,
        EventBody::CompensationStarted { step: 0, by, reason, .. }
            if by == "ana" && reason.contains("ordered undone")
    )));
    clean(&h);

    // The charge did not happen: the reservation alone is undone.
    let mut h = charge_found_twice();
    let next = h.step(order(None, &[], true)).unwrap();
    let started = wake_now(&mut h, next);
    let release = wake_now(&mut h, started);
    assert_eq!(sent_target(&release), "release");
    answer(&mut h, created("rl-1"));
    assert_eq!(h.state.phase, Phase::Compensated);
    clean(&h);
}

#[test]
fn orders_that_cannot_be_carried_out_are_refused_saying_why() {
    let refusal = |h: &mut Harness, input: Input| h.step(input).unwrap_err().to_string();
    let mut h = charge_found_twice();
    let log = h.log.len();
    assert!(
        refusal(&mut h, order(Some("ch-1"), &["ch-9"], false)).contains("not a record the lookup")
    );
    assert!(refusal(&mut h, order(Some("ch-1"), &["ch-1"], false)).contains("twice"));
    assert!(refusal(&mut h, order(None, &["ch-2"], false)).contains("own record"));
    assert_eq!(h.log.len(), log, "nothing recorded");
    // Not in review: refused as any resolution is.
    let mut h = Harness::new(lookup_policy());
    h.step(deliver_saga(0)).unwrap();
    assert!(refusal(&mut h, order(Some("x"), &[], true)).contains("not in manual review"));
    // A one-step task has nothing to undo with.
    let mut h = Harness::new(lookup_policy());
    h.step(deliver(5, 0)).unwrap();
    found_after_lost_answer(&mut h, &["a", "b"]);
    assert!(refusal(&mut h, order(Some("a"), &["b"], false)).contains("one-step"));
}

/// A rule checker that let these through would prove nothing.
#[test]
fn the_rules_catch_compensations_out_of_order_twice_or_of_nothing() {
    let (h, _) = shipment_refused();
    let forged = |step: u32, remote_id: &str| EventBody::CompensationStarted {
        step,
        remote_id: remote_id.into(),
        by: crate::event::POLICY_SAGA_BY.into(),
        reason: "forged".into(),
    };
    let with = |bodies: Vec<EventBody>| {
        let mut log = h.log.clone();
        for body in bodies {
            let last = log.last().unwrap().clone();
            log.push(Event {
                lsn: last.lsn + 1,
                task_seq: last.task_seq + 1,
                body,
                ..last
            });
        }
        let (_, violations) = check_task(&log, CheckConfig::default());
        violations.iter().map(|v| v.rule).collect::<Vec<_>>()
    };
    assert_eq!(with(vec![]), []);
    assert!(with(vec![forged(0, "res-1")]).contains(&Rule::CompensationsInReverseOrder));
    assert!(with(vec![forged(2, "x")]).contains(&Rule::CompensationOnlyForSuccess));
    assert!(with(vec![forged(1, "other")]).contains(&Rule::CompensationOnlyForSuccess));
    assert!(
        with(vec![forged(1, "ch-1"), forged(1, "ch-1")]).contains(&Rule::CompensationOncePerStep)
    );
    let forward = EventBody::SendIntended {
        attempt: 4,
        idempotency_key: None,
    };
    assert!(with(vec![forward]).contains(&Rule::NoForwardAfterCompensation));
    // An operator's compensation without an order, and an order of a record no lookup found.
    let by_hand = EventBody::CompensationStarted {
        step: 1,
        remote_id: "ch-1".into(),
        by: "mallory".into(),
        reason: "forged".into(),
    };
    assert!(with(vec![by_hand]).contains(&Rule::CompensationOnlyForSuccess));
    let mut h = charge_found_twice();
    let last = h.log.last().unwrap().clone();
    h.log.push(Event {
        lsn: last.lsn + 1,
        task_seq: last.task_seq + 1,
        body: EventBody::CompensationOrdered {
            step: 1,
            record: "ch-1".into(),
            duplicates: vec!["someone-elses".into()],
            whole_task: false,
            by: "ana".into(),
            reason: "forged".into(),
        },
        ..last
    });
    let (_, violations) = check_task(&h.log, CheckConfig::default());
    assert!(
        violations
            .iter()
            .any(|v| v.rule == Rule::CompensationOnlyForSuccess
                && v.detail.contains("someone-elses")),
        "{violations:?}"
    );
}

fn run(policy: Policy, steps: Vec<super::properties::Step>) -> Result<Harness, TestCaseError> {
    let mut h = Harness::new(policy);
    h.step(deliver_saga(0)).unwrap();
    let mut offset = 1;
    for s in steps {
        let before = h.log.len();
        let was_terminal = h.state.phase.is_terminal();
        let Some(input) = to_input(&mut h, s, &mut offset) else {
            continue;
        };
        let sends_before = h.sends.len();
        let _ = h.step(input);
        if was_terminal {
            prop_assert_eq!(h.sends.len(), sends_before, "a terminal task sent again");
            let harmless = h.log[before..].iter().all(|e| {
                matches!(
                    e.body,
                    EventBody::DuplicateDelivery { .. }
                        | EventBody::RequestConflict { .. }
                        | EventBody::OperatorNote { .. }
                )
            });
            prop_assert!(
                harmless,
                "an event that is not a redelivery or a note after the end"
            );
        }
        prop_assert_eq!(&fold(&h.log), &h.state);
    }
    Ok(h)
}

/// The generated sequences reach every end of a saga; otherwise the property would pass
/// vacuously.
#[test]
fn generated_saga_inputs_reach_every_corner() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(proptest::test_runner::RngAlgorithm::ChaCha),
    );
    let strategy = (policy(), proptest::collection::vec(step(), 1..80));
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..3_000 {
        let (policy, steps) = strategy.new_tree(&mut runner).unwrap().current();
        let h = run(policy, steps).unwrap();
        seen.insert(format!("{:?}", h.state.phase));
        if let Some(Leg::Step(n)) = h.state.leg() {
            seen.insert(format!("step {n}"));
        }
        for e in &h.log {
            if let EventBody::ManualReviewRequired { reason } = &e.body {
                seen.insert(format!("{reason:?}").split(' ').next().unwrap().to_string());
            }
            seen.insert(e.body.name().to_string());
        }
        let saga = h.state.saga.as_ref().unwrap();
        let undone =
            |c: &crate::saga::Compensation| matches!(c.outcome, CompensationOutcome::Done { .. });
        if saga.steps.iter().flat_map(|s| &s.duplicates).any(undone) {
            seen.insert("duplicate undone".into());
        }
        if saga.ordered_by.is_some() && h.state.phase == Phase::Compensated {
            seen.insert("whole task ordered undone".into());
        }
    }
    for corner in [
        "Succeeded",
        "Compensated",
        "Rejected",
        "Failed",
        "ManualReview",
        "step 2",
        "CompensationRefused",
        "CompensationNotSent",
        "MultipleMatches",
        "CompensationOrdered",
        "StepNotBuilt",
        "duplicate undone",
        "whole task ordered undone",
    ] {
        assert!(seen.contains(corner), "never reached {corner}: {seen:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// No interleaving of inputs makes a saga break a rule: every attempt belongs to the leg
    /// whose target it goes to, compensations follow a failure, once each and last first, and
    /// a compensated task undid every step that succeeded and can be undone.
    #[test]
    fn no_input_sequence_breaks_a_sagas_rules(policy in policy(), steps in proptest::collection::vec(step(), 1..80)) {
        let ttl = policy.idempotency_ttl_ms;
        let max_policy_resends = policy.reconcile.as_ref().map_or(0, |r| r.max_policy_resends);
        let h = run(policy, steps)?;
        let (state, violations) = check_task(&h.log, CheckConfig { key_ttl_ms: ttl, max_policy_resends });
        prop_assert!(violations.is_empty(), "{:?}\n{:#?}", violations, h.log);
        prop_assert_eq!(&state, &h.state);
        let saga = state.saga.as_ref().unwrap();
        if state.phase == Phase::Compensated {
            for s in saga.steps.iter().filter(|s| s.compensate.is_some()) {
                if let StepOutcome::Succeeded { .. } = s.outcome {
                    prop_assert!(matches!(s.compensation.as_ref().map(|c| &c.outcome), Some(CompensationOutcome::Done { .. })), "{} not undone", s.name);
                }
            }
        }
        if state.phase == Phase::Succeeded {
            let all = saga.steps.iter().all(|s| matches!(s.outcome, StepOutcome::Succeeded { .. }));
            prop_assert!(all, "succeeded with a step that did not");
            prop_assert!(!saga.compensation_began());
        }
    }
}
