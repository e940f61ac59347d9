//! Replaying the whole ledger to prove that no rule was broken.
//!
//! One streaming pass over the log in LSN order checks that LSNs are contiguous from 1 and
//! that every event decodes, and feeds each event to its task's [`TaskAudit`] (the rule checks
//! and counts shared with the replay of the events topic). A task is checked while it is open:
//! from its first event until it has as many events as its stored summary says, or the end of
//! the log. Then its fold is compared with the summary and the task is dropped. So memory holds
//! the open tasks, not the log: in a ledger written by the engine, the tasks that were in
//! flight together (plus any task that gets events much later, such as a late duplicate
//! delivery, until it gets them). An event of a task that was already dropped (its summary
//! counts too few events) re-opens it from the index, to the end of the log, where it is
//! compared again; it is counted once.
//!
//! The summaries are read first, in one sequential scan of the `tasks` column family, into a
//! table of 22 bytes a task ([`Summaries`]): looking each task's summary up when it opens was a
//! random read of a block that no longer fits in the cache, and most of the audit's time.
//! The `unsettled` index (what start-up and a partition's take-over resume) is compared with
//! the summaries in one merge, both being in task id order.
//! Every read is made in one snapshot, so a ledger written to meanwhile is audited as it was
//! when the audit started.
//!
//! The pass is a pipeline of three threads, each with about a third of the work: one iterates
//! over the log and checks its keys, one decodes and fingerprints the events, and the calling
//! thread checks the tasks. Meanwhile a fourth thread reads the per-task index and fingerprints
//! it (count and a sum of hashes of `task, seq, lsn`), as the events are. Equal fingerprints
//! mean every event is indexed under its task and sequence number and no index entry points
//! elsewhere. Only when they differ does a slower pass look up each index entry in the log to
//! name what is wrong.

mod versions;

use std::cmp::Ordering;
use std::collections::hash_map::{Entry, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::mpsc;

use rocksdb::{Direction, IteratorMode, ReadOptions, SnapshotWithThreadMode, DB};
use sendledger_core::audit::{AuditReport, Finding, Integrity, LsnSequence, TaskAudit};
use sendledger_core::error::Chain;
use sendledger_core::{CheckConfig, Event, TaskId};

use crate::envelope::decode_event;
use crate::error::Result;
use crate::keys::*;
use crate::ledger::Ledger;
use crate::summary::TaskSummary;
use crate::task_index::IndexEntry;

/// How often `progress` is called, in events.
const PROGRESS_EVERY: u64 = 100_000;

type Snapshot<'a> = SnapshotWithThreadMode<'a, DB>;

/// A task between its first event and its last.
struct Open {
    audit: TaskAudit,
    /// The stored summary, if there is one.
    summary: Option<TaskSummary>,
    /// Dropped once already, and counted then.
    reopened: bool,
    last_lsn: u64,
}

impl Open {
    /// Has every event its summary announces (and was not dropped before).
    fn complete(&self) -> bool {
        !self.reopened
            && self
                .summary
                .is_some_and(|s| self.audit.state().next_seq >= s.next_seq)
    }
}

/// Every task's stored summary, by task id.
struct Summaries {
    /// The `tasks` entries (key and value as stored: 22 bytes a task), in task id order. One
    /// whose summary does not decode is left out: it counts as missing.
    entries: Vec<([u8; 16], [u8; 6])>,
    /// `starts[b]..starts[b + 1]` are the entries whose ids start with the `bits` bits `b`. Task
    /// ids are SHA-256 outputs, evenly spread, so each range holds a few entries: a lookup
    /// touches two places in memory where a binary search would touch twenty.
    starts: Vec<u32>,
    bits: u32,
}

impl Summaries {
    fn read(ledger: &Ledger, snapshot: &Snapshot) -> Result<Summaries> {
        let cf = ledger.cf(CF_TASKS);
        // Sized once from RocksDB's count of the keys: a vector grown by doubling could hold
        // twice the memory the table needs.
        let estimate = ledger
            .db()
            .property_int_value_cf(cf, "rocksdb.estimate-num-keys")?
            .unwrap_or(0);
        let mut entries = Vec::with_capacity(estimate as usize);
        let mut it = snapshot.raw_iterator_cf_opt(cf, scan_options());
        it.seek_to_first();
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if let (Ok(id), Ok(value), Ok(_)) = (k.try_into(), v.try_into(), TaskSummary::decode(v))
            {
                entries.push((id, value));
            }
            it.next();
        }
        it.status()?;
        let bits = (entries.len() / 4).max(2).ilog2();
        let mut summaries = Summaries {
            starts: Vec::with_capacity((1 << bits) + 1),
            entries,
            bits,
        };
        for (i, (id, _)) in summaries.entries.iter().enumerate() {
            let range = summaries.range_of(id);
            while summaries.starts.len() <= range {
                summaries.starts.push(i as u32);
            }
        }
        let len = summaries.entries.len() as u32;
        summaries.starts.resize((1 << bits) + 1, len);
        Ok(summaries)
    }

    fn range_of(&self, task: &[u8; 16]) -> usize {
        let first = u64::from_be_bytes(task[..8].try_into().expect("8 bytes"));
        (first >> (64 - self.bits)) as usize
    }

    fn get(&self, task: &TaskId) -> Option<TaskSummary> {
        let range = self.range_of(&task.0);
        let (from, to) = (self.starts[range], self.starts[range + 1]);
        self.entries[from as usize..to as usize]
            .iter()
            .find(|(id, _)| *id == task.0)
            .and_then(|(_, value)| TaskSummary::decode(value).ok())
    }
}

