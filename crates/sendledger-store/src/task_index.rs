//! The task index: every task by phase, target and when it entered that phase (with why a
//! failed task failed), so that listing the failed tasks of one target in a time range, or
//! retrying them in bulk, reads one range of keys instead of every task.
//!
//! A task has exactly one entry, moved by each append that changes its phase (or its failure
//! kind): the writer of the task's events passes its entry before and after them
//! ([`crate::Append::reindex`]), and the journal deletes the old key and writes the new one in
//! the same batch as the events. [`crate::Ledger::list_tasks`] reads it. Tasks without an accepted request (rejected messages) are not
//! indexed.

use sendledger_core::event::Millis;
use sendledger_core::{FailureKind, Phase, State, TaskId};

use crate::summary::{phase_code, phase_of_code};

/// Where a task stands, as the index keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub phase: Phase,
    pub target: String,
    /// When the task entered its phase (ms since the Unix epoch).
    pub since: Millis,
    /// Why it failed (failed tasks only).
    pub failure: Option<FailureKind>,
}

impl IndexEntry {
    /// The entry of a task in `state`; none for one without an accepted request.
    pub fn of(state: &State) -> Option<IndexEntry> {
        // A task whose history retention removed is listed only while it holds events
        // recorded since, so that retention finds them.
        if state.pruned && !state.recorded_since_pruned() {
            return None;
        }
        let request = state.request.as_ref()?;
        Some(IndexEntry {
            phase: state.phase,
            target: request.target.clone(),
            since: state.phase_since,
            failure: state.failure_kind,
        })
    }

    /// `phase ‖ len(target) ‖ target ‖ since ‖ task_id`: one phase's tasks by target, each
    /// target's by the time they entered the phase.
    // format: do not change
    pub(crate) fn key(&self, task: TaskId) -> Vec<u8> {
        let mut k = prefix(self.phase, Some(&self.target));
        k.extend_from_slice(&self.since.to_be_bytes());
        k.extend_from_slice(&task.0);
        k
    }

    /// The value: the failure kind's code plus one, 0 for none.
    // format: do not change
    pub(crate) fn value(&self) -> [u8; 1] {
        [self
            .failure
            .and_then(|f| FailureKind::ALL.iter().position(|k| *k == f))
            .map_or(0, |i| i as u8 + 1)]
    }

    pub(crate) fn decode(key: &[u8], value: &[u8]) -> Option<(TaskId, IndexEntry)> {
        let phase = phase_of_code(*key.first()?)?;
        let len = u16::from_be_bytes(key.get(1..3)?.try_into().ok()?) as usize;
        let target = std::str::from_utf8(key.get(3..3 + len)?).ok()?.to_string();
        let rest = key.get(3 + len..)?;
        if rest.len() != 24 {
            return None;
        }
        let since = u64::from_be_bytes(rest[..8].try_into().ok()?);
        let task = TaskId(rest[8..].try_into().ok()?);
        let failure = match value {
            [0] => None,
            [code] => Some(*FailureKind::ALL.get(*code as usize - 1)?),
            _ => return None,
        };
        Some((
            task,
            IndexEntry {
                phase,
                target,
                since,
                failure,
            },
        ))
    }
}

/// The key prefix of a phase's entries, or of one target's within it.
pub(crate) fn prefix(phase: Phase, target: Option<&str>) -> Vec<u8> {
    let mut k = vec![phase_code(phase)];
    if let Some(target) = target {
        k.extend_from_slice(&(target.len() as u16).to_be_bytes());
        k.extend_from_slice(target.as_bytes());
    }
    k
}

/// Which tasks to list: those in `phases` (every phase when empty), of `target` when given,
/// that entered their phase in `[from, to)`, and failed for `failure` when given.
#[derive(Debug, Clone, Default)]
pub struct TaskQuery {
    pub phases: Vec<Phase>,
    pub target: Option<String>,
    pub failure: Option<FailureKind>,
    pub from: Option<Millis>,
    pub to: Option<Millis>,
    /// Resume after this cursor (a previous page's `next`).
    pub after: Option<Cursor>,
    /// At most this many tasks.
    pub limit: usize,
}

/// Where a listing stopped: the key of the last entry it read, opaque to callers (written as
/// hex in URLs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor(pub(crate) Vec<u8>);

impl Cursor {
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn from_hex(text: &str) -> Option<Cursor> {
        if text.len() % 2 != 0 || text.is_empty() {
            return None;
        }
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
            .collect::<Option<Vec<u8>>>()
            .map(Cursor)
    }
}

/// One page of a listing.
#[derive(Debug, Clone, Default)]
pub struct TaskPage {
    pub tasks: Vec<(TaskId, IndexEntry)>,
    /// Set when there may be more: pass it as the next query's `after`.
    pub next: Option<Cursor>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_sort_by_phase_target_then_time() {
        let entry = |phase, target: &str, since, failure| IndexEntry {
            phase,
            target: target.into(),
            since,
            failure,
        };
        let a = entry(Phase::Failed, "pay", 5, Some(FailureKind::Throttled));
        let task = TaskId([7; 16]);
        assert_eq!(
            IndexEntry::decode(&a.key(task), &a.value()),
            Some((task, a.clone()))
        );
        let later = entry(Phase::Failed, "pay", 6, None);
        let other_target = entry(Phase::Failed, "payx", 1, None);
        let earlier_phase = entry(Phase::Succeeded, "zzz", 9, None);
        assert!(a.key(task) < later.key(task));
        assert!(later.key(task) < other_target.key(task));
        assert!(earlier_phase.key(task) < a.key(task));
        assert_eq!(a.value(), [2], "throttled is kind 1, plus one");
        assert_eq!(later.value(), [0]);
    }

    #[test]
    fn cursors_round_trip_as_hex() {
        let c = Cursor(vec![0, 1, 0xab, 0xff]);
        assert_eq!(c.to_hex(), "0001abff");
        assert_eq!(Cursor::from_hex("0001abff"), Some(c));
        assert_eq!(Cursor::from_hex("0g"), None);
        assert_eq!(Cursor::from_hex("abc"), None);
        assert_eq!(Cursor::from_hex(""), None);
    }
}
