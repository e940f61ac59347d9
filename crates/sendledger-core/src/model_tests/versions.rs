//! Scenarios of versioned requests: a version waits for the one before it, names it, and a
//! version with a later one is not retried.

use super::*;
use crate::decide::Versions;
use crate::event::PreviousVersion;
use crate::ids::TaskId;
use crate::result::{Projection, ResultStatus};

fn deliver_version(version: u32, amount: u64, offset: i64) -> Input {
    let mut request = request(amount);
    request.version = version;
    Input::Deliver {
        request: request.accept(&Limits::default()).unwrap(),
        source: Source {
            topic: "requests".into(),
            partition: 0,
            offset,
        },
        steps: None,
    }
}

/// The log as the ledger gives it back: every event through bincode, as stored.
fn stored(log: &[Event]) -> Vec<Event> {
    log.iter()
        .map(|e| bincode::deserialize(&bincode::serialize(e).unwrap()).unwrap())
        .collect()
}

/// Version 2 accepted while version 1 is unsettled: recorded with the version it follows, it
/// waits (once recorded, however often it looks again) and sends nothing until version 1
/// settles, then sends; its task id is its version's, and its result names the version, also
/// when its events are read back from their stored encoding.
#[test]
fn a_version_waits_for_the_one_before_it_then_runs() {
    let previous = PreviousVersion {
        version: 1,
        task_id: TaskId::derive_version("acme", "payment.create", "ord-7", 1),
    };
    let mut h = Harness::new(lookup_policy());
    h.versions = Versions {
        previous: Some(previous),
        unsettled: Some(previous),
        later: None,
    };
    let wait = h.step(deliver_version(2, 5, 0)).unwrap();
    assert_eq!(
        wait,
        Action::WakeAt(h.now + crate::decide::EARLIER_VERSION_RECHECK_MS)
    );
    assert_eq!(
        h.names(),
        ["TaskAccepted", "RequestVersion", "SendDeferred"]
    );
    assert_eq!(
        h.log[1].body,
        EventBody::RequestVersion {
            version: 2,
            previous: Some(previous)
        }
    );
    let task = TaskId::derive_version("acme", "payment.create", "ord-7", 2);
    assert!(h.log.iter().all(|e| e.task_id == task));
    // Still unsettled at the next look: no new event, no send.
    h.now += crate::decide::EARLIER_VERSION_RECHECK_MS;
    assert!(matches!(h.step(Input::Wake).unwrap(), Action::WakeAt(_)));
    assert!(matches!(h.step(Input::Recover).unwrap(), Action::WakeAt(_)));
    assert_eq!(h.log.len(), 3);
    assert!(h.sends.is_empty());
    // Version 1 settled: the first intent.
    h.versions.unsettled = None;
    assert!(matches!(
        h.step(Input::Wake).unwrap(),
        Action::Send { attempt: 1, .. }
    ));
    h.step(Input::Outcome {
        attempt: 1,
        outcome: AttemptOutcome::Succeeded {
            remote_id: "pay-9".into(),
            status: 201,
            answer: Default::default(),
        },
    })
    .unwrap();
    assert_eq!(h.state.phase, Phase::Succeeded);
    assert!(check_task(&h.log, CheckConfig::default()).1.is_empty());

    let log = stored(&h.log);
    let state = fold(&log);
    assert_eq!(state.request.as_ref().map(|r| r.version), Some(2));
    assert_eq!(state.request.as_ref().map(|r| r.task_id()), Some(task));
    assert_eq!(state.previous_version, Some(previous));
    let announced = Projection::of(&log).announced().cloned().unwrap();
    assert_eq!(announced.status, ResultStatus::Succeeded);
    assert_eq!((announced.request_version, announced.version), (2, 1));
    // A redelivery of version 2 is a duplicate, another payload a conflict.
    let mut h2 = Harness::new(lookup_policy());
    h2.state = state;
    h2.log = log;
    h2.step(deliver_version(2, 5, 1)).unwrap();
    h2.step(deliver_version(2, 6, 2)).unwrap();
    assert_eq!(
        h2.names()[h2.names().len() - 2..],
        ["DuplicateDelivery", "RequestConflict"]
    );
    assert!(h2.sends.is_empty());
}