/// Hashes a task id by its first eight bytes, which are already evenly spread (SHA-256): the
/// open tasks' map is looked up twice an event.
#[derive(Default)]
struct TaskIdHasher(u64);

impl Hasher for TaskIdHasher {
    fn write(&mut self, bytes: &[u8]) {
        if let Some(first) = bytes.get(..8) {
            self.0 = u64::from_le_bytes(first.try_into().expect("8 bytes"));
        }
    }

    // The length a `[u8; 16]` hashes before its bytes: the same for every id.
    fn write_usize(&mut self, _: usize) {}

    fn finish(&self) -> u64 {
        self.0
    }
}

type TaskMap<V> = HashMap<TaskId, V, BuildHasherDefault<TaskIdHasher>>;

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

    /// One task index entry, key and value.
    fn add_entry(&mut self, key: &[u8], value: &[u8]) {
        let mut h = mix(key.len() as u64);
        for chunk in key.chunks(8).chain(value.chunks(8)) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            h = mix(h ^ u64::from_le_bytes(word));
        }
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
    // A full scan: read ahead (each scan running holds a buffer of this size, and larger ones
    // read no faster), and keep its blocks out of the cache (nothing reads them again).
    opts.set_readahead_size(512 << 10);
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
    let snapshot = ledger.db().snapshot();
    let pruned = ledger.pruned_totals()?;
    report.pruned_events = pruned.events;
    report.pruned_tasks = pruned.tasks;
    // Queues of a few batches, so that a thread descheduled for a moment does not stall the
    // others at once.
    let (raw_tx, raw_rx) = mpsc::sync_channel::<Raw>(8);
    let (tx, rx) = mpsc::sync_channel::<Batch>(8);
    let (scan, decoded, index_print, expected_task_index) = std::thread::scope(|s| {
        let reader = s.spawn(|| read_log(ledger, &snapshot, pruned.events, raw_tx));
        let decoder = s.spawn(|| decode_log(raw_rx, tx));
        let index = s.spawn(|| {
            let events = index_fingerprint(ledger, &snapshot)?;
            let kept = kept_sum(ledger, &snapshot)?;
            Ok::<_, crate::Error>((events, task_index_fingerprint(ledger, &snapshot)?, kept))
        });
        // The reader and the decoder fill their queues meanwhile.
        let checked = Summaries::read(ledger, &snapshot).and_then(|summaries| {
            check_unsettled(ledger, &snapshot, &summaries, &mut report)?;
            let check = Check {
                ledger,
                snapshot: &snapshot,
                summaries: &summaries,
                config,
            };
            check.tasks(rx, &mut report, &mut progress)
        });
        let scan = reader.join().expect("the log reader does not panic");
        let decoded = decoder.join().expect("the decoder does not panic");
        let index = index.join().expect("the index scan does not panic");
        let expected = checked?;
        let (index, task_index, kept) = index?;
        check_kept(ledger, &snapshot, kept, &mut report)?;
        Ok::<_, crate::Error>((scan?, decoded, index, (expected, task_index)))
    })?;
    report.events = scan.entries;
    // Damage to the log first, then what the tasks broke.
    report.violations.splice(0..0, scan.findings);
    if decoded.print != index_print || !decoded.undecodable.is_empty() {
        compare_index(
            ledger,
            &snapshot,
            decoded.print,
            &decoded.undecodable,
            &mut report,
        )?;
    }
    match expected_task_index {
        (_, None) => report.skipped_checks.push(
            "index-consistent (task index): a ledger of format 2 or older has no task index \
             (the service builds it when it opens the ledger)"
                .into(),
        ),
        (expected, Some(found)) if expected != found => {
            compare_task_index(ledger, &snapshot, expected, found, &mut report)?
        }
        _ => {}
    }
    Ok(report)
}

