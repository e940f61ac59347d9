//! The JSON records sendledger publishes on the events topic: every event as an [`EventRecord`]
//! (schema `schemas/event.schema.json`), and its inverse for the readers of that topic. The
//! results topic carries the core crate's [`TaskResult`]s (projected by
//! [`sendledger_core::result::Projection`]).
//!
//! A record is a pure function of its event: a record built from the same event is the same
//! record, byte for byte, which is what makes a re-publication after a crash a harmless
//! duplicate.
//!
//! [`TaskResult`]: sendledger_core::result::TaskResult

use sendledger_core::result::event_id;
use sendledger_core::{Event, EventBody, TaskId};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// One ledger event on the events topic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventRecord {
    /// `<task_id>:<task_seq>`; also the `sendledger-event-id` header.
    pub event_id: String,
    pub lsn: u64,
    pub task_id: String,
    pub task_seq: u32,
    pub at: u64,
    /// The event's name (`TaskAccepted`, `SendIntended`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// The event's fields.
    pub body: Value,
}

pub fn event_record(event: &Event) -> EventRecord {
    let mut body = match serde_json::to_value(&event.body) {
        // Externally tagged: `{"Variant": {fields}}`.
        Ok(Value::Object(map)) if map.len() == 1 => map
            .into_iter()
            .next()
            .map(|(_, v)| v)
            .unwrap_or(Value::Null),
        Ok(other) => other,
        Err(_) => Value::Null,
    };
    if let Value::Object(map) = &mut body {
        if let Some(hash) = map.get_mut("payload_hash") {
            *hash = Value::String(bytes_hex(hash));
        }
        if let EventBody::InputRejected { raw, .. } = &event.body {
            map.insert(
                "raw".into(),
                Value::String(String::from_utf8_lossy(raw).into_owned()),
            );
        }
    }
    EventRecord {
        event_id: event_id(event.task_id, event.task_seq),
        lsn: event.lsn,
        task_id: event.task_id.to_string(),
        task_seq: event.task_seq,
        at: event.at,
        kind: event.body.name().into(),
        body,
    }
}

/// The event an [`EventRecord`] carries: the inverse of [`event_record`]. Faithful for every
/// event except the raw bytes of an `InputRejected` message that were not valid UTF-8 (the
/// record carries them as text, with invalid sequences replaced).
pub fn event_from_record(record: &EventRecord) -> Result<Event> {
    let bad = |detail: String| Error::BadRecord {
        event_id: record.event_id.clone(),
        detail,
    };
    let task_id: TaskId = record.task_id.parse().map_err(bad)?;
    if record.event_id != event_id(task_id, record.task_seq) {
        return Err(bad(format!(
            "event_id is not task_id:task_seq ({}:{})",
            record.task_id, record.task_seq
        )));
    }
    let mut body = record.body.clone();
    if let Value::Object(map) = &mut body {
        if let Some(hash) = map.get_mut("payload_hash") {
            let bytes = hash
                .as_str()
                .and_then(hex_bytes)
                .ok_or_else(|| bad("payload_hash is not a hex string".into()))?;
            *hash = Value::from(bytes);
        }
        if record.kind == "InputRejected" {
            if let Some(raw) = map.get_mut("raw") {
                let text = raw
                    .as_str()
                    .ok_or_else(|| bad("raw is not a string".into()))?;
                *raw = Value::from(text.as_bytes().to_vec());
            }
        }
    }
    let tagged = Value::Object(Map::from_iter([(record.kind.clone(), body)]));
    let body: EventBody = serde_json::from_value(tagged).map_err(|e| bad(e.to_string()))?;
    Ok(Event {
        lsn: record.lsn,
        task_id,
        task_seq: record.task_seq,
        at: record.at,
        body,
    })
}

fn hex_bytes(hex: &str) -> Option<Vec<u8>> {
    // Digits only: `from_str_radix` alone would also take a sign (`+a` as 0x0a).
    if hex.len() % 2 != 0 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect()
}

