//! The records the remote holds, with the indexes that lookups, idempotency keys and duplicate
//! counting use.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A record the remote holds: one per performed create.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    /// Milliseconds since the Unix epoch, by the simulator's clock.
    pub created_at: u64,
    /// The request body as received (a JSON object).
    pub body: Value,
    /// The create's W3C `traceparent` header, when it had one (as received, unchecked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// Every record in creation order, and the indexes into it.
#[derive(Default)]
pub(crate) struct Store {
    pub(crate) records: Vec<Record>,
    /// Identity value → the indexes of its records, in creation order.
    pub(crate) by_identity: HashMap<String, Vec<usize>>,
    /// Idempotency key → the index of the record it created.
    by_key: HashMap<String, usize>,
    /// Identities with more than one record.
    pub(crate) duplicates: u64,
}

impl Store {
    /// Creates a record, or returns the first one created with the same idempotency key
    /// (`true`: a replay).
    pub(crate) fn commit(
        &mut self,
        identity_field: &str,
        body: Value,
        key: Option<String>,
        traceparent: Option<String>,
    ) -> (Record, bool) {
        if let Some(&i) = key.as_ref().and_then(|k| self.by_key.get(k)) {
            return (self.records[i].clone(), true);
        }
        let index = self.records.len();
        let record = Record {
            id: format!("rec-{}", index + 1),
            created_at: now_ms(),
            body,
            traceparent,
        };
        if let Some(identity) = field_text(&record.body, identity_field) {
            let entry = self.by_identity.entry(identity).or_default();
            entry.push(index);
            if entry.len() == 2 {
                self.duplicates += 1;
            }
        }
        if let Some(k) = key {
            self.by_key.insert(k, index);
        }
        self.records.push(record.clone());
        (record, false)
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The value of a dotted body field, as text (strings as is, numbers and booleans printed).
pub(crate) fn field_text(body: &Value, dotted: &str) -> Option<String> {
    let mut v = body;
    for part in dotted.split('.') {
        v = v.get(part)?;
    }
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn field_text_reads_dotted_paths() {
        let body = json!({"a": {"b": "x", "n": 5}, "t": true, "o": {}});
        assert_eq!(field_text(&body, "a.b").as_deref(), Some("x"));
        assert_eq!(field_text(&body, "a.n").as_deref(), Some("5"));
        assert_eq!(field_text(&body, "t").as_deref(), Some("true"));
        assert_eq!(field_text(&body, "o"), None);
        assert_eq!(field_text(&body, "missing"), None);
    }
}