/// The sum of the [`crate::retention::leaf`] of every entry retention kept, and how many there are.
fn kept_sum(ledger: &Ledger, snapshot: &Snapshot) -> Result<(crate::retention::Digest, u64)> {
    let Some(cf) = ledger.db().cf_handle(CF_RETAINED) else {
        return Ok(([0; 32], 0));
    };
    let mut sum = [0; 32];
    let mut n = 0;
    for item in snapshot.iterator_cf_opt(cf, scan_options(), IteratorMode::Start) {
        let (k, v) = item?;
        let task = decode_task_key(&k).ok_or(crate::Error::BadValue {
            what: "retained key",
        })?;
        sum = crate::retention::add(&sum, &crate::retention::leaf(task, &v));
        n += 1;
    }
    Ok((sum, n))
}

/// Compares what retention kept with the ledger's record of it ([`crate::retention::Chain`]).
fn check_kept(
    ledger: &Ledger,
    snapshot: &Snapshot,
    (sum, n): (crate::retention::Digest, u64),
    report: &mut AuditReport,
) -> Result<()> {
    let format = snapshot.get_cf(ledger.cf(CF_META), META_FORMAT)?;
    if format.as_deref().is_some_and(|f| f < &[6][..]) {
        if n > 0 {
            report.skipped_checks.push(
                "retained-intact: a ledger of format 5 has no record of what retention kept \
                 (the service adds it when it opens the ledger)"
                    .into(),
            );
        }
        return Ok(());
    }
    let chain = match snapshot.get_cf(ledger.cf(CF_META), META_PRUNE_CHAIN)? {
        Some(v) => crate::retention::Chain::decode(&v)?,
        None => crate::retention::Chain::default(),
    };
    if chain.kept_sum != sum {
        report.violations.push(Finding::integrity(
            Integrity::RetainedIntact,
            None,
            Vec::new(),
            format!(
                "the {n} entries retention kept of removed tasks do not add up to its record of them (checkpoint {}): one was changed, added or deleted outside retention; audit with --archive to name it",
                chain.seq
            ),
        ));
    }
    Ok(())
}

/// Log entries handed from thread to thread at once: enough that handing them over costs
/// little, few enough that the batches in the queues take little memory.
const BATCH: usize = 1024;

/// Log entries in LSN order as read: their values back to back.
struct Raw {
    /// Each entry's LSN and where its value ends in `values`.
    entries: Vec<(u64, usize)>,
    values: Vec<u8>,
    /// Log entries read up to the end of this batch.
    read: u64,
}

