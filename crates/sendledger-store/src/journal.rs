//! The group-commit journal: the one writer of the ledger.
//!
//! Callers submit an [`Append`] and wait for its acknowledgement (async or blocking). The
//! journal thread takes every append that is pending, writes them all in one `WriteBatch`
//! (with `sync = true` unless durability is `buffered`), assigns LSNs in commit order, and only
//! then acknowledges each caller with the LSNs of its events. Many tasks share one fsync.
//! In kafka mode an append with events is written only after its requests partition's
//! transaction took them (see [`Replicator`]); partitions do not wait for each other.
//!
//! Metrics (through the `metrics` facade; the binary installs the exporter):
//! `sendledger_journal_batch_appends` (appends per write batch) and
//! `sendledger_journal_fsync_seconds` (time of each batch write, its fsync included with `sync`
//! durability), both histograms.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::Receiver;
use rocksdb::{ColumnFamily, WriteBatch, WriteOptions, DB};
use sendledger_core::error::Chain;
use sendledger_core::{Event, EventBody, Identity, NewEvent, PayloadHash, State, TaskId};
use tokio::sync::oneshot;

use crate::diverged::Diverged;
use crate::envelope::encode_new_event;
use crate::error::{cause, Cause, Error, Result};
use crate::keys::*;
use crate::retention::Removal;
use crate::summary::TaskSummary;
use crate::task_index::IndexEntry;

/// Everything that must become durable atomically with a set of events.
#[derive(Debug, Default, Clone)]
pub struct Append {
    /// Events in order; the journal gives them contiguous LSNs.
    pub events: Vec<NewEvent>,
    /// New summaries of the tasks the events belong to.
    pub tasks: Vec<(TaskId, TaskSummary)>,
    /// First acceptances of requests that name no version: identity → task and payload hash.
    pub identities: Vec<(Identity, TaskId, PayloadHash)>,
    /// Acceptances of versions above 0: the identity's latest version, its task and payload
    /// hash (its [`version_key`] entry).
    pub versions: Vec<(Identity, u32, TaskId, PayloadHash)>,
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
    /// The requests partition of the tasks' requests: the `unsettled` index lists a new task
    /// under it, and in kafka mode that partition's log of record carries the events.
    pub partition: Option<i32>,
    /// Kafka mode: the events were read from the log of record (a restore), so they are
    /// recorded without being written to it again; `cursors` carries the checkpoint.
    pub restored: bool,
    /// Kafka mode, a restore: tasks whose events in the ledger from this sequence number on
    /// differ from the log of record's. The index forgets them (before `events` are indexed);
    /// the log's events replace them.
    pub truncate_tasks: Vec<(TaskId, u32)>,
    /// Kafka mode, a restore: tasks truncated to no event at all (their log never held them):
    /// their summaries and listings go too.
    pub forget_tasks: Vec<TaskId>,
    /// Kafka mode, a restore: reviews owed for the tasks whose history here the log's
    /// replaced, by requests partition, kept until the review is recorded (the replaced
    /// events exist nowhere else).
    pub reviews_owed: Vec<(i32, Diverged)>,
    /// Reviews owed that are recorded now: (requests partition, task).
    pub reviews_recorded: Vec<(i32, TaskId)>,
    /// Task index moves: (task, its entry before these events, after them); see
    /// [`Append::reindex`].
    pub index: Vec<(TaskId, Option<IndexEntry>, Option<IndexEntry>)>,
    /// Kafka mode, with `partition` and no events: a turn in the partition's transactions, so
    /// its done requests offsets are committed even when no events come to carry them (every
    /// delivery dropped as already processed).
    pub commit_offsets: bool,
    /// Settled tasks whose history retention removes ([`crate::retention`]): planned by each
    /// task's writer with [`crate::Ledger::prune_plan`].
    pub prune: Vec<crate::retention::Prune>,
    /// Removed tasks whose identity is forgotten (`storage.identity_retention`): planned by
    /// each task's writer with [`crate::Ledger::forget_plan`].
    pub forget: Vec<crate::retention::Forget>,
}

impl Append {
    /// Moves `task`'s index entry from what `before` says to what `after` says, when they
    /// differ.
    pub fn reindex(&mut self, task: TaskId, before: &State, after: &State) {
        // What an entry is made of, compared first: most decisions change none of it, and
        // building the entries copies the target's name.
        let same = |s: &State| {
            let listed = s.request.is_some() && (!s.pruned || s.recorded_since_pruned());
            (listed, s.phase, s.phase_since, s.failure_kind)
        };
        if same(before) == same(after) {
            return;
        }
        let (old, new) = (IndexEntry::of(before), IndexEntry::of(after));
        if old != new {
            self.index.push((task, old, new));
        }
    }
}

/// Kafka mode's log of record as the journal sees it: before the ledger records a partition's
/// appends, their events are made durable there (the Kafka crate implements it). Each call
/// runs on a thread of its own, one at a time per partition, partitions in parallel.
pub trait Replicator: Send + Sync {
    /// The generation of requests partition `partition`'s log here: it changes each time the
    /// partition is taken over (its log opened anew), and is `None` while the partition is not
    /// owned here. An append carries the generation it was made in; one made in an earlier
    /// generation is refused, since the partition's tasks were resumed from the log since.
    fn generation(&self, partition: i32) -> Option<u64>;

    /// Makes `events` (of requests partition `partition`, in order) durable in its log of
    /// generation `generation` (refused as lost when the partition's log is of another one),
    /// and returns where they landed (the checkpoint recorded with them), `None` when nothing
    /// was written to the log. `history` reads the events the ledger holds for a task, those
    /// before `events`.
    fn replicate(
        &self,
        partition: i32,
        generation: u64,
        events: &[NewEvent],
        history: &dyn Fn(TaskId) -> Result<Vec<Event>>,
    ) -> std::result::Result<Option<Logged>, Replication>;

