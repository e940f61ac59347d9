//! Retention's inputs to a task's actor, its only writer: removing the history of a settled
//! task, and forgetting a removed one (`docs/operating/retention.md`).

use actix::prelude::*;
use sendledger_core::{State, TaskId};
use sendledger_store::Append;

use super::TaskActor;
use crate::error::{Error, Result};
use crate::messages::{Reply, TaskInput};

impl TaskActor {
    /// Retention's inputs record nothing in the log of record. In kafka mode they apply to
    /// this instance's copy of the task whoever owns its partition, so that copies of
    /// partitions owned elsewhere (a standby's, or one left from an earlier assignment) are
    /// bounded too; the task's state is read again first unless this instance is its writer
    /// (its partition owned here since the state was read), as another's events may have
    /// reached the copy. The journal refuses a removal planned from a history that changed
    /// before it was written.
    pub(super) fn retain(&mut self, input: TaskInput) -> ResponseActFuture<Self, Result<Reply>> {
        let Some(ownership) = self.shared.ownership.clone() else {
            return self.retention_input(input);
        };
        let partition = self.state.source.as_ref().map(|s| s.partition);
        match partition.and_then(|p| ownership.epoch(p)) {
            Some(epoch) if epoch <= self.loaded_at => self.retention_input(input),
            _ => self.reload_then(ownership.current(), input, Self::retention_input),
        }
    }

    fn retention_input(&mut self, input: TaskInput) -> ResponseActFuture<Self, Result<Reply>> {
        match input {
            TaskInput::Prune { cutoff, published } => self.prune(cutoff, published),
            TaskInput::Forget { cutoff } => self.forget(cutoff),
            _ => unreachable!("only retention's inputs come here"),
        }
    }

    /// Removes the task's history, when retention may: the task is settled since before
    /// `cutoff`, nothing of it is under way, and the ledger's plan agrees (every event
    /// published, no rule broken). As the task's only writer, it plans and submits the removal
    /// before it records anything else; then it goes on from what retention kept.
    fn prune(
        &mut self,
        cutoff: u64,
        published: Option<u64>,
    ) -> ResponseActFuture<Self, Result<Reply>> {
        let task_id = self.task_id;
        let reply = move |state: &State, pruned: bool| done(task_id, state, pruned, "Pruned");
        let busy = self.attempt_in_flight || self.lookup_in_flight;
        if !self.state.phase.is_terminal() || self.state.phase_since >= cutoff || busy {
            return Box::pin(fut::ready(Ok(reply(&self.state, false))));
        }
        let check = sendledger_core::CheckConfig {
            key_ttl_ms: None,
            max_policy_resends: (self.policy.reconcile.as_ref())
                .map_or(0, |r| r.max_policy_resends)
                .max(sendledger_core::CheckConfig::default().max_policy_resends),
        };
        let ledger = self.shared.ledger.clone();
        let work = async move {
            let plan = ledger
                .read(move |l| l.prune_plan(task_id, cutoff, published, check))
                .await?;
            let Some(plan) = plan else {
                return Ok(None);
            };
            let retained = plan.retained.clone();
            let append = Append {
                prune: vec![plan],
                ..Append::default()
            };
            Ok::<_, Error>(recorded(ledger.append(append).await)?.then_some(retained))
        };
        Box::pin(work.into_actor(self).map(move |res, act, _| {
            let Some(retained) = res? else {
                return Ok(reply(&act.state, false));
            };
            act.state = sendledger_core::fold(&[retained.event(task_id)]);
            metrics::counter!(crate::metric_definitions::TASKS_PRUNED_TOTAL).increment(1);
            Ok(reply(&act.state, true))
        }))
    }

    /// Forgets the task, when identity retention may: its history was removed and it settled
    /// before `cutoff`. Then it is a task that never was.
    fn forget(&mut self, cutoff: u64) -> ResponseActFuture<Self, Result<Reply>> {
        let task_id = self.task_id;
        let reply =
            move |state: &State, forgotten: bool| done(task_id, state, forgotten, "Forgotten");
        if !self.state.pruned {
            return Box::pin(fut::ready(Ok(reply(&self.state, false))));
        }
        let ledger = self.shared.ledger.clone();
        let work = async move {
            let Some(plan) = ledger.read(move |l| l.forget_plan(task_id, cutoff)).await? else {
                return Ok(false);
            };
            let append = Append {
                forget: vec![plan],
                ..Append::default()
            };
            recorded(ledger.append(append).await)
        };
        Box::pin(work.into_actor(self).map(move |res, act, _| {
            if !res? {
                return Ok(reply(&act.state, false));
            }
            act.state = State::default();
            metrics::counter!(crate::metric_definitions::IDENTITIES_FORGOTTEN_TOTAL).increment(1);
            Ok(reply(&act.state, true))
        }))
    }
}

/// Whether a removal's append was recorded: not when the journal found it planned from a
/// history that changed since (another writer of a kafka-mode copy); the next pass plans again.
fn recorded(appended: sendledger_store::Result<std::ops::Range<u64>>) -> Result<bool> {
    match appended {
        Ok(_) => Ok(true),
        Err(sendledger_store::Error::RemovalOutdated { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The reply to a retention input: nothing recorded in the log, and `what` it did when `did`.
fn done(task_id: TaskId, state: &State, did: bool, what: &'static str) -> Reply {
    Reply {
        task_id,
        phase: state.phase,
        lsns: 0..0,
        events: if did { vec![what] } else { Vec::new() },
    }
}