fn bytes_hex(v: &Value) -> String {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|b| format!("{:02x}", b.as_u64().unwrap_or(0)))
            .collect(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sendledger_core::fixtures::{accepted, history, src};
    use sendledger_core::{Evidence, PayloadHash, ReviewReason};

    /// Every kind of event body (and every variant inside one) survives the events topic.
    #[test]
    fn every_event_reads_back_from_its_record() {
        use sendledger_core::{NotSentCause, UnknownCause};
        let (task, acc) = accepted();
        let bodies = vec![
            acc,
            EventBody::DuplicateDelivery { source: src(8) },
            EventBody::RequestConflict {
                source: src(9),
                payload_hash: PayloadHash([0xab; 32]),
            },
            EventBody::SendIntended {
                attempt: 1,
                idempotency_key: None,
            },
            EventBody::SendIntended {
                attempt: 2,
                idempotency_key: Some("key-1".into()),
            },
            EventBody::SendNotSent {
                attempt: 1,
                cause: NotSentCause::Connect("refused".into()),
                retry_at: 5,
            },
            EventBody::SendNotSent {
                attempt: 1,
                cause: NotSentCause::Throttled { status: 429 },
                retry_at: 6,
            },
            EventBody::SendNotSent {
                attempt: 1,
                cause: NotSentCause::ServerError { status: 503 },
                retry_at: 7,
            },
            EventBody::SendUnknown {
                attempt: 1,
                cause: UnknownCause::Timeout,
            },
            EventBody::SendUnknown {
                attempt: 1,
                cause: UnknownCause::ResetAfterWrite("reset".into()),
            },
            EventBody::SendUnknown {
                attempt: 1,
                cause: UnknownCause::Status(504),
            },
            EventBody::SendUnknown {
                attempt: 1,
                cause: UnknownCause::Recovery,
            },
            EventBody::Confirmed {
                remote_id: "r-1".into(),
                evidence: Evidence::Response { status: 201 },
            },
            EventBody::Confirmed {
                remote_id: "r-1".into(),
                evidence: Evidence::Lookup,
            },
            EventBody::Confirmed {
                remote_id: "r-1".into(),
                evidence: Evidence::Operator {
                    by: "ann".into(),
                    reason: "checked".into(),
                },
            },
            EventBody::Rejected {
                status: 422,
                detail: "{\"error\":\"no\"}".into(),
            },
            EventBody::LookupPerformed {
                matches: vec![],
                next_check_at: Some(9),
            },
            EventBody::LookupPerformed {
                matches: vec!["a".into(), "b".into()],
                next_check_at: None,
            },
            EventBody::ManualReviewRequired {
                reason: ReviewReason::MultipleMatches {
                    remote_ids: vec!["a".into(), "b".into()],
                },
            },
            EventBody::ManualReviewRequired {
                reason: ReviewReason::DeadlinePassed { lookups: 3 },
            },
            EventBody::ManualReviewRequired {
                reason: ReviewReason::NoLookup,
            },
            EventBody::ManualReviewRequired {
                reason: ReviewReason::LookupsFailed {
                    lookups: 2,
                    last_error: "lookup answered 503".into(),
                },
            },
            EventBody::ResendAuthorized {
                by: "ann".into(),
                reason: "absent".into(),
            },
            EventBody::Failed {
                reason: "exhausted".into(),
            },
            EventBody::OperatorNote {
                who: "ann".into(),
                text: "hi".into(),
            },
            EventBody::InputRejected {
                source: src(3),
                reason: "bad".into(),
                raw: br#"{"tenant":"acme"}"#.to_vec(),
            },
        ];
        let kinds: std::collections::BTreeSet<&str> = bodies.iter().map(|b| b.name()).collect();
        assert_eq!(kinds.len(), 14, "a body kind is missing from this test");
        for event in history(task, bodies) {
            let json = serde_json::to_vec(&event_record(&event)).unwrap();
            let record: EventRecord = serde_json::from_slice(&json).unwrap();
            assert_eq!(event_from_record(&record).unwrap(), event);
        }
        let mut wrong =
            event_record(&history(task, vec![EventBody::DuplicateDelivery { source: src(1) }])[0]);
        wrong.task_seq += 1;
        assert!(event_from_record(&wrong).is_err());
        // A payload hash is hex digits only, as `event_record` writes it.
        let conflict = EventBody::RequestConflict {
            source: src(9),
            payload_hash: PayloadHash([0x0a; 32]),
        };
        let mut signed = event_record(&history(task, vec![conflict])[0]);
        signed.body["payload_hash"] = "+a".repeat(32).into();
        assert!(event_from_record(&signed).is_err());
    }

    #[test]
    fn a_conflict_record_carries_its_payload_hash_in_hex_and_its_source() {
        let (task, _) = accepted();
        let conflict = EventBody::RequestConflict {
            source: src(9),
            payload_hash: PayloadHash([1; 32]),
        };
        let rec = event_record(&history(task, vec![conflict])[0]);
        assert_eq!(rec.kind, "RequestConflict");
        assert_eq!(rec.body["payload_hash"], Value::String("01".repeat(32)));
        assert_eq!(rec.body["source"]["offset"], 9);
    }

    #[test]
    fn a_rejected_input_record_carries_its_raw_bytes_as_text() {
        let rejected = EventBody::InputRejected {
            source: src(3),
            reason: "not JSON".into(),
            raw: br#"{"tenant":"acme","request_key":"x"}"#.to_vec(),
        };
        let task = TaskId::for_rejected_input("req", 0, 3);
        assert_eq!(
            event_record(&history(task, vec![rejected])[0]).body["raw"],
            Value::String(r#"{"tenant":"acme","request_key":"x"}"#.into())
        );
    }
}
