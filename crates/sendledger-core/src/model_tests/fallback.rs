//! Scenarios of a target with a fallback: attempts move there only on proof that nothing of the
//! task can exist at the task's own target.

use super::*;
use crate::decide::Fallback;
use crate::result::{Projection, ResultStatus};

const BACKUP: &str = "backup";

/// `lookup_policy()` (3 attempts) with a fallback of 2 attempts at a fixed 200 ms.
fn with_fallback() -> Policy {
    Policy {
        fallback: Some(Fallback {
            target: BACKUP.into(),
            policy: Box::new(Policy {
                retry: RetryPolicy {
                    max_attempts: 2,
                    initial_backoff_ms: 200,
                    max_backoff_ms: 200,
                    multiplier: 1.0,
                    jitter: false,
                    ..RetryPolicy::default()
                },
                ..lookup_policy()
            }),
        }),
        ..lookup_policy()
    }
}

fn hold_of(target: &str, until: u64) -> Hold {
    Hold {
        until,
        spread_ms: 0,
        reason: WaitReason::BreakerOpen {
            target: target.into(),
        },
    }
}

fn refused(h: &mut Harness) -> Action {
    let attempt = h.state.in_flight.expect("an attempt in flight");
    h.step(Input::Outcome {
        attempt,
        outcome: AttemptOutcome::NotSent {
            cause: NotSentCause::Connect("connection refused".into()),
            retry_after_ms: None,
        },
    })
    .unwrap()
}

/// Refuses attempts and wakes the task at each retry until the task does something else than
/// wait for a retry; returns that.
fn refuse_until_moved(h: &mut Harness) -> Action {
    loop {
        match refused(h) {
            Action::WakeAt(at) => {
                h.now = at;
                h.step(Input::Wake).unwrap();
            }
            other => return other,
        }
    }
}

fn check(h: &Harness) {
    let (_, violations) = check_task(&h.log, CheckConfig::default());
    assert!(violations.is_empty(), "{violations:?}");
}

/// The task's own target refuses every attempt: once its attempts are exhausted, the next one
/// goes to the fallback at once, with the fallback's own budget and a fresh idempotency key,
/// and the result names the fallback as the target that holds the record.
#[test]
fn exhausted_attempts_proven_not_sent_move_to_the_fallback() {
    let mut h = Harness::new(with_fallback());
    h.step(deliver(5, 0)).unwrap();
    let moved = refuse_until_moved(&mut h);
    assert_eq!(
        moved,
        Action::Send {
            attempt: 4,
            idempotency_key: None,
            target: BACKUP.into()
        }
    );
    assert_eq!(h.sent_to, ["payments", "payments", "payments", BACKUP]);
    assert_eq!(h.state.fallback_target.as_deref(), Some(BACKUP));
    assert_eq!(h.state.target(), Some(BACKUP));
    // The fallback's budget: one refusal waits its fixed 200 ms, the second fails the task.
    assert_eq!(refused(&mut h), Action::WakeAt(h.now + 200));
    h.now += 200;
    assert!(matches!(
        h.step(Input::Wake).unwrap(),
        Action::Send { attempt: 5, ref target, .. } if target == BACKUP
    ));
    h.step(Input::Outcome {
        attempt: 5,
        outcome: AttemptOutcome::Succeeded {
            remote_id: "b-1".into(),
            status: 201,
            answer: Default::default(),
        },
    })
    .unwrap();
    assert_eq!(h.state.phase, Phase::Succeeded);
    let result = Projection::of(&h.log);
    let last = h.log.last().unwrap();
    let mut projection = Projection::of(&h.log[..h.log.len() - 1]);
    let r = projection.apply(last).unwrap();
    assert_eq!(r.status, ResultStatus::Succeeded);
    assert_eq!(r.target.as_deref(), Some("payments"));
    assert_eq!(r.remote_target.as_deref(), Some(BACKUP));
    assert_eq!(r.remote_id.as_deref(), Some("b-1"));
    assert!(result.settled());
    check(&h);
}

/// The fallback's attempts exhausted too: the task fails (nothing was sent anywhere), can be
/// retried, and its new version starts at its own target again.
#[test]
fn a_task_failed_at_its_fallback_is_retried_at_its_own_target() {
    let mut h = Harness::new(with_fallback());
    h.step(deliver(5, 0)).unwrap();
    refuse_until_moved(&mut h);
    refuse_until_moved(&mut h);
    assert_eq!(h.state.phase, Phase::Failed);
    assert_eq!(h.sends.len(), 5, "3 at the own target, 2 at the fallback");
    assert!(h.state.retryable().is_ok());
    h.step(Input::Operator(OperatorResolution::Retry {
        by: "ana".into(),
        reason: "both are back".into(),
    }))
    .unwrap();
    assert!(matches!(
        h.step(Input::Wake).unwrap(),
        Action::Send { attempt: 6, ref target, .. } if target == "payments"
    ));
    assert_eq!(h.log.last().unwrap().body.name(), "SendIntended");
    check(&h);
}

