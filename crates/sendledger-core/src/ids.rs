//! Deterministic identifiers: a task's id from its identity, a payload's hash from its
//! canonical JSON.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A task's id: the first 16 bytes of SHA-256 over the length-prefixed identity fields.
/// Stable across redeliveries, restarts and machines.
///
/// Serialized as 32 lowercase hex digits in human-readable formats (JSON) and as its 16 bytes
/// in binary ones (bincode: the ledger), as derived before.
// format: do not change (the derivation and the 16-byte width are stored in every key)
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId(pub [u8; 16]);

/// The binary form of [`TaskId`], as `#[derive]` wrote it.
// format: do not change (stored inside events)
#[derive(Serialize, Deserialize)]
#[serde(rename = "TaskId")]
struct TaskIdBytes([u8; 16]);

impl Serialize for TaskId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.collect_str(self)
        } else {
            TaskIdBytes(self.0).serialize(serializer)
        }
    }
}

impl<'de> Deserialize<'de> for TaskId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            let text = std::borrow::Cow::<str>::deserialize(deserializer)?;
            text.parse().map_err(serde::de::Error::custom)
        } else {
            TaskIdBytes::deserialize(deserializer).map(|b| TaskId(b.0))
        }
    }
}

impl TaskId {
    pub fn derive(tenant: &str, operation: &str, request_key: &str) -> TaskId {
        TaskId::of_identity(b"sendledger.task.v1", [tenant, operation, request_key], &[])
    }

    /// The id of version `version` of a request's task: version 0 (a request that names no
    /// version) is [`TaskId::derive`]'s id, so every task recorded before versions existed
    /// keeps its id; a later version's id adds the version under a domain tag of its own.
    // format: do not change (stored in every key of a versioned task)
    pub fn derive_version(
        tenant: &str,
        operation: &str,
        request_key: &str,
        version: u32,
    ) -> TaskId {
        match version {
            0 => TaskId::derive(tenant, operation, request_key),
            v => TaskId::of_identity(
                b"sendledger.task-version.v1",
                [tenant, operation, request_key],
                &v.to_be_bytes(),
            ),
        }
    }

    /// The first 16 bytes of SHA-256 over `tag`, each part with its length (u64, big-endian)
    /// first, then `suffix`.
    fn of_identity(tag: &[u8], parts: [&str; 3], suffix: &[u8]) -> TaskId {
        let mut h = Sha256::new();
        h.update(tag);
        for part in parts {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        h.update(suffix);
        let digest = h.finalize();
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        TaskId(id)
    }
}

impl TaskId {
    /// The id under which an invalid message from a requests-topic position is recorded. A
    /// domain tag of its own keeps it apart from every task identity.
    pub fn for_rejected_input(topic: &str, partition: i32, offset: i64) -> TaskId {
        let mut h = Sha256::new();
        h.update(b"sendledger.rejected-input.v1");
        h.update((topic.len() as u64).to_be_bytes());
        h.update(topic.as_bytes());
        h.update(partition.to_be_bytes());
        h.update(offset.to_be_bytes());
        let digest = h.finalize();
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        TaskId(id)
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TaskId({self})")
    }
}

impl FromStr for TaskId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut id = [0u8; 16];
        parse_hex(s, &mut id).ok_or_else(|| format!("task id must be 32 hex digits, got {s:?}"))?;
        Ok(TaskId(id))
    }
}

/// SHA-256 of a payload's canonical JSON (sorted keys, no whitespace).
///
/// Serialized as 64 lowercase hex digits in human-readable formats (JSON: the events topic,
/// timelines) and as its 32 bytes in binary ones (bincode: the ledger).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PayloadHash(pub [u8; 32]);

/// The binary form of [`PayloadHash`], as `#[derive]` wrote it.
// format: do not change (stored inside `TaskAccepted` and `RequestConflict`)
#[derive(Serialize, Deserialize)]
#[serde(rename = "PayloadHash")]
struct PayloadHashBytes([u8; 32]);

impl Serialize for PayloadHash {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.collect_str(self)
        } else {
            PayloadHashBytes(self.0).serialize(serializer)
        }
    }
}

impl<'de> Deserialize<'de> for PayloadHash {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            let text = std::borrow::Cow::<str>::deserialize(deserializer)?;
            let mut hash = [0u8; 32];
            parse_hex(&text, &mut hash).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "payload hash must be 64 hex digits, got {text:?}"
                ))
            })?;
            Ok(PayloadHash(hash))
        } else {
            PayloadHashBytes::deserialize(deserializer).map(|b| PayloadHash(b.0))
        }
    }
}

impl PayloadHash {
    pub fn of_canonical(canonical_json: &str) -> PayloadHash {
        PayloadHash(Sha256::digest(canonical_json.as_bytes()).into())
    }
}

impl fmt::Display for PayloadHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for PayloadHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PayloadHash({self})")
    }
}