/// What the log reader found besides the entries.
struct Scan {
    entries: u64,
    findings: Vec<Finding>,
}

/// Reads the log in LSN order and checks its keys. Its own thread: RocksDB's iteration is as
/// much work as decoding the events, so each has a thread, and checking the tasks a third.
/// With `pruned` events removed by retention, gaps in the log are expected: their LSNs are
/// counted instead, and must add up to what retention recorded removing.
fn read_log(
    ledger: &Ledger,
    snapshot: &Snapshot,
    pruned: u64,
    tx: mpsc::SyncSender<Raw>,
) -> Result<Scan> {
    let mut scratch = AuditReport::default();
    let mut lsns = LsnSequence::default();
    let (mut next, mut missing) = (1u64, 0u64);
    let mut scan = Scan {
        entries: 0,
        findings: Vec::new(),
    };
    let new_batch = || Raw {
        entries: Vec::with_capacity(BATCH),
        values: Vec::with_capacity(BATCH * 128),
        read: 0,
    };
    let mut batch = new_batch();
    let mut it = snapshot.raw_iterator_cf_opt(ledger.cf(CF_LOG), scan_options());
    it.seek_to_first();
    while let (Some(k), Some(v)) = (it.key(), it.value()) {
        scan.entries += 1;
        match decode_u64(k) {
            None => scan.findings.push(Finding::integrity(
                Integrity::EventDecodable,
                None,
                vec![],
                format!("malformed log key {k:02x?}"),
            )),
            Some(lsn) => {
                if pruned > 0 {
                    missing += lsn.saturating_sub(next);
                    next = next.max(lsn + 1);
                } else {
                    lsns.push(lsn, &mut scratch);
                }
                batch.values.extend_from_slice(v);
                batch.entries.push((lsn, batch.values.len()));
            }
        }
        if batch.entries.len() == BATCH {
            batch.read = scan.entries;
            if tx.send(std::mem::replace(&mut batch, new_batch())).is_err() {
                break; // the checker stopped on an error of its own
            }
        }
        it.next();
    }
    it.status()?;
    missing += (ledger.last_lsn() + 1).saturating_sub(next);
    if pruned > 0 && missing != pruned {
        scan.findings.push(Finding::integrity(
            Integrity::LsnContiguous,
            None,
            vec![],
            format!(
                "{missing} LSNs are missing from the log, and retention recorded removing {pruned} events: {}",
                if missing > pruned {
                    "events were removed that no retention accounts for"
                } else {
                    "the record of what retention removed was changed"
                }
            ),
        ));
    }
    batch.read = scan.entries;
    let _ = tx.send(batch);
    scan.findings.append(&mut scratch.violations);
    Ok(scan)
}

/// Decoded events in LSN order, and how many log entries were read up to them.
struct Batch {
    events: Vec<Event>,
    entries: u64,
}

/// What decoding the log found besides the events.
struct Decoded {
    print: Fingerprint,
    undecodable: Vec<u64>,
}

/// Decodes the entries the reader sends and fingerprints them, for the checker.
fn decode_log(rx: mpsc::Receiver<Raw>, tx: mpsc::SyncSender<Batch>) -> Decoded {
    let mut decoded = Decoded {
        print: Fingerprint::default(),
        undecodable: Vec::new(),
    };
    for raw in rx {
        let mut events = Vec::with_capacity(raw.entries.len());
        let mut start = 0;
        for &(lsn, end) in &raw.entries {
            match decode_event(lsn, &raw.values[start..end]) {
                Ok(event) => {
                    decoded.print.add(&event.task_id.0, event.task_seq, lsn);
                    events.push(event);
                }
                Err(_) => decoded.undecodable.push(lsn),
            }
            start = end;
        }
        let batch = Batch {
            events,
            entries: raw.read,
        };
        if tx.send(batch).is_err() {
            break; // the checker stopped on an error of its own
        }
    }
    decoded
}

/// What checking the tasks reads besides the log.
struct Check<'a> {
    ledger: &'a Ledger,
    snapshot: &'a Snapshot<'a>,
    summaries: &'a Summaries,
    config: CheckConfig,
}