    /// Events `replicate` committed for partition `partition` could not be written to the
    /// ledger: the partition's copy here lacks committed events, so it must be given up and
    /// taken over again (restored from the log) before any of its tasks decides again.
    fn unrecorded(&self, partition: i32);
}

/// Why a partition's events were not made durable, with its cause.
#[derive(Debug, Clone)]
pub enum Replication {
    /// Not now (the brokers unreachable, a transaction aborted): the appends may be tried again.
    Failed(Cause),
    /// The partition belongs to another instance now: nothing more for its tasks here.
    Lost(Cause),
}

/// The cursor holding the checkpoint of requests partition `partition`'s log of record: the
/// events-topic offset to read from to catch up.
pub fn log_checkpoint(partition: i32) -> String {
    format!("{LOG_CHECKPOINTS}{partition}")
}

/// The prefix of every log checkpoint's cursor name.
// format: do not change
pub(crate) const LOG_CHECKPOINTS: &str = "log-of-record/";

/// The cursor holding the events-topic offset of the first event of the last transaction the
/// ledger holds of requests partition `partition`'s log (written with the checkpoint): a
/// take-over reads the log from there, so that it sees that transaction whole even when the
/// copy is current.
pub fn log_tail(partition: i32) -> String {
    format!("{LOG_TAILS}{partition}")
}

/// The prefix of every log tail's cursor name.
// format: do not change
const LOG_TAILS: &str = "log-tail/";

/// Where events recorded from a partition's log of record are in it: the offset of the first
/// event of the last transaction among them, and the position after the last event (the
/// checkpoint: the offset before it is an event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Logged {
    pub first: i64,
    pub next: i64,
}

impl Logged {
    /// The cursors recording this position of requests partition `partition`'s log.
    pub(crate) fn cursors(self, partition: i32) -> [(String, u64); 2] {
        [
            (log_checkpoint(partition), self.next.max(0) as u64),
            (
                log_tail(partition),
                self.first.clamp(0, self.next.max(0)) as u64,
            ),
        ]
    }
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

/// Kafka mode: a partition whose transaction has been under way this long is taken for
/// stalled (a commit takes milliseconds): its tasks take no room at their targets, and its
/// requests pause at their share of the in-flight budget, until it ends.
pub const TRANSACTION_STALLED: std::time::Duration = std::time::Duration::from_millis(500);

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
    /// Kafka mode: since when each requests partition's transaction under way has been.
    transactions: std::sync::Mutex<BTreeMap<i32, std::time::Instant>>,
}

impl JournalStats {
    /// Why the ledger cannot write now, if it cannot.
    pub fn failing(&self) -> Option<String> {
        self.failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Kafka mode: whether requests partition `partition`'s transaction under way has been so
    /// for [`TRANSACTION_STALLED`] or longer (its commits hang).
    pub fn transaction_stalled(&self, partition: i32) -> bool {
        let transactions = self.transactions.lock().unwrap_or_else(|e| e.into_inner());
        (transactions.get(&partition)).is_some_and(|since| since.elapsed() >= TRANSACTION_STALLED)
    }

    /// Whether a transaction of partition `partition` is under way: written, or finished and
    /// not yet settled by the journal.
    pub fn transaction_under_way(&self, partition: i32) -> bool {
        let transactions = self.transactions.lock().unwrap_or_else(|e| e.into_inner());
        transactions.contains_key(&partition)
    }

    fn transaction(&self, partition: i32, under_way: bool) {
        let mut transactions = self.transactions.lock().unwrap_or_else(|e| e.into_inner());
        match under_way {
            true => transactions.insert(partition, std::time::Instant::now()),
            false => transactions.remove(&partition),
        };
    }

    fn set_failing(&self, why: Option<String>) {
        *self.failing.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }
}

pub(crate) struct Request {
    pub append: Append,
    pub ack: oneshot::Sender<Result<Range<u64>>>,
    /// Kafka mode: the generation of the append's partition when it was made (see
    /// [`Replicator::generation`]).
    pub generation: Option<u64>,
}

/// Most appends one batch takes; the rest wait for the next batch.
const MAX_BATCH: usize = 4096;

/// Kafka mode's replicator, once installed ([`crate::Ledger::install_replicator`]).
pub(crate) type ReplicatorSlot = Arc<std::sync::OnceLock<Arc<dyn Replicator>>>;

pub(crate) fn run(
    db: Arc<DB>,
    sync: bool,
    archive: Option<std::path::PathBuf>,
    replicated: Option<ReplicatorSlot>,
    rx: Receiver<Request>,
    last_lsn: Arc<AtomicU64>,
    stats: Arc<JournalStats>,
) {
    let mut write_opts = WriteOptions::default();
    write_opts.set_sync(sync);
    let next_lsn = last_lsn.load(Ordering::SeqCst) + 1;
    let mut writer = Writer {
        db,
        write_opts,
        unsynced: WriteOptions::default(),
        next_lsn,
        last_lsn,
        stats,
        archive: archive.map(crate::archive::Writer::new),
    };
    match replicated {
        None => {
            let mut pending = Vec::with_capacity(MAX_BATCH);
            while let Ok(first) = rx.recv() {
                pending.push(first);
                pending.extend(rx.try_iter().take(MAX_BATCH - 1));
                writer.write(&mut pending, None);
            }
        }
        Some(slot) => run_replicated(writer, &slot, rx),
    }
}

/// The ledger's writes: LSNs in commit order, stats, acknowledgements.
struct Writer {
    db: Arc<DB>,
    write_opts: WriteOptions,
    /// For restores (see [`run_replicated`]).
    unsynced: WriteOptions,
    next_lsn: u64,
    last_lsn: Arc<AtomicU64>,
    stats: Arc<JournalStats>,
    /// Where retention's removals are archived before they are written (`storage.archive`).
    archive: Option<crate::archive::Writer>,
}

impl Writer {
    /// Writes every append of `pending` in one batch and answers each (drained either way).
    /// Writes `pending` in one batch and answers each. Kafka mode: when the write fails, the
    /// partitions of the failed appends whose events were replicated (committed to their log,
    /// which the ledger now lacks) are given up through `replicator` before anyone is answered:
    /// a task must not decide again from this copy (it would reuse a sequence number the log
    /// has).
    fn write(&mut self, pending: &mut Vec<Request>, replicator: Option<&dyn Replicator>) {
        self.write_with(pending, replicator, true);
    }

