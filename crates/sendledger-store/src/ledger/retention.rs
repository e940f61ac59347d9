//! [`Ledger`]'s reads for retention: the candidates for removal and forgetting, and the plan of
//! each (see [`crate::retention`]).

use rocksdb::{Direction, IteratorMode};
use sendledger_core::event::Millis;
use sendledger_core::{check_task, CheckConfig, Phase, Retained, TaskId};

use crate::error::{Error, Result};
use crate::keys::*;
use crate::ledger::Ledger;
use crate::reads::task_stored;
use crate::retention::{
    prune_chain, pruned_totals, removed_digest, retained, Chain, Forget, Prune, PrunedTotals,
};
use crate::task_index::{prefix, IndexEntry};

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
        let stored = task_stored(self.db(), task)?;
        let previous = stored.kept()?;
        let history = stored.history(task, previous.as_ref().map(|(r, _)| r))?;
        let Some(retained) = Retained::of(&history) else {
            return Ok(None);
        };
        let (state, violations) = check_task(&history, check);
        if let Some(v) = violations.first() {
            tracing::warn!(task_id = %task, rule = ?v.rule, detail = %v.detail, "a settled task's history breaks a rule: kept past its retention for the audit to report");
            return Ok(None);
        }
        // Of a task removed before, only the events recorded since go (its index entry lists
        // them).
        let last = stored.events.last().map_or(0, |(lsn, _)| *lsn);
        if stored.events.is_empty()
            || retained.settled_at >= cutoff
            || published.is_some_and(|p| last > p)
        {
            return Ok(None);
        }
        let index = IndexEntry::of(&state);
        let digest = removed_digest(
            previous.as_ref().and_then(|(_, d)| d.as_ref()),
            &stored.events,
        );
        Ok(Some(Prune {
            task,
            retained,
            events: stored.events,
            seqs: stored.seqs,
            digest,
            replaces: stored.retained,
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
        let stored = task_stored(self.db(), task)?;
        let Some((retained, _)) = stored.kept()? else {
            return Ok(None);
        };
        if retained.settled_at >= cutoff {
            return Ok(None);
        }
        let history = stored.history(task, Some(&retained))?;
        Ok(Some(Forget {
            task,
            settled_at: retained.settled_at,
            retained: stored.retained.expect("kept above"),
            events: stored.events,
            seqs: stored.seqs,
            index: IndexEntry::of(&sendledger_core::fold(&history)),
            version_of: (retained.request_version > 0).then(|| retained.identity.clone()),
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

    /// The ledger's record of retention's checkpoints.
    pub fn prune_chain(&self) -> Result<Chain> {
        prune_chain(self.db())
    }
}
