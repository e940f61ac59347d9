//! The JSON records sendledger publishes on the events topic: every event as an [`EventRecord`]
//! (schema `schemas/event.schema.json`), and its inverse for the readers of that topic. The
//! results topic carries the core crate's [`TaskResult`]s (projected by
//! [`sendledger_core::result::Projection`]).
//!
//! A record is a pure function of its event: a record built from the same event is the same
//! record, byte for byte, which is what makes a re-publication after a crash a harmless
//! duplicate. So are its headers ([`record_headers`]): the `sendledger-event-id`, the
//! CloudEvents attributes in binary content mode (`ce_specversion`, `ce_id`, `ce_source`,
//! `ce_type`, `ce_time`, `content-type`), and the task's `traceparent` when it has one.
//!
//! [`TaskResult`]: sendledger_core::result::TaskResult

use std::io::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use sendledger_core::result::event_id;
use sendledger_core::trace::TRACEPARENT;
use sendledger_core::{Event, EventBody, ResultStatus, TaskId, TraceParent};
use serde::de::{
    DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, VariantAccess, Visitor,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, RecordError, Result};

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

/// The JSON of `event`'s record on the events topic: [`EventRecord`]'s fields in order, the
/// body the event's fields as serde writes them (a payload hash in hex, an input's raw bytes
/// as text). Written straight from the event: the publisher writes one for every event.
pub fn event_record_json(event: &Event) -> Result<Vec<u8>> {
    let name = event.body.name();
    // Externally tagged: `{"Variant":{fields}}`; the record's body is `{fields}`.
    let tagged = serde_json::to_string(&event.body).map_err(Error::Encode)?;
    let body = tagged
        .strip_prefix("{\"")
        .and_then(|t| t.strip_prefix(name))
        .and_then(|t| t.strip_prefix("\":"))
        .and_then(|t| t.strip_suffix('}'))
        .filter(|b| b.starts_with('{'))
        .ok_or(Error::NotTagged { name })?;
    // The other fields need no escaping: hex digits, digits and the variant's name.
    let mut out = Vec::with_capacity(tagged.len() + 160);
    write!(
        out,
        "{{\"event_id\":\"{}\",\"lsn\":{},\"task_id\":\"{}\",\"task_seq\":{},\"at\":{},\"type\":\"{name}\",\"body\":{body}}}",
        event_id(event.task_id, event.task_seq),
        event.lsn,
        event.task_id,
        event.task_seq,
        event.at,
    )
    .map_err(|e| Error::Encode(serde_json::Error::io(e)))?;
    Ok(out)
}

/// How events are written on the events topic (`kafka.events_encoding`). Readers take either,
/// record by record: a JSON record begins with `{`, a binary one with its format byte.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventEncoding {
    /// An [`EventRecord`] in JSON (`schemas/event.schema.json`), for anyone to read.
    #[default]
    Json,
    /// The event as the ledger stores it (a format byte, then bincode; the ledger's format
    /// rules keep old records readable): about a third of the JSON's size and several times
    /// faster to decode, for a log of record that take-overs read whole. Read by sendledger
    /// (take-overs, standbys, `audit --from-kafka`), not by JSON consumers.
    Binary,
}

impl EventEncoding {
    /// The record's payload for `event`.
    pub fn payload(self, event: &Event) -> Result<Vec<u8>> {
        match self {
            EventEncoding::Json => event_record_json(event),
            EventEncoding::Binary => Ok(sendledger_store::envelope::encode_event(event)),
        }
    }

    /// The record's `content-type` header.
    pub fn content_type(self) -> &'static str {
        match self {
            EventEncoding::Json => JSON,
            EventEncoding::Binary => BINARY_EVENT,
        }
    }
}

/// The media type of JSON records (event records in JSON, and results).
pub const JSON: &str = "application/json";
/// The media type of binary event records ([`EventEncoding::Binary`]).
pub const BINARY_EVENT: &str = "application/vnd.sendledger.event";