    /// [`Writer::write`], synced as the ledger's durability says (`synced`) or not at all.
    fn write_with(
        &mut self,
        pending: &mut Vec<Request>,
        replicator: Option<&dyn Replicator>,
        synced: bool,
    ) {
        if pending.is_empty() {
            return;
        }
        let started = std::time::Instant::now();
        let removal = self.plan_removal(pending);
        if pending.is_empty() {
            return;
        }
        let stats = &self.stats;
        let (batch, ranges) = build_batch(&self.db, self.next_lsn, pending, removal.as_ref());
        let events = ranges.last().map_or(0, |r| r.end - self.next_lsn);
        let write_started = std::time::Instant::now();
        let opts = if synced {
            &self.write_opts
        } else {
            &self.unsynced
        };
        match self.db.write_opt(batch, opts) {
            Ok(()) => {
                metrics::histogram!(crate::metric_definitions::JOURNAL_FSYNC_SECONDS)
                    .record(write_started.elapsed().as_secs_f64());
                metrics::histogram!(crate::metric_definitions::JOURNAL_BATCH_APPENDS)
                    .record(pending.len() as f64);
                self.next_lsn += events;
                self.last_lsn.store(self.next_lsn - 1, Ordering::SeqCst);
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
                metrics::counter!(crate::metric_definitions::LEDGER_WRITE_FAILURES_TOTAL)
                    .increment(1);
                stats.set_failing(Some(e.to_string()));
                if let Some(replicator) = replicator {
                    let unrecorded: BTreeSet<i32> = pending
                        .iter()
                        .filter(|r| r.generation.is_some() && !r.append.restored)
                        .filter(|r| !r.append.events.is_empty())
                        .filter_map(|r| r.append.partition)
                        .collect();
                    for partition in unrecorded {
                        tracing::error!(partition, "events committed to the partition's log could not be written to the ledger; the partition is taken over again from its log");
                        replicator.unrecorded(partition);
                    }
                }
                for req in pending.drain(..) {
                    let _ = req.ack.send(Err(Error::Rocks(e.clone())));
                }
            }
        }
    }
}

impl Writer {
    /// Plans the removals and forgettings of `pending` ([`crate::retention`]) and archives
    /// them. When either fails, the appends that carry them are answered with the error and
    /// taken out of `pending` (nothing of them is written; retention tries again later).
    fn plan_removal(&mut self, pending: &mut Vec<Request>) -> Option<Removal> {
        let removes = |r: &Request| !r.append.prune.is_empty() || !r.append.forget.is_empty();
        if !pending.iter().any(removes) {
            return None;
        }
        // A removal planned from a history that changed since is answered as such.
        let (current, outdated): (Vec<_>, Vec<_>) = pending
            .drain(..)
            .map(|r| match removes(&r) {
                true => (check_planned(&self.db, &r.append), r),
                false => (Ok(()), r),
            })
            .partition(|(checked, _)| checked.is_ok());
        pending.extend(current.into_iter().map(|(_, r)| r));
        for (checked, req) in outdated {
            let _ = req.ack.send(checked.map(|()| 0..0));
        }
        if !pending.iter().any(removes) {
            return None;
        }
        let prunes: Vec<_> = pending.iter().flat_map(|r| &r.append.prune).collect();
        let forgets: Vec<_> = pending.iter().flat_map(|r| &r.append.forget).collect();
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let planned = Removal::plan(&self.db, &prunes, &forgets, at)
            .map_err(|e| crate::error::cause(Chain(&e).to_string()));
        let archived = planned.and_then(|removal| match &mut self.archive {
            Some(archive) => archive.append(&removal).map(|()| removal).map_err(|e| {
                crate::error::cause(format!("archiving in {}: {e}", archive.dir().display()))
            }),
            None => Ok(removal),
        });
        match archived {
            Ok(removal) => Some(removal),
            Err(source) => {
                tracing::error!(error = %source, "retention's removals could not be archived or planned; the tasks are kept and tried again at the next pass");
                let (failed, kept): (Vec<_>, Vec<_>) = pending.drain(..).partition(removes);
                pending.extend(kept);
                for req in failed {
                    let _ = req.ack.send(Err(Error::Removal {
                        source: source.clone(),
                    }));
                }
                None
            }
        }
    }
}

/// Refuses the removals and forgettings of `append` unless each was planned from what the
/// ledger holds of its task now: the same events (by LSN) and the same kept value. A task's
/// writer plans them before the journal writes them; in kafka mode a copy of a partition owned
/// elsewhere is written by its restore too, which may record events of the task in between.
fn check_planned(db: &DB, append: &crate::Append) -> Result<()> {
    // Events the same write truncates are not the removal's (a snapshot's install).
    let truncated: std::collections::HashMap<TaskId, u32> =
        append.truncate_tasks.iter().copied().collect();
    let planned = (append.prune.iter())
        .map(|p| (p.task, &p.events, p.replaces.as_deref()))
        .chain((append.forget.iter()).map(|f| (f.task, &f.events, Some(f.retained.as_slice()))));
    for (task, events, retained) in planned {
        let outdated = || Error::RemovalOutdated {
            task: task.to_string(),
        };
        let from = truncated.get(&task).copied();
        // A snapshot's install of a task the ledger did not hold: only the copy's restore
        // records such a task, and it plans and writes its steps one after the other, while
        // a task's actor plans removals only of tasks with events. Nothing can come between;
        // not reading the task spares a take-over's install a fifth of its time.
        if events.is_empty() && retained.is_none() && from.is_none() {
            continue;
        }
        // One over a task it held, whose events this write truncates: what retention kept of
        // it must be what the install replaces (an actor may have removed its history since).
        if events.is_empty() && from == Some(0) {
            if crate::retention::retained_value(db, task)?.as_deref() != retained {
                return Err(outdated());
            }
            continue;
        }
        let now = crate::reads::task_stored(db, task)?;
        let held = (now.events.iter().zip(&now.seqs))
            .filter(|(_, seq)| from.is_none_or(|from| **seq < from))
            .map(|((lsn, _), _)| *lsn);
        if !held.eq(events.iter().map(|(lsn, _)| *lsn)) || now.retained.as_deref() != retained {
            return Err(outdated());
        }
    }
    Ok(())
}

/// One partition's transaction, finished: its appends and what became of their events.
struct Replicated {
    partition: i32,
    members: Vec<Request>,
    outcome: std::result::Result<Option<Logged>, Replication>,
}

/// Kafka mode. The events of each requests partition are made durable in its log before the
/// ledger records them, one transaction at a time per partition and partitions independently:
/// the appends of a partition whose transaction is under way wait for it and then go together
/// in the next one, while every other partition goes on (a partition whose commit hangs holds
/// up only its own tasks). A partition's appends are recorded in the order they arrived, and
/// its next transaction starts only once the last one's events are in the ledger, since the
/// replicator reads the tasks' earlier events from it. Appends without events and restored
/// ones are recorded at once: every writer waits for its previous append's acknowledgement,
/// so none of them has to be ordered after another's transaction.
///
/// Restored appends (a take-over's restore steps, each up to thousands of events) are written
/// in a batch of their own, after the other appends of the turn are acknowledged, and not
/// synced: they are what the log of record already holds, each carries its checkpoint, and
/// RocksDB's write-ahead log keeps writes in order, so a crash loses at most the last steps
/// with their checkpoints (read again at the next take-over), and the next synced write (any
/// decision of a resumed task) makes them durable. A restore so costs the other partitions'
/// acknowledgements no fsync and no wait behind its write.
fn run_replicated(mut writer: Writer, slot: &ReplicatorSlot, rx: Receiver<Request>) {
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<Replicated>();
    let never = crossbeam_channel::never();
    let mut open = true;
    // Partitions with a transaction under way, and the appends waiting for it to end.
    let mut busy: BTreeMap<i32, Vec<Request>> = BTreeMap::new();
    let mut ready = Vec::with_capacity(MAX_BATCH);
    let mut restored = Vec::new();
    loop {
        if !open && busy.is_empty() {
            return;
        }
        let requests = if open { &rx } else { &never };
        let mut arrived = Vec::new();
        let mut finished = Vec::new();
        crossbeam_channel::select! {
            recv(requests) -> req => match req {
                Ok(req) => arrived.push(req),
                Err(_) => open = false,
            },
            recv(done_rx) -> done => finished.extend(done),
        }
        arrived.extend(rx.try_iter().take(MAX_BATCH));
        finished.extend(done_rx.try_iter());
        // Partitions whose transaction ended take their waiting appends first: they are older.
        let mut groups: BTreeMap<i32, Vec<Request>> = BTreeMap::new();
        for done in finished {
            writer.stats.transaction(done.partition, false);
            let waiting = busy.remove(&done.partition).unwrap_or_default();
            if !waiting.is_empty() {
                groups.insert(done.partition, waiting);
            }
            settle(done, &mut ready);
        }
        for req in arrived {
            let a = &req.append;
            match (a.events.first(), a.partition) {
                (None, Some(p)) if a.commit_offsets => match busy.get_mut(&p) {
                    Some(waiting) => waiting.push(req),
                    None => groups.entry(p).or_default().push(req),
                },
                (None, _) => ready.push(req),
                (Some(_), _) if a.restored => restored.push(req),
                (Some(_), Some(p)) => match busy.get_mut(&p) {
                    Some(waiting) => waiting.push(req),
                    None => groups.entry(p).or_default().push(req),
                },
                (Some(e), None) => {
                    let task = e.task_id.to_string();
                    let _ = req.ack.send(Err(Error::NoPartition { task }));
                }
            }
        }
        // Recorded before the next transactions start: they read these tasks' histories.
        writer.write(&mut ready, slot.get().map(|r| &**r));
        writer.write_with(&mut restored, None, false);
        for (partition, members) in groups {
            let replicator = slot.get().cloned();
            let generation = replicator.as_ref().and_then(|r| r.generation(partition));
            let members = match &replicator {
                Some(_) => refuse_stale(partition, generation, members),
                None => members,
            };
            if members.is_empty() {
                continue;
            }
            busy.insert(partition, Vec::new());
            writer.stats.transaction(partition, true);
            let events: Vec<NewEvent> = members
                .iter()
                .flat_map(|r| r.append.events.iter().cloned())
                .collect();
            let (db, done) = (writer.db.clone(), done_tx.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("sendledger-log-{partition}"))
                .spawn(move || {
                    let history = |task| crate::reads::task_events(&db, task);
                    let outcome = match (replicator, generation) {
                        (Some(r), Some(g)) => r.replicate(partition, g, &events, &history),
                        _ => Err(Replication::Failed(cause(
                            "the log of record is not open yet",
                        ))),
                    };
                    // The database is let go before the journal hears the outcome: once the
                    // journal ends (the ledger closed), nothing holds it open.
                    drop(db);
                    let _ = done.send(Replicated {
                        partition,
                        members,
                        outcome,
                    });
                });
            if let Err(e) = spawned {
                // The closure (and the appends in it) is gone: their callers see the journal
                // closed. Nothing of them was written.
                tracing::error!(partition, error = %e, "cannot start a thread for the partition's transaction");
                busy.remove(&partition);
                writer.stats.transaction(partition, false);
            }
        }
    }
}

/// The appends of `members` made in generation `generation` of the partition's log, the one
/// it has now. The others are answered as lost: made while the partition was not owned here,
/// or before it was given up and taken over anew (a task's decision from before then, waiting
/// behind a transaction that outlived the partition's revocation). The partition's tasks were
/// resumed from its log since, on a state without them.
fn refuse_stale(partition: i32, generation: Option<u64>, members: Vec<Request>) -> Vec<Request> {
    let (current, stale): (Vec<_>, Vec<_>) = members
        .into_iter()
        .partition(|r| r.generation.is_some() && r.generation == generation);
    let detail = match generation {
        None => "the partition is not owned here",
        Some(_) => "the partition was given up and taken over anew since the append was made",
    };
    for req in stale {
        let _ = req.ack.send(Err(Error::PartitionLost {
            partition,
            source: cause(detail),
        }));
    }
    current
}

/// Moves a finished transaction's appends to `ready` (the last one carrying the partition's
/// new checkpoint), or answers them with its failure.
fn settle(done: Replicated, ready: &mut Vec<Request>) {
    let Replicated {
        partition,
        mut members,
        outcome,
    } = done;
    match outcome {
        Ok(logged) => {
            // A turn without events wrote nothing to the events partition: no checkpoint.
            let wrote = members.iter().any(|r| !r.append.events.is_empty());
            if let (Some(last), Some(logged)) = (members.last_mut().filter(|_| wrote), logged) {
                last.append.cursors.extend(logged.cursors(partition));
            }
            ready.extend(members);
        }
        Err(why) => {
            let kind = match why {
                Replication::Failed(_) => "failed",
                Replication::Lost(_) => "lost",
            };
            metrics::counter!(crate::metric_definitions::LOG_FAILURES_TOTAL, "kind" => kind)
                .increment(1);
            for req in members {
                let error = match &why {
                    Replication::Failed(source) => Error::NotReplicated {
                        partition,
                        source: source.clone(),
                    },
                    Replication::Lost(source) => Error::PartitionLost {
                        partition,
                        source: source.clone(),
                    },
                };
                let _ = req.ack.send(Err(error));
            }
        }
    }
}

fn build_batch(
    db: &DB,
    first_lsn: u64,
    pending: &[Request],
    removal: Option<&Removal>,
) -> (WriteBatch, Vec<Range<u64>>) {
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
    let (unsettled, task_index, meta) = (
        cf(CF_UNSETTLED_BY_PARTITION),
        cf(CF_TASK_INDEX),
        cf(CF_META),
    );
    let mut batch = WriteBatch::default();
    let mut ranges = Vec::with_capacity(pending.len());
    let mut lsn = first_lsn;
    for req in pending {
        let a = &req.append;
        let start = lsn;
        for (task, from) in &a.truncate_tasks {
            delete_task_events(&mut batch, task_events, *task, *from);
        }
        for ev in &a.events {
            batch.put_cf(log, lsn_key(lsn), encode_new_event(lsn, ev));
            batch.put_cf(
                task_events,
                task_event_key(ev.task_id, ev.task_seq),
                lsn_key(lsn),
            );
            lsn += 1;
        }
        // The tasks whose first event is in this append.
        let mut first = (a.events.iter())
            .filter(|e| e.task_seq == 0)
            .map(|e| e.task_id)
            .collect::<Vec<_>>();
        first.sort_unstable();
        for (task, summary) in &a.tasks {
            batch.put_cf(tasks, task.0, summary.encode());
            // The unsettled index lists a task once its first events (or, in a restore, the
            // events that replace its own, or a retry of the failed task) leave it unsettled,
            // and forgets it once it settles: nothing else changes whether it is listed.
            let new = first.binary_search(task).is_ok();
            if !summary.phase.is_terminal() {
                let retried = a
                    .events
                    .iter()
                    .any(|e| e.task_id == *task && matches!(e.body, EventBody::TaskRetried { .. }));
                if new || retried || a.truncate_tasks.iter().any(|(t, _)| t == task) {
                    batch.put_cf(unsettled, unsettled_key(a.partition, *task), []);
                }
            } else if !new {
                // A task's appends all carry the partition of its request: the one it was
                // listed under.
                batch.delete_cf(unsettled, unsettled_key(a.partition, *task));
            }
        }
        for (task, old, new) in &a.index {
            if let Some(old) = old {
                batch.delete_cf(task_index, old.key(*task));
            }
            if let Some(new) = new {
                batch.put_cf(task_index, new.key(*task), new.value());
            }
        }
        for (id, task, hash) in &a.identities {
            let mut v = Vec::with_capacity(48);
            v.extend_from_slice(&task.0);
            v.extend_from_slice(&hash.0);
            batch.put_cf(identity, identity_key(id), v);
        }
        for (id, version, task, hash) in &a.versions {
            batch.put_cf(
                identity,
                version_key(id),
                version_value(*version, *task, hash),
            );
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
        for task in &a.forget_tasks {
            batch.delete_cf(tasks, task.0);
            batch.delete_cf(unsettled, unsettled_key(a.partition, *task));
        }
        for (partition, owed) in &a.reviews_owed {
            batch.put_cf(
                meta,
                review_owed_key(*partition, owed.task_id),
                owed.encode(),
            );
        }
        for (partition, task) in &a.reviews_recorded {
            batch.delete_cf(meta, review_owed_key(*partition, *task));
        }
        ranges.push(start..lsn);
    }
    if let Some(removal) = removal {
        let prunes: Vec<_> = pending.iter().flat_map(|r| &r.append.prune).collect();
        let forgets: Vec<_> = pending.iter().flat_map(|r| &r.append.forget).collect();
        let accepted_now: Vec<_> = (pending.iter())
            .flat_map(|r| &r.append.versions)
            .map(|(identity, ..)| version_key(identity))
            .collect();
        retention_into(db, &mut batch, &prunes, &forgets, &accepted_now, removal);
    }
    (batch, ranges)
}

/// Removes `task`'s entries in the per-task index from sequence number `from` on.
fn delete_task_events(batch: &mut WriteBatch, cf: &ColumnFamily, task: TaskId, from: u32) {
    let last = task_event_key(task, u32::MAX);
    batch.delete_range_cf(cf, task_event_key(task, from), last);
    batch.delete_cf(cf, last);
}

/// Removes the histories `prunes` plans and keeps what retention keeps of each, forgets the
/// tasks `forgets` plans, and writes the ledger's record of both (`removal`, planned from them).
fn retention_into(
    db: &DB,
    batch: &mut WriteBatch,
    prunes: &[&crate::retention::Prune],
    forgets: &[&crate::retention::Forget],
    accepted_now: &[Vec<u8>],
    removal: &Removal,
) {
    let cf = |name| {
        db.cf_handle(name)
            .expect("column families are created at open")
    };
    // A task's events: their log entries and their per-task index entries, each deleted by
    // its key. (A range deletion would do it in one entry, but every read of the family
    // then goes through the range tombstones in the memtable: one per removed task, thousands
    // a second.)
    let remove_events =
        |batch: &mut WriteBatch, task: TaskId, events: &[(u64, Vec<u8>)], seqs: &[u32]| {
            for (lsn, _) in events {
                batch.delete_cf(cf(CF_LOG), lsn_key(*lsn));
            }
            for seq in seqs {
                batch.delete_cf(cf(CF_TASK_EVENTS), task_event_key(task, *seq));
            }
        };
    for (p, value) in prunes.iter().zip(&removal.values) {
        remove_events(batch, p.task, &p.events, &p.seqs);
        // What is kept stands for the identity of a request without a version; a later
        // version's entry stays until that version is forgotten.
        if p.retained.request_version == 0 {
            batch.delete_cf(cf(CF_IDENTITY), identity_key(&p.retained.identity));
        }
        if let Some(entry) = &p.index {
            batch.delete_cf(cf(CF_TASK_INDEX), entry.key(p.task));
        }
        batch.put_cf(cf(CF_RETAINED), p.task.0, value);
        batch.put_cf(
            cf(CF_RETAINED_BY_TIME),
            retained_time_key(p.retained.settled_at, p.task),
            [],
        );
    }
    for f in forgets {
        remove_events(batch, f.task, &f.events, &f.seqs);
        if let Some(entry) = &f.index {
            batch.delete_cf(cf(CF_TASK_INDEX), entry.key(f.task));
        }
        batch.delete_cf(cf(CF_RETAINED), f.task.0);
        batch.delete_cf(
            cf(CF_RETAINED_BY_TIME),
            retained_time_key(f.settled_at, f.task),
        );
        batch.delete_cf(cf(CF_TASKS), f.task.0);
        // The identity's latest version goes with it when it is this task, unless this very
        // write accepts a later one.
        if let Some(identity) = &f.version_of {
            let key = version_key(identity);
            let latest = db.get_cf(cf(CF_IDENTITY), &key).ok().flatten();
            let names_task = latest
                .as_deref()
                .and_then(decode_version_value)
                .is_some_and(|(_, task, _)| task == f.task);
            if names_task && !accepted_now.contains(&key) {
                batch.delete_cf(cf(CF_IDENTITY), key);
            }
        }
    }
    batch.put_cf(cf(CF_META), META_PRUNED, removal.totals.encode());
    batch.put_cf(cf(CF_META), META_PRUNE_CHAIN, removal.chain.encode());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Ledger, LedgerOptions};
    use sendledger_core::fixtures::{accepted, src};
    use sendledger_core::EventBody;
    use std::sync::Mutex;

    /// Partition 1 is written (its checkpoint advances by the events' count), partition 2 was
    /// taken over, partition 3 cannot be written now. Remembers what it was given.
    #[derive(Default)]
    struct Log {
        written: Mutex<Vec<(i32, usize, usize)>>,
        unrecorded: Mutex<Vec<i32>>,
    }

    impl Replicator for Log {
        fn generation(&self, _partition: i32) -> Option<u64> {
            Some(0)
        }

        fn unrecorded(&self, partition: i32) {
            self.unrecorded.lock().unwrap().push(partition);
        }

        fn replicate(
            &self,
            partition: i32,
            _generation: u64,
            events: &[NewEvent],
            history: &dyn Fn(TaskId) -> Result<Vec<Event>>,
        ) -> std::result::Result<Option<Logged>, Replication> {
            let known = events
                .first()
                .map_or(0, |e| history(e.task_id).map_or(0, |h| h.len()));
            self.written
                .lock()
                .unwrap()
                .push((partition, events.len(), known));
            match partition {
                1 => Ok(Some(Logged {
                    first: 100,
                    next: 100 + events.len() as i64,
                })),
                2 => Err(Replication::Lost(cause("fenced"))),
                _ => Err(Replication::Failed(cause("brokers unreachable"))),
            }
        }
    }

    fn events_of(task: TaskId, from_seq: u32, bodies: Vec<EventBody>) -> Vec<NewEvent> {
        bodies
            .into_iter()
            .enumerate()
            .map(|(i, body)| NewEvent {
                task_id: task,
                task_seq: from_seq + i as u32,
                at: 1,
                body,
            })
            .collect()
    }

    /// A kafka-mode ledger in a temporary directory (kept as long as the returned guard).
    fn replicated_ledger() -> (tempfile::TempDir, Ledger) {
        let dir = tempfile::tempdir().unwrap();
        let options = LedgerOptions {
            replicated: true,
            ..LedgerOptions::default()
        };
        let ledger = Ledger::open(dir.path(), options).unwrap();
        (dir, ledger)
    }

    fn append(partition: Option<i32>, events: Vec<NewEvent>) -> Append {
        Append {
            events,
            partition,
            ..Append::default()
        }
    }

    /// Events committed to their log that the ledger then fails to write (here: the disk is
    /// full) leave the partition's copy without committed events: the replicator is told to
    /// give the partition up, so it is taken over again from its log before a task of it
    /// decides again (and reuses a sequence number the log has).
    #[test]
    fn committed_events_the_ledger_cannot_write_give_their_partition_up() {
        struct Mounted(std::path::PathBuf);
        impl Drop for Mounted {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount").arg(&self.0).status();
            }
        }
        let mount = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
            .arg(mount.path())
            .status()
            .unwrap();
        assert!(
            status.success(),
            "mount a size-limited tmpfs (needs root, as scripts/test runs)"
        );
        let _mounted = Mounted(mount.path().to_path_buf());
        let options = LedgerOptions {
            replicated: true,
            ..LedgerOptions::default()
        };
        let ledger = Ledger::open(mount.path().join("ledger"), options).unwrap();
        let log = Arc::new(Log::default());
        assert!(ledger.install_replicator(log.clone()).is_ok());
        let (task, body) = accepted();
        ledger
            .append_blocking(append(Some(1), events_of(task, 0, vec![body])))
            .unwrap();
        // Fill the disk.
        {
            use std::io::Write;
            let mut filler = std::fs::File::create(mount.path().join("filler")).unwrap();
            while filler.write_all(&[0u8; 64 * 1024]).is_ok() {}
        }
        let note = EventBody::OperatorNote {
            who: "ana".into(),
            text: "x".repeat(1024 * 1024),
        };
        let failed = ledger.append_blocking(append(Some(1), events_of(task, 1, vec![note])));
        assert!(matches!(failed, Err(Error::Rocks(_))), "{failed:?}");
        assert_eq!(log.written.lock().unwrap().len(), 2, "the log took it");
        assert_eq!(*log.unrecorded.lock().unwrap(), [1]);
    }

