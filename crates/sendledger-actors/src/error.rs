//! Errors of the engine, and whether trying again may help ([`Error::is_transient`]).

use std::sync::Arc;

use sendledger_core::TaskId;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request (or an operator's resolution) is refused; the message is the core crate's.
    #[error(transparent)]
    Invalid(#[from] sendledger_core::Error),
    #[error("unknown target `{0}`; add it to the configuration or fix the request")]
    UnknownTarget(String),
    #[error("ledger")]
    Ledger(#[from] sendledger_store::Error),
    #[error("task {0} not found")]
    NoSuchTask(TaskId),
    /// The task's events could not be read when its actor started: nothing is decided for it
    /// until a later actor of the task reads them.
    #[error("cannot load the events of task {task_id}")]
    Load {
        task_id: TaskId,
        source: Arc<sendledger_store::Error>,
    },
    /// Kafka mode: the task belongs to a requests partition this instance does not own (never
    /// did, or lost it to another instance); nothing was recorded.
    #[error("task {task_id} belongs to requests partition {partition}, which this instance does not own; the instance the consumer group assigned it to processes it")]
    NotOwned { task_id: TaskId, partition: i32 },
    /// A kafka-mode call (partitions, restores, the replicator) on an engine in local mode.
    #[error(
        "{0} belongs to kafka mode; this engine runs in local mode (storage.mode = \"local\")"
    )]
    LocalMode(&'static str),
    /// Kafka mode: a replicator is installed already.
    #[error("the engine's log of record is installed already")]
    ReplicatorInstalled,
    /// Kafka mode: a partition is restored only while this instance does not own it (its
    /// tasks would act on a state being rewritten).
    #[error("requests partition {0} is owned here; a partition is restored before it is assigned, never while it is")]
    RestoreWhileOwned(i32),
    /// Kafka mode: a new task's input names no requests partition (a defect).
    #[error("task {0} has no requests partition; in kafka mode every task belongs to the partition of its request")]
    NoPartition(TaskId),
    /// A retry refused while a delivery of the same request (another version, say) is being
    /// recorded: the two are decided one at a time.
    #[error("a delivery of task {0}'s request is being recorded; try the retry again")]
    IdentityBusy(TaskId),
    #[error("the engine is shutting down; the request was not recorded, deliver it again later")]
    ShuttingDown,
    #[error("the engine has stopped")]
    Stopped,
}

impl Error {
    /// Whether the same call may succeed when tried again: the engine is draining, or the
    /// ledger failed in a way that may pass (see `sendledger_store::Error`). A refused request,
    /// an unknown target or task, a stopped engine and a permanent ledger failure (closed,
    /// damaged, of a newer format) come back every time.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Ledger(e) => e.is_transient(),
            Error::Load { source, .. } => source.is_transient(),
            Error::ShuttingDown | Error::IdentityBusy(_) => true,
            Error::Invalid(_)
            | Error::UnknownTarget(_)
            | Error::NoSuchTask(_)
            | Error::NotOwned { .. }
            | Error::NoPartition(_)
            | Error::LocalMode(_)
            | Error::ReplicatorInstalled
            | Error::RestoreWhileOwned(_)
            | Error::Stopped => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
