//! Replaying the whole ledger to prove that no rule was broken.
//!
//! One streaming pass over the log in LSN order checks that LSNs are contiguous from 1 and
//! that every event decodes, and feeds each event to its task's [`TaskAudit`] (the rule checks
//! and counts shared with the replay of the events topic). A task is checked while it is open:
//! from its first event until it has as many events as its stored summary says, or the end of
//! the log. Then its fold is compared with the summary and the task is dropped. So memory holds
//! the open tasks, not the log: in a ledger written by the engine, the tasks that were in
//! flight together (plus any task that gets events much later, such as a late duplicate
//! delivery, until it gets them). An event of a task that was already dropped re-opens it from
//! the index.
//!
//! Meanwhile a second thread reads the per-task index and fingerprints it (count and a sum of
//! hashes of `task, seq, lsn`); the log pass fingerprints the events it decodes the same way.
//! Equal fingerprints mean every event is indexed under its task and sequence number and no
//! index entry points elsewhere. Only when they differ does a slower pass look up each index
//! entry in the log to name what is wrong.

use std::collections::hash_map::{Entry, HashMap};
use std::sync::mpsc;

use rocksdb::{Direction, IteratorMode, ReadOptions};
use sendledger_core::audit::{AuditReport, Finding, Integrity, LsnSequence, TaskAudit};
use sendledger_core::{CheckConfig, Event, TaskId};

use crate::envelope::decode_event;
use crate::error::Result;
use crate::keys::*;
use crate::ledger::{Ledger, TaskSummary};

/// How often `progress` is called, in events.
const PROGRESS_EVERY: u64 = 100_000;

/// A task between its first event and its last.
struct Open {
    audit: TaskAudit,
    /// `None` until looked up (in batches); then the stored summary, if there is one.
    summary: Option<Option<TaskSummary>>,
    last_lsn: u64,
}

impl Open {
    /// Has every event its summary announces.
    fn complete(&self) -> bool {
        matches!(self.summary, Some(Some(s)) if self.audit.state().next_seq >= s.next_seq)
    }
}

/// Count and wrapping sum of the hashes of `(task, seq, lsn)`: equal for two sets of entries
/// when they hold the same entries (up to a 2^-64 chance).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    count: u64,
    sum: u64,
}

impl Fingerprint {
    fn add(&mut self, task: &[u8; 16], seq: u32, lsn: u64) {
        let a = u64::from_le_bytes(task[..8].try_into().expect("8 bytes"));
        let b = u64::from_le_bytes(task[8..].try_into().expect("8 bytes"));
        let h = mix(mix(mix(a) ^ b) ^ u64::from(seq)) ^ lsn;
        self.count += 1;
        self.sum = self.sum.wrapping_add(mix(h));
    }
}

/// SplitMix64's finalizer.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn scan_options() -> ReadOptions {
    let mut opts = ReadOptions::default();
    // A full scan: read ahead, and keep its blocks out of the cache (nothing reads them again).
    opts.set_readahead_size(8 << 20);
    opts.fill_cache(false);
    opts
}

/// Replays the ledger. `progress` is called with the number of log entries read so far.
///
/// `config` is what the checker knows of the targets' configuration.
pub fn audit(
    ledger: &Ledger,
    config: CheckConfig,
    mut progress: impl FnMut(u64),
) -> Result<AuditReport> {
    let mut report = AuditReport {
        source: format!("ledger {}", ledger.path().display()),
        last_lsn: ledger.last_lsn(),
        ..AuditReport::default()
    };
    let (tx, rx) = mpsc::sync_channel::<Batch>(4);
    let (read, index_print) = std::thread::scope(|s| {
        let reader = s.spawn(|| read_log(ledger, tx));
        let index = s.spawn(|| index_fingerprint(ledger));
        let checked = check_tasks(ledger, config, rx, &mut report, &mut progress);
        let read = reader.join().expect("the log reader does not panic");
        let index = index.join().expect("the index scan does not panic");
        checked?;
        Ok::<_, crate::Error>((read?, index?))
    })?;
    report.events = read.entries;
    // Damage to the log first, then what the tasks broke.
    report.violations.splice(0..0, read.findings);
    if read.print != index_print || !read.undecodable.is_empty() {
        compare_index(ledger, read.print, &read.undecodable, &mut report)?;
    }
    Ok(report)
}

/// Decoded events in LSN order, and how many log entries were read up to them.
struct Batch {
    events: Vec<Event>,
    entries: u64,
}

/// What the log reader found besides the events.
struct Read {
    entries: u64,
    print: Fingerprint,
    undecodable: Vec<u64>,
    findings: Vec<Finding>,
}

const BATCH: usize = 4096;

