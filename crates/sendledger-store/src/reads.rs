//! Reads of a task's events straight from the database, shared by the ledger's readers and the
//! journal (which checks a task's history before it writes).

use rocksdb::{Direction, IteratorMode, ReadOptions, DB};
use sendledger_core::{Event, Retained, TaskId};

use crate::envelope::decode_event;
use crate::error::{Error, Result};
use crate::keys::*;
use crate::retention::{decode_retained, Digest};

/// The requests partition a task's request came from, as its first event records it.
pub(crate) fn request_partition(db: &DB, task: TaskId) -> Result<Option<i32>> {
    Ok(task_event(db, task, 0)?.and_then(|e| e.body.source().map(|s| s.partition)))
}

/// A task's event `seq`, read from the ledger's database.
pub(crate) fn task_event(db: &DB, task: TaskId, seq: u32) -> Result<Option<Event>> {
    let cf = |name| {
        db.cf_handle(name)
            .expect("column families are created at open")
    };
    let snapshot = db.snapshot();
    let read = || at(&snapshot);
    let Some(lsn) = db.get_cf_opt(cf(CF_TASK_EVENTS), task_event_key(task, seq), &read())? else {
        return Ok(None);
    };
    let lsn = decode_u64(&lsn).ok_or(Error::BadValue {
        what: "task_events",
    })?;
    indexed_event(lsn, db.get_cf_opt(cf(CF_LOG), lsn_key(lsn), &read())?).map(Some)
}

/// A task's events in task order, read from the ledger's database (the journal reads them too).
/// A task whose history retention removed begins with the `Pruned` event of what it kept.
pub(crate) fn task_events(db: &DB, task: TaskId) -> Result<Vec<Event>> {
    let stored = task_stored(db, task)?;
    let kept = stored.kept()?;
    stored.history(task, kept.as_ref().map(|(r, _)| r))
}

/// A task's records as stored: what retention kept of it, and its events' envelopes.
pub(crate) struct Stored {
    pub retained: Option<Vec<u8>>,
    /// LSN and envelope of each event in the log, in task order.
    pub events: Vec<(u64, Vec<u8>)>,
    /// The sequence number each of `events` is indexed under.
    pub seqs: Vec<u32>,
}

impl Stored {
    /// What retention kept of the task, decoded, with the digest of the events it removed.
    pub fn kept(&self) -> Result<Option<(Retained, Option<Digest>)>> {
        self.retained.as_deref().map(decode_retained).transpose()
    }

    /// The task's events as every reader sees them: `kept` (what [`Stored::kept`] gives) as a
    /// `Pruned` event at `task_seq` 0, then the events in the log.
    pub fn history(&self, task: TaskId, kept: Option<&Retained>) -> Result<Vec<Event>> {
        let events = (self.events.iter()).map(|(lsn, bytes)| decode_event(*lsn, bytes));
        kept.map(|r| Ok(r.event(task)))
            .into_iter()
            .chain(events)
            .collect()
    }
}

/// A task's records as stored (see [`task_events`]).
pub(crate) fn task_stored(db: &DB, task: TaskId) -> Result<Stored> {
    let cf = |name| {
        db.cf_handle(name)
            .expect("column families are created at open")
    };
    let snapshot = db.snapshot();
    let read = || at(&snapshot);
    let retained = match db.cf_handle(CF_RETAINED) {
        Some(retained) => db.get_cf_opt(retained, task.0, &read())?,
        None => None,
    };
    let mut lsns = Vec::new();
    let mut seqs = Vec::new();
    let start = task_event_key(task, 0);
    for item in db.iterator_cf_opt(
        cf(CF_TASK_EVENTS),
        read(),
        IteratorMode::From(&start, Direction::Forward),
    ) {
        let (k, v) = item?;
        if k[..16] != task.0 {
            break;
        }
        let bad = || Error::BadValue {
            what: "task_events",
        };
        lsns.push(decode_u64(&v).ok_or_else(bad)?);
        seqs.push(
            (k.get(16..20).and_then(|b| b.try_into().ok()))
                .map(u32::from_be_bytes)
                .ok_or_else(bad)?,
        );
    }
    let log = cf(CF_LOG);
    let keys: Vec<_> = lsns.iter().map(|l| (log, lsn_key(*l))).collect();
    let events = db
        .multi_get_cf_opt(keys, &read())
        .into_iter()
        .zip(lsns)
        .map(|(v, lsn)| match v? {
            Some(bytes) => Ok((lsn, bytes)),
            None => Err(missing(lsn)),
        })
        .collect::<Result<_>>()?;
    Ok(Stored {
        retained,
        events,
        seqs,
    })
}

/// Reads at `snapshot`. A task's reads (what retention kept of it, its index, its events) are
/// made at one snapshot: retention removes a task's index entries and events and writes what
/// it keeps in one batch, and reads on either side of it would find an index entry whose event
/// is gone, which is corruption only when one snapshot sees it.
fn at(snapshot: &rocksdb::SnapshotWithThreadMode<'_, DB>) -> ReadOptions {
    let mut options = ReadOptions::default();
    options.set_snapshot(snapshot);
    options
}

/// The event the task index points to at `lsn`, as read from the log: missing is corruption.
fn indexed_event(lsn: u64, bytes: Option<Vec<u8>>) -> Result<Event> {
    match bytes {
        Some(bytes) => decode_event(lsn, &bytes),
        None => Err(missing(lsn)),
    }
}

fn missing(lsn: u64) -> Error {
    Error::Corrupt {
        lsn,
        detail: "indexed event missing from the log".into(),
    }
}
