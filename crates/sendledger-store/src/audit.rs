//! Replaying the whole ledger to prove that no rule was broken.
//!
//! Two streaming passes, so memory stays bounded by one task's events whatever the log size:
//! the log in LSN order (every event decodes, LSNs are contiguous from 1), then the per-task
//! index in task order (each task's sequence is contiguous, its events are re-folded with the
//! core `fold` and checked against the rules of DESIGN.md §2, and its stored summary agrees).

use std::collections::BTreeMap;

use rocksdb::IteratorMode;
use sendledger_core::{check_task, Event, EventBody, Evidence, Phase, TaskId, UnknownCause};
use serde::Serialize;

use crate::envelope::decode_event;
use crate::error::Result;
use crate::keys::*;
use crate::ledger::Ledger;

/// A broken rule or a damaged log, naming the task (when there is one) and the LSNs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub task_id: Option<String>,
    pub rule: &'static str,
    pub lsns: Vec<u64>,
    pub detail: String,
}

/// What the audit found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
    pub events: u64,
    pub last_lsn: u64,
    pub tasks: u64,
    pub tasks_by_state: BTreeMap<&'static str, u64>,
    pub attempts: u64,
    pub unknown_outcomes: u64,
    pub unknowns_resolved_by_lookup: u64,
    pub unknowns_resolved_by_same_key_resend: u64,
    pub unknowns_resolved_by_authorized_resend: u64,
    pub unknowns_resolved_by_operator: u64,
    pub unknowns_open: u64,
    pub recovered_after_crash: u64,
    pub manual_reviews_open: u64,
    pub duplicates_dropped: u64,
    pub conflicts: u64,
    pub rejected_inputs: u64,
    pub violations: Vec<Finding>,
}

impl AuditReport {
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Replays the ledger. `progress` is called with the number of events read so far.
pub fn audit(ledger: &Ledger, mut progress: impl FnMut(u64)) -> Result<AuditReport> {
    let mut report = AuditReport {
        last_lsn: ledger.last_lsn(),
        ..AuditReport::default()
    };
    let db = ledger.db();
    let integrity = |lsns: Vec<u64>, detail: String| Finding {
        task_id: None,
        rule: "log-integrity",
        lsns,
        detail,
    };

    // Pass 1: the log itself.
    let mut expected = 1u64;
    for item in db.iterator_cf(ledger.cf(CF_LOG), IteratorMode::Start) {
        let (k, v) = item?;
        let Some(lsn) = decode_u64(&k) else {
            report
                .violations
                .push(integrity(vec![], format!("malformed log key {k:02x?}")));
            continue;
        };
        if lsn != expected {
            report.violations.push(integrity(
                vec![expected.saturating_sub(1), lsn],
                format!("LSN gap: {} missing", range_text(expected, lsn)),
            ));
        }
        expected = lsn + 1;
        if let Err(e) = decode_event(lsn, &v) {
            report.violations.push(integrity(vec![lsn], e.to_string()));
        }
        report.events += 1;
        if report.events % 100_000 == 0 {
            progress(report.events);
        }
    }
    progress(report.events);

    // Pass 2: task by task through the index.
    let mut current: Option<TaskId> = None;
    let mut events: Vec<Event> = Vec::new();
    let mut indexed = 0u64;
    let log = ledger.cf(CF_LOG);
    for item in db.iterator_cf(ledger.cf(CF_TASK_EVENTS), IteratorMode::Start) {
        let (k, v) = item?;
        let (Some(task), Some(lsn)) = (
            k.get(..16).and_then(|t| t.try_into().ok()).map(TaskId),
            decode_u64(&v),
        ) else {
            report.violations.push(integrity(
                vec![],
                format!("malformed task_events entry {k:02x?}"),
            ));
            continue;
        };
        if current != Some(task) {
            if let Some(done) = current.take() {
                check_one(ledger, done, &events, &mut report)?;
            }
            current = Some(task);
            events.clear();
        }
        indexed += 1;
        match db.get_cf(log, lsn_key(lsn))? {
            Some(bytes) => match decode_event(lsn, &bytes) {
                Ok(event) if event.task_id == task => events.push(event),
                Ok(event) => report.violations.push(Finding {
                    task_id: Some(task.to_string()),
                    rule: "log-integrity",
                    lsns: vec![lsn],
                    detail: format!("index points to an event of task {}", event.task_id),
                }),
                Err(_) => {} // reported in pass 1
            },
            None => report.violations.push(Finding {
                task_id: Some(task.to_string()),
                rule: "log-integrity",
                lsns: vec![lsn],
                detail: "indexed event missing from the log".into(),
            }),
        }
    }
    if let Some(done) = current {
        check_one(ledger, done, &events, &mut report)?;
    }
    if indexed != report.events {
        report.violations.push(integrity(
            vec![],
            format!(
                "{} events in the log, {indexed} in the task index",
                report.events
            ),
        ));
    }
    Ok(report)
}

fn range_text(from: u64, to: u64) -> String {
    if to == from + 1 {
        from.to_string()
    } else {
        format!("{from}..{}", to - 1)
    }
}

fn check_one(
    ledger: &Ledger,
    task: TaskId,
    events: &[Event],
    report: &mut AuditReport,
) -> Result<()> {
    let (state, violations) = check_task(events, None);
    for v in violations {
        report.violations.push(Finding {
            task_id: Some(task.to_string()),
            rule: v.rule.name(),
            lsns: v.lsns,
            detail: v.detail,
        });
    }
    report.tasks += 1;
    *report.tasks_by_state.entry(state.phase.name()).or_default() += 1;
    report.attempts += u64::from(state.attempts);
    report.duplicates_dropped += u64::from(state.duplicates);
    report.conflicts += u64::from(state.conflicts);
    if state.phase == Phase::ManualReview {
        report.manual_reviews_open += 1;
    }
    let (mut unknown, mut authorized) = (false, false);
    for e in events {
        match &e.body {
            EventBody::SendUnknown { cause, .. } => {
                report.unknown_outcomes += 1;
                if *cause == UnknownCause::Recovery {
                    report.recovered_after_crash += 1;
                }
                unknown = true;
            }
            EventBody::ResendAuthorized { .. } => authorized = true,
            EventBody::Confirmed { evidence, .. } if unknown => match evidence {
                Evidence::Lookup => report.unknowns_resolved_by_lookup += 1,
                Evidence::Response { .. } if authorized => {
                    report.unknowns_resolved_by_authorized_resend += 1
                }
                Evidence::Response { .. } => report.unknowns_resolved_by_same_key_resend += 1,
                Evidence::Operator { .. } => report.unknowns_resolved_by_operator += 1,
            },
            EventBody::InputRejected { .. } => report.rejected_inputs += 1,
            _ => {}
        }
    }
    if state.unresolved_unknown {
        report.unknowns_open += 1;
    }
    match ledger.task_summary(task)? {
        Some(s) if s.phase == state.phase && s.next_seq == state.next_seq => {}
        other => report.violations.push(Finding {
            task_id: Some(task.to_string()),
            rule: "log-integrity",
            lsns: events.last().map(|e| vec![e.lsn]).unwrap_or_default(),
            detail: format!(
                "task summary {:?} disagrees with the fold ({} after {} events)",
                other.map(|s| (s.phase.name(), s.next_seq)),
                state.phase.name(),
                state.next_seq
            ),
        }),
    }
    Ok(())
}