/// Reads and decodes the log in LSN order (its own thread, so decoding and checking overlap).
fn read_log(ledger: &Ledger, tx: mpsc::SyncSender<Batch>) -> Result<Read> {
    let mut scratch = AuditReport::default();
    let mut lsns = LsnSequence::default();
    let mut read = Read {
        entries: 0,
        print: Fingerprint::default(),
        undecodable: Vec::new(),
        findings: Vec::new(),
    };
    let mut events = Vec::with_capacity(BATCH);
    let mut it = ledger
        .db()
        .raw_iterator_cf_opt(ledger.cf(CF_LOG), scan_options());
    it.seek_to_first();
    while let (Some(k), Some(v)) = (it.key(), it.value()) {
        read.entries += 1;
        match decode_u64(k) {
            None => read.findings.push(Finding::integrity(
                Integrity::EventDecodable,
                None,
                vec![],
                format!("malformed log key {k:02x?}"),
            )),
            Some(lsn) => {
                lsns.push(lsn, &mut scratch);
                match decode_event(lsn, v) {
                    Ok(event) => {
                        read.print.add(&event.task_id.0, event.task_seq, lsn);
                        events.push(event);
                    }
                    Err(_) => read.undecodable.push(lsn),
                }
            }
        }
        if events.len() == BATCH {
            let batch = Batch {
                events: std::mem::replace(&mut events, Vec::with_capacity(BATCH)),
                entries: read.entries,
            };
            if tx.send(batch).is_err() {
                break; // the checker stopped on an error of its own
            }
        }
        it.next();
    }
    it.status()?;
    let _ = tx.send(Batch {
        events,
        entries: read.entries,
    });
    read.findings.append(&mut scratch.violations);
    Ok(read)
}

/// Feeds every event to its open task, closing tasks as they complete.
fn check_tasks(
    ledger: &Ledger,
    config: CheckConfig,
    rx: mpsc::Receiver<Batch>,
    report: &mut AuditReport,
    progress: &mut impl FnMut(u64),
) -> Result<()> {
    let mut open: HashMap<TaskId, Open> = HashMap::new();
    // Opened tasks whose summary is not looked up yet.
    let mut unresolved: Vec<TaskId> = Vec::new();
    let mut reported = 0;
    for batch in rx {
        for event in &batch.events {
            let task = event.task_id;
            let entry = match open.entry(task) {
                Entry::Occupied(o) => o.into_mut(),
                Entry::Vacant(v) => {
                    unresolved.push(task);
                    v.insert(reopen(ledger, config, event)?)
                }
            };
            entry.audit.push(event, report);
            entry.last_lsn = event.lsn;
            if entry.complete() {
                let done = open.remove(&task).expect("present");
                close(task, done, report);
            }
        }
        resolve_summaries(ledger, &mut unresolved, &mut open, report)?;
        if batch.entries / PROGRESS_EVERY > reported {
            reported = batch.entries / PROGRESS_EVERY;
            progress(batch.entries);
        }
    }
    // Tasks with fewer events than their summary says, or without a summary.
    let mut rest: Vec<_> = open.into_iter().collect();
    rest.sort_unstable_by_key(|(task, _)| *task);
    for (task, done) in rest {
        close(task, done, report);
    }
    Ok(())
}

/// Looks up the summaries of newly opened tasks in one batched read, and closes those that
/// turn out complete.
fn resolve_summaries(
    ledger: &Ledger,
    unresolved: &mut Vec<TaskId>,
    open: &mut HashMap<TaskId, Open>,
    report: &mut AuditReport,
) -> Result<()> {
    unresolved.retain(|t| open.contains_key(t));
    unresolved.sort_unstable();
    let keys: Vec<&[u8]> = unresolved.iter().map(|t| &t.0[..]).collect();
    let values = ledger
        .db()
        .batched_multi_get_cf(ledger.cf(CF_TASKS), keys, true);
    for (task, value) in unresolved.drain(..).zip(values) {
        let summary = value?.and_then(|v| TaskSummary::decode(&v).ok());
        let entry = open.get_mut(&task).expect("retained above");
        entry.summary = Some(summary);
        if entry.complete() {
            let done = open.remove(&task).expect("present");
            close(task, done, report);
        }
    }
    Ok(())
}

/// Opens a task at `event`: its summary, and its earlier events when `event` is not its first
/// (they were checked and counted already, so they are folded in silently).
fn reopen(ledger: &Ledger, config: CheckConfig, event: &Event) -> Result<Open> {
    let mut audit = TaskAudit::new(event.task_id, config);
    if event.task_seq > 0 {
        let mut scratch = AuditReport::default();
        for earlier in events_before(ledger, event.task_id, event.lsn)? {
            audit.push(&earlier, &mut scratch);
        }
    }
    Ok(Open {
        audit,
        summary: None,
        last_lsn: event.lsn,
    })
}