impl Check<'_> {
    /// Feeds every event to its open task, closing tasks as they complete.
    fn tasks(
        &self,
        rx: mpsc::Receiver<Batch>,
        report: &mut AuditReport,
        progress: &mut impl FnMut(u64),
    ) -> Result<Fingerprint> {
        let mut task_index = Fingerprint::default();
        // The tasks that follow an earlier version of their request, checked against it once
        // every task was.
        let mut followers = Vec::new();
        // Boxed: a task's state is large, and the map moves its entries as it grows and shrinks.
        let mut open: TaskMap<Box<Open>> = TaskMap::default();
        let mut reported = 0;
        for batch in rx {
            // The summaries of the tasks that start in this batch, looked up in one loop: each
            // lookup misses the CPU's caches, and together the misses overlap.
            let mut starting = (batch.events.iter())
                .filter(|e| e.task_seq == 0)
                .map(|e| self.summaries.get(&e.task_id))
                .collect::<Vec<_>>()
                .into_iter();
            for event in &batch.events {
                let task = event.task_id;
                let first = (event.task_seq == 0).then(|| starting.next().expect("looked up"));
                let entry = match open.entry(task) {
                    Entry::Occupied(o) => o.into_mut(),
                    Entry::Vacant(v) => {
                        let summary = first.unwrap_or_else(|| self.summaries.get(&task));
                        v.insert(self.open(event, summary)?)
                    }
                };
                entry.audit.push(event, report);
                entry.last_lsn = event.lsn;
                if entry.complete() {
                    let done = open.remove(&task).expect("present");
                    close(task, done, report, &mut task_index, &mut followers);
                }
            }
            if batch.entries / PROGRESS_EVERY > reported {
                reported = batch.entries / PROGRESS_EVERY;
                progress(batch.entries);
            }
        }
        // Tasks with fewer events than their summary says, without a summary, or re-opened.
        let mut rest: Vec<_> = open.into_iter().collect();
        rest.sort_unstable_by_key(|(task, _)| *task);
        for (task, done) in rest {
            close(task, done, report, &mut task_index, &mut followers);
        }
        self.versions(followers, report)?;
        Ok(task_index)
    }

    /// Opens a task at `event` with its summary, and its earlier events when `event` is not its
    /// first. Earlier events the log holds were checked and counted already, with the task,
    /// which was dropped since: they are folded in silently.
    fn open(&self, event: &Event, summary: Option<TaskSummary>) -> Result<Box<Open>> {
        let mut audit = TaskAudit::new(event.task_id, self.config);
        let mut reopened = false;
        if event.task_seq > 0 {
            let mut scratch = AuditReport::default();
            for earlier in self.events_before(event.task_id, event.lsn)? {
                audit.push(&earlier, &mut scratch);
                // Counted with the task before it was dropped (what retention kept was not).
                reopened |= earlier.lsn > 0;
            }
        }
        Ok(Box::new(Open {
            audit,
            summary,
            reopened,
            last_lsn: event.lsn,
        }))
    }

    /// The task's events before `lsn` that are in the index and decode (what does not is
    /// reported elsewhere).
    fn events_before(&self, task: TaskId, lsn: u64) -> Result<Vec<Event>> {
        let (ledger, snapshot) = (self.ledger, self.snapshot);
        // What retention kept of a task stands for the events it removed.
        let kept = match ledger.db().cf_handle(CF_RETAINED) {
            Some(cf) => snapshot.get_cf(cf, task.0)?,
            None => None,
        };
        let retained = match kept {
            Some(v) => Some(crate::retention::decode_retained(&v)?.0.event(task)),
            None => None,
        };
        let start = task_event_key(task, 0);
        let mut lsns = Vec::new();
        for item in snapshot.iterator_cf(
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
        let values = snapshot.multi_get_cf(lsns.iter().map(|l| (log, lsn_key(*l))));
        let mut events = Vec::with_capacity(lsns.len() + 1);
        events.extend(retained);
        for (value, lsn) in values.into_iter().zip(lsns) {
            if let Some(event) = value?.and_then(|bytes| decode_event(lsn, &bytes).ok()) {
                events.push(event);
            }
        }
        Ok(events)
    }
}

