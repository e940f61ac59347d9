//! An open ledger: opening it (its format and mode checked, see [`format`]), appends through
//! its journal, and reads.

use std::ops::Range;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rocksdb::{
    Cache, ColumnFamilyDescriptor, Direction, IteratorMode, Options, ReadOptions,
    WriteBufferManager, DB,
};
use sendledger_core::{Event, TaskId};
use tokio::sync::oneshot;

use crate::diverged::Diverged;
use crate::envelope::decode_event;
use crate::error::{Error, Result};
use crate::journal::{self, Append, JournalStats, Replicator, ReplicatorSlot, Request, TimerKind};
use crate::keys::*;
use crate::options::{Durability, LedgerOptions};
use crate::reads::{request_partition, task_event, task_events};
use crate::summary::{Processed, TaskSummary};

#[cfg(feature = "fault-injection")]
mod fault;
mod format;
mod listing;
mod retention;
mod versions;

use format::{
    check_format_and_last_lsn, check_mode, migrate_to_format_2, migrate_to_format_3,
    migrate_to_format_4, migrate_to_format_6,
};

pub use format::FORMAT_VERSION;
pub use versions::Latest;

/// An open ledger. Cheap to clone; the journal stops when the last clone is dropped.
#[derive(Clone)]
pub struct Ledger {
    inner: Arc<Inner>,
}

struct Inner {
    db: Arc<DB>,
    path: PathBuf,
    tx: Mutex<Option<crossbeam_channel::Sender<Request>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    last_lsn: Arc<AtomicU64>,
    stats: Arc<JournalStats>,
    /// The shared block cache and write budget (a read-only ledger uses RocksDB's defaults).
    memory: Option<(usize, Cache, WriteBufferManager)>,
    /// Kafka mode: where the journal finds the replicator.
    replicator: Option<ReplicatorSlot>,
}

