//! The group-commit journal: the one writer of the ledger.
//!
//! Callers submit an [`Append`] and wait for its acknowledgement (async or blocking). The
//! journal thread takes every append that is pending, writes them all in one `WriteBatch`
//! (with `sync = true` unless durability is `buffered`), assigns LSNs in commit order, and only
//! then acknowledges each caller with the LSNs of its events. Many tasks share one fsync.
//!
//! Metrics (through the `metrics` facade; the binary installs the exporter):
//! `sendledger_journal_batch_appends` (appends per write batch) and
//! `sendledger_journal_fsync_seconds` (time of each batch write, its fsync included with `sync`
//! durability), both histograms.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use rocksdb::{WriteBatch, WriteOptions, DB};
use sendledger_core::{Identity, NewEvent, PayloadHash, TaskId};
use tokio::sync::oneshot;

use crate::envelope::encode_event;
use crate::error::{Error, Result};
use crate::keys::*;
use crate::ledger::TaskSummary;

/// Everything that must become durable atomically with a set of events.
#[derive(Debug, Default, Clone)]
pub struct Append {
    /// Events in order; the journal gives them contiguous LSNs.
    pub events: Vec<NewEvent>,
    /// New summaries of the tasks the events belong to.
    pub tasks: Vec<(TaskId, TaskSummary)>,
    /// First acceptances: identity → task and payload hash.
    pub identities: Vec<(Identity, TaskId, PayloadHash)>,
    /// Offsets of the requests-topic messages these events record: (topic, partition,
    /// offset). Each is marked processed atomically with the events.
    pub offsets: Vec<(String, i32, i64)>,
    /// Watermarks to raise: (topic, partition, offset) says every offset up to and including
    /// `offset` is processed; the markers it covers are removed.
    pub offset_watermarks: Vec<(String, i32, i64)>,
    /// Timers removed, then timers set: (due at ms, task).
    pub clear_timers: Vec<(u64, TaskId)>,
    pub set_timers: Vec<(u64, TaskId, TimerKind)>,
    /// Named cursors (e.g. the publisher's last delivered LSN).
    pub cursors: Vec<(String, u64)>,
}

/// Why a timer was set.
// format: do not change (stored as one byte)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimerKind {
    Retry = 1,
    Check = 2,
}

impl TimerKind {
    pub fn from_byte(b: u8) -> Option<TimerKind> {
        match b {
            1 => Some(TimerKind::Retry),
            2 => Some(TimerKind::Check),
            _ => None,
        }
    }
}

/// Counters of the journal since the ledger was opened.
#[derive(Debug, Default)]
pub struct JournalStats {
    /// Appends acknowledged.
    pub appends: AtomicU64,
    /// Events written.
    pub events: AtomicU64,
    /// Write batches (one fsync each with `sync` durability).
    pub batches: AtomicU64,
    /// Total time spent in batch writes, in microseconds.
    pub write_micros: AtomicU64,
    /// Batch writes that failed (nothing of them recorded).
    pub write_failures: AtomicU64,
    /// Why the last batch write failed, until one succeeds again (a full disk, an I/O error).
    pub failing: std::sync::Mutex<Option<String>>,
}