    #[test]
    fn replicated_appends_are_recorded_only_once_their_partition_log_took_them() {
        let (_dir, ledger) = replicated_ledger();
        let (task, body) = accepted();
        let first = events_of(task, 0, vec![body]);

        let early = ledger.append_blocking(append(Some(1), first.clone()));
        assert!(
            matches!(early, Err(Error::NotReplicated { partition: 1, .. })),
            "{early:?}"
        );
        assert!(early.unwrap_err().is_transient());

        let log = Arc::new(Log::default());
        assert!(ledger.install_replicator(log.clone()).is_ok());
        assert!(ledger.install_replicator(log.clone()).is_err(), "once only");

        let range = ledger.append_blocking(append(Some(1), first)).unwrap();
        assert_eq!(range, 1..2);
        assert_eq!(ledger.log_checkpoint(1).unwrap(), Some(101));
        assert_eq!(ledger.log_tail(1).unwrap(), Some(100));
        let dup = EventBody::DuplicateDelivery { source: src(8) };
        let range = ledger
            .append_blocking(append(Some(1), events_of(task, 1, vec![dup.clone()])))
            .unwrap();
        assert_eq!(range, 2..3);
        assert_eq!(
            log.written.lock().unwrap().last(),
            Some(&(1, 1, 1)),
            "the replicator reads the task's earlier events"
        );

        let lost = ledger.append_blocking(append(Some(2), events_of(task, 2, vec![dup.clone()])));
        assert!(
            matches!(lost, Err(Error::PartitionLost { partition: 2, .. })),
            "{lost:?}"
        );
        assert!(!lost.unwrap_err().is_transient());
        let failed = ledger.append_blocking(append(Some(3), events_of(task, 2, vec![dup.clone()])));
        assert!(failed.unwrap_err().is_transient());
        let orphan = ledger.append_blocking(append(None, events_of(task, 2, vec![dup.clone()])));
        assert!(
            matches!(orphan, Err(Error::NoPartition { .. })),
            "{orphan:?}"
        );
        assert_eq!(
            ledger.task_events(task).unwrap().len(),
            2,
            "nothing refused was recorded"
        );

        let restored = Append {
            restored: true,
            cursors: vec![(log_checkpoint(4), 7)],
            ..append(None, events_of(task, 2, vec![dup]))
        };
        let range = ledger.append_blocking(restored).unwrap();
        assert_eq!(range, 3..4, "LSNs stay contiguous past refused appends");
        assert_eq!(ledger.log_checkpoint(4).unwrap(), Some(7));
        assert_eq!(
            log.written.lock().unwrap().len(),
            4,
            "a restore is not written back"
        );
    }

