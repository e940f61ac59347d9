//! Task requests as they arrive (JSON), their validation, and the form the ledger stores.
//!
//! A payload reaches the remote with its number tokens exactly as the producer wrote them
//! (`100.00`, `-0`, `12345678901234567890123`, `1E2`): a request read from JSON keeps its
//! payload's text, canonicalized by [`crate::canonical::canonical_text`], which sorts object
//! keys and drops whitespace only. serde_json's `arbitrary_precision` feature keeps the parsed
//! value's numbers exact too (never rounded through an f64, `1e400` not refused), for templates
//! and filters. A payload with a key twice in one object is refused.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Number, Value};

use crate::canonical::{canonical_json, object_member, object_with_fields, NotCanonical};
use crate::error::{Error, Result};
use crate::ids::{PayloadHash, TaskId};
use crate::reason::sanitize_reason;
use crate::trace::{TraceParent, TRACEPARENT};

/// A task request as it arrives on the requests topic (schema: `schemas/task-request.schema.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskRequest {
    pub tenant: String,
    pub operation: String,
    pub request_key: String,
    /// Name of a configured target (remote endpoint).
    pub target: String,
    /// The business payload sent to the remote; a JSON object.
    pub payload: serde_json::Value,
    /// The payload's canonical text, number tokens as written, when the request was read
    /// from JSON ([`TaskRequest::from_json`]); it is what is stored and sent. `None` for a
    /// request built in code: the canonical text is then written from `payload`.
    #[serde(skip)]
    pub payload_text: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// The version of the business operation: 0 (the default) for a request that names none.
    /// A higher version of the same identity is a new execution, which starts once every
    /// earlier version is settled; a version below the latest one seen is a redelivery of
    /// that version, or refused when it was never seen (`docs/rules.md`, Task versions).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u32,
}

fn is_zero(version: &u32) -> bool {
    *version == 0
}

/// Size limits applied when a request is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_identity_len: usize,
    pub max_target_len: usize,
    pub max_payload_bytes: usize,
    pub max_metadata_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_identity_len: 256,
            max_target_len: 128,
            max_payload_bytes: 64 * 1024,
            max_metadata_bytes: 8 * 1024,
        }
    }
}

/// `(tenant, operation, request_key)`: what makes two requests the same task.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Identity {
    pub tenant: String,
    pub operation: String,
    pub request_key: String,
}

impl Identity {
    /// The task of the identity's unversioned requests (version 0).
    pub fn task_id(&self) -> TaskId {
        TaskId::derive(&self.tenant, &self.operation, &self.request_key)
    }

    /// The task of the identity's requests of `version`.
    pub fn task_id_at(&self, version: u32) -> TaskId {
        TaskId::derive_version(&self.tenant, &self.operation, &self.request_key, version)
    }
}

/// The identity's address, `tenant/operation/request_key`, each part with `%` written `%25`
/// and `/` written `%2F`: one address names one identity (`a/b/c%2Fd` is request key `c/d`).
/// Parsed back by [`Identity::from_str`]. Used by `inspect`, the admin endpoint's task route
/// and as the Kafka key of a task's requests and records.
impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, part) in [&self.tenant, &self.operation, &self.request_key]
            .into_iter()
            .enumerate()
        {
            if i > 0 {
                f.write_char('/')?;
            }
            for ch in part.chars() {
                match ch {
                    '%' => f.write_str("%25")?,
                    '/' => f.write_str("%2F")?,
                    ch => f.write_char(ch)?,
                }
            }
        }
        Ok(())
    }
}

impl FromStr for Identity {
    type Err = Error;