/// The event a record of the events topic carries, in either encoding ([`EventEncoding`]).
pub fn event_from_payload(payload: &[u8]) -> Result<Event> {
    match payload.first() {
        Some(b'{') => event_from_json(payload),
        _ => sendledger_store::envelope::decode_record(payload).map_err(|e| Error::BadRecord {
            event_id: String::new(),
            source: RecordError::Binary(e),
        }),
    }
}

/// `event`'s record as a value (see [`event_record_json`]).
pub fn event_record(event: &Event) -> Result<EventRecord> {
    serde_json::from_slice(&event_record_json(event)?).map_err(Error::Encode)
}

/// The header carrying a record's stable id (see [`sendledger_core::result::event_id`]).
pub const EVENT_ID_HEADER: &str = "sendledger-event-id";
/// CloudEvents (Kafka protocol binding, binary content mode) header names.
pub const CE_SPECVERSION: &str = "ce_specversion";
pub const CE_ID: &str = "ce_id";
pub const CE_SOURCE: &str = "ce_source";
pub const CE_TYPE: &str = "ce_type";
pub const CE_TIME: &str = "ce_time";
/// The binding's name for the record's media type (`application/json`).
pub const CONTENT_TYPE: &str = "content-type";

/// Which topic a published record is on: the kind of CloudEvent it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind<'a> {
    /// An [`EventRecord`] of this event name (`TaskAccepted`, `SendIntended`, ...).
    Event(&'a str),
    /// A task result of this status.
    Result(ResultStatus),
}

impl RecordKind<'_> {
    /// The CloudEvents `type`: `sendledger.event.<EventName>` or `sendledger.result.<status>`.
    pub fn ce_type(&self) -> String {
        match self {
            RecordKind::Event(name) => format!("sendledger.event.{name}"),
            RecordKind::Result(status) => format!("sendledger.result.{}", status.name()),
        }
    }
}

/// The CloudEvents `source` of event records: `sendledger/<consumer group>/events`. The
/// consumer group names the deployment (one ledger per group) and does not change across
/// restarts.
pub fn events_source(group_id: &str) -> String {
    format!("sendledger/{group_id}/events")
}

/// The CloudEvents `source` of result records: `sendledger/<consumer group>/results`. Not
/// the events' source: a result shares its id with the event it announces, and a source and
/// an id name one CloudEvent.
pub fn results_source(group_id: &str) -> String {
    format!("sendledger/{group_id}/results")
}

/// RFC 3339 (UTC, milliseconds) of an event's `at`, for `ce_time`.
pub fn ce_time(at_ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(at_ms)).to_string()
}

/// What the headers of a published record say ([`record_headers`]).
#[derive(Debug, Clone, Copy)]
pub struct Attributes<'a> {
    /// The record's event id (`sendledger-event-id`, and `ce_id`).
    pub id: &'a str,
    /// `ce_source` ([`events_source`], [`results_source`]).
    pub source: &'a str,
    /// `ce_type` ([`RecordKind::ce_type`]).
    pub kind: &'a str,
    /// The payload's media type ([`JSON`], or [`EventEncoding::content_type`]).
    pub content_type: &'a str,
    /// The event's time, for `ce_time`.
    pub at_ms: u64,
    /// The task's trace context, if it has one.
    pub trace: Option<TraceParent>,
}

/// The Kafka headers of a published record, in order: its event id, its CloudEvents
/// attributes, and `traceparent` when its task has a trace context. A pure function of its
/// attributes, like the record itself.
pub fn record_headers(attributes: &Attributes) -> Vec<(&'static str, String)> {
    fold_record_headers(
        Vec::with_capacity(8),
        attributes,
        |mut headers, key, value| {
            headers.push((key, value.to_string()));
            headers
        },
    )
}