/// Checks a task's summary against the fold of its events, and adds the task index entry the
/// fold calls for to `task_index`.
fn close(
    task: TaskId,
    done: Box<Open>,
    report: &mut AuditReport,
    task_index: &mut Fingerprint,
    followers: &mut Vec<(TaskId, sendledger_core::PreviousVersion)>,
) {
    let summary = done.summary;
    let mut scratch = AuditReport::default();
    let counts = if done.reopened {
        &mut scratch
    } else {
        &mut *report
    };
    let state = done.audit.finish(counts);
    if let Some(previous) = state.previous_version {
        followers.push((task, previous));
    }
    // A task retention removed is no longer listed by phase.
    if let Some(entry) = IndexEntry::of(&state) {
        task_index.add_entry(&entry.key(task), &entry.value());
    }
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

/// The `unsettled` index lists exactly the tasks whose summary is not terminal: a task missing
/// from it would not be resumed at start-up (or on a partition's take-over), and one listed
/// that settled would be resumed for nothing. Both lists are in task id order, so one merge
/// compares them. A ledger of format 1 opened read-only has no such index.
fn check_unsettled(
    ledger: &Ledger,
    snapshot: &Snapshot,
    summaries: &Summaries,
    report: &mut AuditReport,
) -> Result<()> {
    let Some(cf) = ledger.db().cf_handle(CF_UNSETTLED_BY_PARTITION) else {
        report.skipped_checks.push(
            "index-consistent (unsettled tasks): a ledger of format 3 or older has no \
             unsettled index by partition (the service builds it when it opens the ledger)"
                .into(),
        );
        return Ok(());
    };
    let mut finding = |task, detail| index_finding(report, task, detail);
    let mut listed = Vec::new();
    let mut it = snapshot.raw_iterator_cf_opt(cf, scan_options());
    it.seek_to_first();
    while let Some(k) = it.key() {
        match decode_unsettled_key(k) {
            Some((_, id)) => listed.push(id),
            None => finding(None, format!("malformed unsettled entry {k:02x?}")),
        }
        it.next();
    }
    it.status()?;
    // Task id order, whatever the partitions (a task listed twice is named below).
    listed.sort_unstable();
    let unsettled: Vec<(TaskId, TaskSummary)> = (summaries.entries.iter())
        .filter_map(|(id, v)| Some((TaskId(*id), TaskSummary::decode(v).ok()?)))
        .filter(|(_, s)| !s.phase.is_terminal())
        .collect();
    let (mut i, mut j) = (0, 0);
    loop {
        let order = match (listed.get(i), unsettled.get(j)) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(a), Some((b, _))) => a.cmp(b),
        };
        match order {
            Ordering::Equal => (i, j) = (i + 1, j + 1),
            Ordering::Less => {
                let task = listed[i];
                let phase = summaries.get(&task).map_or("missing", |s| s.phase.name());
                finding(
                    Some(task),
                    format!("the unsettled index lists task {task}, whose summary is {phase}"),
                );
                i += 1;
            }
            Ordering::Greater => {
                let (task, summary) = unsettled[j];
                finding(
                    Some(task),
                    format!(
                        "task {task} is {} but missing from the unsettled index: a restart \
                         would not resume it",
                        summary.phase.name()
                    ),
                );
                j += 1;
            }
        }
    }
    Ok(())
}

