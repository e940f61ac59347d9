//! Key and value encodings of the column families. Integers are big-endian so that byte order
//! is numeric order.
// format: do not change (every function here defines bytes already on disk)

use sendledger_core::{Identity, PayloadHash, TaskId};

pub const CF_LOG: &str = "log";
pub const CF_TASK_EVENTS: &str = "task_events";
pub const CF_TASKS: &str = "tasks";
pub const CF_IDENTITY: &str = "identity";
pub const CF_OFFSETS: &str = "offsets";
pub const CF_TIMERS: &str = "timers";
pub const CF_CURSORS: &str = "cursors";
pub const CF_META: &str = "meta";
/// Format 2 and 3: the tasks not settled (not in a terminal phase), by task id, each with the
/// partition of its request ([`partition_value`]). Emptied by the migration to format 4, which
/// lists them in [`CF_UNSETTLED_BY_PARTITION`]; the name is never used for anything else.
pub const CF_UNSETTLED: &str = "unsettled";

/// Format 4: the tasks not settled, by the requests partition of their request then task id
/// ([`unsettled_key`]), with no value: a partition's are read without reading the others'.
pub const CF_UNSETTLED_BY_PARTITION: &str = "unsettled_by_partition";

/// Format 3: every task by phase, target and when it entered the phase
/// ([`crate::task_index`]).
pub const CF_TASK_INDEX: &str = "task_index";

/// Format 5: what retention kept of each settled task whose history it removed, by task id
/// (an envelope byte, then bincode of `sendledger_core::Retained`).
pub const CF_RETAINED: &str = "retained";

/// Format 5: the tasks in [`CF_RETAINED`] by when they settled ([`retained_time_key`]), with no
/// value: those whose identity retention forgets are one range.
pub const CF_RETAINED_BY_TIME: &str = "retained_by_time";

/// Every column family; a ledger of format 1 lacks the last five, one of format 2 the last
/// four, one of format 3 the last three, one of format 4 the last two.
pub const ALL_CFS: [&str; 13] = [
    CF_LOG,
    CF_TASK_EVENTS,
    CF_TASKS,
    CF_IDENTITY,
    CF_OFFSETS,
    CF_TIMERS,
    CF_CURSORS,
    CF_META,
    CF_UNSETTLED,
    CF_TASK_INDEX,
    CF_UNSETTLED_BY_PARTITION,
    CF_RETAINED,
    CF_RETAINED_BY_TIME,
];

pub const META_FORMAT: &[u8] = b"format";
/// What retention removed so far (`crate::retention::PrunedTotals`). Absent until it first
/// removes something.
// format: do not change
pub const META_PRUNED: &[u8] = b"pruned";
/// Format 6: the chain of retention's checkpoints (`crate::retention::Chain`). Absent until
/// retention first removes something.
// format: do not change
pub const META_PRUNE_CHAIN: &[u8] = b"prune-chain";
/// Which mode writes the ledger: `local` or `kafka` (see [`crate::Ledger::open`]).
// format: do not change
pub const META_MODE: &[u8] = b"mode";

/// Kafka mode: the prefix of the `meta` keys of reviews owed, one per task whose history here
/// was replaced by its log's ([`crate::restore::Diverged`]): `prefix ‖ partition ‖ task_id`.
/// Kept until the task's review is recorded, since the replaced events exist nowhere else.
// format: do not change
pub const META_REVIEWS_OWED: &[u8] = b"review-owed/";

/// The `meta` key of the review owed for `task` of requests partition `partition`.
pub fn review_owed_key(partition: i32, task: TaskId) -> Vec<u8> {
    let mut k = review_owed_prefix(partition);
    k.extend_from_slice(&task.0);
    k
}

/// The prefix of the `meta` keys of the reviews owed for requests partition `partition`.
pub fn review_owed_prefix(partition: i32) -> Vec<u8> {
    let mut k = Vec::with_capacity(META_REVIEWS_OWED.len() + 20);
    k.extend_from_slice(META_REVIEWS_OWED);
    k.extend_from_slice(&partition.to_be_bytes());
    k
}

pub fn lsn_key(lsn: u64) -> [u8; 8] {
    lsn.to_be_bytes()
}

pub fn decode_u64(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.try_into().ok()?))
}

