//! The metrics this crate records (see `sendledger_core::metric`). Recorded through these
//! constants only.

use sendledger_core::metric::{MetricDefinition as M, MetricUnit};

pub const JOURNAL_BATCH_APPENDS: &str = "sendledger_journal_batch_appends";
pub const JOURNAL_FSYNC_SECONDS: &str = "sendledger_journal_fsync_seconds";
pub const LEDGER_WRITE_FAILURES_TOTAL: &str = "sendledger_ledger_write_failures_total";
pub const LOG_FAILURES_TOTAL: &str = "sendledger_log_failures_total";
/// Recorded by the engine (a known identity) and the Kafka consumer (a processed offset): the
/// two indexes that find duplicates live here.
pub const DUPLICATES_DROPPED_TOTAL: &str = "sendledger_duplicates_dropped_total";

pub const DEFINITIONS: &[M] = &[
    M::histogram(
        JOURNAL_BATCH_APPENDS,
        "Appends per journal write batch (group commit).",
    )
    .in_unit(MetricUnit::Count),
    M::histogram(
        JOURNAL_FSYNC_SECONDS,
        "Time of each journal batch write, its fsync included.",
    )
    .in_unit(MetricUnit::Seconds),
    M::counter(
        LEDGER_WRITE_FAILURES_TOTAL,
        "Ledger batch writes that failed (a full disk, an I/O error): nothing of them was recorded, sent or acknowledged.",
    ),
    M::counter(
        LOG_FAILURES_TOTAL,
        "Kafka mode: journal batches whose partition transaction failed or whose partition was lost, by kind (failed, lost): nothing of them was recorded, sent or acknowledged.",
    ),
    M::counter(
        DUPLICATES_DROPPED_TOTAL,
        "Deliveries dropped as duplicates: by identity (a known request) or offset (already processed).",
    ),
];