/// A task whose own target's breaker is open goes to the fallback without waiting, as long as
/// nothing of it may have reached its own target; with both breakers open it waits.
#[test]
fn an_open_breaker_sends_new_tasks_to_the_fallback() {
    let mut h = Harness::new(with_fallback());
    h.hold = Some(hold_of("payments", h.now + 5_000));
    assert!(matches!(
        h.step(deliver(5, 0)).unwrap(),
        Action::Send { attempt: 1, ref target, .. } if target == BACKUP
    ));
    assert_eq!(h.names(), ["TaskAccepted", "SendIntendedAt"]);

    let mut both = Harness::new(with_fallback());
    both.hold = Some(hold_of("payments", both.now + 5_000));
    both.fallback_hold = Some(hold_of(BACKUP, both.now + 2_000));
    assert_eq!(
        both.step(deliver(5, 0)).unwrap(),
        Action::WakeAt(both.now + 2_000),
        "looks again when the first of the two may take an attempt"
    );
    assert_eq!(both.names(), ["TaskAccepted", "SendDeferred"]);
    both.now += 2_000;
    both.fallback_hold = None;
    assert!(matches!(
        both.step(Input::Wake).unwrap(),
        Action::Send { attempt: 1, ref target, .. } if target == BACKUP
    ));
    check(&h);
    check(&both);
}

/// Once the task's attempts at its own target are exhausted, an open breaker at the fallback
/// makes it wait for the fallback: never another attempt at its own target.
#[test]
fn an_exhausted_task_waits_for_its_fallback_not_its_own_target() {
    let mut h = Harness::new(with_fallback());
    h.step(deliver(5, 0)).unwrap();
    let until = h.now + 60_000;
    h.fallback_hold = Some(hold_of(BACKUP, until));
    for _ in 0..2 {
        let Action::WakeAt(at) = refused(&mut h) else {
            panic!("a retry at the own target");
        };
        h.now = at;
        h.step(Input::Wake).unwrap();
    }
    assert_eq!(refused(&mut h), Action::WakeAt(until));
    assert_eq!(h.state.phase, Phase::RetryWait);
    assert_eq!(h.names().last(), Some(&"SendDeferred"));
    h.now = until;
    h.fallback_hold = Some(hold_of(BACKUP, h.now + 1_000));
    assert_eq!(h.step(Input::Wake).unwrap(), Action::WakeAt(h.now + 1_000));
    assert_eq!(h.sends.len(), 3, "no fourth attempt at the own target");
    assert_eq!(
        h.names().iter().filter(|n| **n == "SendDeferred").count(),
        1
    );
    h.fallback_hold = None;
    h.now += 1_000;
    h.step(Input::Recover).unwrap();
    assert!(matches!(
        h.step(Input::Wake).unwrap(),
        Action::Send { attempt: 4, ref target, .. } if target == BACKUP
    ));
    check(&h);
}

/// An attempt whose outcome is unknown may have reached the own target: the task never moves
/// to the fallback, neither when the breaker opens nor after an authorized resend is refused.
#[test]
fn after_an_unknown_outcome_the_fallback_is_never_used() {
    let mut policy = with_fallback();
    policy.reconcile.as_mut().unwrap().resend_when_absent = true;
    let mut h = Harness::new(policy);
    h.step(deliver(5, 0)).unwrap();
    unknown_outcome(&mut h);
    h.now += 10_000;
    h.hold = Some(hold_of("payments", h.now + 3_000));
    assert_eq!(lookup(&mut h, Ok(vec![])), Action::WakeAt(h.now + 3_000));
    assert!(h.state.resend_authorized);
    h.now += 3_000;
    h.hold = None;
    assert!(matches!(
        h.step(Input::Wake).unwrap(),
        Action::Send { attempt: 2, ref target, .. } if target == "payments"
    ));
    for _ in 0..5 {
        if let Action::WakeAt(at) = refused(&mut h) {
            h.now = at;
        }
        if h.state.in_flight.is_none() && h.state.phase == Phase::Unknown {
            break;
        }
    }
    assert!(h.sent_to.iter().all(|t| t == "payments"), "{:?}", h.sent_to);
    assert_eq!(h.state.phase, Phase::Unknown, "back to reconciling");
    check(&h);
}

/// The audit's rule: an attempt at the fallback after an unknown outcome is a violation.
#[test]
fn the_rules_refuse_a_fallback_after_an_unknown_outcome() {
    let (task, accepted) = crate::fixtures::accepted();
    let log = crate::fixtures::history(
        task,
        vec![
            accepted,
            EventBody::SendIntended {
                attempt: 1,
                idempotency_key: None,
            },
            EventBody::SendUnknown {
                attempt: 1,
                cause: UnknownCause::Timeout,
            },
            EventBody::ResendAuthorized {
                by: "ana".into(),
                reason: "checked".into(),
            },
            EventBody::SendIntendedAt {
                attempt: 2,
                idempotency_key: None,
                target: BACKUP.into(),
            },
        ],
    );
    let (_, violations) = check_task(&log, CheckConfig::default());
    assert_eq!(
        violations.iter().map(|v| v.rule).collect::<Vec<_>>(),
        [Rule::FallbackOnlyOnProof]
    );
    assert_eq!(violations[0].lsns, [log[2].lsn, log[4].lsn]);
}
