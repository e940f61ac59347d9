//! Errors of the ledger.

use std::path::PathBuf;

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
    #[error("ledger at {path} has an unreadable format marker; it is not a sendledger ledger or it is damaged")]
    BadFormatMarker { path: PathBuf },
    #[error(
        "event envelope at lsn {lsn} has format version {version}, which this build does not read"
    )]
    UnknownEnvelope { lsn: u64, version: u8 },
    #[error("event at lsn {lsn} cannot be decoded: {detail}")]
    Corrupt { lsn: u64, detail: String },
    #[error("ledger value under {what} is malformed")]
    BadValue { what: &'static str },
    #[error("append rejected: {0}")]
    InvalidAppend(String),
    #[error("the journal has stopped; the ledger is closed")]
    Closed,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