    /// Partition 3's transactions wait until the test lets them go; every call is remembered
    /// with the number of earlier events the ledger held for its first task.
    struct Gate {
        open: Mutex<bool>,
        opened: std::sync::Condvar,
        calls: Mutex<Vec<(i32, usize)>>,
        /// The generation of every partition's log.
        generation: std::sync::atomic::AtomicU64,
    }

    impl Gate {
        fn closed() -> Arc<Gate> {
            Arc::new(Gate {
                open: Mutex::new(false),
                opened: std::sync::Condvar::new(),
                calls: Mutex::new(Vec::new()),
                generation: std::sync::atomic::AtomicU64::new(0),
            })
        }

        fn open(&self) {
            *self.open.lock().unwrap() = true;
            self.opened.notify_all();
        }

        fn wait_for_calls(&self, n: usize) {
            while self.calls.lock().unwrap().len() < n {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }

    impl Replicator for Gate {
        fn generation(&self, _partition: i32) -> Option<u64> {
            Some(self.generation.load(Ordering::SeqCst))
        }

        fn unrecorded(&self, partition: i32) {
            panic!("no ledger write fails in these tests (partition {partition})");
        }

        fn replicate(
            &self,
            partition: i32,
            _generation: u64,
            events: &[NewEvent],
            history: &dyn Fn(TaskId) -> Result<Vec<Event>>,
        ) -> std::result::Result<Option<Logged>, Replication> {
            let known = history(events[0].task_id).map_or(0, |h| h.len());
            self.calls.lock().unwrap().push((partition, known));
            if partition == 3 {
                let mut open = self.open.lock().unwrap();
                while !*open {
                    open = self.opened.wait(open).unwrap();
                }
            }
            Ok(Some(Logged {
                first: 0,
                next: events.len() as i64,
            }))
        }
    }

    #[test]
    fn a_partition_whose_transaction_hangs_holds_up_only_its_own_appends() {
        let (_dir, ledger) = replicated_ledger();
        let gate = Gate::closed();
        assert!(ledger.install_replicator(gate.clone()).is_ok());
        let (slow, body) = accepted();
        let dup = EventBody::DuplicateDelivery { source: src(8) };
        let first = {
            let ledger = ledger.clone();
            let events = events_of(slow, 0, vec![body.clone()]);
            std::thread::spawn(move || ledger.append_blocking(append(Some(3), events)))
        };
        gate.wait_for_calls(1);
        let second = {
            let ledger = ledger.clone();
            let events = events_of(slow, 1, vec![dup.clone()]);
            std::thread::spawn(move || ledger.append_blocking(append(Some(3), events)))
        };

        // Partition 1 is recorded while partition 3's transaction hangs.
        let other = TaskId([7; 16]);
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let ledger = ledger.clone();
            let events = events_of(other, 0, vec![body]);
            std::thread::spawn(move || tx.send(ledger.append_blocking(append(Some(1), events))));
        }
        let range = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("partition 1 is not held up by partition 3")
            .unwrap();
        assert_eq!(range, 1..2);
        assert_eq!(ledger.task_events(slow).unwrap().len(), 0);
        assert!(!second.is_finished(), "partition 3's next append waits");
        assert_eq!(
            gate.calls
                .lock()
                .unwrap()
                .iter()
                .filter(|c| c.0 == 3)
                .count(),
            1,
            "one transaction at a time per partition"
        );

        gate.open();
        assert_eq!(first.join().unwrap().unwrap(), 2..3);
        assert_eq!(second.join().unwrap().unwrap(), 3..4);
        assert_eq!(
            gate.calls.lock().unwrap().last(),
            Some(&(3, 1)),
            "the next transaction starts once the last one's events are in the ledger"
        );
        assert_eq!(ledger.task_events(slow).unwrap().len(), 2);
    }

