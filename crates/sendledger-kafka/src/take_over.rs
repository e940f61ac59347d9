//! Kafka mode's take-over of a partition, from its log opened (every older writer fenced) to
//! the partition ready to be owned: the ledger's copy checked against the log, the log read
//! from the copy's checkpoint and applied a step at a time (or the whole log, and the copy
//! truncated to it). Generic over the brokers ([`Brokers`]: [`Kafka`], or the
//! simulation's model of them) and over the writer of the copy ([`Copy`]: the engine, or the
//! simulation's instance), so that the simulation runs this code.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::message::Message as _;
use sendledger_core::error::Chain;
use sendledger_core::{Event, Retained, TaskId};
use sendledger_store::{install_append, restore_append, truncate_append, Ledger, Logged};

pub use crate::partition_log::LastTransaction;
use crate::partition_log::{
    event_at, read_partition, record_event, PartitionLog, TransactionalLog,
};
use crate::snapshot::{Entry, Manifest};
use crate::Kafka;

/// How long a take-over waits for the brokers (opening the log, reading it).
pub const TAKE_OVER_TIMEOUT: Duration = Duration::from_secs(30);

/// Events applied per restore step: a partition's log is read and applied in steps, so a long
/// log never sits in memory whole (each step records its checkpoint).
pub const RESTORE_STEP: usize = 10_000;

/// How long a take-over (or a standby starting to follow a partition) waits for a transaction
/// of the partition's last generation here to end (see
/// [`sendledger_store::Ledger::quiesce_blocking`]).
pub const QUIESCE: Duration = Duration::from_secs(5);

/// The brokers as a take-over reads them.
pub trait Brokers: Sync {
    type Log: TransactionalLog;

    /// Opens partition `partition`'s log: fences every older writer and ends its open
    /// transaction.
    fn open(&self, partition: i32) -> Result<Self::Log, String>;

    /// The end of the events partition, and its first committed event at `offset` or after,
    /// with its offset.
    fn event_at(&self, partition: i32, offset: i64) -> Result<(i64, Option<(i64, Event)>), String>;

    /// Reads the committed events of the partition from `from` to its end, in order, each
    /// with its offset and its record's timestamp (ms).
    fn read(
        &self,
        partition: i32,
        from: i64,
        each: &mut dyn FnMut(i64, i64, Event) -> Result<(), String>,
    ) -> Result<(), String>;

    /// The first offset the events partition still holds (its retention may have removed
    /// the events before it).
    fn log_start(&self, _partition: i32) -> Result<i64, String> {
        Ok(0)
    }

    /// The manifest of the partition's latest snapshot, when snapshots are written and there
    /// is one ([`crate::snapshot`]).
    fn latest_snapshot(&self, _partition: i32) -> Result<Option<Manifest>, String> {
        Ok(None)
    }

    /// Reads the chunks of the snapshot `manifest` describes, in order, each checked
    /// ([`crate::snapshot::read_chunks`]).
    fn read_snapshot(
        &self,
        manifest: &Manifest,
        _each: &mut dyn FnMut(Vec<Entry>) -> Result<(), String>,
    ) -> Result<(), String> {
        Err(format!("snapshot {:x} cannot be read here", manifest.id))
    }
}

/// The writer of the ledger's copy of a partition during its take-over.
pub trait Copy {
    fn ledger(&self) -> &Ledger;

    /// Applies a restore step: `events` read from the log, recorded with where they end in it
    /// (none while a truncation is under way). Returns the events applied.
    fn restore(
        &self,
        partition: i32,
        events: Vec<Event>,
        checkpoint: Option<Logged>,
    ) -> Result<usize, String>;