/// `task_id ‖ task_seq` → LSN.
pub fn task_event_key(task: TaskId, seq: u32) -> [u8; 20] {
    let mut k = [0u8; 20];
    k[..16].copy_from_slice(&task.0);
    k[16..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// The task of a key that is a task id alone (`tasks`, format 2's `unsettled`); `None` for a
/// malformed one.
pub fn decode_task_key(key: &[u8]) -> Option<TaskId> {
    Some(TaskId(key.try_into().ok()?))
}

pub fn decode_task_event_key(key: &[u8]) -> Option<(TaskId, u32)> {
    if key.len() != 20 {
        return None;
    }
    Some((
        TaskId(key[..16].try_into().ok()?),
        u32::from_be_bytes(key[16..].try_into().ok()?),
    ))
}

/// `tenant ‖ operation ‖ request_key`, each with a u16 length prefix so boundaries are exact.
pub fn identity_key(identity: &Identity) -> Vec<u8> {
    let mut k = Vec::with_capacity(
        6 + identity.tenant.len() + identity.operation.len() + identity.request_key.len(),
    );
    for part in [&identity.tenant, &identity.operation, &identity.request_key] {
        k.extend_from_slice(&(part.len() as u16).to_be_bytes());
        k.extend_from_slice(part.as_bytes());
    }
    k
}

/// The key, in the `identity` family, of the identity's latest version above 0: its
/// [`identity_key`] and then `0xff` `v`. No identity key is a prefix of another or continues
/// past its third part, so it names no identity.
// format: do not change
pub fn version_key(identity: &Identity) -> Vec<u8> {
    let mut k = identity_key(identity);
    k.extend_from_slice(&[0xff, b'v']);
    k
}

/// A [`version_key`]'s value: the version (u32, big-endian), its task, its payload hash.
// format: do not change
pub fn version_value(version: u32, task: TaskId, hash: &PayloadHash) -> Vec<u8> {
    let mut v = Vec::with_capacity(52);
    v.extend_from_slice(&version.to_be_bytes());
    v.extend_from_slice(&task.0);
    v.extend_from_slice(&hash.0);
    v
}

/// A [`version_value`] read back.
pub fn decode_version_value(v: &[u8]) -> Option<(u32, TaskId, PayloadHash)> {
    if v.len() != 52 {
        return None;
    }
    Some((
        u32::from_be_bytes(v[..4].try_into().ok()?),
        TaskId(v[4..20].try_into().ok()?),
        PayloadHash(v[20..].try_into().ok()?),
    ))
}

/// `topic ‖ 0x00 ‖ partition`: the partition's watermark, the highest offset below which every
/// offset is processed (Kafka topic names never contain a NUL byte).
pub fn offset_key(topic: &str, partition: i32) -> Vec<u8> {
    let mut k = Vec::with_capacity(topic.len() + 13);
    k.extend_from_slice(topic.as_bytes());
    k.push(0);
    k.extend_from_slice(&partition.to_be_bytes());
    k
}

/// `topic ‖ 0x00 ‖ partition ‖ offset`: one processed offset above the watermark. Sorts right
/// after the partition's watermark key, in offset order.
pub fn offset_marker_key(topic: &str, partition: i32, offset: i64) -> Vec<u8> {
    let mut k = offset_key(topic, partition);
    k.extend_from_slice(&(offset.max(0) as u64).to_be_bytes());
    k
}

/// `(topic, partition, Some(offset) for a marker / None for the watermark)`.
pub fn decode_offset_key(key: &[u8]) -> Option<(String, i32, Option<i64>)> {
    let nul = key.iter().position(|b| *b == 0)?;
    let topic = String::from_utf8(key[..nul].to_vec()).ok()?;
    let rest = &key[nul + 1..];
    match rest.len() {
        4 => Some((topic, i32::from_be_bytes(rest.try_into().ok()?), None)),
        12 => Some((
            topic,
            i32::from_be_bytes(rest[..4].try_into().ok()?),
            Some(u64::from_be_bytes(rest[4..].try_into().ok()?) as i64),
        )),
        _ => None,
    }
}

/// An `unsettled` value: the requests partition of the task's request, or nothing for a task
/// submitted without one.
pub fn partition_value(partition: Option<i32>) -> Vec<u8> {
    partition.map_or_else(Vec::new, |p| p.to_be_bytes().to_vec())
}

/// The partition of an `unsettled` value; `None` for a malformed one.
pub fn decode_partition_value(value: &[u8]) -> Option<Option<i32>> {
    match value {
        [] => Some(None),
        v => Some(Some(i32::from_be_bytes(v.try_into().ok()?))),
    }
}

/// The prefix of the `unsettled_by_partition` keys of requests partition `partition` (`None`:
/// tasks submitted without one): `0 ‖ 0u32` for none, `1 ‖ partition` (BE) for one.
pub fn unsettled_prefix(partition: Option<i32>) -> [u8; 5] {
    let mut k = [0u8; 5];
    if let Some(p) = partition {
        k[0] = 1;
        k[1..].copy_from_slice(&p.to_be_bytes());
    }
    k
}

/// `unsettled_prefix(partition) ‖ task_id`: a partition's tasks are one range.
pub fn unsettled_key(partition: Option<i32>, task: TaskId) -> [u8; 21] {
    let mut k = [0u8; 21];
    k[..5].copy_from_slice(&unsettled_prefix(partition));
    k[5..].copy_from_slice(&task.0);
    k
}

/// The partition and task of an `unsettled_by_partition` key; `None` for a malformed one.
pub fn decode_unsettled_key(key: &[u8]) -> Option<(Option<i32>, TaskId)> {
    let task = TaskId(key.get(5..)?.try_into().ok()?);
    let partition = match key.first()? {
        0 => None,
        1 => Some(i32::from_be_bytes(key.get(1..5)?.try_into().ok()?)),
        _ => return None,
    };
    (unsettled_key(partition, task) == key).then_some((partition, task))
}

/// `settled_at_ms ‖ task_id`: a `retained_by_time` key, in the order the tasks settled.
pub fn retained_time_key(settled_at_ms: u64, task: TaskId) -> [u8; 24] {
    timer_key(settled_at_ms, task)
}

/// `due_at_ms ‖ task_id`: iteration order is due order.
pub fn timer_key(due_at_ms: u64, task: TaskId) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&due_at_ms.to_be_bytes());
    k[8..].copy_from_slice(&task.0);
    k
}

