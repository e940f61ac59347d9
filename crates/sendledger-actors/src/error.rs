//! Errors of the engine.

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
    #[error("the engine is shutting down; the request was not recorded, deliver it again later")]
    ShuttingDown,
    #[error("the engine has stopped")]
    Stopped,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
