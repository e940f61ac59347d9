//! The messages the engine's actors exchange, apart from the actors: an actor that only sends
//! one kind of message holds a [`Recipient`](actix::Recipient) of it, not the address of the
//! actor that handles it, so the task actor knows nothing of the registry, the timers or the
//! reconciler, and they know nothing of it but its input.

use std::ops::Range;

use actix::prelude::*;
use sendledger_core::decide::{AttemptOutcome, OperatorResolution};
use sendledger_core::{AcceptedRequest, Phase, Source, TaskId};

use crate::error::Result;
use crate::remote::LookupError;

/// Something for a task to handle.
#[derive(Debug, Clone)]
pub enum TaskInput {
    Deliver {
        request: AcceptedRequest,
        source: Source,
    },
    /// A timer of the task fired; `due` names it so it can be cleared.
    Wake {
        due: u64,
    },
    /// The task's last decision asked to decide again at once ([`Action::Continue`]).
    ///
    /// [`Action::Continue`]: sendledger_core::Action::Continue
    Continue,
    /// A lookup ended; `asked_at` is when it was sent.
    Lookup {
        attempt: u32,
        asked_at: u64,
        result: std::result::Result<sendledger_core::saga::Found, LookupError>,
    },
    Recover,
    /// A requests-topic message that is not a valid request (see [`Input::Reject`]).
    Reject {
        source: Source,
        reason: String,
        raw: Vec<u8>,
    },
    /// An operator's decision, with the id of the credential it came under (none: on the
    /// ledger's files or under no named credential).
    Operator(OperatorResolution, Option<String>),
    /// Its target's breaker closed and the target retries its failed tasks then (see
    /// [`sendledger_core::decide::Input::RetryOnClose`]).
    RetryOnClose {
        reason: String,
    },
    /// Kafka mode: the partition's restore found two histories of the task (see
    /// [`sendledger_core::decide::Input::Diverged`]).
    Diverged {
        task_seq: u32,
        replaced: Vec<sendledger_core::Event>,
    },
    /// Retention: remove the task's history if it settled before `cutoff` (ms since the
    /// epoch) and each of its events is at or below `published` (see
    /// [`sendledger_store::Ledger::prune_plan`]); its reply names the `Pruned` event when it did.
    Prune {
        cutoff: u64,
        published: Option<u64>,
    },
    /// Identity retention: forget the task, whose history retention removed, if it settled
    /// before `cutoff` (see [`sendledger_store::Ledger::forget_plan`]); its reply names
    /// `Forgotten` when it did. A later delivery of its request is a new task.
    Forget {
        cutoff: u64,
    },
    /// An attempt of the task ended (internal: sent by the actor to itself).
    Outcome {
        attempt: u32,
        outcome: AttemptOutcome,
    },
}

/// The answer to a task message: the task's phase afterwards and what was recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub task_id: TaskId,
    pub phase: Phase,
    /// LSNs of the events recorded for this message (empty when nothing was recorded).
    pub lsns: Range<u64>,
    /// Names of the events recorded, in order.
    pub events: Vec<&'static str>,
}

#[derive(Message)]
#[rtype(result = "Result<Reply>")]
pub struct TaskMsg(pub TaskInput);

/// A message for the actor of `task_id`.
#[derive(Message)]
#[rtype(result = "Result<Reply>")]
pub struct Route {
    pub task_id: TaskId,
    pub input: TaskInput,
}

/// Sent by a task actor that has nothing in flight after handling `handled` messages.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Idle {
    pub task_id: TaskId,
    pub handled: u64,
}

/// Stop taking new work; tasks already live finish what they are doing.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Drain;

/// How many task actors are alive and how many messages wait for room.
#[derive(Message)]
#[rtype(result = "(usize, usize)")]
pub struct Load;

/// A lookup for the reconciler to run.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LookupJob {
    pub task_id: TaskId,
    /// Where the task's attempts went: its own target, or its fallback.
    pub target: String,
    pub request: AcceptedRequest,
    /// A multi-step task's steps' remote ids, which the lookup's templates may read.
    pub steps: sendledger_core::saga::StepRecords,
    /// The task's latest attempt when the lookup was issued; its result is about this attempt.
    pub attempt: u32,
    /// Records created before this time cannot be the task's.
    pub since: u64,
}

/// Wake `task_id` at `at` (ms since the epoch).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Schedule {
    pub at: u64,
    pub task_id: TaskId,
}
