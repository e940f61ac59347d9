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
//! What may be removed ([`Ledger::prune_plan`]): a task settled with a terminal result
//! ([`Retained::of`]), that entered its terminal phase before the cutoff, whose every event is
//! published (at or below each named cursor). Never a task in progress, in review or with an
//! unpublished result.

use rocksdb::{Direction, IteratorMode};
use sendledger_core::event::Millis;
use sendledger_core::{check_task, CheckConfig, EventBody, Phase, Retained, TaskId};

use crate::error::{Error, Result};
use crate::keys::*;
use crate::ledger::Ledger;
use crate::task_index::{prefix, IndexEntry};

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

/// The removal of one settled task's history, as [`Ledger::prune_plan`] plans it and the
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

/// The phases a task may be removed in.
const SETTLED: [Phase; 4] = [
    Phase::Succeeded,
    Phase::Rejected,
    Phase::Failed,
    Phase::Compensated,
];

impl Ledger {
    /// At most `limit` tasks that settled before `cutoff`, from the task index (each target's
    /// oldest first), after the index key `after` (a previous page's cursor): the candidates
    /// for removal, each still to be planned by its writer. Returns the page's cursor, `None`
    /// once every candidate was listed. Reads the entries it returns, plus one per target.
    pub fn prunable(
        &self,
        cutoff: Millis,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<(Vec<TaskId>, Option<Vec<u8>>)> {
        let cf = self.cf(CF_TASK_INDEX);
        let mut out = Vec::new();
        for phase in SETTLED {
            let scope = prefix(phase, None);
            let mut start = scope.clone();
            if let Some(after) = after {
                if after >= &scope[..] {
                    start = [after, &[0]].concat();
                }
            }
            loop {
                let mut target = None;
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
                    if entry.since >= cutoff {
                        target = Some(entry.target);
                        break;
                    }
                    out.push(task);
                    if out.len() == limit {
                        return Ok((out, Some(k.to_vec())));
                    }
                }
                // The rest of this target's entries settled later: on to the next target.
                let Some(target) = target else { break };
                start = prefix(phase, Some(&target));
                start.extend_from_slice(&[0xff; 25]);
            }
        }
        Ok((out, None))
    }

    /// How to remove `task`'s history, when it may be removed: settled with a terminal
    /// result, in that phase since before `cutoff`, and each of its events at or below
    /// `published` (the publisher's cursors; `None` when nothing publishes). `None` when it
    /// may not. Called by the writer of the task's events, which submits the plan before it
    /// records anything else.
    ///
    /// A history that breaks a rule under `check` is kept (and logged), so that removing it
    /// never hides a violation from the audit.
    pub fn prune_plan(
        &self,
        task: TaskId,
        cutoff: Millis,
        published: Option<u64>,
        check: CheckConfig,
    ) -> Result<Option<Prune>> {
        let history = self.task_events(task)?;
        let Some(retained) = Retained::of(&history) else {
            return Ok(None);
        };
        let (state, violations) = check_task(&history, check);
        if let Some(v) = violations.first() {
            tracing::warn!(task_id = %task, rule = ?v.rule, detail = %v.detail, "a settled task's history breaks a rule: kept past its retention for the audit to report");
            return Ok(None);
        }
        let last = history.iter().map(|e| e.lsn).max().unwrap_or(0);
        if retained.settled_at >= cutoff || published.is_some_and(|p| last > p) {
            return Ok(None);
        }
        // A task read back from an earlier removal has no index entry: only its later events go.
        let lsns: Vec<u64> = history.iter().map(|e| e.lsn).filter(|l| *l > 0).collect();
        if lsns.is_empty() {
            return Ok(None);
        }
        let index = (!state.pruned).then(|| IndexEntry::of(&state)).flatten();
        Ok(Some(Prune {
            task,
            retained,
            lsns,
            index,
        }))
    }

    /// At most `limit` removed tasks that settled before `cutoff`, in the order they settled,
    /// after the `retained_by_time` key `after` (a previous page's cursor): the candidates
    /// whose identity is forgotten, each by its writer. Returns the page's cursor, `None` once
    /// every candidate was listed.
    pub fn forgettable(
        &self,
        cutoff: Millis,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<(Vec<TaskId>, Option<Vec<u8>>)> {
        let start = match after {
            Some(after) => [after, &[0]].concat(),
            None => Vec::new(),
        };
        let mut out = Vec::new();
        for item in self.db().iterator_cf(
            self.cf(CF_RETAINED_BY_TIME),
            IteratorMode::From(&start, Direction::Forward),
        ) {
            let (k, _) = item?;
            let (settled, task) = decode_timer_key(&k).ok_or(Error::BadValue {
                what: "retained_by_time",
            })?;
            if settled >= cutoff {
                break;
            }
            out.push(task);
            if out.len() == limit {
                return Ok((out, Some(k.to_vec())));
            }
        }
        Ok((out, None))
    }

    /// How to forget `task`, when its history was removed and it settled before `cutoff`.
    /// Called by the writer of the task's events, as [`Ledger::prune_plan`].
    pub fn forget_plan(&self, task: TaskId, cutoff: Millis) -> Result<Option<Forget>> {
        let history = self.task_events(task)?;
        let Some(EventBody::Pruned { retained }) = history.first().map(|e| &e.body) else {
            return Ok(None);
        };
        if retained.settled_at >= cutoff {
            return Ok(None);
        }
        Ok(Some(Forget {
            task,
            settled_at: retained.settled_at,
            lsns: history.iter().map(|e| e.lsn).filter(|l| *l > 0).collect(),
        }))
    }

    /// What retention kept of `task`, if its history was removed.
    pub fn retained(&self, task: TaskId) -> Result<Option<Retained>> {
        retained(self.db(), task)
    }

    /// What retention removed from this ledger so far.
    pub fn pruned_totals(&self) -> Result<PrunedTotals> {
        pruned_totals(self.db())
    }
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
    use sendledger_core::{Identity, PayloadHash, ResultStatus};

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
            status: ResultStatus::Succeeded,
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
