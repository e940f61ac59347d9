//! Kafka mode's two histories of one task: a restore that found them asks the task to go to
//! review, with the replaced history as evidence, unless nothing in it touched the remote.

use super::*;

fn replaced(bodies: Vec<EventBody>) -> Vec<Event> {
    bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| Event {
            lsn: 0,
            task_id: crate::ids::TaskId([0; 16]),
            task_seq: 1 + i as u32,
            at: 500,
            body,
        })
        .collect()
}

/// The kept history succeeded; the replaced one sent a request whose outcome was unknown: the
/// task goes to review even from its terminal state (a second record may exist), once; an
/// operator then settles it, and the rules hold throughout.
#[test]
fn a_replaced_history_that_sent_reopens_even_a_settled_task_for_review() {
    let mut h = Harness::new(lookup_policy());
    h.step(deliver(5, 0)).unwrap();
    h.step(Input::Outcome {
        attempt: 1,
        outcome: AttemptOutcome::Succeeded {
            remote_id: "r-2".into(),
            status: 201,
            answer: Default::default(),
        },
    })
    .unwrap();
    assert_eq!(h.state.phase, Phase::Succeeded);
    let diverged = || Input::Diverged {
        task_seq: 1,
        replaced: replaced(vec![
            EventBody::SendIntended {
                attempt: 1,
                idempotency_key: None,
            },
            EventBody::SendUnknown {
                attempt: 1,
                cause: UnknownCause::Timeout,
            },
        ]),
    };
    h.step(diverged()).unwrap();
    assert_eq!(h.state.phase, Phase::ManualReview);
    let Some(ReviewReason::DivergentHistory {
        task_seq: 1,
        replaced,
    }) = &h.state.review_reason
    else {
        panic!("{:?}", h.state.review_reason);
    };
    assert_eq!(replaced.len(), 2);
    assert!(
        replaced[0].starts_with("SendIntended: attempt 1"),
        "{replaced:?}"
    );
    let events = h.log.len();
    h.step(diverged()).unwrap();
    assert_eq!(h.log.len(), events, "the same divergence is reviewed once");
    h.step(Input::Operator(OperatorResolution::Succeeded {
        remote_id: "r-2".into(),
        by: "ana".into(),
        reason: "one record at the remote".into(),
    }))
    .unwrap();
    assert_eq!(h.state.phase, Phase::Succeeded);
    let (_, violations) = check_task(&h.log, CheckConfig::default());
    assert!(violations.is_empty(), "{violations:?}");
}

/// A replaced history of redeliveries, notes and waits touched no remote: nothing to review.
#[test]
fn a_replaced_history_that_touched_no_remote_needs_no_review() {
    let mut h = Harness::new(lookup_policy());
    h.step(deliver(5, 0)).unwrap();
    let events = h.log.len();
    h.step(Input::Diverged {
        task_seq: 2,
        replaced: replaced(vec![
            EventBody::DuplicateDelivery {
                source: Source {
                    topic: "requests".into(),
                    partition: 0,
                    offset: 9,
                },
            },
            EventBody::OperatorNote {
                who: "ana".into(),
                text: "looked".into(),
            },
        ]),
    })
    .unwrap();
    assert_eq!(h.log.len(), events);
    assert_eq!(h.state.phase, Phase::Sending);
}

/// Any other review after a terminal state is still a violation.
#[test]
fn only_a_divergence_reopens_a_settled_task() {
    let (task, accepted) = crate::fixtures::accepted();
    let log = crate::fixtures::history(
        task,
        vec![
            accepted,
            EventBody::SendIntended {
                attempt: 1,
                idempotency_key: None,
            },
            EventBody::Confirmed {
                remote_id: "r".into(),
                evidence: Evidence::Response { status: 201 },
            },
            EventBody::ManualReviewRequired {
                reason: ReviewReason::NoLookup,
            },
        ],
    );
    let (_, violations) = check_task(&log, CheckConfig::default());
    assert_eq!(
        violations.iter().map(|v| v.rule).collect::<Vec<_>>(),
        [Rule::TerminalIsFinal]
    );
}

/// The log lost every event of a task (a copy ahead of its log is truncated to it): the task
/// is recorded again from its first replaced event, so the acknowledged request is not lost;
/// it goes to review when the rest of what was lost could have touched the remote, and
/// resumes as accepted when it could not. Asking again records nothing more.
#[test]
fn a_task_its_log_lost_is_recorded_again_from_its_acceptance() {
    let mut sent = Harness::new(lookup_policy());
    sent.step(deliver(5, 0)).unwrap();
    sent.step(Input::Outcome {
        attempt: 1,
        outcome: AttemptOutcome::Succeeded {
            remote_id: "r-1".into(),
            status: 201,
            answer: Default::default(),
        },
    })
    .unwrap();
    let lost = sent.log.clone();

    let mut h = Harness::new(lookup_policy());
    let diverged = || Input::Diverged {
        task_seq: 0,
        replaced: lost.clone(),
    };
    h.step(diverged()).unwrap();
    let names: Vec<&str> = h.log.iter().map(|e| e.body.name()).collect();
    assert_eq!(names, ["TaskAccepted", "ManualReviewRequired"]);
    assert_eq!(h.log[0].body, lost[0].body);
    let Some(ReviewReason::DivergentHistory {
        task_seq: 0,
        replaced,
    }) = &h.state.review_reason
    else {
        panic!("{:?}", h.state.review_reason);
    };
    assert_eq!(
        replaced.len(),
        2,
        "the intent and its confirmation: {replaced:?}"
    );
    h.step(diverged()).unwrap();
    assert_eq!(h.log.len(), 2, "reviewed once");
    let (_, violations) = check_task(&h.log, CheckConfig::default());
    assert!(violations.is_empty(), "{violations:?}");

    // Only its acceptance was lost: it goes on as accepted.
    let mut h = Harness::new(lookup_policy());
    h.step(Input::Diverged {
        task_seq: 0,
        replaced: lost[..1].to_vec(),
    })
    .unwrap();
    assert_eq!(h.state.phase, Phase::Accepted);
    assert_eq!(h.log.len(), 1);
    // Nothing to go on from without an acceptance.
    let mut h = Harness::new(lookup_policy());
    h.step(Input::Diverged {
        task_seq: 0,
        replaced: lost[1..].to_vec(),
    })
    .unwrap();
    assert!(h.log.is_empty());
}