/// The task's events before `lsn` that are in the index and decode (what does not is reported
/// elsewhere).
fn events_before(ledger: &Ledger, task: TaskId, lsn: u64) -> Result<Vec<Event>> {
    let db = ledger.db();
    let start = task_event_key(task, 0);
    let mut lsns = Vec::new();
    for item in db.iterator_cf(
        ledger.cf(CF_TASK_EVENTS),
        IteratorMode::From(&start, Direction::Forward),
    ) {
        let (k, v) = item?;
        if k[..16] != task.0 {
            break;
        }
        lsns.extend(decode_u64(&v).filter(|l| *l < lsn));
    }
    let log = ledger.cf(CF_LOG);
    let values = db.multi_get_cf(lsns.iter().map(|l| (log, lsn_key(*l))));
    let mut events = Vec::with_capacity(lsns.len());
    for (value, lsn) in values.into_iter().zip(lsns) {
        if let Some(event) = value?.and_then(|bytes| decode_event(lsn, &bytes).ok()) {
            events.push(event);
        }
    }
    Ok(events)
}

fn close(task: TaskId, done: Open, report: &mut AuditReport) {
    let summary = done.summary.flatten();
    let state = done.audit.finish(report);
    if summary.is_some_and(|s| s.phase == state.phase && s.next_seq == state.next_seq) {
        return;
    }
    report.violations.push(Finding::integrity(
        Integrity::IndexConsistent,
        Some(task),
        vec![done.last_lsn],
        format!(
            "task summary {} disagrees with the fold of its events ({} after {} events)",
            summary.map_or("missing".into(), |s| format!(
                "({}, {} events)",
                s.phase.name(),
                s.next_seq
            )),
            state.phase.name(),
            state.next_seq
        ),
    ));
}

/// The fingerprint of the per-task index.
fn index_fingerprint(ledger: &Ledger) -> Result<Fingerprint> {
    let mut print = Fingerprint::default();
    let mut it = ledger
        .db()
        .raw_iterator_cf_opt(ledger.cf(CF_TASK_EVENTS), scan_options());
    it.seek_to_first();
    while let (Some(k), Some(v)) = (it.key(), it.value()) {
        match (decode_task_event_key(k), decode_u64(v)) {
            (Some((task, seq)), Some(lsn)) => print.add(&task.0, seq, lsn),
            // Counted apart, so that a malformed entry always makes the prints differ.
            _ => print.count += 1 << 32,
        }
        it.next();
    }
    it.status()?;
    Ok(print)
}

/// The slow comparison, when the fingerprints differ: every index entry is looked up in the
/// log. Also names the task of each undecodable event that the index knows.
fn compare_index(
    ledger: &Ledger,
    log_print: Fingerprint,
    undecodable: &[u64],
    report: &mut AuditReport,
) -> Result<()> {
    let db = ledger.db();
    let log = ledger.cf(CF_LOG);
    let mut matching = 0u64;
    let mut attributed = Vec::new();
    for item in db.iterator_cf(ledger.cf(CF_TASK_EVENTS), IteratorMode::Start) {
        let (k, v) = item?;
        let (Some((task, seq)), Some(lsn)) = (decode_task_event_key(&k), decode_u64(&v)) else {
            report.violations.push(Finding::integrity(
                Integrity::IndexConsistent,
                None,
                vec![],
                format!("malformed task_events entry {k:02x?}"),
            ));
            continue;
        };
        let problem = match db.get_cf(log, lsn_key(lsn))? {
            None => "indexed event missing from the log".to_string(),
            Some(bytes) => match decode_event(lsn, &bytes) {
                Err(e) => {
                    attributed.push(lsn);
                    report.violations.push(Finding::integrity(
                        Integrity::EventDecodable,
                        Some(task),
                        vec![lsn],
                        format!("event {seq} of the task: {e}"),
                    ));
                    continue;
                }
                Ok(e) if e.task_id == task && e.task_seq == seq => {
                    matching += 1;
                    continue;
                }
                Ok(e) => format!(
                    "index entry for event {seq} points to event {} of task {}",
                    e.task_seq, e.task_id
                ),
            },
        };
        report.violations.push(Finding::integrity(
            Integrity::IndexConsistent,
            Some(task),
            vec![lsn],
            problem,
        ));
    }
    for &lsn in undecodable.iter().filter(|l| !attributed.contains(l)) {
        let detail = match db.get_cf(log, lsn_key(lsn))? {
            Some(bytes) => decode_event(lsn, &bytes)
                .err()
                .map_or("undecodable".into(), |e| e.to_string()),
            None => "undecodable".into(),
        };
        report.violations.push(Finding::integrity(
            Integrity::EventDecodable,
            None,
            vec![lsn],
            format!("{detail} (no index entry names its task)"),
        ));
    }
    if matching < log_print.count {
        report.violations.push(Finding::integrity(
            Integrity::IndexConsistent,
            None,
            vec![],
            format!(
                "{} events of the log are not in the task index",
                log_print.count - matching
            ),
        ));
    }
    Ok(())
}