    /// Records tasks of the partition known from a snapshot by what retention keeps of them
    /// ([`install_append`], replacing what the copy holds of them when `replace`), before the
    /// snapshot's events are restored. Returns how many were recorded.
    fn install(
        &self,
        partition: i32,
        kept: Vec<(TaskId, Retained)>,
        replace: bool,
    ) -> Result<usize, String> {
        let ledger = self.ledger();
        let mut append =
            install_append(ledger, kept, replace).map_err(|e| Chain(&e).to_string())?;
        let n = append.tasks.len();
        append.restored = true;
        append.partition = Some(partition);
        ledger
            .append_blocking(append)
            .map_err(|e| Chain(&e).to_string())?;
        Ok(n)
    }

    /// Truncates the copy to the log, once the whole log was restored over it: `logged` is
    /// how many events the log holds of each task, `checkpoint` where the log ends.
    fn truncate(
        &self,
        partition: i32,
        logged: HashMap<TaskId, u32>,
        checkpoint: Logged,
    ) -> Result<(), String>;
}

/// The ledger's copy written directly, as the engine's restore and truncation write it minus
/// the engine's ownership check and metrics: for tools and the simulation, which take
/// partitions over without a running engine.
pub struct LedgerCopy<'a> {
    pub ledger: &'a Ledger,
}

impl Copy for LedgerCopy<'_> {
    fn ledger(&self) -> &Ledger {
        self.ledger
    }

    fn restore(
        &self,
        partition: i32,
        events: Vec<Event>,
        checkpoint: Option<Logged>,
    ) -> Result<usize, String> {
        let restored = restore_append(self.ledger, events).map_err(|e| Chain(&e).to_string())?;
        let n = restored.append.events.len();
        let (append, _) = restored.into_append(partition, checkpoint);
        self.ledger
            .append_blocking(append)
            .map_err(|e| Chain(&e).to_string())?;
        Ok(n)
    }

    fn truncate(
        &self,
        partition: i32,
        logged: HashMap<TaskId, u32>,
        checkpoint: Logged,
    ) -> Result<(), String> {
        let restored =
            truncate_append(self.ledger, partition, &logged).map_err(|e| Chain(&e).to_string())?;
        let (append, _) = restored.into_append(partition, Some(checkpoint));
        self.ledger
            .append_blocking(append)
            .map_err(|e| Chain(&e).to_string())?;
        Ok(())
    }
}

/// What a restore did.
#[derive(Debug, Default)]
pub struct Restore {
    /// Events applied.
    pub events: usize,
    /// Why the copy was found apart from its log and truncated to it, if it was.
    pub truncated: Option<String>,
    /// Time spent applying (the rest is waiting for the brokers).
    pub applying: Duration,
    /// The snapshot the restore began from, if it began from one.
    pub snapshot: Option<Manifest>,
}