impl JournalStats {
    /// Why the ledger cannot write now, if it cannot.
    pub fn failing(&self) -> Option<String> {
        self.failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_failing(&self, why: Option<String>) {
        *self.failing.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }
}

pub(crate) struct Request {
    pub append: Append,
    pub ack: oneshot::Sender<Result<Range<u64>>>,
}

/// Most appends one batch takes; the rest wait for the next batch.
const MAX_BATCH: usize = 4096;

pub(crate) fn run(
    db: Arc<DB>,
    sync: bool,
    rx: mpsc::Receiver<Request>,
    last_lsn: Arc<AtomicU64>,
    stats: Arc<JournalStats>,
) {
    let mut write_opts = WriteOptions::default();
    write_opts.set_sync(sync);
    let mut next_lsn = last_lsn.load(Ordering::SeqCst) + 1;
    let mut pending = Vec::with_capacity(MAX_BATCH);
    while let Ok(first) = rx.recv() {
        pending.push(first);
        while pending.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(req) => pending.push(req),
                Err(_) => break,
            }
        }
        let started = std::time::Instant::now();
        let (batch, ranges) = build_batch(&db, next_lsn, &pending);
        let events = ranges.last().map_or(0, |r| r.end - next_lsn);
        let write_started = std::time::Instant::now();
        match db.write_opt(batch, &write_opts) {
            Ok(()) => {
                metrics::histogram!("sendledger_journal_fsync_seconds")
                    .record(write_started.elapsed().as_secs_f64());
                metrics::histogram!("sendledger_journal_batch_appends")
                    .record(pending.len() as f64);
                next_lsn += events;
                last_lsn.store(next_lsn - 1, Ordering::SeqCst);
                stats.batches.fetch_add(1, Ordering::Relaxed);
                if stats.write_failures.load(Ordering::Relaxed) > 0 {
                    stats.set_failing(None);
                }
                stats.events.fetch_add(events, Ordering::Relaxed);
                stats
                    .appends
                    .fetch_add(pending.len() as u64, Ordering::Relaxed);
                stats
                    .write_micros
                    .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                for (req, range) in pending.drain(..).zip(ranges) {
                    // A caller that stopped waiting still has its append durable.
                    let _ = req.ack.send(Ok(range));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, appends = pending.len(), "ledger write failed; appends not recorded, nothing is sent or acknowledged until writes succeed (a full disk: free space, then restart)");
                stats.write_failures.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("sendledger_ledger_write_failures_total").increment(1);
                stats.set_failing(Some(e.to_string()));
                for req in pending.drain(..) {
                    let _ = req.ack.send(Err(Error::Rocks(e.clone())));
                }
            }
        }
    }
}

fn build_batch(db: &DB, first_lsn: u64, pending: &[Request]) -> (WriteBatch, Vec<Range<u64>>) {
    let cf = |name| {
        db.cf_handle(name)
            .expect("column families are created at open")
    };
    let (log, task_events, tasks, identity, offsets, timers, cursors) = (
        cf(CF_LOG),
        cf(CF_TASK_EVENTS),
        cf(CF_TASKS),
        cf(CF_IDENTITY),
        cf(CF_OFFSETS),
        cf(CF_TIMERS),
        cf(CF_CURSORS),
    );
    let mut batch = WriteBatch::default();
    let mut ranges = Vec::with_capacity(pending.len());
    let mut lsn = first_lsn;
    for req in pending {
        let a = &req.append;
        let start = lsn;
        for ev in &a.events {
            let event = ev.clone().with_lsn(lsn);
            batch.put_cf(log, lsn_key(lsn), encode_event(&event));
            batch.put_cf(
                task_events,
                task_event_key(ev.task_id, ev.task_seq),
                lsn_key(lsn),
            );
            lsn += 1;
        }
        for (task, summary) in &a.tasks {
            batch.put_cf(tasks, task.0, summary.encode());
        }
        for (id, task, hash) in &a.identities {
            let mut v = Vec::with_capacity(48);
            v.extend_from_slice(&task.0);
            v.extend_from_slice(&hash.0);
            batch.put_cf(identity, identity_key(id), v);
        }
        for (topic, partition, offset) in &a.offsets {
            batch.put_cf(offsets, offset_marker_key(topic, *partition, *offset), []);
        }
        for (topic, partition, offset) in &a.offset_watermarks {
            batch.put_cf(offsets, offset_key(topic, *partition), offset.to_be_bytes());
            let from = offset_marker_key(topic, *partition, 0);
            batch.delete_range_cf(
                offsets,
                from,
                offset_marker_key(topic, *partition, offset.saturating_add(1)),
            );
        }
        for (due, task) in &a.clear_timers {
            batch.delete_cf(timers, timer_key(*due, *task));
        }
        for (due, task, kind) in &a.set_timers {
            batch.put_cf(timers, timer_key(*due, *task), [*kind as u8]);
        }
        for (name, value) in &a.cursors {
            batch.put_cf(cursors, name.as_bytes(), value.to_be_bytes());
        }
        ranges.push(start..lsn);
    }
    (batch, ranges)
}