/// The first version of an identity (no version before it) runs at once and names none; a
/// request naming no version records no `RequestVersion`.
#[test]
fn a_first_version_runs_at_once() {
    let mut h = Harness::new(lookup_policy());
    assert!(matches!(
        h.step(deliver_version(3, 5, 0)).unwrap(),
        Action::Send { attempt: 1, .. }
    ));
    assert_eq!(
        h.names(),
        ["TaskAccepted", "RequestVersion", "SendIntended"]
    );
    assert_eq!(
        h.log[1].body,
        EventBody::RequestVersion {
            version: 3,
            previous: None
        }
    );
    let mut plain = Harness::new(lookup_policy());
    plain.step(deliver(5, 0)).unwrap();
    assert_eq!(plain.names(), ["TaskAccepted", "SendIntended"]);
    assert_eq!(
        plain.log[0].task_id,
        TaskId::derive("acme", "payment.create", "ord-7")
    );
}

/// A failed version is not retried once a later version was accepted: the later one is how the
/// operation runs again.
#[test]
fn a_version_with_a_later_one_is_not_retried() {
    let mut policy = lookup_policy();
    policy.retry.max_attempts = 1;
    let mut h = Harness::new(policy);
    h.step(deliver_version(1, 5, 0)).unwrap();
    h.step(Input::Outcome {
        attempt: 1,
        outcome: AttemptOutcome::NotSent {
            cause: NotSentCause::Connect("connection refused".into()),
            retry_after_ms: None,
        },
    })
    .unwrap();
    assert_eq!(h.state.phase, Phase::Failed);
    let retry = Input::Operator(OperatorResolution::Retry {
        by: "ana".into(),
        reason: "the remote is back".into(),
    });
    h.versions.later = Some(2);
    let refused = h.step(retry.clone()).unwrap_err();
    assert!(refused.to_string().contains("a later version"), "{refused}");
    assert_eq!(h.state.phase, Phase::Failed);
    h.versions.later = None;
    assert_eq!(h.step(retry).unwrap(), Action::WakeAt(h.now));
}

/// The checker flags a `RequestVersion` out of place: twice, after the acceptance's write,
/// under another version's task id, or naming a later version as the one before it.
#[test]
fn a_request_version_out_of_place_is_flagged() {
    let mut h = Harness::new(lookup_policy());
    h.step(deliver_version(2, 5, 0)).unwrap();
    let clean = h.log.clone();
    assert!(check_task(&clean, CheckConfig::default()).1.is_empty());
    let at = |log: &[Event], seq: u32, body: EventBody| {
        let mut log = log.to_vec();
        log.insert(
            seq as usize,
            Event {
                lsn: 0,
                task_id: log[0].task_id,
                task_seq: seq,
                at: 0,
                body,
            },
        );
        for (i, e) in log.iter_mut().enumerate() {
            e.task_seq = i as u32;
            e.lsn = i as u64 + 1;
        }
        log
    };
    let version = |version, previous| EventBody::RequestVersion { version, previous };
    let rules = |log: &[Event]| -> Vec<Rule> {
        check_task(log, CheckConfig::default())
            .1
            .into_iter()
            .map(|v| v.rule)
            .collect()
    };
    assert_eq!(
        rules(&at(&clean, 2, version(2, None))),
        [Rule::VersionsInOrder]
    );
    assert_eq!(
        rules(&at(&clean, 3, version(2, None))),
        [Rule::VersionsInOrder]
    );
    let mut wrong = clean.clone();
    wrong[1].body = version(4, None);
    assert_eq!(rules(&wrong), [Rule::VersionsInOrder]);
    wrong[1].body = version(
        2,
        Some(PreviousVersion {
            version: 2,
            task_id: TaskId([7; 16]),
        }),
    );
    assert_eq!(rules(&wrong), [Rule::VersionsInOrder]);
}