/// Restores partition `partition`, whose log was just opened, from `brokers` into `copy` in
/// steps of `step` events. Call it before the partition is owned.
///
/// The copy is checked against the log first: the log must still hold, at the offset before
/// the checkpoint, the last event the copy recorded. A copy ahead of its log or apart from it
/// (the brokers lost committed events, or a tail was written again since) is restored from the
/// log's start and truncated to it. The log is read on a thread of its own, two steps ahead at
/// most, while the last step is applied.
pub fn restore<B: Brokers>(
    brokers: &B,
    copy: &impl Copy,
    partition: i32,
    step: usize,
) -> Result<Restore, String> {
    let step_size = step.max(1);
    let ledger = copy.ledger();
    let (checkpoint, truncated) = copy_checkpoint(brokers, ledger, partition)?;
    let start = brokers.log_start(partition)?;
    let mut restore = Restore::default();
    // Truncating: how many events the log holds of each task.
    let mut logged: HashMap<TaskId, u32> = HashMap::new();
    // A copy that holds nothing of the partition begins from its latest snapshot, if there
    // is one the log agrees with; the events after it are restored as after a checkpoint. So
    // does a copy found apart from a log that no longer holds its first events (the brokers
    // lost events, or this instance was away longer than the retention), brought up to the
    // snapshot and then truncated to the snapshot and the log after it.
    let behind = truncated.is_some() && start > 0;
    if checkpoint.is_none() || behind {
        let truncating = behind.then_some(&mut logged);
        restore.snapshot = begin_from_snapshot(brokers, copy, partition, &mut restore, truncating)?;
    }
    if behind && restore.snapshot.is_none() {
        return Err(format!(
            "the copy of partition {partition} cannot be checked against its log ({}), the log no longer holds its first events (it starts at offset {start}; the brokers lost events, or this instance was away longer than the events topic's retention), and no snapshot of it can be used: the copy cannot be truncated to the log; move this instance's ledger directory away and start it again",
            truncated.unwrap_or_default()
        ));
    }
    // From the copy's last transaction on, which the copy holds but which may be the one a
    // fenced writer's partial commit left without its results: a copy kept current (by its
    // owner, or as a standby) reads it again to see it whole.
    let tail_start = ledger
        .log_tail(partition)
        .map_err(|e| Chain(&e).to_string())?;
    // Never before the log's start: what retention removed cannot be read (a copy whose
    // checkpoint is before it was found apart from the log above).
    let from = match (&restore.snapshot, checkpoint, &truncated) {
        (Some(m), ..) => m.tail_first.max(start),
        (None, Some(c), None) => tail_start.map_or(c, |t| t.min(c)).max(start),
        _ => start,
    };
    if checkpoint.is_none() && restore.snapshot.is_none() && start > 0 {
        tracing::error!(partition, start, "the partition's log no longer holds its first events and no snapshot of it can be used: the tasks whose events were removed are not known here, and a redelivery of their requests runs again");
    }
    let snapshot_end = (restore.snapshot.as_ref()).map(|m| Logged {
        first: m.tail_first,
        next: m.next,
    });
    let truncate = truncated.is_some();
    restore.truncated = truncated;
    std::thread::scope(|scope| {
        // Each step comes with where it ends in the log (none for an empty step): the
        // checkpoint, whose offset before is an event, and its last transaction's start.
        let (steps, decoded) = std::sync::mpsc::sync_channel::<(Vec<Event>, Option<Logged>)>(2);
        let reader = scope.spawn(move || -> Result<(), String> {
            let mut step = Vec::with_capacity(step_size);
            let mut tail = LastTransaction::default();
            brokers.read(partition, from, &mut |offset, timestamp, event| {
                tail.read(offset, timestamp, &event);
                step.push(event);
                if step.len() >= step_size {
                    let full = std::mem::replace(&mut step, Vec::with_capacity(step_size));
                    steps
                        .send((full, tail.logged()))
                        .map_err(|_| "the restore stopped".to_string())?;
                }
                Ok(())
            })?;
            let _ = steps.send((step, tail.logged()));
            Ok(())
        });
        // Truncating: where the log ends.
        let mut end = snapshot_end;
        let mut failed = None;
        for (events, next) in decoded.iter() {
            let at = std::time::Instant::now();
            if truncate {
                for e in &events {
                    let n = logged.entry(e.task_id).or_default();
                    *n = (*n).max(e.task_seq + 1);
                }
                end = next.or(end);
            }
            // A copy being truncated records its checkpoint with the truncation: until then, a
            // take-over finds it apart from its log again.
            match copy.restore(partition, events, next.filter(|_| !truncate)) {
                Ok(n) => {
                    restore.applying += at.elapsed();
                    restore.events += n;
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        // Stops the reader if applying failed.
        drop(decoded);
        let read = reader
            .join()
            .unwrap_or_else(|_| Err("the log's reader panicked".into()));
        if let Some(e) = failed {
            return Err(e);
        }
        read?;
        if truncate {
            if restore.snapshot.is_some() {
                // A settled task the snapshot left out (its identity's retention ended) is not
                // one the log lost: it is left as it is.
                for item in ledger.task_summaries() {
                    let (id, summary) = item.map_err(|e| Chain(&e).to_string())?;
                    if summary.phase.is_terminal() {
                        logged.entry(id).or_insert(summary.next_seq);
                    }
                }
            }
            let end = end.unwrap_or(Logged { first: 0, next: 0 });
            copy.truncate(partition, std::mem::take(&mut logged), end)?;
        }
        Ok(())
    })?;
    Ok(restore)
}

/// The partition's latest snapshot, if there is one and the log agrees with it: the log
/// reaches its end, and holds at the offset before it the event it names, unless retention
/// removed that event. A snapshot the log disagrees with is not used (the whole log is read).
fn usable_snapshot(brokers: &impl Brokers, partition: i32) -> Result<Option<Manifest>, String> {
    let Some(manifest) = brokers.latest_snapshot(partition)? else {
        return Ok(None);
    };
    let last = manifest.last_event()?;
    let at = manifest.next - 1;
    let (end, found) = brokers.event_at(partition, at)?;
    let id = |e: &Event| (e.task_id, e.task_seq, e.at, e.body.clone());
    let apart = match found {
        _ if end < manifest.next => Some(format!("the log ends at offset {end}, before it")),
        Some((offset, logged)) if offset == at => {
            (id(&logged) != id(&last)).then(|| format!("the log's event at offset {at} is another"))
        }
        // Removed by the log's retention: nothing to compare with.
        _ => None,
    };
    if let Some(why) = apart {
        tracing::error!(partition, snapshot = %format!("{:x}", manifest.id), next = manifest.next, why = %why, "the partition's latest snapshot is not what its log holds: it is not used, and the log is read from its start");
        return Ok(None);
    }
    Ok(Some(manifest))
}

/// Begins a copy of the partition from its latest snapshot the log agrees with, if there is
/// one (see [`restore`]); returns that snapshot, applied. `restore` counts the events applied
/// and the time spent. A copy that holds nothing of the partition records the snapshot's end
/// as its checkpoint; one being truncated (`truncating`: how many events the log holds of
/// each task, filled in) has its tasks brought up to the snapshot, and records its checkpoint
/// with the truncation.
pub(crate) fn begin_from_snapshot(
    brokers: &impl Brokers,
    copy: &impl Copy,
    partition: i32,
    restore: &mut Restore,
    mut truncating: Option<&mut HashMap<TaskId, u32>>,
) -> Result<Option<Manifest>, String> {
    let Some(manifest) = usable_snapshot(brokers, partition)? else {
        return Ok(None);
    };
    // Each chunk's settled tasks installed by what retention keeps of them, then its other
    // events restored; the last chunk records where the snapshot ends, unless truncating.
    let mut left = manifest.chunks.len();
    brokers.read_snapshot(&manifest, &mut |entries| {
        left -= 1;
        let at = std::time::Instant::now();
        let mut kept = Vec::new();
        let mut events = Vec::new();
        for entry in entries {
            if let Some(logged) = truncating.as_deref_mut() {
                let covered = entry.kept.as_ref().map_or(0, |r| r.events);
                logged.insert(entry.task, covered + entry.events.len() as u32);
            }
            let history = entry.history()?;
            let skip = usize::from(entry.kept.is_some());
            events.extend(history.into_iter().skip(skip));
            if let Some(retained) = entry.kept {
                kept.push((entry.task, retained));
            }
        }
        copy.install(partition, kept, truncating.is_some())?;
        let checkpoint = (left == 0 && truncating.is_none()).then_some(Logged {
            first: manifest.tail_first,
            next: manifest.next,
        });
        restore.events += copy.restore(partition, events, checkpoint)?;
        restore.applying += at.elapsed();
        Ok(())
    })?;
    Ok(Some(manifest))
}

/// The copy's checkpoint of `partition`, and why the copy is not what its log holds, if it is
/// not (see [`check_copy`]).
pub(crate) fn copy_checkpoint(
    brokers: &impl Brokers,
    ledger: &Ledger,
    partition: i32,
) -> Result<(Option<i64>, Option<String>), String> {
    let checkpoint = ledger
        .log_checkpoint(partition)
        .map_err(|e| Chain(&e).to_string())?;
    let apart = match checkpoint {
        Some(checkpoint) if checkpoint > 0 => check_copy(brokers, ledger, partition, checkpoint)?,
        _ => None,
    };
    Ok((checkpoint, apart))
}

fn check_copy(
    brokers: &impl Brokers,
    ledger: &Ledger,
    partition: i32,
    checkpoint: i64,
) -> Result<Option<String>, String> {
    let last = checkpoint - 1;
    let (end, found) = brokers.event_at(partition, last)?;
    if end < checkpoint {
        return Ok(Some(format!(
            "the log ends at offset {end}, before the copy's checkpoint {checkpoint}"
        )));
    }
    let Some((_, logged)) = found.filter(|(offset, _)| *offset == last) else {
        return Ok(Some(format!(
            "the log holds no committed event at offset {last}, the last one the copy recorded"
        )));
    };
    let held = ledger
        .task_event(logged.task_id, logged.task_seq)
        .map_err(|e| Chain(&e).to_string())?;
    // A task the copy knows from a snapshot by what retention keeps of it: its events up to
    // there were checked against the log with the snapshot.
    let covered = || -> Result<bool, String> {
        let kept = (ledger.retained(logged.task_id)).map_err(|e| Chain(&e).to_string())?;
        Ok(kept.is_some_and(|r| logged.task_seq < r.events))
    };
    match held {
        Some(held) if held.body == logged.body && held.at == logged.at => Ok(None),
        None if covered()? => Ok(None),
        _ => Ok(Some(format!(
            "the log's event at offset {last} (task {} event {}) is not one the copy recorded",
            logged.task_id, logged.task_seq
        ))),
    }
}

impl Brokers for Kafka {
    type Log = PartitionLog;

    fn open(&self, partition: i32) -> Result<PartitionLog, String> {
        PartitionLog::open(self, partition, TAKE_OVER_TIMEOUT).map_err(|e| Chain(&e).to_string())
    }

    fn event_at(&self, partition: i32, offset: i64) -> Result<(i64, Option<(i64, Event)>), String> {
        event_at(self, partition, offset, TAKE_OVER_TIMEOUT).map_err(|e| Chain(&e).to_string())
    }

    fn read(
        &self,
        partition: i32,
        from: i64,
        each: &mut dyn FnMut(i64, i64, Event) -> Result<(), String>,
    ) -> Result<(), String> {
        // Why `each` stopped the read, kept apart from the brokers' errors.
        let mut stopped = None;
        let read = read_partition(self, partition, from, TAKE_OVER_TIMEOUT, |record| {
            let event = record_event(record)?;
            let timestamp = record.timestamp().to_millis().unwrap_or(0);
            each(record.offset(), timestamp, event).map_err(|why| {
                stopped = Some(why.clone());
                crate::Error::Replay {
                    topic: self.config().events_topic.clone(),
                    detail: why,
                }
            })
        });
        match (read, stopped) {
            (_, Some(why)) => Err(why),
            (Err(e), None) => Err(Chain(&e).to_string()),
            (Ok(_), None) => Ok(()),
        }
    }

    fn log_start(&self, partition: i32) -> Result<i64, String> {
        crate::snapshot::log_start(self, partition, TAKE_OVER_TIMEOUT)
            .map_err(|e| Chain(&e).to_string())
    }

    fn latest_snapshot(&self, partition: i32) -> Result<Option<Manifest>, String> {
        if self.config().snapshot_interval.is_none() {
            return Ok(None);
        }
        crate::snapshot::latest(self, partition, TAKE_OVER_TIMEOUT)
            .map_err(|e| Chain(&e).to_string())
    }

    fn read_snapshot(
        &self,
        manifest: &Manifest,
        each: &mut dyn FnMut(Vec<Entry>) -> Result<(), String>,
    ) -> Result<(), String> {
        crate::snapshot::read_chunks(self, manifest, TAKE_OVER_TIMEOUT, each)
            .map_err(|e| Chain(&e).to_string())
    }
}
