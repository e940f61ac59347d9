//! sendledger-store: the RocksDB ledger.
//!
//! One RocksDB database per ledger directory holds the append-only event log, its indexes
//! (events per task, task summaries, identities, tasks by phase and target), Kafka processed offsets, durable timers and
//! publisher cursors. Every write goes through one group-commit [`journal`] thread, which turns
//! all pending appends into one `WriteBatch` and one fsync, and assigns log sequence numbers in
//! commit order with no gaps. [`audit()`] replays the whole ledger against the rules of
//! `docs/rules.md` and the integrity of the log and its indexes, in memory bounded by the tasks
//! in progress and a 22-byte summary of every task. [`Ledger::task_counts`] counts its tasks by
//! state (the admin endpoint's gauges).
//! The key encodings, column families and format versions are listed in `docs/architecture.md`.
//!
//! The `fault-injection` feature (test-only; only the workspace test crate enables it) adds raw
//! writes to the log, to build damaged ledgers for the audit tests.
//!
//! This is the only crate that depends on `rocksdb`. It may depend on `sendledger-core` for the
//! types it stores, and on the `metrics` facade (never an exporter: the service installs one; the names are in [`metric_definitions`]),
//! never on Kafka, actors or HTTP. Invariants: the log is append-only; an
//! event's index, offset, timer and cursor updates commit atomically with it; RocksDB calls
//! never run on an async executor thread (the journal has its own thread; async callers only
//! await an acknowledgement).

pub mod archive;
pub mod archive_audit;
pub mod audit;
pub mod counts;
mod diverged;
pub mod envelope;
pub mod error;
pub mod journal;
pub mod keys;
pub mod ledger;
pub mod metric_definitions;
pub mod options;
mod reads;
pub mod restore;
pub mod retention;
pub mod summary;
pub mod task_index;

pub use audit::audit;
pub use counts::TaskCounts;
pub use error::{Error, Result};
pub use journal::{
    log_checkpoint, log_tail, Append, JournalStats, Logged, Replication, Replicator, TimerKind,
    TRANSACTION_STALLED,
};
pub use ledger::{Latest, Ledger, MemoryUsage, FORMAT_VERSION};
pub use options::{Durability, LedgerOptions, Memory};
pub use restore::{install_append, restore_append, truncate_append, Diverged, Restored};
pub use retention::{Chain, Checkpoint, Forget, Prune, PrunedTotals};
pub use sendledger_core::audit::{AuditReport, Finding};
pub use summary::{Processed, TaskSummary};
pub use task_index::{Cursor, IndexEntry, TaskPage, TaskQuery};
