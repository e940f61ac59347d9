//! Kafka mode's partition snapshots (`docs/kafka-mode.md`, "Snapshots"): the state of a
//! partition's tasks as its log of record folds it up to an offset, written to the snapshots
//! topic, so that a take-over on an empty disk reads the latest snapshot and the log after it
//! instead of the whole log, and the events topic can keep a finite retention.
//!
//! A snapshot holds one [`Entry`] per task the log recorded: a settled task with its result
//! announced by what retention keeps of it (a [`Retained`], about a hundred bytes, enough to
//! answer a redelivery with the task's result and never execute it again), any other task by
//! its events. So its size follows the tasks that matter and the count of identities, not the
//! events of history. A snapshot is made from the previous one and the log after it
//! ([`Compactor`]), never from a local copy: it is a statement about the log ("its events up to
//! offset `next` fold to these tasks") that stays true whoever writes it and whenever, and a
//! take-over checks it against the log before using it (the log still holds, at `next - 1`,
//! the event the snapshot names, unless retention removed it).
//!
//! Records (in the snapshots topic's partition of the same number): a snapshot's chunks, then
//! its [`Manifest`], which names the first chunk's offset and each chunk's digest; a reader
//! finds the last manifest from the partition's end and uses a snapshot only whole. Values
//! are a format byte, a kind byte and bincode.

mod io;

use std::collections::BTreeMap;

use sendledger_core::event::Millis;
use sendledger_core::{fold, Event, Retained, State, TaskId};
use sendledger_store::envelope::{decode_event, encode_event};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

pub use io::{latest, log_start, read_chunks, write, Written};

/// The format of snapshot records.
// format: do not change
const FORMAT_V1: u8 = 1;
// format: do not change
const KIND_CHUNK: u8 = 0;
// format: do not change
const KIND_MANIFEST: u8 = 1;

/// Bytes of entries a chunk holds at most (one large entry alone may exceed it): well under
/// the brokers' default largest message (1 MB).
pub const CHUNK_BYTES: usize = 512 * 1024;

/// One task of a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub task: TaskId,
    /// What retention keeps of the task's history up to [`Retained::events`], when the task
    /// settled with a result announced.
    pub kept: Option<Retained>,
    /// The task's events after `kept` (all of them when there is none), each in the ledger's
    /// versioned envelope.
    pub events: Vec<Vec<u8>>,
}

impl Entry {
    /// The task's events as a ledger reads them: `kept` as a `Pruned` event, then the rest.
    pub fn history(&self) -> Result<Vec<Event>, String> {
        let kept = self.kept.as_ref().map(|r| Ok(r.event(self.task)));
        let events = self
            .events
            .iter()
            .map(|bytes| decode_event(0, bytes).map_err(|e| format!("task {}: {e}", self.task)));
        kept.into_iter().chain(events).collect()
    }
}

/// An event in the ledger's envelope, as a snapshot holds it: at LSN 0 (it is in no ledger's
/// log; a ledger that restores it gives it one).
pub fn envelope(event: &Event) -> Vec<u8> {
    encode_event(&Event {
        lsn: 0,
        ..event.clone()
    })
}

/// A chunk of a snapshot's entries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    /// The snapshot it belongs to ([`Manifest::id`]).
    pub id: u64,
    /// Its place among the snapshot's chunks, from 0.
    pub index: u32,
    pub entries: Vec<Entry>,
}

/// What a snapshot is and where its chunks are: written after them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Shared by its chunks (chunks of other snapshots may be interleaved with them).
    pub id: u64,
    pub partition: i32,
    /// The events offset after the last event the snapshot holds: the log is read from here.
    pub next: i64,
    /// Offset of the first event of the log's last transaction before `next`: a take-over
    /// reads from it, to see that transaction whole (as from a ledger's checkpoint).
    pub tail_first: i64,
    /// The event at `next - 1`, in the ledger's envelope: checked against the log.
    pub last: Vec<u8>,
    /// Offset of the first chunk in the snapshots partition.
    pub first_chunk: i64,
    /// The SHA-256 of each chunk's value, in order.
    pub chunks: Vec<[u8; 32]>,
    /// Tasks in all, those of them kept as a [`Retained`], and the settled tasks left out
    /// because their identities' retention ended (`storage.identity_retention`).
    pub tasks: u64,
    pub kept: u64,
    pub forgotten: u64,
    /// When it was written, ms.
    pub written_at: u64,
}