/// What [`record_headers`] lists, folded into `init` one header at a time, in order, without
/// owning the values: `header(acc, key, value)`.
pub fn fold_record_headers<T>(
    init: T,
    attributes: &Attributes,
    mut header: impl FnMut(T, &'static str, &str) -> T,
) -> T {
    let mut acc = init;
    for (key, value) in [
        (EVENT_ID_HEADER, attributes.id),
        (CE_SPECVERSION, "1.0"),
        (CE_ID, attributes.id),
        (CE_SOURCE, attributes.source),
        (CE_TYPE, attributes.kind),
        (CE_TIME, &ce_time(attributes.at_ms)),
        (CONTENT_TYPE, attributes.content_type),
    ] {
        acc = header(acc, key, value);
    }
    match attributes.trace {
        Some(trace) => header(acc, TRACEPARENT, &trace.to_string()),
        None => acc,
    }
}

/// The event an [`EventRecord`] carries: the inverse of [`event_record`]. Faithful for every
/// event except the raw bytes of an `InputRejected` message that were not valid UTF-8 (the
/// record carries them as text, with invalid sequences replaced).
pub fn event_from_record(record: &EventRecord) -> Result<Event> {
    let task_id = checked_task_id(&record.event_id, &record.task_id, record.task_seq)?;
    let tagged = Value::Object(Map::from_iter([(record.kind.clone(), record.body.clone())]));
    let body: EventBody = serde_json::from_value(tagged).map_err(|e| Error::BadRecord {
        event_id: record.event_id.clone(),
        source: e.into(),
    })?;
    Ok(Event {
        lsn: record.lsn,
        task_id,
        task_seq: record.task_seq,
        at: record.at,
        body,
    })
}

/// The task id of a record, checked against its event id (`<task_id>:<task_seq>`, as
/// [`event_id`] writes it).
fn checked_task_id(event_id: &str, task_id: &str, task_seq: u32) -> Result<TaskId> {
    let bad = |source: RecordError| Error::BadRecord {
        event_id: event_id.to_string(),
        source,
    };
    let task: TaskId = task_id.parse().map_err(|problem| {
        bad(RecordError::TaskId {
            task_id: task_id.to_string(),
            problem,
        })
    })?;
    if !is_event_id(event_id, task, task_seq) {
        return Err(bad(RecordError::EventId {
            task_id: task_id.to_string(),
            task_seq,
        }));
    }
    Ok(task)
}

/// Whether `text` is [`event_id`]`(task, seq)`, compared without writing it out.
fn is_event_id(text: &str, task: TaskId, seq: u32) -> bool {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let Some((hex, digits)) = text.split_once(':') else {
        return false;
    };
    hex.len() == 32
        && hex
            .as_bytes()
            .chunks(2)
            .zip(task.0)
            .all(|(pair, b)| pair == [HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]])
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'))
        && digits.parse::<u32>() == Ok(seq)
}

/// An event record as read, its body left as JSON text (see [`event_from_json`]).
#[derive(Deserialize)]
struct RawEventRecord<'a> {
    #[serde(borrow)]
    event_id: std::borrow::Cow<'a, str>,
    lsn: u64,
    #[serde(borrow)]
    task_id: std::borrow::Cow<'a, str>,
    task_seq: u32,
    at: u64,
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    body: &'a serde_json::value::RawValue,
}