pub fn decode_timer_key(key: &[u8]) -> Option<(u64, TaskId)> {
    if key.len() != 24 {
        return None;
    }
    let due = u64::from_be_bytes(key[..8].try_into().ok()?);
    Some((due, TaskId(key[8..].try_into().ok()?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_numerically_and_round_trip() {
        assert!(lsn_key(255) < lsn_key(256));
        let t = TaskId([7; 16]);
        assert!(timer_key(1_000, t) < timer_key(1_001, TaskId([0; 16])));
        assert_eq!(decode_timer_key(&timer_key(42, t)), Some((42, t)));
        assert_eq!(
            decode_offset_key(&offset_key("requests", 3)),
            Some(("requests".into(), 3, None))
        );
        let marker = offset_marker_key("requests", 3, 77);
        assert_eq!(
            decode_offset_key(&marker),
            Some(("requests".into(), 3, Some(77)))
        );
        assert!(offset_key("requests", 3) < marker);
        assert!(marker < offset_marker_key("requests", 3, 256));
        assert!(offset_marker_key("requests", 3, i64::MAX) < offset_key("requests", 4));
        assert!(task_event_key(t, 9) < task_event_key(t, 10));
        assert_eq!(decode_task_event_key(&task_event_key(t, 9)), Some((t, 9)));
        let a = Identity {
            tenant: "ab".into(),
            operation: "c".into(),
            request_key: "d".into(),
        };
        let b = Identity {
            tenant: "a".into(),
            operation: "bc".into(),
            request_key: "d".into(),
        };
        assert_ne!(identity_key(&a), identity_key(&b));
        for p in [None, Some(0), Some(7), Some(i32::MAX)] {
            assert_eq!(decode_partition_value(&partition_value(p)), Some(p));
        }
        assert_eq!(decode_partition_value(&[1, 2]), None);
    }

    /// A partition's unsettled tasks are one key range, in task order, apart from the tasks
    /// of every other partition and those without one.
    #[test]
    fn unsettled_keys_group_tasks_by_partition() {
        let (a, b) = (TaskId([1; 16]), TaskId([2; 16]));
        let mut keys = [
            unsettled_key(Some(1), b),
            unsettled_key(None, b),
            unsettled_key(Some(256), a),
            unsettled_key(Some(1), a),
            unsettled_key(Some(0), b),
        ];
        keys.sort();
        let decoded: Vec<_> = keys
            .iter()
            .map(|k| decode_unsettled_key(k).unwrap())
            .collect();
        assert_eq!(
            decoded,
            vec![
                (None, b),
                (Some(0), b),
                (Some(1), a),
                (Some(1), b),
                (Some(256), a)
            ]
        );
        assert!(keys
            .iter()
            .filter(|k| k.starts_with(&unsettled_prefix(Some(1))))
            .eq([unsettled_key(Some(1), a), unsettled_key(Some(1), b)].iter()));
        assert_eq!(decode_unsettled_key(&[2; 21]), None);
        assert_eq!(decode_unsettled_key(&unsettled_key(Some(3), a)[..20]), None);
        let mut odd = unsettled_key(None, a);
        odd[2] = 9;
        assert_eq!(decode_unsettled_key(&odd), None);
    }
}
