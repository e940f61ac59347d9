//! A ledger's storage format and mode: refused when newer or of the other mode, migrated when
//! older.

use std::path::Path;

use rocksdb::{IteratorMode, DB};

use crate::error::{Error, Result};
use crate::journal;
use crate::keys::*;
use crate::reads::{request_partition, task_events};
use crate::summary::TaskSummary;
use crate::task_index::IndexEntry;

/// The storage format this build writes and the newest it reads.
// format: do not change (bump only with a migration)
pub const FORMAT_VERSION: u8 = 6;

/// Refuses a ledger of a newer storage format (or none), and returns its format and last LSN.
pub(super) fn check_format_and_last_lsn(db: &DB, path: &Path) -> Result<(u8, u64)> {
    let meta = db
        .cf_handle(CF_META)
        .expect("opened with every column family");
    let format = match db.get_cf(meta, META_FORMAT)?.as_deref() {
        Some([v]) if *v <= FORMAT_VERSION => *v,
        Some([v]) => {
            return Err(Error::NewerFormat {
                path: path.to_path_buf(),
                found: *v,
                supported: FORMAT_VERSION,
            })
        }
        _ => {
            return Err(Error::BadFormatMarker {
                path: path.to_path_buf(),
            })
        }
    };
    let log = db
        .cf_handle(CF_LOG)
        .expect("opened with every column family");
    let mut it = db.iterator_cf(log, IteratorMode::End);
    let last = match it.next() {
        Some(item) => decode_u64(&item?.0).ok_or(Error::BadValue { what: "log key" })?,
        None => 0,
    };
    // Retention may have removed the newest entries: their LSNs are never given again.
    let pruned = crate::retention::pruned_totals(db)?.last_lsn;
    Ok((format, last.max(pruned)))
}

/// Records the mode of a ledger opened for the first time (`replicated`: kafka mode), and
/// refuses a ledger written in the other mode. A ledger from before the mode was recorded
/// holding events is a kafka-mode one when it has a log checkpoint, else a local-mode one.
pub(super) fn check_mode(db: &DB, path: &Path, replicated: bool, last_lsn: u64) -> Result<()> {
    let name = |kafka: bool| if kafka { "kafka" } else { "local" };
    let meta = db
        .cf_handle(CF_META)
        .expect("opened with every column family");
    let written = match db.get_cf(meta, META_MODE)?.as_deref() {
        Some(b"kafka") => true,
        Some(b"local") => false,
        Some(_) => return Err(Error::BadValue { what: "meta mode" }),
        None => {
            let written = if last_lsn == 0 {
                replicated
            } else {
                let cursors = db
                    .cf_handle(CF_CURSORS)
                    .expect("opened with every column family");
                let prefix = journal::LOG_CHECKPOINTS.as_bytes();
                db.prefix_iterator_cf(cursors, prefix)
                    .next()
                    .transpose()?
                    .is_some_and(|(k, _)| k.starts_with(prefix))
            };
            db.put_cf(meta, META_MODE, name(written))?;
            written
        }
    };
    if written != replicated {
        return Err(Error::OtherMode {
            path: path.to_path_buf(),
            written: name(written),
            wanted: name(replicated),
        });
    }
    Ok(())
}

/// Format 1 to 2: lists every task not settled in the `unsettled` index (the partition of its
/// request from its first event), in one write with the new format marker.
pub(super) fn migrate_to_format_2(db: &DB, path: &Path) -> Result<()> {
    let cf = |name| db.cf_handle(name).expect("opened with every column family");
    let mut batch = rocksdb::WriteBatch::default();
    let mut listed = 0u64;
    for item in db.iterator_cf(cf(CF_TASKS), IteratorMode::Start) {
        let (k, v) = item?;
        if TaskSummary::decode(&v)?.phase.is_terminal() {
            continue;
        }
        let task = decode_task_key(&k).ok_or(Error::BadValue { what: "tasks key" })?;
        let partition = request_partition(db, task)?;
        batch.put_cf(cf(CF_UNSETTLED), task.0, partition_value(partition));
        listed += 1;
    }
    write_migration(db, batch, 2)?;
    tracing::info!(ledger = %path.display(), unsettled = listed, "ledger migrated to storage format 2: its unsettled tasks are indexed");
    Ok(())
}

