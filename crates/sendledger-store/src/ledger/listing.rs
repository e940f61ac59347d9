//! [`Ledger::list_tasks`]: one page of the task index ([`crate::task_index`]).

use rocksdb::{Direction, IteratorMode};

use crate::error::{Error, Result};
use crate::keys::CF_TASK_INDEX;
use crate::ledger::Ledger;
use crate::summary::phase_code;
use crate::task_index::{prefix, Cursor, IndexEntry, TaskPage, TaskQuery};

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
    use sendledger_core::event::{Millis, NotSentCause};
    use sendledger_core::{EventBody, FailureKind, Phase, State, TaskId};

    use super::*;
    use crate::journal::Append;

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

    /// The audit checks the task index against the fold of every task: clean as written; a
    /// stale entry is named, a missing one counted.
    #[test]
    fn the_audit_finds_a_task_index_that_disagrees_with_the_events() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), crate::LedgerOptions::default()).unwrap();
        let a = append_task(&ledger, "a", "pay", 100, failed_connect());
        let b = append_task(&ledger, "b", "pay", 200, vec![]);
        let report = crate::audit(&ledger, Default::default(), |_| {}).unwrap();
        assert!(report.is_clean(), "{:?}", report.violations);

        let cf = ledger.db().cf_handle(CF_TASK_INDEX).unwrap();
        let entry = |task| {
            let page = ledger
                .list_tasks(&TaskQuery {
                    limit: 10,
                    ..TaskQuery::default()
                })
                .unwrap();
            page.tasks.into_iter().find(|(t, _)| *t == task).unwrap().1
        };
        // Task a listed as still retrying, task b's entry gone.
        let (a_entry, b_entry) = (entry(a), entry(b));
        let stale = IndexEntry {
            phase: Phase::RetryWait,
            failure: None,
            ..a_entry.clone()
        };
        ledger.db().delete_cf(cf, a_entry.key(a)).unwrap();
        ledger.db().put_cf(cf, stale.key(a), stale.value()).unwrap();
        ledger.db().delete_cf(cf, b_entry.key(b)).unwrap();
        let report = crate::audit(&ledger, Default::default(), |_| {}).unwrap();
        let found: Vec<_> = report
            .violations
            .iter()
            .map(|f| (f.rule, f.task_id.clone(), f.detail.clone()))
            .collect();
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].0, "index-consistent");
        assert_eq!(found[0].1, Some(a.to_string()));
        assert!(
            found[0].2.contains("retry_wait") && found[0].2.contains("failed"),
            "{found:?}"
        );
        assert!(found[1].2.contains("1 task(s) are missing"), "{found:?}");
    }
}
