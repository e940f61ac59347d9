//! Task requests as they arrive (JSON), their validation, and canonical JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ids::{PayloadHash, TaskId};

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
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
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
    pub fn task_id(&self) -> TaskId {
        TaskId::derive(&self.tenant, &self.operation, &self.request_key)
    }
}

/// A validated request as the ledger stores it: the payload is kept as canonical JSON text.
// format: do not change (stored inside `TaskAccepted`; add fields only in a new envelope version)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceptedRequest {
    pub identity: Identity,
    pub target: String,
    pub payload: String,
    pub metadata: BTreeMap<String, String>,
}

impl AcceptedRequest {
    pub fn task_id(&self) -> TaskId {
        self.identity.task_id()
    }

    pub fn payload_hash(&self) -> PayloadHash {
        PayloadHash::of_canonical(&self.payload)
    }

    /// The payload as a JSON value (it was valid JSON when accepted).
    pub fn payload_value(&self) -> serde_json::Value {
        serde_json::from_str(&self.payload).unwrap_or(serde_json::Value::Null)
    }
}

impl TaskRequest {
    /// Parses a request from JSON bytes (the Kafka message value).
    pub fn from_json(bytes: &[u8]) -> Result<TaskRequest> {
        serde_json::from_slice(bytes).map_err(|e| Error::Json(e.to_string()))
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
        let payload = canonical_json(&self.payload);
        if payload.len() > limits.max_payload_bytes {
            return Err(Error::PayloadTooLarge {
                len: payload.len(),
                max: limits.max_payload_bytes,
            });
        }
        let metadata_len: usize = self.metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
        if metadata_len > limits.max_metadata_bytes {
            return Err(Error::TooLong {
                field: "metadata",
                len: metadata_len,
                max: limits.max_metadata_bytes,
            });
        }
        Ok(AcceptedRequest {
            identity: Identity {
                tenant: self.tenant.clone(),
                operation: self.operation.clone(),
                request_key: self.request_key.clone(),
            },
            target: self.target.clone(),
            payload,
            metadata: self.metadata.clone(),
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

/// Canonical JSON: object keys sorted by their UTF-8 bytes, no insignificant whitespace.
/// Independent of how `serde_json` orders maps, so the hash never depends on a feature flag.
pub fn canonical_json(value: &serde_json::Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    // serde_json's string escaping is deterministic; serializing a &str cannot fail.
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
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
            metadata: BTreeMap::new(),
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

    #[test]
    fn unknown_fields_and_bad_json_are_errors() {
        let err = TaskRequest::from_json(br#"{"tenant":"a","operation":"b","request_key":"c","target":"t","payload":{},"extra":1}"#)
            .unwrap_err();
        assert!(err.to_string().contains("unknown field `extra`"), "{err}");
        assert!(TaskRequest::from_json(b"not json").is_err());
        let err = TaskRequest::from_json(br#"{"tenant":"a"}"#).unwrap_err();
        assert!(err.to_string().contains("missing field"), "{err}");
    }
}