/// The fingerprint of the per-task index.
fn index_fingerprint(ledger: &Ledger, snapshot: &Snapshot) -> Result<Fingerprint> {
    let mut print = Fingerprint::default();
    let mut it = snapshot.raw_iterator_cf_opt(ledger.cf(CF_TASK_EVENTS), scan_options());
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

/// Reports an index that disagrees with what it indexes.
fn index_finding(report: &mut AuditReport, task: Option<TaskId>, detail: String) {
    report.violations.push(Finding::integrity(
        Integrity::IndexConsistent,
        task,
        vec![],
        detail,
    ))
}

/// The task index's fingerprint; none for a ledger without one.
fn task_index_fingerprint(ledger: &Ledger, snapshot: &Snapshot) -> Result<Option<Fingerprint>> {
    let Some(cf) = ledger.db().cf_handle(CF_TASK_INDEX) else {
        return Ok(None);
    };
    let mut print = Fingerprint::default();
    let mut it = snapshot.raw_iterator_cf_opt(cf, scan_options());
    it.seek_to_first();
    while let (Some(k), Some(v)) = (it.key(), it.value()) {
        print.add_entry(k, v);
        it.next();
    }
    it.status()?;
    Ok(Some(print))
}

/// The slow comparison, when the task index's fingerprint differs from the folds': each entry
/// is checked against the fold of its task's events, naming the tasks whose entry is wrong;
/// entries missing altogether are counted.
fn compare_task_index(
    ledger: &Ledger,
    snapshot: &Snapshot,
    expected: Fingerprint,
    found: Fingerprint,
    report: &mut AuditReport,
) -> Result<()> {
    let mut finding = |task, detail| index_finding(report, task, detail);
    let cf = ledger.db().cf_handle(CF_TASK_INDEX).expect("fingerprinted");
    // Tasks whose entry is right, and tasks that have an entry, right or wrong.
    let (mut right, mut listed) = (0u64, 0u64);
    for item in snapshot.iterator_cf(cf, IteratorMode::Start) {
        let (k, v) = item?;
        let Some((task, entry)) = IndexEntry::decode(&k, &v) else {
            finding(None, format!("malformed task index entry {k:02x?}"));
            continue;
        };
        // A task whose events cannot all be read is reported where they are read
        // (event-decodable); its entry is not judged here.
        let Ok(events) = ledger.task_events(task) else {
            listed += 1;
            continue;
        };
        let state = sendledger_core::fold(&events);
        let wanted = IndexEntry::of(&state);
        listed += u64::from(wanted.is_some());
        match wanted {
            Some(wanted) if wanted == entry => right += 1,
            wanted => finding(
                Some(task),
                format!(
                    "the task index lists task {task} as {} since {} at {}, but its events say {}",
                    entry.phase.name(),
                    entry.since,
                    entry.target,
                    wanted.map_or("it has no entry".into(), |w| format!(
                        "{} since {}",
                        w.phase.name(),
                        w.since
                    ))
                ),
            ),
        }
    }
    if listed < expected.count {
        finding(
            None,
            format!(
                "{} task(s) are missing from the task index ({} entries, {} tasks to index, \
                 {right} of them right): lists and bulk retries do not see them",
                expected.count - listed,
                found.count,
                expected.count
            ),
        );
    }
    Ok(())
}

/// The slow comparison, when the fingerprints differ: every index entry is looked up in the
/// log. Also names the task of each undecodable event that the index knows.
fn compare_index(
    ledger: &Ledger,
    snapshot: &Snapshot,
    log_print: Fingerprint,
    undecodable: &[u64],
    report: &mut AuditReport,
) -> Result<()> {
    let log = ledger.cf(CF_LOG);
    let mut matching = 0u64;
    let mut attributed = Vec::new();
    for item in snapshot.iterator_cf(ledger.cf(CF_TASK_EVENTS), IteratorMode::Start) {
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
        let problem = match snapshot.get_cf(log, lsn_key(lsn))? {
            None => "indexed event missing from the log".to_string(),
            Some(bytes) => match decode_event(lsn, &bytes) {
                Err(e) => {
                    attributed.push(lsn);
                    report.violations.push(Finding::integrity(
                        Integrity::EventDecodable,
                        Some(task),
                        vec![lsn],
                        format!("event {seq} of the task: {}", Chain(&e)),
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
        let detail = match snapshot.get_cf(log, lsn_key(lsn))? {
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