/// What RocksDB holds in memory for a ledger, from its shared cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryUsage {
    /// The cache's capacity: the configured budget.
    pub budget: usize,
    /// Bytes in the cache, memtables included.
    pub cached: usize,
    /// Of which memtables (write buffers).
    pub write_buffers: usize,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Ledger {
    /// Opens (or creates) the ledger in `dir`. The directory is made `0700`.
    pub fn open(dir: impl AsRef<Path>, options: LedgerOptions) -> Result<Ledger> {
        let path = dir.as_ref().to_path_buf();
        let dir_err = |source| Error::Dir {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&path).map_err(dir_err)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).map_err(dir_err)?;

        let (mut opts, family, cache, buffers) = options.memory.rocksdb_options();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_max_background_jobs(2);
        opts.set_keep_log_file_num(4);
        // Open every family that exists, so a ledger from a newer build fails on its format
        // marker with a clear message rather than on an unknown column family.
        let mut names: Vec<String> = DB::list_cf(&opts, &path).unwrap_or_default();
        for cf in ALL_CFS {
            if !names.iter().any(|n| n == cf) {
                names.push(cf.to_string());
            }
        }
        let cfs = names
            .iter()
            .map(|n| ColumnFamilyDescriptor::new(n, family.clone()));
        let db = DB::open_cf_descriptors(&opts, &path, cfs).map_err(|e| {
            // RocksDB reports its lock only in the message: held by another process ("While
            // lock file: …/LOCK: …") or by another open handle of this one.
            let message = e.to_string();
            if message.contains("While lock file") || message.contains("lock hold by current") {
                Error::InUse { path: path.clone() }
            } else {
                Error::Rocks(e)
            }
        })?;

        let meta = db.cf_handle(CF_META).expect("created above");
        if db.get_cf(meta, META_FORMAT)?.is_none() {
            db.put_cf(meta, META_FORMAT, [FORMAT_VERSION])?;
        }
        let (format, last) = check_format_and_last_lsn(&db, &path)?;
        if format == 1 {
            migrate_to_format_2(&db, &path)?;
        }
        if format <= 2 {
            migrate_to_format_3(&db, &path)?;
        }
        if format <= 3 {
            migrate_to_format_4(&db, &path)?;
        }
        if format <= 4 {
            // Format 5 adds the `retained` family (created above), empty until retention
            // first removes something: nothing to move.
            db.put_cf(meta, META_FORMAT, [5])?;
        }
        if format <= 5 {
            migrate_to_format_6(&db, &path)?;
        }
        check_mode(&db, &path, options.replicated, last)?;
        let db = Arc::new(db);
        let last_lsn = Arc::new(AtomicU64::new(last));
        let stats = Arc::new(JournalStats::default());
        let (tx, rx) = crossbeam_channel::unbounded();
        let sync = options.durability == Durability::Sync;
        let replicator = options.replicated.then(ReplicatorSlot::default);
        let thread = {
            let (db, last_lsn, stats) = (db.clone(), last_lsn.clone(), stats.clone());
            let replicator = replicator.clone();
            let archive = options.archive.clone();
            std::thread::Builder::new()
                .name("sendledger-journal".into())
                .spawn(move || journal::run(db, sync, archive, replicator, rx, last_lsn, stats))
                .map_err(|source| Error::Dir {
                    path: path.clone(),
                    source,
                })?
        };
        Ok(Ledger {
            inner: Arc::new(Inner {
                db,
                path,
                tx: Mutex::new(Some(tx)),
                thread: Mutex::new(Some(thread)),
                last_lsn,
                stats,
                memory: Some((options.memory.budget(), cache, buffers)),
                replicator,
            }),
        })
    }

    /// What RocksDB holds in memory for this ledger; `None` for a read-only ledger.
    pub fn memory_usage(&self) -> Option<MemoryUsage> {
        let (budget, cache, buffers) = self.inner.memory.as_ref()?;
        Some(MemoryUsage {
            budget: *budget,
            cached: cache.get_usage(),
            write_buffers: buffers.get_usage(),
        })
    }

    /// Opens the ledger in `dir` for reading only (`inspect`, `audit`): nothing in the
    /// directory is created, changed or locked, so a running service may hold it. Appends
    /// fail with [`Error::Closed`]. A directory without a ledger is [`Error::NoLedger`].
    pub fn open_read_only(dir: impl AsRef<Path>) -> Result<Ledger> {
        let path = dir.as_ref().to_path_buf();
        // RocksDB names its current manifest in `CURRENT`; without it there is no database.
        if !path.join("CURRENT").is_file() {
            return Err(Error::NoLedger { path });
        }
        let opts = Options::default();
        let names = DB::list_cf(&opts, &path)?;
        // A ledger of format 3 or older (no `unsettled_by_partition` index) is read as it is:
        // what the index would answer is found by scanning the summaries. One of format 2 or
        // older has no task index, and cannot list tasks by phase ([`Error::NoTaskIndex`]).
        // One of format 4 or older has no `retained` family: nothing was removed from it.
        let later = [
            CF_UNSETTLED,
            CF_TASK_INDEX,
            CF_UNSETTLED_BY_PARTITION,
            CF_RETAINED,
            CF_RETAINED_BY_TIME,
        ];
        let mut format_1 = ALL_CFS.iter().filter(|cf| !later.contains(cf));
        if format_1.any(|cf| !names.iter().any(|n| n == cf)) {
            return Err(Error::BadFormatMarker { path });
        }
        let db = DB::open_cf_for_read_only(&opts, &path, &names, false)?;
        let (_, last) = check_format_and_last_lsn(&db, &path)?;
        Ok(Ledger {
            inner: Arc::new(Inner {
                db: Arc::new(db),
                path,
                tx: Mutex::new(None),
                thread: Mutex::new(None),
                last_lsn: Arc::new(AtomicU64::new(last)),
                stats: Arc::new(JournalStats::default()),
                memory: None,
                replicator: None,
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Kafka mode: installs the log of record every batch's events are made durable in before
    /// they are recorded. Once only; refused (returned) for a ledger not opened `replicated`
    /// or when one is installed already.
    pub fn install_replicator(
        &self,
        replicator: Arc<dyn Replicator>,
    ) -> std::result::Result<(), Arc<dyn Replicator>> {
        match &self.inner.replicator {
            Some(slot) => slot.set(replicator),
            None => Err(replicator),
        }
    }

    /// Kafka mode: the checkpoint of requests partition `partition`'s log of record (the
    /// events-topic offset to read from), if events of it were ever recorded here.
    pub fn log_checkpoint(&self, partition: i32) -> Result<Option<i64>> {
        Ok(self
            .cursor(&journal::log_checkpoint(partition))?
            .map(|c| c as i64))
    }

    /// Kafka mode: the offset of the first event of the last transaction of requests partition
    /// `partition`'s log recorded here (see [`journal::log_tail`]); `None` when none was, or
    /// only by a version that did not record it.
    pub fn log_tail(&self, partition: i32) -> Result<Option<i64>> {
        Ok(self
            .cursor(&journal::log_tail(partition))?
            .map(|c| c as i64))
    }

    /// Kafka mode: the reviews owed for tasks of requests partition `partition` whose history
    /// here a restore replaced (see [`Append::reviews_owed`]).
    pub fn reviews_owed(&self, partition: i32) -> Result<Vec<Diverged>> {
        let prefix = review_owed_prefix(partition);
        let mut out = Vec::new();
        for item in self.inner.db.prefix_iterator_cf(self.cf(CF_META), &prefix) {
            let (k, v) = item?;
            let Some(task) = k.strip_prefix(&prefix[..]) else {
                break;
            };
            let task = decode_task_key(task).ok_or(Error::BadValue {
                what: "review owed key",
            })?;
            out.push(Diverged::decode(task, &v)?);
        }
        Ok(out)
    }

    /// The requests partition of `task`'s request (from its first event).
    pub fn request_partition(&self, task: TaskId) -> Result<Option<i32>> {
        request_partition(&self.inner.db, task)
    }

    pub(crate) fn submit(&self, append: Append) -> Result<oneshot::Receiver<Result<Range<u64>>>> {
        let (ack, rx) = oneshot::channel();
        // Kafka mode: the generation of the partition's log the append is made in.
        let generation = match (&self.inner.replicator, append.partition) {
            (Some(slot), Some(partition)) if !append.restored => {
                slot.get().and_then(|r| r.generation(partition))
            }
            _ => None,
        };
        let tx = self.inner.tx.lock().unwrap_or_else(|e| e.into_inner());
        tx.as_ref()
            .ok_or(Error::Closed)?
            .send(Request {
                append,
                ack,
                generation,
            })
            .map_err(|_| Error::Closed)?;
        Ok(rx)
    }

    /// Appends atomically and waits until it is durable. Returns the LSNs of the events.
    pub async fn append(&self, append: Append) -> Result<Range<u64>> {
        self.submit(append)?.await.map_err(|_| Error::Closed)?
    }

    /// Kafka mode: waits until what the last generation of requests partition `partition`
    /// had committed is written here, before a restore step is computed from the ledger (it
    /// must not miss events about to be written). Call it once the partition is given up: a
    /// transaction still under way is waited for up to `bound` (one that ends later is
    /// refused, since its generation is over), then an empty append passes through the
    /// journal after whatever it had settled. Blocking.
    pub fn quiesce_blocking(&self, partition: i32, bound: std::time::Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + bound;
        while self.stats().transaction_under_way(partition) && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        self.append_blocking(Append::default()).map(|_| ())
    }

    /// [`Ledger::append`] for threads outside an async runtime.
    pub fn append_blocking(&self, append: Append) -> Result<Range<u64>> {
        self.submit(append)?
            .blocking_recv()
            .map_err(|_| Error::Closed)?
    }

    /// Writes every column family's memtable to disk and compacts it fully, so the next open
    /// has no write-ahead log to replay and no compaction to catch up on. Blocking, and as
    /// long as rewriting the whole ledger: for tools (the audit benchmark), not the service.
    pub fn compact(&self) -> Result<()> {
        let cfs: Vec<_> = ALL_CFS.iter().map(|n| self.cf(n)).collect();
        self.inner
            .db
            .flush_cfs_opt(&cfs, &rocksdb::FlushOptions::default())?;
        for cf in cfs {
            self.inner
                .db
                .compact_range_cf(cf, None::<&[u8]>, None::<&[u8]>);
        }
        Ok(())
    }

    /// Replaces the processed offsets of a requests-topic partition: forgets them all, so that
    /// its messages count as new again (a topic deleted and recreated while the ledger was
    /// kept), or, with `through`, counts every offset up to it as processed (the partition was
    /// processed by another ledger up to there). The service refuses such a partition until
    /// then. Returns how many entries were removed. Blocking; for a stopped ledger (the command
    /// holds the ledger's lock, so no service writes meanwhile). Identities stay known: a
    /// redelivered old request is still a duplicate of its task.
    pub fn reset_offsets(&self, topic: &str, partition: i32, through: Option<i64>) -> Result<u64> {
        let cf = self.cf(CF_OFFSETS);
        let prefix = offset_key(topic, partition);
        let mut batch = rocksdb::WriteBatch::default();
        let mut removed = 0;
        for item in self
            .inner
            .db
            .iterator_cf(cf, IteratorMode::From(&prefix, Direction::Forward))
        {
            let (k, _) = item?;
            if !k.starts_with(&prefix) {
                break;
            }
            batch.delete_cf(cf, k);
            removed += 1;
        }
        if let Some(through) = through {
            batch.put_cf(cf, &prefix, through.to_be_bytes());
        }
        let mut sync = rocksdb::WriteOptions::default();
        sync.set_sync(true);
        self.inner.db.write_opt(batch, &sync)?;
        Ok(removed)
    }

    /// Runs reads on the blocking pool, never on an async executor thread.
    pub async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Ledger) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let ledger = self.clone();
        tokio::task::spawn_blocking(move || f(&ledger))
            .await
            .map_err(|_| Error::Closed)?
    }

    /// The highest LSN committed so far (0 when the log is empty).
    pub fn last_lsn(&self) -> u64 {
        self.inner.last_lsn.load(Ordering::SeqCst)
    }

    pub fn stats(&self) -> &JournalStats {
        &self.inner.stats
    }

    pub(crate) fn db(&self) -> &DB {
        &self.inner.db
    }

    pub(crate) fn cf(&self, name: &str) -> &rocksdb::ColumnFamily {
        self.inner
            .db
            .cf_handle(name)
            .expect("column families are created at open")
    }

    /// A task's events in task order.
    pub fn task_events(&self, task: TaskId) -> Result<Vec<Event>> {
        task_events(&self.inner.db, task)
    }

    /// A task's events in task order, as [`Ledger::task_events`], for a task that is most
    /// likely new: its summary is looked up first, and a task without one has no events
    /// (they are written in one batch). The lookup of a missing key is answered by the
    /// filters; reading the events seeks in every level.
    pub fn task_history(&self, task: TaskId) -> Result<Vec<Event>> {
        match self.task_summary(task)? {
            Some(_) => self.task_events(task),
            None => Ok(Vec::new()),
        }
    }

    /// A task's event `seq` (0 is its first), if the ledger holds it.
    pub fn task_event(&self, task: TaskId, seq: u32) -> Result<Option<Event>> {
        task_event(&self.inner.db, task, seq)
    }

    /// Events from `from` (inclusive) in LSN order, at most `limit`.
    pub fn read_log(&self, from: u64, limit: usize) -> Result<Vec<Event>> {
        self.log_from(from).take(limit).collect()
    }

    /// An iterator over the log from `from` in LSN order; each item is decoded on the way.
    pub fn log_from(&self, from: u64) -> impl Iterator<Item = Result<Event>> + '_ {
        let start = lsn_key(from);
        self.inner
            .db
            .iterator_cf(
                self.cf(CF_LOG),
                IteratorMode::From(&start, Direction::Forward),
            )
            .map(|item| {
                let (k, v) = item?;
                let lsn = decode_u64(&k).ok_or(Error::BadValue { what: "log key" })?;
                decode_event(lsn, &v)
            })
    }

    pub fn task_summary(&self, task: TaskId) -> Result<Option<TaskSummary>> {
        self.inner
            .db
            .get_cf(self.cf(CF_TASKS), task.0)?
            .map(|v| TaskSummary::decode(&v))
            .transpose()
    }

    /// The summaries of `tasks`, in their order: one batched read, cheaper than a point read
    /// each.
    pub fn task_summaries_of(&self, tasks: &[TaskId]) -> Result<Vec<Option<TaskSummary>>> {
        self.task_summaries_with(tasks, &ReadOptions::default())
    }

    fn task_summaries_with(
        &self,
        tasks: &[TaskId],
        options: &ReadOptions,
    ) -> Result<Vec<Option<TaskSummary>>> {
        let cf = self.cf(CF_TASKS);
        self.inner
            .db
            .batched_multi_get_cf_opt(cf, tasks.iter().map(|t| &t.0), false, options)
            .into_iter()
            .map(|v| v?.map(|v| TaskSummary::decode(&v)).transpose())
            .collect()
    }

    /// Every task's summary in task id order. Reads the whole `tasks` column family (six bytes
    /// per task), so the cost grows with every task ever recorded.
    pub fn task_summaries(&self) -> impl Iterator<Item = Result<(TaskId, TaskSummary)>> + '_ {
        self.inner
            .db
            .iterator_cf(self.cf(CF_TASKS), IteratorMode::Start)
            .map(|item| {
                let (k, v) = item?;
                let id = decode_task_key(&k).ok_or(Error::BadValue { what: "tasks key" })?;
                Ok((id, TaskSummary::decode(&v)?))
            })
    }

    /// Every task not in a terminal state, in task id order, for resumption at start-up. Read
    /// from the `unsettled` index: the cost grows with the tasks not settled, not with every
    /// task ever recorded.
    pub fn active_tasks(&self) -> Result<Vec<(TaskId, TaskSummary)>> {
        self.unsettled(None)
    }

    /// The tasks not in a terminal state whose request came from requests partition
    /// `partition`, in task id order (kafka mode: the tasks a partition's new owner resumes).
    pub fn active_tasks_of_partition(&self, partition: i32) -> Result<Vec<(TaskId, TaskSummary)>> {
        self.unsettled(Some(partition))
    }

    /// The tasks not settled, of one requests partition or (`None`) all: a partition's are
    /// one range of the index.
    fn unsettled(&self, partition: Option<i32>) -> Result<Vec<(TaskId, TaskSummary)>> {
        let db = &self.inner.db;
        let Some(index) = db.cf_handle(CF_UNSETTLED_BY_PARTITION) else {
            // A ledger of format 3 or older opened read-only has no such index: every summary
            // is read.
            let mut out = Vec::new();
            for item in self.task_summaries() {
                let (id, summary) = item?;
                if summary.phase.is_terminal() {
                    continue;
                }
                if partition.is_some() && request_partition(db, id)? != partition {
                    continue;
                }
                out.push((id, summary));
            }
            return Ok(out);
        };
        // The index and the summaries are read in one snapshot: a task that settles between
        // the two reads would otherwise look like an index that disagrees with its summary.
        let snapshot = db.snapshot();
        let mut options = ReadOptions::default();
        options.set_snapshot(&snapshot);
        let prefix = partition.map(|p| unsettled_prefix(Some(p)));
        let from = match &prefix {
            Some(p) => IteratorMode::From(p, rocksdb::Direction::Forward),
            None => IteratorMode::Start,
        };
        let mut ids = Vec::new();
        for item in snapshot.iterator_cf(index, from) {
            let (k, _) = item?;
            if prefix.is_some_and(|p| !k.starts_with(&p)) {
                break;
            }
            let (_, task) = decode_unsettled_key(&k).ok_or(Error::BadValue {
                what: "unsettled key",
            })?;
            ids.push(task);
        }
        // Task id order, whatever the partitions.
        ids.sort_unstable();
        let summaries = self.task_summaries_with(&ids, &options)?;
        let mut out = Vec::with_capacity(ids.len());
        for (id, summary) in ids.into_iter().zip(summaries) {
            match summary {
                Some(s) if !s.phase.is_terminal() => out.push((id, s)),
                // The audit names such a task (index-consistent); it is not resumed.
                other => {
                    tracing::warn!(task_id = %id, summary = ?other, "the unsettled index lists a task whose summary is settled or missing; not resumed")
                }
            }
        }
        Ok(out)
    }

    /// What is processed of a requests-topic partition: the watermark and the offsets above it.
    pub fn processed(&self, topic: &str, partition: i32) -> Result<Processed> {
        let mut out = Processed::default();
        let prefix = offset_key(topic, partition);
        for item in self.inner.db.iterator_cf(
            self.cf(CF_OFFSETS),
            IteratorMode::From(&prefix, Direction::Forward),
        ) {
            let (k, v) = item?;
            if !k.starts_with(&prefix) {
                break;
            }
            match decode_offset_key(&k) {
                Some((_, _, None)) => {
                    out.watermark =
                        Some(decode_u64(&v).ok_or(Error::BadValue { what: "offsets" })? as i64)
                }
                Some((_, _, Some(offset))) => {
                    out.above.insert(offset);
                }
                None => {
                    return Err(Error::BadValue {
                        what: "offsets key",
                    })
                }
            }
        }
        Ok(out)
    }

    /// Timers due at or before `now`, earliest first, at most `limit`.
    pub fn due_timers(&self, now: u64, limit: usize) -> Result<Vec<(u64, TaskId, TimerKind)>> {
        let mut out = Vec::new();
        for item in self
            .inner
            .db
            .iterator_cf(self.cf(CF_TIMERS), IteratorMode::Start)
        {
            let (k, v) = item?;
            let (due, task) = decode_timer_key(&k).ok_or(Error::BadValue { what: "timers key" })?;
            if due > now || out.len() >= limit {
                break;
            }
            let kind = v
                .first()
                .and_then(|b| TimerKind::from_byte(*b))
                .ok_or(Error::BadValue { what: "timers" })?;
            out.push((due, task, kind));
        }
        Ok(out)
    }

    /// When the earliest timer is due.
    pub fn next_timer(&self) -> Result<Option<u64>> {
        match self
            .inner
            .db
            .iterator_cf(self.cf(CF_TIMERS), IteratorMode::Start)
            .next()
        {
            Some(item) => Ok(Some(
                decode_timer_key(&item?.0)
                    .ok_or(Error::BadValue { what: "timers key" })?
                    .0,
            )),
            None => Ok(None),
        }
    }

    pub fn cursor(&self, name: &str) -> Result<Option<u64>> {
        self.inner
            .db
            .get_cf(self.cf(CF_CURSORS), name.as_bytes())?
            .map(|v| decode_u64(&v).ok_or(Error::BadValue { what: "cursors" }))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use sendledger_core::Phase;

    use super::*;

    #[test]
    fn format_5_is_migrated_with_the_sum_of_what_retention_kept() {
        let dir = tempfile::tempdir().unwrap();
        drop(Ledger::open(dir.path(), LedgerOptions::default()).unwrap());
        // Entries as format 5 wrote them: `1`, then bincode of what was kept.
        let v1 = |key: &str| {
            let retained = crate::retention::sample_retained(key);
            let mut v = vec![1u8];
            bincode::serialize_into(&mut v, &retained).unwrap();
            v
        };
        let kept = [(TaskId([1; 16]), v1("a")), (TaskId([2; 16]), v1("b"))];
        {
            let db = DB::open_cf(&Options::default(), dir.path(), ALL_CFS).unwrap();
            let (meta, retained) = (
                db.cf_handle(CF_META).unwrap(),
                db.cf_handle(CF_RETAINED).unwrap(),
            );
            for (task, value) in &kept {
                db.put_cf(retained, task.0, value).unwrap();
            }
            db.put_cf(meta, META_FORMAT, [5]).unwrap();
        }
        let ledger = Ledger::open(dir.path(), LedgerOptions::default()).unwrap();
        let chain = ledger.prune_chain().unwrap();
        let sum = kept.iter().fold([0; 32], |sum, (task, value)| {
            crate::retention::add(&sum, &crate::retention::leaf(*task, value))
        });
        assert_eq!((chain.seq, chain.head, chain.kept_sum), (0, [0; 32], sum));
        // An archive started after the migration holds none of them, and says nothing of them.
        let archive = tempfile::tempdir().unwrap();
        let config = sendledger_core::CheckConfig::default();
        let report =
            crate::archive_audit::audit_archive(archive.path(), Some(&ledger), config).unwrap();
        assert!(report.is_clean(), "{:?}", report.violations);
        drop(ledger);
        let ledger = Ledger::open_read_only(dir.path()).unwrap();
        let v = ledger.db().get_cf(ledger.cf(CF_META), META_FORMAT).unwrap();
        assert_eq!(v.as_deref(), Some(&[6][..]));
    }

    #[test]
    fn a_newer_format_is_refused_with_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        drop(Ledger::open(dir.path(), LedgerOptions::default()).unwrap());
        {
            let opts = Options::default();
            let db = DB::open_cf(&opts, dir.path(), ALL_CFS).unwrap();
            let meta = db.cf_handle(CF_META).unwrap();
            assert_eq!(
                db.get_cf(meta, META_FORMAT).unwrap().as_deref(),
                Some(&[FORMAT_VERSION][..])
            );
            db.put_cf(meta, META_FORMAT, [FORMAT_VERSION + 1]).unwrap();
        }
        let err = Ledger::open(dir.path(), LedgerOptions::default())
            .err()
            .expect("must refuse");
        assert!(
            matches!(
                err,
                Error::NewerFormat {
                    found: 7,
                    supported: 6,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("run a sendledger version that supports it"),
            "{err}"
        );
    }

    /// A ledger keeps the mode it was first opened in: local mode refuses a kafka-mode copy
    /// and kafka mode a local-mode record, naming both. A ledger from before the mode was
    /// recorded counts as kafka mode when it holds a log checkpoint.
    #[test]
    fn a_ledger_refuses_the_other_mode() {
        let kafka = LedgerOptions {
            replicated: true,
            ..LedgerOptions::default()
        };
        let (local_dir, kafka_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        drop(Ledger::open(local_dir.path(), LedgerOptions::default()).unwrap());
        let err = Ledger::open(local_dir.path(), kafka.clone()).err().unwrap();
        assert!(
            err.to_string()
                .contains("written in local mode and cannot be opened in kafka mode"),
            "{err}"
        );
        drop(Ledger::open(kafka_dir.path(), kafka.clone()).unwrap());
        let err = Ledger::open(kafka_dir.path(), LedgerOptions::default())
            .err()
            .unwrap();
        assert!(
            matches!(
                err,
                Error::OtherMode {
                    written: "kafka",
                    wanted: "local",
                    ..
                }
            ),
            "{err}"
        );
        assert!(!err.is_transient());

        // Before the marker: events and a checkpoint.
        let old = tempfile::tempdir().unwrap();
        {
            let db = DB::open_cf(
                &{
                    let mut o = Options::default();
                    o.create_if_missing(true);
                    o.create_missing_column_families(true);
                    o
                },
                old.path(),
                ALL_CFS,
            )
            .unwrap();
            db.put_cf(
                db.cf_handle(CF_META).unwrap(),
                META_FORMAT,
                [FORMAT_VERSION],
            )
            .unwrap();
            db.put_cf(db.cf_handle(CF_LOG).unwrap(), lsn_key(1), b"x")
                .unwrap();
            db.put_cf(
                db.cf_handle(CF_CURSORS).unwrap(),
                journal::log_checkpoint(3).as_bytes(),
                7u64.to_be_bytes(),
            )
            .unwrap();
        }
        assert!(matches!(
            Ledger::open(old.path(), LedgerOptions::default())
                .err()
                .unwrap(),
            Error::OtherMode {
                written: "kafka",
                ..
            }
        ));
        drop(Ledger::open(old.path(), kafka).unwrap());
    }

    #[test]
    fn a_ledger_open_elsewhere_is_reported_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let _open = Ledger::open(dir.path(), LedgerOptions::default()).unwrap();
        let err = Ledger::open(dir.path(), LedgerOptions::default())
            .err()
            .expect("locked");
        assert!(matches!(err, Error::InUse { .. }), "{err}");
    }

    /// A RocksDB I/O error may pass (a full disk, once space is freed); a closed journal, a
    /// RocksDB refusal of the call itself, or a newer format never do.
    #[test]
    fn io_errors_are_transient_and_a_closed_or_refused_ledger_is_permanent() {
        let dir = tempfile::tempdir().unwrap();
        // RocksDB cannot open its lock file when a directory stands in its place.
        let db = dir.path().join("db");
        std::fs::create_dir_all(db.join("LOCK")).unwrap();
        let mut opts = Options::default();
        opts.create_if_missing(true);
        let Err(io) = DB::open(&opts, &db) else {
            panic!("opened without a lock file")
        };
        let io = Error::from(io);
        assert!(io.is_transient(), "{io:?}");
        opts.create_if_missing(false);
        let Err(refused) = DB::open(&opts, dir.path().join("none")) else {
            panic!("opened a missing database")
        };
        let refused = Error::from(refused);
        assert!(!refused.is_transient(), "{refused:?}");
        assert!(!Error::Closed.is_transient());
        let newer = Error::NewerFormat {
            path: dir.path().into(),
            found: 2,
            supported: 1,
        };
        assert!(!newer.is_transient());
    }

    /// Task `n` accepted from requests partition `partition`, as its first append records it,
    /// with the phase it is left in.
    fn first_append(n: u8, partition: i32, phase: Phase) -> (TaskId, Append) {
        let (_, mut body) = sendledger_core::fixtures::accepted();
        if let sendledger_core::EventBody::TaskAccepted { source, .. } = &mut body {
            source.partition = partition;
        }
        let task = TaskId([n; 16]);
        let append = Append {
            events: vec![sendledger_core::NewEvent {
                task_id: task,
                task_seq: 0,
                at: 1,
                body,
            }],
            tasks: vec![(task, TaskSummary { phase, next_seq: 1 })],
            partition: Some(partition),
            ..Append::default()
        };
        (task, append)
    }

    fn ids(tasks: Vec<(TaskId, TaskSummary)>) -> Vec<TaskId> {
        tasks.into_iter().map(|(t, _)| t).collect()
    }

    /// The unsettled index lists a task from its first events until it settles, under the
    /// partition of its request; a task settled by its first append is never listed. A ledger
    /// of format 1 (no index) is read by scanning its summaries, and indexed when the service
    /// opens it; one of format 3 (indexed by task) is indexed by partition.
    #[test]
    fn unsettled_tasks_are_indexed_by_partition_and_format_1_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), LedgerOptions::default()).unwrap();
        let (a, first_a) = first_append(1, 1, Phase::Accepted);
        let (b, first_b) = first_append(2, 2, Phase::Accepted);
        let (_, rejected) = first_append(3, 1, Phase::Rejected);
        let (d, first_d) = first_append(4, 1, Phase::Unknown);
        for append in [first_a, first_b, rejected, first_d] {
            ledger.append_blocking(append).unwrap();
        }
        assert_eq!(ids(ledger.active_tasks().unwrap()), vec![a, b, d]);
        // Task b settles; task d goes to review, still not settled. (The journal records the
        // summary it is given, whatever the event.)
        for (task, phase) in [(b, Phase::Succeeded), (d, Phase::ManualReview)] {
            let mut next = first_append(0, 0, phase).1;
            next.events[0].task_id = task;
            next.events[0].task_seq = 1;
            next.tasks = vec![(task, TaskSummary { phase, next_seq: 2 })];
            ledger.append_blocking(next).unwrap();
        }
        let all = ledger.active_tasks().unwrap();
        assert_eq!(ids(all.clone()), vec![a, d]);
        assert_eq!(all[1].1.phase, Phase::ManualReview);
        assert_eq!(
            ids(ledger.active_tasks_of_partition(1).unwrap()),
            vec![a, d]
        );
        assert_eq!(ids(ledger.active_tasks_of_partition(2).unwrap()), vec![]);
        drop(ledger);

        // The same ledger as format 1 wrote it: no index, format marker 1.
        {
            let mut db = DB::open_cf(&Options::default(), dir.path(), ALL_CFS).unwrap();
            db.drop_cf(CF_UNSETTLED).unwrap();
            db.drop_cf(CF_UNSETTLED_BY_PARTITION).unwrap();
            db.put_cf(db.cf_handle(CF_META).unwrap(), META_FORMAT, [1])
                .unwrap();
        }
        let old = Ledger::open_read_only(dir.path()).unwrap();
        assert_eq!(ids(old.active_tasks().unwrap()), vec![a, d]);
        assert_eq!(ids(old.active_tasks_of_partition(1).unwrap()), vec![a, d]);
        drop(old);
        let migrated = Ledger::open(dir.path(), LedgerOptions::default()).unwrap();
        assert_eq!(
            migrated
                .inner
                .db
                .get_cf(migrated.cf(CF_META), META_FORMAT)
                .unwrap()
                .as_deref(),
            Some(&[FORMAT_VERSION][..])
        );
        assert_eq!(
            ids(migrated.active_tasks_of_partition(1).unwrap()),
            vec![a, d]
        );
        assert_eq!(ids(migrated.active_tasks_of_partition(2).unwrap()), vec![]);
        assert_eq!(ids(migrated.active_tasks().unwrap()), vec![a, d]);
        drop(migrated);

        // As format 3 wrote it: the index by task id, with each task's partition as value.
        {
            let mut db = DB::open_cf(&Options::default(), dir.path(), ALL_CFS).unwrap();
            let by_partition = db.cf_handle(CF_UNSETTLED_BY_PARTITION).unwrap();
            let listed: Vec<_> = db
                .iterator_cf(by_partition, IteratorMode::Start)
                .map(|item| decode_unsettled_key(&item.unwrap().0).unwrap())
                .collect();
            assert_eq!(listed, vec![(Some(1), a), (Some(1), d)]);
            db.drop_cf(CF_UNSETTLED_BY_PARTITION).unwrap();
            let by_task = db.cf_handle(CF_UNSETTLED).unwrap();
            for (partition, task) in listed {
                db.put_cf(by_task, task.0, partition_value(partition))
                    .unwrap();
            }
            db.put_cf(db.cf_handle(CF_META).unwrap(), META_FORMAT, [3])
                .unwrap();
        }
        let old = Ledger::open_read_only(dir.path()).unwrap();
        assert_eq!(ids(old.active_tasks_of_partition(1).unwrap()), vec![a, d]);
        drop(old);
        let migrated = Ledger::open(dir.path(), LedgerOptions::default()).unwrap();
        assert_eq!(
            ids(migrated.active_tasks_of_partition(1).unwrap()),
            vec![a, d]
        );
        assert_eq!(ids(migrated.active_tasks().unwrap()), vec![a, d]);
        let emptied = migrated
            .inner
            .db
            .iterator_cf(migrated.cf(CF_UNSETTLED), IteratorMode::Start);
        assert_eq!(emptied.count(), 0, "format 4 leaves the old index empty");
    }
}
