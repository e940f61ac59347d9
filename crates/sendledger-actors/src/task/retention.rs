//! Retention's inputs to a task's actor, its only writer: removing the history of a settled
//! task, and forgetting a removed one (`docs/operating/retention.md`).

use actix::prelude::*;
use sendledger_core::{State, TaskId};
use sendledger_store::Append;

use super::TaskActor;
use crate::error::{Error, Result};
use crate::messages::Reply;

impl TaskActor {
    /// Removes the task's history, when retention may: the task is settled since before
    /// `cutoff`, nothing of it is under way, and the ledger's plan agrees (every event
    /// published, no rule broken). As the task's only writer, it plans and submits the removal
    /// before it records anything else; then it goes on from what retention kept.
    pub(super) fn prune(
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
            ledger
                .append(Append {
                    prune: vec![plan],
                    ..Append::default()
                })
                .await?;
            Ok::<_, Error>(Some(retained))
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
    pub(super) fn forget(&mut self, cutoff: u64) -> ResponseActFuture<Self, Result<Reply>> {
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
            ledger
                .append(Append {
                    forget: vec![plan],
                    ..Append::default()
                })
                .await?;
            Ok::<_, Error>(true)
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

/// The reply to a retention input: nothing recorded in the log, and `what` it did when `did`.
fn done(task_id: TaskId, state: &State, did: bool, what: &'static str) -> Reply {
    Reply {
        task_id,
        phase: state.phase,
        lsns: 0..0,
        events: if did { vec![what] } else { Vec::new() },
    }
}