    /// Partition 3 is given up and taken over anew while its transaction hangs (a commit that
    /// outlived the partition's revocation). An append made before, waiting behind that
    /// transaction, is refused as lost: the partition's tasks were resumed from its log
    /// without it. One made after goes into the next transaction, alone.
    #[test]
    fn appends_made_before_their_partition_was_taken_over_anew_are_refused() {
        let (_dir, ledger) = replicated_ledger();
        let gate = Gate::closed();
        assert!(ledger.install_replicator(gate.clone()).is_ok());
        let (slow, body) = accepted();
        let first = {
            let ledger = ledger.clone();
            let events = events_of(slow, 0, vec![body.clone()]);
            std::thread::spawn(move || ledger.append_blocking(append(Some(3), events)))
        };
        gate.wait_for_calls(1);
        let dup = EventBody::DuplicateDelivery { source: src(8) };
        let before = ledger
            .submit(append(Some(3), events_of(slow, 1, vec![dup])))
            .unwrap();
        gate.generation.store(1, Ordering::SeqCst);
        let other = TaskId([7; 16]);
        let after = ledger
            .submit(append(Some(3), events_of(other, 0, vec![body])))
            .unwrap();

        gate.open();
        assert_eq!(first.join().unwrap().unwrap(), 1..2);
        let refused = before.blocking_recv().unwrap();
        assert!(
            matches!(&refused, Err(Error::PartitionLost { partition: 3, source }) if source.to_string().contains("taken over anew")),
            "{refused:?}"
        );
        assert_eq!(after.blocking_recv().unwrap().unwrap(), 2..3);
        assert_eq!(gate.calls.lock().unwrap().len(), 2, "two transactions");
        assert_eq!(ledger.task_events(slow).unwrap().len(), 1);
        assert_eq!(ledger.task_events(other).unwrap().len(), 1);
    }

