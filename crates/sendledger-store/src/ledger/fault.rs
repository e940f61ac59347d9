//! Damage for the audit tests, and a journal that dies (the `fault-injection` feature).

use sendledger_core::TaskId;

use super::Ledger;
use crate::error::Result;
use crate::keys::*;

/// Damage for the audit tests, and a journal that dies. Test-only: compiled only with the
/// `fault-injection` feature, which only the workspace test crate enables.
impl Ledger {
    /// Stores `bytes` under `lsn` in the log as they are, bypassing the journal, the envelope
    /// and the indexes (an undecodable event, or an event the index does not know).
    pub fn inject_raw_log_entry(&self, lsn: u64, bytes: &[u8]) -> Result<()> {
        Ok(self.inner.db.put_cf(self.cf(CF_LOG), lsn_key(lsn), bytes)?)
    }

    /// Stores `value` as what retention kept of `task`, bypassing the journal and retention's
    /// record of what it kept.
    pub fn inject_retained(&self, task: TaskId, value: &[u8]) -> Result<()> {
        Ok(self.inner.db.put_cf(self.cf(CF_RETAINED), task.0, value)?)
    }

    /// What retention kept of `task`, as stored.
    pub fn stored_retained(&self, task: TaskId) -> Result<Option<Vec<u8>>> {
        Ok(self.inner.db.get_cf(self.cf(CF_RETAINED), task.0)?)
    }

    /// Removes the log entry at `lsn` and nothing else (a gap the index still points into).
    pub fn delete_log_entry(&self, lsn: u64) -> Result<()> {
        Ok(self.inner.db.delete_cf(self.cf(CF_LOG), lsn_key(lsn))?)
    }

    /// Lists `task` in the unsettled index (under no partition), or removes it from under
    /// every partition, whatever its summary says.
    pub fn set_unsettled_entry(&self, task: TaskId, listed: bool) -> Result<()> {
        let (db, cf) = (&self.inner.db, self.cf(CF_UNSETTLED_BY_PARTITION));
        if listed {
            return Ok(db.put_cf(cf, unsettled_key(None, task), [])?);
        }
        for item in db.iterator_cf(cf, rocksdb::IteratorMode::Start) {
            let (k, _) = item?;
            if decode_unsettled_key(&k).is_some_and(|(_, t)| t == task) {
                db.delete_cf(cf, k)?;
            }
        }
        Ok(())
    }

    /// Stops the journal as if its thread had died: appends already acknowledged stay, every
    /// later append of every handle fails with [`Error::Closed`]. Reads still work.
    pub fn stop_journal(&self) {
        self.inner
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(t) = self
            .inner
            .thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = t.join();
        }
    }
}