    /// Reads an address written by [`Identity`]'s `Display`: exactly three `/`-separated
    /// parts, in which only `%25` and `%2F` (any case) are escapes.
    fn from_str(address: &str) -> Result<Identity> {
        let bad = |problem: String| Error::BadAddress {
            address: sanitize_reason(address),
            problem,
        };
        let parts = address
            .split('/')
            .map(|part| {
                unescape_part(part).ok_or_else(|| {
                    bad(format!(
                        "`{}` has a `%` that is not %25 or %2F",
                        sanitize_reason(part)
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let [tenant, operation, request_key] = <[String; 3]>::try_from(parts).map_err(|parts| {
            bad(format!(
                "it has {} `/`-separated parts, not 3; write a `/` inside a part as %2F",
                parts.len()
            ))
        })?;
        Ok(Identity {
            tenant,
            operation,
            request_key,
        })
    }
}

fn unescape_part(part: &str) -> Option<String> {
    let mut out = String::with_capacity(part.len());
    let mut rest = part;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        match rest.get(at + 1..at + 3)?.to_ascii_uppercase().as_str() {
            "25" => out.push('%'),
            "2F" => out.push('/'),
            _ => return None,
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// A validated request as the ledger stores it: the payload is kept as canonical JSON text
/// (sorted keys, no whitespace, number tokens as the producer wrote them), and is the body sent.
// format: do not change (stored inside `TaskAccepted`; add fields only in a new envelope version)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceptedRequest {
    pub identity: Identity,
    pub target: String,
    pub payload: String,
    pub metadata: BTreeMap<String, String>,
    /// The request's version. Not part of the stored encoding (which predates versions): a
    /// versioned task records it in its `RequestVersion` event, and the fold sets it here.
    #[serde(skip)]
    pub version: u32,
}

impl AcceptedRequest {
    /// The task of this request's identity and version.
    pub fn task_id(&self) -> TaskId {
        self.identity.task_id_at(self.version)
    }

    pub fn payload_hash(&self) -> PayloadHash {
        PayloadHash::of_canonical(&self.payload)
    }

    /// Whether `stored`, the payload hash recorded when this request's task was accepted, is
    /// this request's payload. Ledgers written before number tokens were kept verbatim stored
    /// payloads whose numbers serde_json had read as a u64, i64 or f64 and printed again
    /// (`100.00` as `100.0`); a redelivery of such a request matches that form too, so it is a
    /// duplicate, not a conflict.
    /// Ledgers written before exponents were kept as written stored them as serde_json
    /// writes them (`1E2` as `1e+2`); that form matches too.
    pub fn has_payload_hash(&self, stored: PayloadHash) -> bool {
        if self.payload_hash() == stored {
            return true;
        }
        let Ok(value) = serde_json::from_str(&self.payload) else {
            return false;
        };
        PayloadHash::of_canonical(&canonical_json(&value)) == stored
            || legacy_numbers(&value)
                .is_some_and(|legacy| PayloadHash::of_canonical(&canonical_json(&legacy)) == stored)
    }

    /// The payload with `fields` set as top-level string members (replacing any of the same
    /// name), in canonical text; every other token stays as written. `None` when the payload
    /// is not an object (it always is once accepted).
    pub fn payload_with_fields<'a>(
        &self,
        fields: impl IntoIterator<Item = (&'a str, String)>,
    ) -> Option<String> {
        object_with_fields(&self.payload, fields).ok()
    }

    /// The payload as a JSON value (it was valid JSON when accepted).
    pub fn payload_value(&self) -> serde_json::Value {
        serde_json::from_str(&self.payload).unwrap_or(serde_json::Value::Null)
    }
}

impl TaskRequest {
    /// Parses a request from JSON bytes (the Kafka message value). An object with a key twice,
    /// at any depth, is refused. The error quotes the input only through [`sanitize_reason`].
    pub fn from_json(bytes: &[u8]) -> Result<TaskRequest> {
        let mut request: TaskRequest = serde_json::from_slice(bytes)
            .map_err(|e| Error::Json(sanitize_reason(&e.to_string())))?;
        // serde_json accepted the bytes, so they are UTF-8 and one object with a payload; it
        // keeps the last of a key written twice, which the canonical scan refuses.
        let text = std::str::from_utf8(bytes).unwrap_or_default();
        match object_member(text, "payload") {
            Ok(payload) => request.payload_text = payload,
            Err(NotCanonical::DuplicateKey(key)) => {
                return Err(Error::Json(sanitize_reason(&format!(
                    "duplicate key `{key}`; a key may appear once per object"
                ))))
            }
            // Not reached for text serde_json accepted; the payload is then written from its
            // parsed value.
            Err(NotCanonical::Invalid) => {}
        }
        Ok(request)
    }

    /// The task this request is for; `identity().to_string()` is its address and Kafka key.
    pub fn identity(&self) -> Identity {
        Identity {
            tenant: self.tenant.clone(),
            operation: self.operation.clone(),
            request_key: self.request_key.clone(),
        }
    }

    /// Validates the request and turns it into the form the ledger stores.
    pub fn accept(&self, limits: &Limits) -> Result<AcceptedRequest> {
        check_identity_field("tenant", &self.tenant, limits.max_identity_len)?;
        check_identity_field("operation", &self.operation, limits.max_identity_len)?;
        check_identity_field("request_key", &self.request_key, limits.max_identity_len)?;
        check_identity_field("target", &self.target, limits.max_target_len)?;
        if !self.payload.is_object() {
            return Err(Error::PayloadNotObject {
                found: json_kind(&self.payload),
            });
        }
        let payload = match &self.payload_text {
            Some(text) => text.clone(),
            None => canonical_json(&self.payload),
        };
        if payload.len() > limits.max_payload_bytes {
            return Err(Error::PayloadTooLarge {
                len: payload.len(),
                max: limits.max_payload_bytes,
            });
        }
        // A valid trace context does not count: the ingest may add one from a message header
        // (at most 66 bytes), and a request must not become too large by being traced.
        let metadata_len: usize = self
            .metadata
            .iter()
            .filter(|(k, v)| k.as_str() != TRACEPARENT || TraceParent::parse(v).is_none())
            .map(|(k, v)| k.len() + v.len())
            .sum();
        if metadata_len > limits.max_metadata_bytes {
            return Err(Error::TooLong {
                field: "metadata",
                len: metadata_len,
                max: limits.max_metadata_bytes,
            });
        }
        Ok(AcceptedRequest {
            identity: self.identity(),
            target: self.target.clone(),
            payload,
            metadata: self.metadata.clone(),
            version: self.version,
        })
    }
}

fn check_identity_field(field: &'static str, value: &str, max: usize) -> Result<()> {
    if value.is_empty() {
        return Err(Error::Empty { field });
    }
    if value.len() > max {
        return Err(Error::TooLong {
            field,
            len: value.len(),
            max,
        });
    }
    if let Some((at, ch)) = value
        .char_indices()
        .find(|&(_, c)| !(c.is_ascii_alphanumeric() || "-_.:@/+=#".contains(c)))
    {
        return Err(Error::BadChar { field, ch, at });
    }
    Ok(())
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// `value` with every number as serde_json without `arbitrary_precision` read and printed it
/// (`100.00` → `100.0`, `-0` → `-0.0`, `12345678901234567890123` → `1.2345678901234568e+22`).
/// `None` when a number was out of range for it (such a payload was refused, never stored).
fn legacy_numbers(value: &Value) -> Option<Value> {
    Some(match value {
        Value::Number(n) => Value::Number(serde_json::from_str::<LegacyNumber>(n.as_str()).ok()?.0),
        Value::Array(items) => {
            Value::Array(items.iter().map(legacy_numbers).collect::<Option<_>>()?)
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| Some((k.clone(), legacy_numbers(v)?)))
                .collect::<Option<_>>()?,
        ),
        other => other.clone(),
    })
}

/// A number token read the way serde_json reads one into an `f64` field: as a u64 or i64 when
/// it is an integer that fits, else as an f64 (with serde_json's own parser, the one that read
/// payloads before number tokens were kept).
struct LegacyNumber(Number);

impl<'de> Deserialize<'de> for LegacyNumber {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_f64(LegacyNumberVisitor)
    }
}

struct LegacyNumberVisitor;

impl Visitor<'_> for LegacyNumberVisitor {
    type Value = LegacyNumber;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<LegacyNumber, E> {
        Ok(LegacyNumber(v.into()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<LegacyNumber, E> {
        Ok(LegacyNumber(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<LegacyNumber, E> {
        Number::from_f64(v)
            .map(LegacyNumber)
            .ok_or_else(|| E::custom("not a finite number"))
    }
}

impl AcceptedRequest {
    /// The task's trace context, if its request carried a valid one.
    pub fn traceparent(&self) -> Option<TraceParent> {
        self.metadata
            .get(TRACEPARENT)
            .and_then(|v| TraceParent::parse(v))
    }
}

impl TaskRequest {
    /// The request's trace context, if its metadata carries a valid one.
    pub fn traceparent(&self) -> Option<TraceParent> {
        self.metadata
            .get(TRACEPARENT)
            .and_then(|v| TraceParent::parse(v))
    }

    /// Sets the request's trace context (kept in its metadata, replacing any there).
    pub fn set_traceparent(&mut self, trace: TraceParent) {
        self.metadata.insert(TRACEPARENT.into(), trace.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(payload: &str) -> TaskRequest {
        TaskRequest {
            tenant: "acme".into(),
            operation: "payment.create".into(),
            request_key: "ord-1".into(),
            target: "payments".into(),
            payload: serde_json::from_str(payload).unwrap(),
            payload_text: None,
            metadata: BTreeMap::new(),
            version: 0,
        }
    }

    #[test]
    fn key_order_and_whitespace_do_not_change_the_hash() {
        let a = req(r#"{"b": 1, "a": {"y": [1, 2], "x": "s"}}"#)
            .accept(&Limits::default())
            .unwrap();
        let b = req(r#"{"a":{"x":"s","y":[1,2]},"b":1}"#)
            .accept(&Limits::default())
            .unwrap();
        assert_eq!(a.payload, r#"{"a":{"x":"s","y":[1,2]},"b":1}"#);
        assert_eq!(a.payload_hash(), b.payload_hash());
        let c = req(r#"{"a":{"x":"s","y":[2,1]},"b":1}"#)
            .accept(&Limits::default())
            .unwrap();
        assert_ne!(a.payload_hash(), c.payload_hash());
    }

    fn parsed(payload: &str) -> AcceptedRequest {
        let json = format!(
            r#"{{"tenant":"acme","operation":"payment.create","request_key":"ord-1","target":"payments","payload":{payload}}}"#
        );
        TaskRequest::from_json(json.as_bytes())
            .unwrap()
            .accept(&Limits::default())
            .unwrap()
    }

    #[test]
    fn number_tokens_are_kept_as_written() {
        let a = parsed(
            r#"{"iban": 12345678901234567890123, "amount": 100.00, "zero": -0, "big": 1e400, "n": [1E2, 0.10]}"#,
        );
        // Digits, sign, fraction, zeros and exponent exactly as written.
        assert_eq!(
            a.payload,
            r#"{"amount":100.00,"big":1e400,"iban":12345678901234567890123,"n":[1E2,0.10],"zero":-0}"#
        );
        // The parsed value keeps every digit too (serde_json writes an exponent as `e+`).
        assert_eq!(
            a.payload_value().to_string(),
            r#"{"amount":100.00,"big":1e+400,"iban":12345678901234567890123,"n":[1e+2,0.10],"zero":-0}"#
        );
        // Only key order and whitespace are canonicalized: another token is another payload.
        let b = parsed(
            r#"{"zero":-0,"n":[1E2,0.10],"iban":12345678901234567890123,"big":1e400,"amount":100.00}"#,
        );
        assert_eq!(a.payload_hash(), b.payload_hash());
        let c = parsed(
            r#"{"zero":-0,"n":[1E2,0.10],"iban":12345678901234567890123,"big":1e400,"amount":100.0}"#,
        );
        assert_ne!(a.payload_hash(), c.payload_hash());
    }

    #[test]
    fn a_request_stored_before_tokens_were_kept_is_still_a_duplicate() {
        // What the ledger stored for this payload before: numbers re-printed by serde_json.
        let old = AcceptedRequest {
            payload: r#"{"amount":100.0,"iban":1.2345678901234568e+22,"n":[100.0,7],"zero":-0.0}"#
                .into(),
            ..parsed("{}")
        };
        let again = parsed(
            r#"{"amount": 100.00, "iban": 12345678901234567890123, "zero": -0, "n": [1E2, 7]}"#,
        );
        assert_ne!(again.payload_hash(), old.payload_hash());
        assert!(again.has_payload_hash(old.payload_hash()));
        assert!(again.has_payload_hash(again.payload_hash()));
        let other = parsed(
            r#"{"amount": 100.01, "iban": 12345678901234567890123, "zero": -0, "n": [1E2, 7]}"#,
        );
        assert!(!other.has_payload_hash(old.payload_hash()));

        // What the ledger stored while exponents were written as serde_json writes them.
        let exponents = AcceptedRequest {
            payload: r#"{"amount":100.00,"iban":12345678901234567890123,"n":[1e+2,7],"zero":-0}"#
                .into(),
            ..parsed("{}")
        };
        assert_ne!(again.payload_hash(), exponents.payload_hash());
        assert!(again.has_payload_hash(exponents.payload_hash()));
        assert!(!other.has_payload_hash(exponents.payload_hash()));
    }

    #[test]
    fn fields_added_to_the_body_keep_every_other_token() {
        let a = parsed(r#"{"amount": 1E2, "reference": "producer's", "z": [0.10]}"#);
        let body = a
            .payload_with_fields([("reference", "t-1".to_string()), ("b", "x\"y".to_string())])
            .unwrap();
        assert_eq!(
            body,
            r#"{"amount":1E2,"b":"x\"y","reference":"t-1","z":[0.10]}"#
        );
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        let request = |payload: &str| {
            TaskRequest::from_json(format!(
                r#"{{"tenant":"a","operation":"b","request_key":"c","target":"t","payload":{payload}}}"#
            ).as_bytes())
        };
        for (payload, key) in [
            (r#"{"amount": 1, "amount": 2}"#, "amount"),
            (r#"{"a": {"b": [{"iban": "x", "iban": "y"}]}}"#, "iban"),
        ] {
            let err = request(payload).unwrap_err();
            assert!(
                err.to_string().contains(&format!("duplicate key `{key}`")),
                "{err}"
            );
        }
        assert!(request(r#"{"a": {"x": 1}, "b": {"x": 1}, "c": [{"x": 1}, {"x": 1}]}"#).is_ok());
    }

    #[test]
    fn a_hostile_field_name_makes_a_short_single_line_reason() {
        let name = format!(
            "x\\n2026-01-01 ERROR forged\\u001b[31m{}",
            "y".repeat(200_000)
        );
        let json = format!(r#"{{"tenant":"a","{name}":1}}"#);
        let reason = TaskRequest::from_json(json.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(
            reason.starts_with("invalid request JSON: unknown field `x\\n2026"),
            "{reason}"
        );
        assert!(!reason.chars().any(char::is_control), "{reason}");
        assert!(reason.ends_with(crate::reason::TRUNCATED), "{reason}");
        let max = "invalid request JSON: ".len() + crate::reason::MAX_REASON_BYTES;
        assert!(reason.len() <= max, "{} bytes", reason.len());
    }

    #[test]
    fn an_identity_address_names_one_identity() {
        let id = |t: &str, o: &str, k: &str| Identity {
            tenant: t.into(),
            operation: o.into(),
            request_key: k.into(),
        };
        // Once `a/b/c/d` was the address of both of these.
        let (x, y) = (id("a", "b", "c/d"), id("a", "b/c", "d"));
        assert_eq!(x.to_string(), "a/b/c%2Fd");
        assert_eq!(y.to_string(), "a/b%2Fc/d");
        for identity in [
            x,
            y,
            id("t%", "%2F", "/k/"),
            id("acme", "payment.create", "ord-1"),
        ] {
            assert_eq!(
                identity.to_string().parse::<Identity>(),
                Ok(identity.clone())
            );
        }
        assert_eq!("a/b%2fc/d".parse::<Identity>(), Ok(id("a", "b/c", "d")));
        assert_eq!(
            "acme/payment.create/ord-1".parse(),
            Ok(id("acme", "payment.create", "ord-1"))
        );
        for (bad, problem) in [
            ("a/b/c/d", "4 `/`-separated parts"),
            ("a/b", "2 `/`-separated parts"),
            ("a/b/c%41", "`c%41` has a `%`"),
            ("a/b/c%2", "`c%2` has a `%`"),
        ] {
            let err = bad.parse::<Identity>().unwrap_err().to_string();
            assert!(err.contains(problem), "{bad}: {err}");
        }
    }

    #[test]
    fn validation_names_the_field() {
        let limits = Limits::default();
        let mut r = req("{}");
        r.tenant.clear();
        assert_eq!(r.accept(&limits), Err(Error::Empty { field: "tenant" }));
        let mut r = req("{}");
        r.request_key = "a b".into();
        assert_eq!(
            r.accept(&limits),
            Err(Error::BadChar {
                field: "request_key",
                ch: ' ',
                at: 1
            })
        );
        let mut r = req("{}");
        r.operation = "x".repeat(300);
        assert_eq!(
            r.accept(&limits),
            Err(Error::TooLong {
                field: "operation",
                len: 300,
                max: 256
            })
        );
        let r = req("[1]");
        assert_eq!(
            r.accept(&limits),
            Err(Error::PayloadNotObject { found: "an array" })
        );
        let big = format!(r#"{{"blob":"{}"}}"#, "x".repeat(70_000));
        let err = req(&big).accept(&limits).unwrap_err();
        assert!(
            matches!(err, Error::PayloadTooLarge { max: 65536, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("limit of 65536"));
    }

    /// Metadata right at its limit stays acceptable once a valid trace context is added (as
    /// the ingest does from a message header); an invalid one counts like any entry.
    #[test]
    fn a_trace_context_does_not_count_against_the_metadata_limit() {
        let limits = Limits {
            max_metadata_bytes: 10,
            ..Limits::default()
        };
        let mut r = req("{}");
        r.metadata.insert("k".into(), "123456789".into());
        assert!(r.accept(&limits).is_ok());
        r.set_traceparent(
            crate::TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
                .unwrap(),
        );
        assert!(r.accept(&limits).is_ok());
        r.metadata
            .insert(crate::trace::TRACEPARENT.into(), "not a trace".into());
        assert!(matches!(
            r.accept(&limits),
            Err(Error::TooLong {
                field: "metadata",
                ..
            })
        ));
    }

    #[test]
    fn unknown_fields_and_bad_json_are_errors() {
        let err = TaskRequest::from_json(br#"{"tenant":"a","operation":"b","request_key":"c","target":"t","payload":{},"extra":1}"#)
            .unwrap_err();
        assert!(err.to_string().contains("unknown field `extra`"), "{err}");
        assert!(TaskRequest::from_json(b"not json").is_err());
        let err = TaskRequest::from_json(br#"{"tenant":"a"}"#).unwrap_err();
        assert!(err.to_string().contains("missing field"), "{err}");
    }

    #[test]
    fn the_trace_context_travels_in_the_request_metadata() {
        const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut request = TaskRequest::from_json(
            br#"{"tenant":"acme","operation":"op","request_key":"k","target":"t","payload":{}}"#,
        )
        .unwrap();
        let accepted = request.accept(&Default::default()).unwrap();
        assert_eq!(accepted.traceparent(), None);
        request.set_traceparent(TraceParent::parse(GOOD).unwrap());
        assert_eq!(request.traceparent().unwrap().to_string(), GOOD);
        let accepted = request.accept(&Default::default()).unwrap();
        assert_eq!(accepted.traceparent().unwrap().to_string(), GOOD);
    }
}
