//! Kafka mode: a task acts only while its partition is owned here, and on a state read since
//! the partition's latest assignment ([`crate::ownership`]).

use actix::prelude::*;

use super::{LaterVersion, TaskActor};
use crate::error::{Error, Result};
use crate::messages::{Reply, TaskInput};
use crate::ownership::Ownership;

impl TaskActor {
    /// Kafka mode: refuses the input when the task's partition is not owned here, and reads
    /// the task's events again (then decides) when the partition was assigned again since they
    /// were read. `None`: go on with the state as it is.
    pub(super) fn check_ownership(
        &mut self,
        ownership: &Ownership,
        input: TaskInput,
    ) -> Option<ResponseActFuture<Self, Result<Reply>>> {
        let task_id = self.task_id;
        let partition = self
            .state
            .source
            .as_ref()
            .or(match &input {
                TaskInput::Deliver { source, .. } | TaskInput::Reject { source, .. } => {
                    Some(source)
                }
                // A task whose log lost all of it: its first event is recorded again.
                TaskInput::Diverged { replaced, .. } => {
                    replaced.first().and_then(|e| e.body.source())
                }
                _ => None,
            })
            .map(|s| s.partition);
        let Some(partition) = partition else {
            // No request here: the task's first append was refused, say (its partition lost
            // meanwhile). A take-over since may have restored it into the ledger: read it again
            // once, rather than refuse what its partition's new owner asks of it.
            if self.state.request.is_none() && ownership.current() > self.loaded_at {
                return Some(self.reload_then_decide(ownership.current(), input));
            }
            return Some(Box::pin(fut::ready(Err(Error::NoPartition(task_id)))));
        };
        match ownership.epoch(partition) {
            None => Some(Box::pin(fut::ready(Err(Error::NotOwned {
                task_id,
                partition,
            })))),
            Some(epoch) if epoch > self.loaded_at => {
                Some(self.reload_then_decide(ownership.current(), input))
            }
            Some(_) => None,
        }
    }

    /// Reads the task's events again (its state here is from before the latest assignment
    /// `seen`), then decides `input` on them.
    fn reload_then_decide(
        &mut self,
        seen: u64,
        input: TaskInput,
    ) -> ResponseActFuture<Self, Result<Reply>> {
        self.reload_then(seen, input, Self::decide_and_append)
    }

    /// Reads the task's events again (with every assignment up to `seen`), then hands `input`
    /// to `then`.
    pub(super) fn reload_then(
        &mut self,
        seen: u64,
        input: TaskInput,
        then: fn(&mut Self, TaskInput) -> ResponseActFuture<Self, Result<Reply>>,
    ) -> ResponseActFuture<Self, Result<Reply>> {
        let task_id = self.task_id;
        let ledger = self.shared.ledger.clone();
        let read = async move { ledger.read(move |l| l.task_events(task_id)).await };
        Box::pin(read.into_actor(self).then(
            move |res, act, _| -> ResponseActFuture<Self, Result<Reply>> {
                match res {
                    Ok(events) => {
                        act.state = sendledger_core::fold(&events);
                        // A take-over may have restored other versions of the request.
                        act.later_version = LaterVersion::Unknown;
                        act.loaded_at = seen;
                        act.refresh_policy();
                        then(act, input)
                    }
                    Err(e) => Box::pin(fut::ready(Err(e.into()))),
                }
            },
        ))
    }
}