/// An externally tagged enum's variant name and content, deserialized as if they were the
/// JSON `{"<kind>": <content>}` (a record's `type` and `body`) without writing that out.
struct Tagged<'k, D> {
    kind: &'k str,
    content: D,
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Tagged<'_, D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, D::Error> {
        visitor.visit_enum(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

impl<'de, D: Deserializer<'de>> EnumAccess<'de> for Tagged<'_, D> {
    type Error = D::Error;
    type Variant = Content<D>;

    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> std::result::Result<(S::Value, Content<D>), D::Error> {
        let variant = seed.deserialize(self.kind.into_deserializer())?;
        Ok((variant, Content(self.content)))
    }
}

/// The content of a [`Tagged`] variant.
struct Content<D>(D);

impl<'de, D: Deserializer<'de>> VariantAccess<'de> for Content<D> {
    type Error = D::Error;

    fn unit_variant(self) -> std::result::Result<(), D::Error> {
        <()>::deserialize(self.0)
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> std::result::Result<T::Value, D::Error> {
        seed.deserialize(self.0)
    }

    fn tuple_variant<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> std::result::Result<V::Value, D::Error> {
        self.0.deserialize_tuple(len, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> std::result::Result<V::Value, D::Error> {
        self.0.deserialize_struct("", fields, visitor)
    }
}

/// The event the JSON of an [`EventRecord`] carries: [`event_from_record`] of it, decoded
/// straight from the text (a restore or an audit decodes every event of a log).
pub fn event_from_json(json: &[u8]) -> Result<Event> {
    let bad = |event_id: &str, e: serde_json::Error| Error::BadRecord {
        event_id: event_id.to_string(),
        source: e.into(),
    };
    let raw: RawEventRecord = serde_json::from_slice(json).map_err(|e| bad("", e))?;
    let task_id = checked_task_id(&raw.event_id, &raw.task_id, raw.task_seq)?;
    let mut content = serde_json::Deserializer::from_str(raw.body.get());
    let body = EventBody::deserialize(Tagged {
        kind: &raw.kind,
        content: &mut content,
    })
    .map_err(|e| bad(&raw.event_id, e))?;
    Ok(Event {
        lsn: raw.lsn,
        task_id,
        task_seq: raw.task_seq,
        at: raw.at,
        body,
    })
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
            EventBody::SendIntendedAt {
                attempt: 3,
                idempotency_key: Some("key-2".into()),
                target: "backup".into(),
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
            EventBody::ManualReviewRequired {
                reason: ReviewReason::DivergentHistory {
                    task_seq: 1,
                    replaced: vec!["SendIntended: attempt 1".into()],
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
            EventBody::SendDeferred {
                until: 9,
                reason: sendledger_core::WaitReason::BreakerOpen {
                    target: "sim".into(),
                },
            },
            EventBody::TaskRetried {
                by: "ann".into(),
                reason: "back".into(),
            },
        ];
        let bodies = [
            bodies,
            sendledger_core::fixtures::saga_bodies(),
            sendledger_core::fixtures::v8_bodies(),
            sendledger_core::fixtures::v9_bodies(),
            sendledger_core::fixtures::v10_bodies(),
        ]
        .concat();
        let kinds: std::collections::BTreeSet<&str> = bodies.iter().map(|b| b.name()).collect();
        assert_eq!(kinds.len(), 23, "a body kind is missing from this test");
        for event in history(task, bodies) {
            let json = event_record_json(&event).unwrap();
            let record: EventRecord = serde_json::from_slice(&json).unwrap();
            assert_eq!(record, event_record(&event).unwrap());
            assert_eq!(event_from_record(&record).unwrap(), event);
            assert_eq!(event_from_json(&json).unwrap(), event);
            // Either encoding reads back through the one reader of the topic.
            for encoding in [EventEncoding::Json, EventEncoding::Binary] {
                let payload = encoding.payload(&event).unwrap();
                assert_eq!(event_from_payload(&payload).unwrap(), event, "{encoding:?}");
            }
        }
        // A binary record of a format this build does not read, or not an event, is refused
        // with an error, never read as another event.
        let duplicate = EventBody::DuplicateDelivery { source: src(1) };
        let mut binary = EventEncoding::Binary
            .payload(&history(task, vec![duplicate])[0])
            .unwrap();
        assert!(event_from_payload(&[0xff, 1, 2]).is_err());
        assert!(event_from_payload(&[]).is_err());
        binary.truncate(binary.len() / 2);
        assert!(event_from_payload(&binary).is_err());
        let mut wrong =
            event_record(&history(task, vec![EventBody::DuplicateDelivery { source: src(1) }])[0])
                .unwrap();
        wrong.task_seq += 1;
        assert!(event_from_record(&wrong).is_err());
        assert!(event_from_json(&serde_json::to_vec(&wrong).unwrap()).is_err());
        // The event id is compared as `event_id` writes it: lowercase, no leading zero.
        let right =
            event_record(&history(task, vec![EventBody::DuplicateDelivery { source: src(1) }])[0])
                .unwrap();
        for event_id in [
            right.event_id.to_uppercase(),
            right.event_id.replace(':', ":0"),
            right.event_id.replace(':', ":+"),
            format!("{}:", right.task_id),
            right.task_id.clone(),
        ] {
            let mut other = right.clone();
            other.event_id = event_id;
            assert!(event_from_record(&other).is_err(), "{}", other.event_id);
            assert!(event_from_json(&serde_json::to_vec(&other).unwrap()).is_err());
        }
        assert!(event_from_json(&serde_json::to_vec(&right).unwrap()).is_ok());
        // An unknown type, or a body of another shape than its type's, is refused.
        let mut unknown = right.clone();
        unknown.kind = "Teleported".into();
        assert!(event_from_json(&serde_json::to_vec(&unknown).unwrap()).is_err());
        let mut shapeless = right.clone();
        shapeless.body = serde_json::json!([1, 2]);
        assert!(event_from_json(&serde_json::to_vec(&shapeless).unwrap()).is_err());
        // The variant's name cannot reach into the body's JSON.
        let mut injected = right.clone();
        injected.kind = r#"DuplicateDelivery":{},"x"#.into();
        assert!(event_from_json(&serde_json::to_vec(&injected).unwrap()).is_err());
        // A payload hash is hex digits only, as `event_record` writes it.
        let conflict = EventBody::RequestConflict {
            source: src(9),
            payload_hash: PayloadHash([0x0a; 32]),
        };
        let mut signed = event_record(&history(task, vec![conflict])[0]).unwrap();
        signed.body["payload_hash"] = "+a".repeat(32).into();
        assert!(event_from_record(&signed).is_err());
    }

    #[test]
    fn records_carry_cloudevents_headers_and_the_trace_context() {
        let trace = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let kind = RecordKind::Result(ResultStatus::ManualReview);
        let headers = record_headers(&Attributes {
            id: "t:7",
            source: &results_source("sendledger"),
            kind: &kind.ce_type(),
            content_type: JSON,
            at_ms: 1_700_000_000_123,
            trace,
        });
        let expected = [
            ("sendledger-event-id", "t:7"),
            ("ce_specversion", "1.0"),
            ("ce_id", "t:7"),
            ("ce_source", "sendledger/sendledger/results"),
            ("ce_type", "sendledger.result.manual_review"),
            ("ce_time", "2023-11-14T22:13:20.123Z"),
            ("content-type", "application/json"),
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
        ];
        let got: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(got, expected);
        let kind = RecordKind::Event("SendIntended");
        let binary = EventEncoding::Binary.content_type();
        let event = record_headers(&Attributes {
            id: "t:2",
            source: &events_source("g"),
            kind: &kind.ce_type(),
            content_type: binary,
            at_ms: 0,
            trace: None,
        });
        assert_eq!(event.len(), 7, "no traceparent without a trace context");
        assert_eq!(event[3].1, "sendledger/g/events");
        assert_eq!(event[4].1, "sendledger.event.SendIntended");
        assert_eq!(event[5].1, "1970-01-01T00:00:00.000Z");
        assert_eq!(event[6], ("content-type", BINARY_EVENT.to_string()));
    }

    #[test]
    fn a_conflict_record_carries_its_payload_hash_in_hex_and_its_source() {
        let (task, _) = accepted();
        let conflict = EventBody::RequestConflict {
            source: src(9),
            payload_hash: PayloadHash([1; 32]),
        };
        let rec = event_record(&history(task, vec![conflict])[0]).unwrap();
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
            event_record(&history(task, vec![rejected])[0])
                .unwrap()
                .body["raw"],
            Value::String(r#"{"tenant":"acme","request_key":"x"}"#.into())
        );
    }
}
