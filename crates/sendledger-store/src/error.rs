//! Errors of the ledger, and whether trying again may help ([`Error::is_transient`]).

use std::path::PathBuf;

/// What went wrong reading or writing a ledger.
///
/// Transient (the same call may succeed later, and callers retry it): a RocksDB error of kind
/// I/O (a full disk until space is freed, a failing write), busy, timed out, aborted, try
/// again or incomplete. Permanent (retrying repeats it; the work that needs the ledger stops
/// and an operator acts on the message): every other variant, namely the journal stopped
/// ([`Error::Closed`]), a damaged event, index value or format marker, an envelope or storage
/// format this build does not read, a ledger held by another process or not there at all, a
/// directory that cannot be prepared, and any other RocksDB error (corruption, invalid
/// argument, not supported, shutdown in progress...).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot prepare ledger directory {path}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no ledger at {path}")]
    NoLedger { path: PathBuf },
    #[error("rocksdb")]
    Rocks(#[from] rocksdb::Error),
    #[error(
        "the ledger at {path} is in use: a running service (or another open handle) holds its lock"
    )]
    InUse { path: PathBuf },
    #[error(
        "ledger at {path} has storage format {found}, newer than {supported} which this build \
         reads; run a sendledger version that supports it"
    )]
    NewerFormat {
        path: PathBuf,
        found: u8,
        supported: u8,
    },
    #[error("the ledger at {path} has no task index yet (storage format 2): start the service on it once, which indexes its tasks")]
    NoTaskIndex { path: PathBuf },
    #[error("ledger at {path} has an unreadable format marker; it is not a sendledger ledger or it is damaged")]
    BadFormatMarker { path: PathBuf },
    /// The ledger was written in the other storage mode. A local-mode ledger is the record of
    /// its tasks; a kafka-mode ledger is a copy of what the events topic records. Neither can
    /// stand for the other.
    #[error("ledger at {path} was written in {written} mode and cannot be opened in {wanted} mode; use another storage.data directory to change modes (docs/kafka-mode.md, \"Moving from local mode\")")]
    OtherMode {
        path: PathBuf,
        written: &'static str,
        wanted: &'static str,
    },
    #[error(
        "event envelope at lsn {lsn} has format version {version}, which this build does not read"
    )]
    UnknownEnvelope { lsn: u64, version: u8 },
    /// The stored bytes of an event are not an event (see the source for where they fail).
    #[error("event at lsn {lsn} cannot be decoded")]
    Undecodable { lsn: u64, source: bincode::Error },
    /// An event decodes but contradicts where it is stored or what the indexes say.
    #[error("event at lsn {lsn} cannot be decoded: {detail}")]
    Corrupt { lsn: u64, detail: String },
    #[error("ledger value under {what} is malformed")]
    BadValue { what: &'static str },
    #[error("the journal has stopped; the ledger is closed")]
    Closed,
    /// Kafka mode: the events could not be made durable in the log of record now (the brokers
    /// unreachable, a transaction aborted); nothing of the append was recorded, and it may be
    /// tried again.
    #[error(
        "the events of requests partition {partition} could not be written to the log of record"
    )]
    NotReplicated { partition: i32, source: Cause },
    /// Kafka mode: the partition is not this instance's as it was when the append was made
    /// (another instance fenced this one, or the partition was given up and taken over anew
    /// since); nothing of the append was recorded and nothing more may be done for its tasks
    /// on the state the append came from.
    #[error("requests partition {partition} is no longer owned here as it was when the append was made; its tasks are not processed on that state any more")]
    PartitionLost { partition: i32, source: Cause },
    /// Kafka mode: an append with events named no requests partition (a defect: every task
    /// belongs to the partition of its request).
    #[error("an append of events for task {task} names no requests partition; in kafka mode every event belongs to one")]
    NoPartition { task: String },
    /// Retention's removals could not be planned or archived (`storage.archive`): nothing of
    /// them was written, the tasks are as they were.
    #[error("the removal of settled tasks could not be recorded; they are kept")]
    Removal { source: Cause },
    /// A removal or forgetting planned from a history that changed before it was written
    /// (kafka mode: a copy's restore recorded events of the task meanwhile): nothing of it was
    /// written; the task's writer plans it again from what the ledger holds now.
    #[error(
        "the removal of task {task} was planned from a history that changed since; it is kept"
    )]
    RemovalOutdated { task: String },
}

impl Error {
    /// Whether the same call may succeed when tried again (see [`Error`] for the split).
    pub fn is_transient(&self) -> bool {
        use rocksdb::ErrorKind as Kind;
        match self {
            Error::Rocks(e) => matches!(
                e.kind(),
                Kind::IOError
                    | Kind::Busy
                    | Kind::TimedOut
                    | Kind::Aborted
                    | Kind::TryAgain
                    | Kind::Incomplete
            ),
            Error::Dir { .. }
            | Error::NoLedger { .. }
            | Error::InUse { .. }
            | Error::NewerFormat { .. }
            | Error::BadFormatMarker { .. }
            | Error::NoTaskIndex { .. }
            | Error::OtherMode { .. }
            | Error::UnknownEnvelope { .. }
            | Error::Undecodable { .. }
            | Error::Corrupt { .. }
            | Error::BadValue { .. }
            | Error::Closed
            | Error::NoPartition { .. }
            | Error::PartitionLost { .. } => false,
            Error::NotReplicated { .. } | Error::Removal { .. } | Error::RemovalOutdated { .. } => {
                true
            }
        }
    }
}

/// Why the log of record did not take an append (kafka mode): the replicator's error, shared by
/// every append of the refused batch.
pub type Cause = std::sync::Arc<dyn std::error::Error + Send + Sync>;

/// A cause that is only a description (`"the partition is not owned here"`).
pub fn cause(description: impl Into<String>) -> Cause {
    std::sync::Arc::from(Box::<dyn std::error::Error + Send + Sync>::from(
        description.into(),
    ))
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