    /// An append without events that asks for a turn in its partition's transactions (to
    /// commit requests offsets) reaches the replicator with no events, and moves no
    /// checkpoint; an empty append that does not ask never reaches it.
    #[test]
    fn an_offsets_turn_reaches_the_replicator_and_moves_no_checkpoint() {
        let (_dir, ledger) = replicated_ledger();
        let log = Arc::new(Log::default());
        assert!(ledger.install_replicator(log.clone()).is_ok());
        let (task, body) = accepted();
        ledger
            .append_blocking(append(Some(1), events_of(task, 0, vec![body])))
            .unwrap();
        assert_eq!(ledger.log_checkpoint(1).unwrap(), Some(101));

        ledger.append_blocking(append(Some(1), Vec::new())).unwrap();
        assert_eq!(log.written.lock().unwrap().len(), 1, "not a turn");
        let turn = Append {
            commit_offsets: true,
            ..append(Some(1), Vec::new())
        };
        assert_eq!(ledger.append_blocking(turn).unwrap(), 2..2);
        assert_eq!(log.written.lock().unwrap().last(), Some(&(1, 0, 0)));
        assert_eq!(
            ledger.log_checkpoint(1).unwrap(),
            Some(101),
            "nothing was written to the events partition"
        );
    }

    #[test]
    fn a_local_ledger_takes_no_replicator() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), LedgerOptions::default()).unwrap();
        assert!(ledger.install_replicator(Arc::new(Log::default())).is_err());
    }
}
