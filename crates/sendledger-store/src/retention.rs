//! Retention: removing the history of a settled task and keeping a [`Retained`] of it
//! (`docs/operating/retention.md`).
//!
//! A task is removed by the writer of its events (its actor), through the journal, in one
//! batch: its log entries, its per-task index, its identity and its task-index entry go, its
//! [`Retained`] is written to the `retained` column family, and the ledger's [`PrunedTotals`]
//! count what went (the audit accounts for every LSN missing from the log with them). Its
//! summary stays, so start-up and reads know the task. Reads of its events give the
//! [`Retained`] as one `Pruned` event at `task_seq` 0, then any events recorded after it.
//!
//! What may be removed ([`crate::Ledger::prune_plan`]): a task settled with a terminal result
//! ([`Retained::of`]), that entered its terminal phase before the cutoff, whose every event is
//! published (at or below each named cursor). Never a task in progress, in review or with an
//! unpublished result.

use sendledger_core::event::Millis;
use sendledger_core::{Retained, TaskId};

use crate::error::{Error, Result};
use crate::keys::*;
use crate::task_index::IndexEntry;

/// The envelope version of a `retained` value (then bincode of [`Retained`]).
// format: do not change
const RETAINED_V1: u8 = 1;

pub(crate) fn encode_retained(retained: &Retained) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    out.push(RETAINED_V1);
    bincode::serialize_into(&mut out, retained).expect("bincode into Vec is infallible");
    out
}

pub(crate) fn decode_retained(bytes: &[u8]) -> Result<Retained> {
    match bytes.split_first() {
        Some((&RETAINED_V1, rest)) => {
            bincode::deserialize(rest).map_err(|_| Error::BadValue { what: "retained" })
        }
        _ => Err(Error::BadValue { what: "retained" }),
    }
}

/// What retention removed from a ledger so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrunedTotals {
    /// Log entries removed: every LSN missing from the log is one of them.
    pub events: u64,
    /// Tasks whose history was removed (a task removed twice counts twice).
    pub tasks: u64,
    /// The highest LSN removed: the log's last LSN is never below it, even when the newest
    /// entries were removed.
    pub last_lsn: u64,
    /// Removed tasks whose identity was then forgotten too (`storage.identity_retention`).
    pub forgotten: u64,
}

impl PrunedTotals {
    // format: do not change
    pub(crate) fn encode(&self) -> [u8; 32] {
        let mut v = [0u8; 32];
        v[..8].copy_from_slice(&self.events.to_be_bytes());
        v[8..16].copy_from_slice(&self.tasks.to_be_bytes());
        v[16..24].copy_from_slice(&self.last_lsn.to_be_bytes());
        v[24..].copy_from_slice(&self.forgotten.to_be_bytes());
        v
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<PrunedTotals> {
        let field = |i: usize| {
            bytes
                .get(i * 8..i * 8 + 8)
                .and_then(decode_u64)
                .ok_or(Error::BadValue { what: "pruned" })
        };
        if bytes.len() != 32 {
            return Err(Error::BadValue { what: "pruned" });
        }
        Ok(PrunedTotals {
            events: field(0)?,
            tasks: field(1)?,
            last_lsn: field(2)?,
            forgotten: field(3)?,
        })
    }
}

/// The removal of one settled task's history, as [`crate::Ledger::prune_plan`] plans it and the
/// journal carries it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prune {
    pub task: TaskId,
    pub retained: Retained,
    /// The LSNs of the events removed.
    pub lsns: Vec<u64>,
    /// The task's task-index entry, removed with them.
    pub index: Option<IndexEntry>,
}

/// The forgetting of a removed task's identity: what retention kept of it and whatever was
/// recorded after it go, as if the task had never been (`storage.identity_retention`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forget {
    pub task: TaskId,
    /// When it settled: its `retained_by_time` key.
    pub settled_at: Millis,
    /// The LSNs of the events recorded after its history was removed.
    pub lsns: Vec<u64>,
}

/// What retention kept of `task`. A ledger of format 4 opened read-only has no `retained`
/// family: nothing was removed from it.
pub(crate) fn retained(db: &rocksdb::DB, task: TaskId) -> Result<Option<Retained>> {
    let Some(cf) = db.cf_handle(CF_RETAINED) else {
        return Ok(None);
    };
    db.get_cf(cf, task.0)?
        .map(|v| decode_retained(&v))
        .transpose()
}

pub(crate) fn pruned_totals(db: &rocksdb::DB) -> Result<PrunedTotals> {
    let meta = db
        .cf_handle(CF_META)
        .expect("opened with every column family");
    match db.get_cf(meta, META_PRUNED)? {
        Some(v) => PrunedTotals::decode(&v),
        None => Ok(PrunedTotals::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sendledger_core::event::Ended;
    use sendledger_core::{Identity, PayloadHash};

    /// The bytes of a `retained` value and of the `pruned` record are on disk: a change to
    /// either encoding fails here.
    #[test]
    fn retained_values_keep_their_encoding() {
        let retained = Retained {
            identity: Identity {
                tenant: "t".into(),
                operation: "o".into(),
                request_key: "k".into(),
            },
            target: "p".into(),
            payload_hash: PayloadHash([7; 32]),
            status: Ended::Succeeded,
            remote_id: Some("r".into()),
            remote_target: None,
            reason: None,
            http_status: None,
            attempts: 1,
            version: 1,
            result_seq: 2,
            result_lsn: 3,
            result_at: 4,
            events: 3,
            settled_at: 4,
        };
        let bytes = encode_retained(&retained);
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "0101000000000000007401000000000000006f01000000000000006b0100000000000000700707070707\
             070707070707070707070707070707070707070707070707070707000000000101000000000000007200\
             000001000000010000000200000003000000000000000400000000000000030000000400000000000000"
        );
        assert_eq!(decode_retained(&bytes).unwrap(), retained);
        assert!(decode_retained(&[2, 0]).is_err());
        let totals = PrunedTotals {
            events: 1,
            tasks: 2,
            last_lsn: 3,
            forgotten: 4,
        };
        assert_eq!(PrunedTotals::decode(&totals.encode()).unwrap(), totals);
        assert_eq!(
            (totals.encode()[7], totals.encode()[15], totals.encode()[31]),
            (1, 2, 4)
        );
        assert!(PrunedTotals::decode(&[0; 24]).is_err());
    }
}
