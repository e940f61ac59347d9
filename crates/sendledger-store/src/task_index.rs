//! The task index: every task by phase, target and when it entered that phase (with why a
//! failed task failed), so that listing the failed tasks of one target in a time range, or
//! retrying them in bulk, reads one range of keys instead of every task.
//!
//! A task has exactly one entry, moved by each append that changes its phase (or its failure
//! kind): the writer of the task's events passes its entry before and after them
//! ([`Append::reindex`]), and the journal deletes the old key and writes the new one in the
//! same batch as the events. Tasks without an accepted request (rejected messages) are not
//! indexed.

use rocksdb::{Direction, IteratorMode};
use sendledger_core::event::Millis;
use sendledger_core::{FailureKind, Phase, State, TaskId};

use crate::error::{Error, Result};
use crate::journal::Append;
use crate::keys::CF_TASK_INDEX;
use crate::ledger::Ledger;
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

    fn decode(key: &[u8], value: &[u8]) -> Option<(TaskId, IndexEntry)> {
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
fn prefix(phase: Phase, target: Option<&str>) -> Vec<u8> {
    let mut k = vec![phase_code(phase)];
    if let Some(target) = target {
        k.extend_from_slice(&(target.len() as u16).to_be_bytes());
        k.extend_from_slice(target.as_bytes());
    }
    k
}

impl Append {
    /// Moves `task`'s index entry from what `before` says to what `after` says, when they
    /// differ.
    pub fn reindex(&mut self, task: TaskId, before: &State, after: &State) {
        let (old, new) = (IndexEntry::of(before), IndexEntry::of(after));
        if old != new {
            self.index.push((task, old, new));
        }
    }
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
pub struct Cursor(Vec<u8>);

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

/// The most index entries one page reads (matching or not) before it returns what it has,
/// with a cursor to go on: a filter that matches few entries costs bounded work per call.
pub const MAX_SCANNED_PER_PAGE: usize = 100_000;

impl Ledger {
    /// One page of the tasks `query` selects, in index order (by phase, then target, then the
    /// time they entered the phase).
    pub fn list_tasks(&self, query: &TaskQuery) -> Result<TaskPage> {
        let phases = if query.phases.is_empty() {
            crate::summary::PHASES.to_vec()
        } else {
            let mut p = query.phases.clone();
            p.sort_by_key(|p| phase_code(*p));
            p.dedup();
            p
        };
        let cf = self
            .db()
            .cf_handle(CF_TASK_INDEX)
            .ok_or_else(|| Error::NoTaskIndex {
                path: self.path().to_path_buf(),
            })?;
        let mut page = TaskPage::default();
        let mut scanned = 0;
        for phase in phases {
            let scope = prefix(phase, query.target.as_deref());
            let mut start = scope.clone();
            if query.target.is_some() {
                start.extend_from_slice(&query.from.unwrap_or(0).to_be_bytes());
            }
            let start = match &query.after {
                Some(Cursor(after)) if *after >= start => {
                    let mut next = after.clone();
                    next.push(0);
                    next
                }
                _ => start,
            };
            for item in self
                .db()
                .iterator_cf(cf, IteratorMode::From(&start, Direction::Forward))
            {
                let (k, v) = item?;
                if !k.starts_with(&scope) {
                    break;
                }
                let (task, entry) =
                    IndexEntry::decode(&k, &v).ok_or(Error::BadValue { what: "task_index" })?;
                if query.target.is_some() && query.to.is_some_and(|to| entry.since >= to) {
                    break;
                }
                scanned += 1;
                let wanted = query.from.is_none_or(|from| entry.since >= from)
                    && query.to.is_none_or(|to| entry.since < to)
                    && (query.failure.is_none() || entry.failure == query.failure);
                if wanted {
                    page.tasks.push((task, entry));
                }
                if page.tasks.len() >= query.limit || scanned >= MAX_SCANNED_PER_PAGE {
                    page.next = Some(Cursor(k.to_vec()));
                    return Ok(page);
                }
            }
        }
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sendledger_core::event::NotSentCause;
    use sendledger_core::EventBody;

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

    /// A task with these events, as its writer appends them (summary and index move).
    fn append_task(
        ledger: &Ledger,
        key: &str,
        target: &str,
        at: Millis,
        bodies: Vec<EventBody>,
    ) -> TaskId {
        use sendledger_core::{Limits, NewEvent, TaskRequest};
        let json = format!(
            r#"{{"tenant":"acme","operation":"pay","request_key":"{key}","target":"{target}","payload":{{"a":1}}}}"#
        );
        let request = TaskRequest::from_json(json.as_bytes())
            .and_then(|r| r.accept(&Limits::default()))
            .unwrap();
        let task = request.task_id();
        let payload_hash = request.payload_hash();
        let mut all = vec![EventBody::TaskAccepted {
            request,
            payload_hash,
            source: sendledger_core::fixtures::src(1),
        }];
        all.extend(bodies);
        let mut state = State::default();
        for (seq, body) in all.into_iter().enumerate() {
            let before = state.clone();
            state.apply(task, at + seq as u64, &body);
            let mut append = Append {
                events: vec![NewEvent {
                    task_id: task,
                    task_seq: seq as u32,
                    at: at + seq as u64,
                    body,
                }],
                tasks: vec![(
                    task,
                    crate::TaskSummary {
                        phase: state.phase,
                        next_seq: state.next_seq,
                    },
                )],
                ..Append::default()
            };
            append.reindex(task, &before, &state);
            ledger.append_blocking(append).unwrap();
        }
        task
    }

    fn failed_connect() -> Vec<EventBody> {
        vec![
            EventBody::SendIntended {
                attempt: 1,
                idempotency_key: None,
            },
            EventBody::SendNotSent {
                attempt: 1,
                cause: NotSentCause::Connect("refused".into()),
                retry_at: 0,
            },
            EventBody::Failed {
                reason: "attempts exhausted".into(),
            },
        ]
    }

    fn ids(page: &TaskPage) -> Vec<TaskId> {
        page.tasks.iter().map(|(t, _)| *t).collect()
    }

    /// A task is listed once, under its current phase; lists select by phase, target, time
    /// and failure kind, page with a cursor, and a ledger of format 2 is indexed on open.
    #[test]
    fn tasks_are_listed_by_phase_target_time_and_failure() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), crate::LedgerOptions::default()).unwrap();
        let a = append_task(&ledger, "a", "pay", 100, failed_connect());
        let b = append_task(&ledger, "b", "pay", 200, failed_connect());
        let c = append_task(&ledger, "c", "ship", 150, failed_connect());
        let running = append_task(&ledger, "d", "pay", 120, vec![]);
        let query = |phases: Vec<Phase>, target: Option<&str>| TaskQuery {
            phases,
            target: target.map(str::to_string),
            limit: 10,
            ..TaskQuery::default()
        };
        let failed = ledger
            .list_tasks(&query(vec![Phase::Failed], None))
            .unwrap();
        assert_eq!(ids(&failed), [a, b, c]);
        assert!(failed.next.is_none());
        assert_eq!(failed.tasks[0].1.failure, Some(FailureKind::Connect));
        assert_eq!(failed.tasks[0].1.since, 103);
        let all = ledger.list_tasks(&query(vec![], None)).unwrap();
        assert_eq!(
            ids(&all),
            [running, a, b, c],
            "each task once, accepted first"
        );
        let pay = TaskQuery {
            from: Some(150),
            to: Some(300),
            ..query(vec![Phase::Failed], Some("pay"))
        };
        assert_eq!(ids(&ledger.list_tasks(&pay).unwrap()), [b]);
        let throttled = TaskQuery {
            failure: Some(FailureKind::Throttled),
            ..query(vec![Phase::Failed], None)
        };
        assert!(ledger.list_tasks(&throttled).unwrap().tasks.is_empty());
        // Pages of one.
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let page = ledger
                .list_tasks(&TaskQuery {
                    limit: 1,
                    after: after.take(),
                    ..query(vec![Phase::Failed], None)
                })
                .unwrap();
            seen.extend(ids(&page));
            match page.next {
                Some(next) => after = Some(Cursor::from_hex(&next.to_hex()).unwrap()),
                None => break,
            }
        }
        assert_eq!(seen, [a, b, c]);
        drop(ledger);

        // The same ledger as format 2 wrote it: no task index.
        {
            let mut db = rocksdb::DB::open_cf(
                &rocksdb::Options::default(),
                dir.path(),
                crate::keys::ALL_CFS,
            )
            .unwrap();
            db.drop_cf(CF_TASK_INDEX).unwrap();
            db.put_cf(
                db.cf_handle(crate::keys::CF_META).unwrap(),
                crate::keys::META_FORMAT,
                [2],
            )
            .unwrap();
        }
        let old = Ledger::open_read_only(dir.path()).unwrap();
        assert!(matches!(
            old.list_tasks(&query(vec![], None)),
            Err(Error::NoTaskIndex { .. })
        ));
        drop(old);
        let migrated = Ledger::open(dir.path(), crate::LedgerOptions::default()).unwrap();
        assert_eq!(
            ids(&migrated.list_tasks(&query(vec![], None)).unwrap()),
            [running, a, b, c]
        );
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