impl Manifest {
    /// The event the snapshot ends with.
    pub fn last_event(&self) -> Result<Event, String> {
        decode_event(0, &self.last).map_err(|e| format!("the snapshot's last event: {e}"))
    }
}

/// A snapshot record, decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    Chunk(Chunk),
    Manifest(Manifest),
}

/// A chunk's record value.
pub fn encode_chunk(chunk: &Chunk) -> Vec<u8> {
    encode(KIND_CHUNK, chunk)
}

/// A manifest's record value.
pub fn encode_manifest(manifest: &Manifest) -> Vec<u8> {
    encode(KIND_MANIFEST, manifest)
}

fn encode(kind: u8, value: &impl Serialize) -> Vec<u8> {
    let mut out = vec![FORMAT_V1, kind];
    bincode::serialize_into(&mut out, value).expect("bincode into Vec is infallible");
    out
}

/// The kind of a record value, read without decoding the rest: a manifest's is small, a
/// chunk's is not worth decoding while a reader looks for the last manifest.
pub fn is_manifest(value: &[u8]) -> bool {
    value.starts_with(&[FORMAT_V1, KIND_MANIFEST])
}

/// Decodes a snapshot record value.
pub fn decode(value: &[u8]) -> Result<Record, String> {
    let bad = |e: bincode::Error| format!("a snapshot record that does not decode: {e}");
    match value {
        [FORMAT_V1, KIND_CHUNK, rest @ ..] => bincode::deserialize(rest)
            .map(Record::Chunk)
            .map_err(bad),
        [FORMAT_V1, KIND_MANIFEST, rest @ ..] => bincode::deserialize(rest)
            .map(Record::Manifest)
            .map_err(bad),
        [format, ..] if *format != FORMAT_V1 => Err(format!(
            "a snapshot record of format {format}, newer than this version of sendledger reads (1): upgrade it"
        )),
        _ => Err("a snapshot record that is not one".into()),
    }
}

/// The SHA-256 of a chunk's value.
pub fn chunk_digest(value: &[u8]) -> [u8; 32] {
    Sha256::digest(value).into()
}

/// A task as the compactor holds it: what retention keeps of it, its events after that, and
/// the state they fold to, kept only while the task is not reduced (a partition holds many
/// settled tasks: each costs its `Retained` alone).
struct Work {
    kept: Option<Retained>,
    events: Vec<Event>,
    state: Option<State>,
}

impl Work {
    fn history(&self, task: TaskId) -> Vec<Event> {
        let kept = self.kept.as_ref().map(|r| r.event(task));
        kept.into_iter()
            .chain(self.events.iter().cloned())
            .collect()
    }
}

/// Folds a partition's previous snapshot and the log after it into the next snapshot's
/// entries. A task is reduced to what retention keeps of it as soon as it settles with its
/// result announced; events read again (the log from the last transaction the previous
/// snapshot holds) are passed over when they are the ones held. Two different events at one
/// sequence number, or a gap, are refused: a snapshot is never written over a log that
/// holds two histories of a task (the take-over sends such a task to review).
///
/// With an identity retention, a task that settled before its cutoff (and is settled still) is
/// left out of the snapshot: its identity is forgotten, as `storage.identity_retention`
/// forgets it in local mode, later redeliveries notwithstanding (a request seen again after
/// that is a new task). So is a message that was not a valid request, rejected before it.
#[derive(Default)]
pub struct Compactor {
    tasks: BTreeMap<TaskId, Work>,
    forget_before: Option<Millis>,
}

/// The entries of a snapshot, and how many of them are kept as a [`Retained`] and how many
/// settled tasks were left out.
#[derive(Debug, Default)]
pub struct Compacted {
    pub entries: Vec<Entry>,
    pub kept: u64,
    pub forgotten: u64,
}