/// Format 2 to 3: lists every task in the task index (its phase, target and when it entered
/// the phase, from the fold of its events), in one write with the new format marker. Reads
/// every task's events once.
pub(super) fn migrate_to_format_3(db: &DB, path: &Path) -> Result<()> {
    let cf = |name| db.cf_handle(name).expect("opened with every column family");
    let mut batch = rocksdb::WriteBatch::default();
    let mut listed = 0u64;
    for item in db.iterator_cf(cf(CF_TASKS), IteratorMode::Start) {
        let (k, _) = item?;
        let task = decode_task_key(&k).ok_or(Error::BadValue { what: "tasks key" })?;
        let state = sendledger_core::fold(&task_events(db, task)?);
        if let Some(entry) = IndexEntry::of(&state) {
            batch.put_cf(cf(CF_TASK_INDEX), entry.key(task), entry.value());
            listed += 1;
        }
    }
    write_migration(db, batch, 3)?;
    tracing::info!(ledger = %path.display(), tasks = listed, "ledger migrated to storage format 3: its tasks are indexed by phase and target");
    Ok(())
}

/// Format 3 to 4: moves every entry of the `unsettled` index to `unsettled_by_partition`
/// (keyed by partition first), in one write with the new format marker; `unsettled` is left
/// empty.
pub(super) fn migrate_to_format_4(db: &DB, path: &Path) -> Result<()> {
    let cf = |name| db.cf_handle(name).expect("opened with every column family");
    let mut batch = rocksdb::WriteBatch::default();
    let mut moved = 0u64;
    for item in db.iterator_cf(cf(CF_UNSETTLED), IteratorMode::Start) {
        let (k, v) = item?;
        let task = decode_task_key(&k).ok_or(Error::BadValue {
            what: "unsettled key",
        })?;
        let partition = decode_partition_value(&v).ok_or(Error::BadValue { what: "unsettled" })?;
        batch.put_cf(
            cf(CF_UNSETTLED_BY_PARTITION),
            unsettled_key(partition, task),
            [],
        );
        batch.delete_cf(cf(CF_UNSETTLED), k);
        moved += 1;
    }
    write_migration(db, batch, 4)?;
    tracing::info!(ledger = %path.display(), unsettled = moved, "ledger migrated to storage format 4: its unsettled tasks are indexed by partition");
    Ok(())
}

/// Format 5 to 6: starts the ledger's record of retention's removals (`crate::retention::Chain`)
/// with the sum of the entries kept so far, in one write with the new format marker. Their
/// events were removed before checkpoints were written: none covers them.
pub(super) fn migrate_to_format_6(db: &DB, path: &Path) -> Result<()> {
    let cf = |name| db.cf_handle(name).expect("opened with every column family");
    let mut batch = rocksdb::WriteBatch::default();
    let mut chain = crate::retention::Chain::default();
    let mut kept = 0u64;
    for item in db.iterator_cf(cf(CF_RETAINED), IteratorMode::Start) {
        let (k, v) = item?;
        let task = decode_task_key(&k).ok_or(Error::BadValue {
            what: "retained key",
        })?;
        chain.kept_sum = crate::retention::add(&chain.kept_sum, &crate::retention::leaf(task, &v));
        kept += 1;
    }
    if kept > 0 {
        batch.put_cf(cf(CF_META), META_PRUNE_CHAIN, chain.encode());
    }
    write_migration(db, batch, 6)?;
    tracing::info!(ledger = %path.display(), kept, "ledger migrated to storage format 6: retention's removals are checkpointed");
    Ok(())
}

/// Writes a migration's `batch` with the format marker `format`, in one synced write: the
/// ledger is of the new format exactly when the migration's changes are in.
fn write_migration(db: &DB, mut batch: rocksdb::WriteBatch, format: u8) -> Result<()> {
    let meta = db
        .cf_handle(CF_META)
        .expect("opened with every column family");
    batch.put_cf(meta, META_FORMAT, [format]);
    let mut sync = rocksdb::WriteOptions::default();
    sync.set_sync(true);
    Ok(db.write_opt(batch, &sync)?)
}
