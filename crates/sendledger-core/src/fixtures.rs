//! Event histories for unit tests, here and in the crates that project or encode events
//! (feature `fixtures`).

use crate::event::{Event, EventBody, PlannedStep, ReviewReason, Source};
use crate::ids::TaskId;
use crate::request::{Limits, TaskRequest};

/// A source on partition 2 of topic `req`.
pub fn src(offset: i64) -> Source {
    Source {
        topic: "req".into(),
        partition: 2,
        offset,
    }
}

/// The acceptance of request `acme`/`pay`/`k-1` (payload `{"a":1}`, target `sim`), read from
/// JSON as the ingest reads it, and its task id.
pub fn accepted() -> (TaskId, EventBody) {
    let json = br#"{"tenant":"acme","operation":"pay","request_key":"k-1","target":"sim","payload":{"a":1}}"#;
    let request = TaskRequest::from_json(json)
        .and_then(|r| r.accept(&Limits::default()))
        .expect("a valid request");
    let (task, payload_hash) = (request.task_id(), request.payload_hash());
    let body = EventBody::TaskAccepted {
        request,
        payload_hash,
        source: src(7),
    };
    (task, body)
}

/// The events of `task` with these bodies, in order (LSNs 10, 13, 16…, times 1000, 1001…).
pub fn history(task: TaskId, bodies: Vec<EventBody>) -> Vec<Event> {
    bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| Event {
            lsn: 10 + i as u64 * 3,
            task_id: task,
            task_seq: i as u32,
            at: 1000 + i as u64,
            body,
        })
        .collect()
}

/// One body of each kind a multi-step task adds (envelope version 7): its plan, the start of a
/// compensation, and the reviews of a compensation refused or never sent.
pub fn saga_bodies() -> Vec<EventBody> {
    let step = |name: &str, target: &str, compensate: Option<&str>| PlannedStep {
        name: name.into(),
        target: target.into(),
        compensate: compensate.map(Into::into),
    };
    vec![
        EventBody::StepsPlanned {
            steps: vec![
                step("charge", "payments", Some("refunds")),
                step("ship", "shipments", None),
            ],
        },
        EventBody::CompensationStarted {
            step: 0,
            remote_id: "ch-1".into(),
            by: "policy:saga".into(),
            reason: "step ship did not succeed".into(),
        },
        EventBody::ManualReviewRequired {
            reason: ReviewReason::CompensationRefused {
                step: 0,
                name: "charge".into(),
                status: 409,
                detail: "already refunded".into(),
            },
        },
        EventBody::ManualReviewRequired {
            reason: ReviewReason::CompensationNotSent {
                step: 0,
                name: "charge".into(),
                reason: "attempts exhausted".into(),
            },
        },
    ]
}

/// One body of each kind envelope version 8 adds: the fields of a step's answer that later
/// calls read, an operator's order to undo a step's duplicate and then the whole task, and a
/// step's call that cannot be built.
pub fn v8_bodies() -> Vec<EventBody> {
    let not_built = "step `reserve`'s answer has no string, number or boolean at `/x`";
    vec![
        EventBody::SendNotSent {
            attempt: 2,
            cause: crate::event::NotSentCause::NotBuilt(not_built.into()),
            retry_at: 2_000,
        },
        EventBody::ManualReviewRequired {
            reason: ReviewReason::StepNotBuilt {
                step: 1,
                name: "charge".into(),
                reason: not_built.into(),
            },
        },
        EventBody::StepAnswer {
            fields: [("/reservation/id".to_string(), "rsv-7".to_string())].into(),
        },
        EventBody::CompensationOrdered {
            step: 1,
            record: "ch-1".into(),
            duplicates: vec!["ch-2".into()],
            whole_task: true,
            by: "ana".into(),
            reason: "the order was cancelled".into(),
        },
    ]
}

/// The one body envelope version 9 adds: the named credential of an operator's decision.
pub fn v9_bodies() -> Vec<EventBody> {
    vec![EventBody::OperatorCredential {
        operator: "ana".into(),
        credential: "9f86d081884c7d65".into(),
    }]
}

/// The bodies envelope version 10 added: a request's version and the wait for an earlier one.
pub fn v10_bodies() -> Vec<EventBody> {
    let earlier = crate::event::PreviousVersion {
        version: 1,
        task_id: TaskId::derive_version("acme", "payment.create", "ord-42", 1),
    };
    vec![
        EventBody::RequestVersion {
            version: 2,
            previous: Some(earlier),
        },
        EventBody::RequestVersion {
            version: 1,
            previous: None,
        },
        EventBody::SendDeferred {
            until: 1_700_000_030_000,
            reason: crate::event::WaitReason::EarlierVersion {
                version: earlier.version,
                task_id: earlier.task_id,
            },
        },
    ]
}