impl Compactor {
    /// A compactor that leaves out the tasks settled before `cutoff` (ms).
    pub fn forgetting(cutoff: Millis) -> Compactor {
        Compactor {
            forget_before: Some(cutoff),
            ..Compactor::default()
        }
    }

    /// Takes in an entry of the previous snapshot.
    pub fn previous(&mut self, entry: Entry) -> Result<(), String> {
        let history = entry.history()?;
        let state = (entry.kept.is_none() || !entry.events.is_empty()).then(|| fold(&history));
        let events = match entry.kept {
            Some(_) => history.into_iter().skip(1).collect(),
            None => history,
        };
        let work = Work {
            kept: entry.kept,
            events,
            state,
        };
        self.tasks.insert(entry.task, work);
        Ok(())
    }

    /// Takes in the log's next event.
    pub fn event(&mut self, event: Event) -> Result<(), String> {
        let task = event.task_id;
        let work = self.tasks.entry(task).or_insert_with(|| Work {
            kept: None,
            events: Vec::new(),
            state: Some(State::default()),
        });
        if work.state.is_none() {
            work.state = Some(fold(&work.history(task)));
        }
        let state = work.state.as_mut().expect("set above");
        let next = state.next_seq;
        if event.task_seq < next {
            let covered = work.kept.as_ref().map_or(0, |r| r.events);
            if event.task_seq < covered {
                return Ok(());
            }
            let held = &work.events[(event.task_seq - covered) as usize];
            if held.body == event.body && held.at == event.at {
                return Ok(());
            }
            return Err(format!(
                "task {} has two different events at sequence number {} in the log: no snapshot is written over two histories of a task",
                event.task_id, event.task_seq
            ));
        }
        if event.task_seq > next {
            return Err(format!(
                "task {} continues at event {} in the log after {next} of its events: an event is missing",
                event.task_id, event.task_seq
            ));
        }
        state.apply(task, event.at, &event.body);
        let settled = state.phase.is_terminal();
        work.events.push(event);
        if settled {
            if let Some(retained) = Retained::of(&work.history(task)) {
                work.kept = Some(retained);
                work.events.clear();
                work.state = None;
            }
        }
        Ok(())
    }

    /// The next snapshot's entries, in task order.
    pub fn entries(self) -> Compacted {
        let mut out = Compacted::default();
        let cutoff = self.forget_before.unwrap_or(0);
        for (task, work) in self.tasks {
            let forgotten = match (&work.kept, &work.state) {
                (Some(r), _) => work.events.is_empty() && r.settled_at < cutoff,
                // A message that was not a valid request has no identity to keep: it goes
                // whole (a redelivery of it, from its offset, is past the requests topic's
                // retention by then).
                (None, Some(s)) => {
                    s.request.is_none() && s.phase.is_terminal() && s.phase_since < cutoff
                }
                (None, None) => false,
            };
            if forgotten {
                out.forgotten += 1;
                continue;
            }
            out.kept += u64::from(work.kept.is_some());
            out.entries.push(Entry {
                task,
                kept: work.kept,
                events: work.events.iter().map(envelope).collect(),
            });
        }
        out
    }
}

/// Splits `entries` into chunks of about [`CHUNK_BYTES`] each, encoded.
pub fn chunks(id: u64, entries: Vec<Entry>) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut chunk = Chunk {
        id,
        index: 0,
        entries: Vec::new(),
    };
    let mut size = 0;
    for entry in entries {
        let entry_size = bincode::serialized_size(&entry).unwrap_or(0) as usize;
        if size + entry_size > CHUNK_BYTES && !chunk.entries.is_empty() {
            out.push(encode_chunk(&chunk));
            chunk.entries.clear();
            chunk.index += 1;
            size = 0;
        }
        size += entry_size;
        chunk.entries.push(entry);
    }
    if !chunk.entries.is_empty() {
        out.push(encode_chunk(&chunk));
    }
    out
}

#[cfg(test)]
mod tests;
