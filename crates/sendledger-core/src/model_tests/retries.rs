//! Scenarios of failed tasks that are retried: a new version, and only when nothing was sent.

use super::*;

/// A task that failed with every attempt proven not sent (the remote was down) is retried by
/// an operator: a new version, with the target's attempt budget counted afresh, whose result
/// supersedes the failed one.
#[test]
fn a_failed_task_never_sent_is_retried_as_a_new_version() {
    use crate::result::{Projection, ResultStatus};
    let mut h = Harness::new(lookup_policy());
    h.step(deliver(5, 0)).unwrap();
    let refused = || AttemptOutcome::NotSent {
        cause: NotSentCause::Connect("connection refused".into()),
        retry_after_ms: None,
    };
    let exhaust = |h: &mut Harness| loop {
        let attempt = h.state.in_flight.expect("an attempt in flight");
        match h
            .step(Input::Outcome {
                attempt,
                outcome: refused(),
            })
            .unwrap()
        {
            Action::WakeAt(at) => {
                h.now = at;
                h.step(Input::Wake).unwrap();
            }
            _ => break,
        }
    };
    exhaust(&mut h);
    assert_eq!(h.state.phase, Phase::Failed);
    assert_eq!(h.state.failure_kind, Some(crate::FailureKind::Connect));
    assert_eq!((h.sends.len(), h.state.version), (3, 1));

    let retry = |by: &str| {
        Input::Operator(OperatorResolution::Retry {
            by: by.into(),
            reason: "the remote is back".into(),
        })
    };
    assert!(matches!(
        h.step(retry("policy:me")),
        Err(crate::Error::ReservedOperator { .. })
    ));
    assert_eq!(h.step(retry("ana")).unwrap(), Action::WakeAt(h.now));
    assert_eq!((h.state.phase, h.state.version), (Phase::RetryWait, 2));
    assert!(matches!(
        h.step(Input::Wake).unwrap(),
        Action::Send { attempt: 4, .. }
    ));
    // The new version has max_attempts of its own: three more, then failed again.
    exhaust(&mut h);
    assert_eq!((h.state.phase, h.sends.len()), (Phase::Failed, 6));
    h.step(retry("ana")).unwrap();
    h.step(Input::Wake).unwrap();
    h.step(Input::Outcome {
        attempt: 7,
        outcome: AttemptOutcome::Succeeded {
            remote_id: "r-7".into(),
            status: 201,
            answer: Default::default(),
        },
    })
    .unwrap();
    assert_eq!((h.state.phase, h.state.version), (Phase::Succeeded, 3));
    assert!(check_task(&h.log, CheckConfig::default()).1.is_empty());

    // Each version has one terminal result, and each names its version.
    let mut projection = Projection::default();
    let results: Vec<_> = h
        .log
        .iter()
        .filter_map(|e| projection.apply(e))
        .map(|r| (r.status, r.version))
        .collect();
    assert_eq!(
        results,
        [
            (ResultStatus::Failed, 1),
            (ResultStatus::Failed, 2),
            (ResultStatus::Succeeded, 3)
        ]
    );
    // A terminal task is not retried.
    assert!(matches!(
        h.step(retry("ana")),
        Err(crate::Error::NotRetryable { .. })
    ));
}

/// A task one of whose attempts may have reached the remote is never retried, even once an
/// operator resolved it as failed: a retry would be a blind resend. The rule checker flags a
/// log that does it anyway.
#[test]
fn a_task_with_an_unknown_attempt_cannot_be_retried() {
    let mut h = Harness::new(lookup_policy());
    h.step(deliver(5, 0)).unwrap();
    unknown_outcome(&mut h);
    h.now += 20_000;
    lookup(&mut h, Ok(vec![]));
    assert_eq!(h.state.phase, Phase::ManualReview);
    h.step(Input::Operator(OperatorResolution::Failed {
        by: "ana".into(),
        reason: "the customer cancelled".into(),
    }))
    .unwrap();
    assert_eq!(h.state.failure_kind, Some(crate::FailureKind::Operator));
    let err = h
        .step(Input::Operator(OperatorResolution::Retry {
            by: "ana".into(),
            reason: "again".into(),
        }))
        .unwrap_err();
    assert!(
        err.to_string().contains("may have reached the remote"),
        "{err}"
    );

    let mut forged = h.log.clone();
    forged.push(Event {
        lsn: forged.len() as u64 + 1,
        task_id: forged[0].task_id,
        task_seq: forged.len() as u32,
        at: h.now,
        body: EventBody::TaskRetried {
            by: "ana".into(),
            reason: "again".into(),
        },
    });
    let rules: Vec<_> = check_task(&forged, CheckConfig::default())
        .1
        .into_iter()
        .map(|v| v.rule)
        .collect();
    assert_eq!(rules, [Rule::RetryOnlyNotSent]);
}

/// A retry after a success breaks two rules: a terminal state is final, and only a failure
/// can be retried.
#[test]
fn a_retry_after_success_is_flagged() {
    let mut h = Harness::new(lookup_policy());
    h.step(deliver(5, 0)).unwrap();
    h.step(Input::Outcome {
        attempt: 1,
        outcome: AttemptOutcome::Succeeded {
            remote_id: "r-1".into(),
            status: 201,
            answer: Default::default(),
        },
    })
    .unwrap();
    let mut forged = h.log.clone();
    forged.push(Event {
        lsn: 4,
        task_id: forged[0].task_id,
        task_seq: 3,
        at: h.now,
        body: EventBody::TaskRetried {
            by: "ana".into(),
            reason: "again".into(),
        },
    });
    let rules: Vec<_> = check_task(&forged, CheckConfig::default())
        .1
        .into_iter()
        .map(|v| v.rule)
        .collect();
    assert_eq!(rules, [Rule::TerminalIsFinal, Rule::RetryOnlyNotSent]);
}