/// Lowercase hex, two digits a byte, written a run at a time: a `write!` per byte went through
/// the formatting machinery 16 times a task id, and task ids name every record and log line
/// (1.9% of `sendledger-bench kafka`'s CPU, in `perf`).
fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 64];
    for run in bytes.chunks(buf.len() / 2) {
        let out = &mut buf[..run.len() * 2];
        for (pair, b) in out.chunks_exact_mut(2).zip(run) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 0xf)];
        }
        f.write_str(std::str::from_utf8(out).map_err(|_| fmt::Error)?)?;
    }
    Ok(())
}

/// Hex digits (either case) into `out`, exactly two per byte; nothing else (no sign).
fn parse_hex(s: &str, out: &mut [u8]) -> Option<()> {
    fn nibble(digit: u8) -> Option<u8> {
        match digit {
            b'0'..=b'9' => Some(digit - b'0'),
            b'a'..=b'f' => Some(digit - b'a' + 10),
            b'A'..=b'F' => Some(digit - b'A' + 10),
            _ => None,
        }
    }
    if s.len() != out.len() * 2 {
        return None;
    }
    for (byte, pair) in out.iter_mut().zip(s.as_bytes().chunks_exact(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte value is written as its two lowercase hex digits, in order.
    #[test]
    fn ids_are_written_as_lowercase_hex() {
        for first in (0..=255u8).step_by(32) {
            let bytes: [u8; 32] = std::array::from_fn(|i| first + i as u8);
            let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(PayloadHash(bytes).to_string(), expected);
            let task = TaskId(bytes[..16].try_into().unwrap());
            assert_eq!(task.to_string(), expected[..32]);
        }
    }

    #[test]
    fn task_id_is_stable_and_unambiguous() {
        let a = TaskId::derive("acme", "payment.create", "ord-1");
        assert_eq!(a, TaskId::derive("acme", "payment.create", "ord-1"));
        // Length prefixes keep field boundaries apart.
        assert_ne!(
            TaskId::derive("ab", "c", "d"),
            TaskId::derive("a", "bc", "d")
        );
        // The derivation is part of the storage format.
        assert_eq!(a.to_string(), "1955a2f36b8bffcf316b158bfca22be0");
        assert_eq!(a.to_string().parse::<TaskId>().unwrap(), a);
        // Version 0 is the unversioned id; each later version has its own.
        assert_eq!(
            TaskId::derive_version("acme", "payment.create", "ord-1", 0),
            a
        );
        let v2 = TaskId::derive_version("acme", "payment.create", "ord-1", 2);
        assert_eq!(v2.to_string(), "62c00c4790b766f4fe1dcb727b45852a");
        assert_ne!(
            v2,
            TaskId::derive_version("acme", "payment.create", "ord-1", 3)
        );
        assert!("xyz".parse::<TaskId>().is_err());
        assert!("+a".repeat(16).parse::<TaskId>().is_err());
        let upper = a.to_string().to_uppercase();
        assert_eq!(upper.parse::<TaskId>().unwrap(), a);
        for bad in ["g", " ", "-", "é"] {
            let text = format!("{bad}{}", &a.to_string()[bad.len()..]);
            assert!(text.parse::<TaskId>().is_err(), "{text}");
        }
    }

    /// Hex in JSON, 32 bare bytes in bincode (the ledger's encoding, as derived before).
    #[test]
    fn a_payload_hash_is_hex_in_json_and_bytes_in_bincode() {
        let hash = PayloadHash::of_canonical("{}");
        let json = serde_json::to_string(&hash).unwrap();
        assert_eq!(json, format!("\"{hash}\""));
        assert_eq!(json.len(), 66);
        assert_eq!(serde_json::from_str::<PayloadHash>(&json).unwrap(), hash);
        for bad in ["\"ab\"", "[1,2]", &format!("\"{}\"", "+a".repeat(32))] {
            assert!(serde_json::from_str::<PayloadHash>(bad).is_err(), "{bad}");
        }
        let bytes = bincode::serialize(&hash).unwrap();
        assert_eq!(bytes, hash.0);
        assert_eq!(bincode::deserialize::<PayloadHash>(&bytes).unwrap(), hash);
        // A task id the same way: 32 hex digits, 16 bytes.
        let task = TaskId::derive("acme", "payment.create", "ord-1");
        let json = serde_json::to_string(&task).unwrap();
        assert_eq!(json, "\"1955a2f36b8bffcf316b158bfca22be0\"");
        assert_eq!(serde_json::from_str::<TaskId>(&json).unwrap(), task);
        assert!(serde_json::from_str::<TaskId>("[1,2]").is_err());
        assert_eq!(bincode::serialize(&task).unwrap(), task.0);
        assert_eq!(bincode::deserialize::<TaskId>(&task.0).unwrap(), task);
    }
}
