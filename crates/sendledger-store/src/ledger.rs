//! Opening a ledger, its format version, and reads.

use std::ops::Range;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rocksdb::{
    BlockBasedIndexType, BlockBasedOptions, Cache, ColumnFamilyDescriptor, Direction, IteratorMode,
    LruCacheOptions, Options, ReadOptions, WriteBufferManager, DB,
};
use sendledger_core::{Event, Identity, PayloadHash, Phase, TaskId};
use tokio::sync::oneshot;

use crate::envelope::decode_event;
use crate::error::{Error, Result};
use crate::journal::{self, Append, JournalStats, Replicator, ReplicatorSlot, Request, TimerKind};
use crate::keys::*;

/// The storage format this build writes and the newest it reads.
// format: do not change (bump only with a migration)
pub const FORMAT_VERSION: u8 = 2;

/// Whether an acknowledged append survives a power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Each write batch is fsynced before any append in it is acknowledged.
    #[default]
    Sync,
    /// No fsync: acknowledged appends survive a process crash but may be lost on power loss
    /// or an OS crash. Unsafe for production; used to measure the cost of durability.
    Buffered,
}

#[derive(Debug, Clone, Default)]
pub struct LedgerOptions {
    pub durability: Durability,
    pub memory: Memory,
    /// Kafka mode: events are recorded only once a [`Replicator`] made them durable in the
    /// log of record (installed with [`Ledger::install_replicator`]; until then appends of
    /// events are refused as not replicated).
    pub replicated: bool,
}

/// The memory RocksDB may keep for one ledger, shared by every column family: one block cache
/// of `bytes` (index and filter blocks included), with the memtables (write buffers) charged to
/// it and flushed once they pass half of it. Reads beyond it come from the OS page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    pub bytes: usize,
}

impl Default for Memory {
    fn default() -> Self {
        Memory {
            bytes: 64 * 1024 * 1024,
        }
    }
}

impl Memory {
    /// The smallest budget accepted: below it RocksDB would flush tiny memtables constantly.
    pub const MIN_BYTES: usize = 4 * 1024 * 1024;

    /// The budget in effect: `bytes`, and at least [`Memory::MIN_BYTES`].
    pub fn budget(self) -> usize {
        self.bytes.max(Self::MIN_BYTES)
    }

    /// Shards of the block cache: as many as leave each at least 8 MiB, at most 64.
    fn cache_shard_bits(bytes: usize) -> i32 {
        (bytes / (8 << 20)).max(1).ilog2().min(6) as i32
    }

    /// RocksDB options sharing one cache and one write budget, and those of each family.
    fn rocksdb_options(self) -> (Options, Options, Cache, WriteBufferManager) {
        let bytes = self.budget();
        // RocksDB splits an LRU cache into shards by key hash, 64 of them by default for this
        // size: a 64 MiB cache held 1 MiB a shard, less than one unpartitioned filter block of
        // a large table file, so such blocks were read again at nearly every lookup. Shards of
        // at least 8 MiB (and the partitioned blocks below) keep them cached.
        let mut lru = LruCacheOptions::default();
        lru.set_capacity(bytes);
        lru.set_num_shard_bits(Self::cache_shard_bits(bytes));
        let cache = Cache::new_lru_cache_opts(&lru);
        let buffers = WriteBufferManager::new_write_buffer_manager_with_cache(
            bytes / 2,
            false,
            cache.clone(),
        );
        let mut db = Options::default();
        db.set_write_buffer_manager(&buffers);
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&cache);
        // Index and filter blocks count against the cache too, instead of growing with the data.
        table.set_cache_index_and_filter_blocks(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        // Most point reads miss: a new request's identity, a restored task's summary. A
        // filter (about 10 bits a key) answers those without reading a block of each file,
        // and one in the memtable without searching it.
        table.set_bloom_filter(10.0, false);
        // A table file's index and filter are cut into blocks of about 4 KiB, with a small
        // top-level index kept in the cache: a lookup reads the parts it needs instead of the
        // whole index and filter of a 64 MiB file (megabytes, read and checksummed again each
        // time they were evicted).
        table.set_index_type(BlockBasedIndexType::TwoLevelIndexSearch);
        table.set_partition_filters(true);
        table.set_metadata_block_size(4096);
        table.set_pin_top_level_index_and_filter(true);
        table.set_cache_index_and_filter_blocks_with_high_priority(true);
        let mut family = Options::default();
        family.set_block_based_table_factory(&table);
        family.set_write_buffer_size(bytes / 8);
        family.set_memtable_prefix_bloom_ratio(0.02);
        family.set_memtable_whole_key_filtering(true);
        (db, family, cache, buffers)
    }
}

/// The processed offsets of one requests-topic partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Processed {
    /// Every offset up to and including this one is processed.
    pub watermark: Option<i64>,
    /// Processed offsets above the watermark (out of order, not yet folded into it).
    pub above: std::collections::BTreeSet<i64>,
}

impl Processed {
    pub fn contains(&self, offset: i64) -> bool {
        self.watermark.is_some_and(|w| offset <= w) || self.above.contains(&offset)
    }

    /// The highest offset below which everything is processed, counting the markers.
    pub fn contiguous(&self) -> Option<i64> {
        let mut w = self.watermark;
        for &o in &self.above {
            if o == w.map_or(0, |w| w + 1) {
                w = Some(o);
            } else if w.is_some_and(|w| o <= w) {
                continue;
            } else {
                break;
            }
        }
        w
    }
}

/// The compact summary of a task kept for start-up: its phase and number of events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskSummary {
    pub phase: Phase,
    pub next_seq: u32,
}

// format: do not change (phase codes are on disk)
const PHASES: [Phase; 9] = [
    Phase::New,
    Phase::Accepted,
    Phase::Sending,
    Phase::RetryWait,
    Phase::Unknown,
    Phase::ManualReview,
    Phase::Succeeded,
    Phase::Rejected,
    Phase::Failed,
];

impl TaskSummary {
    pub(crate) fn encode(&self) -> [u8; 6] {
        let code = PHASES.iter().position(|p| *p == self.phase).unwrap_or(0) as u8;
        let seq = self.next_seq.to_be_bytes();
        [1, code, seq[0], seq[1], seq[2], seq[3]]
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<TaskSummary> {
        match bytes {
            [1, code, seq @ ..] if seq.len() == 4 => Ok(TaskSummary {
                phase: *PHASES
                    .get(*code as usize)
                    .ok_or(Error::BadValue { what: "tasks" })?,
                next_seq: u32::from_be_bytes(
                    seq.try_into()
                        .map_err(|_| Error::BadValue { what: "tasks" })?,
                ),
            }),
            _ => Err(Error::BadValue { what: "tasks" }),
        }
    }
}

/// Refuses a ledger of a newer storage format (or none), and returns its format and last LSN.
fn check_format_and_last_lsn(db: &DB, path: &Path) -> Result<(u8, u64)> {
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
    Ok((format, last))
}

/// Records the mode of a ledger opened for the first time (`replicated`: kafka mode), and
/// refuses a ledger written in the other mode. A ledger from before the mode was recorded
/// holding events is a kafka-mode one when it has a log checkpoint, else a local-mode one.
fn check_mode(db: &DB, path: &Path, replicated: bool, last_lsn: u64) -> Result<()> {
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
fn migrate_to_format_2(db: &DB, path: &Path) -> Result<()> {
    let cf = |name| db.cf_handle(name).expect("opened with every column family");
    let mut batch = rocksdb::WriteBatch::default();
    let mut listed = 0u64;
    for item in db.iterator_cf(cf(CF_TASKS), IteratorMode::Start) {
        let (k, v) = item?;
        if TaskSummary::decode(&v)?.phase.is_terminal() {
            continue;
        }
        let task = TaskId(
            k[..]
                .try_into()
                .map_err(|_| Error::BadValue { what: "tasks key" })?,
        );
        let partition = request_partition(db, task)?;
        batch.put_cf(cf(CF_UNSETTLED), task.0, partition_value(partition));
        listed += 1;
    }
    batch.put_cf(cf(CF_META), META_FORMAT, [2]);
    let mut sync = rocksdb::WriteOptions::default();
    sync.set_sync(true);
    db.write_opt(batch, &sync)?;
    tracing::info!(ledger = %path.display(), unsettled = listed, "ledger migrated to storage format 2: its unsettled tasks are indexed");
    Ok(())
}

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
            std::thread::Builder::new()
                .name("sendledger-journal".into())
                .spawn(move || journal::run(db, sync, replicator, rx, last_lsn, stats))
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
        // A ledger of format 1 (no `unsettled` index) is read as it is: what the index would
        // answer is found by scanning the summaries.
        let mut format_1 = ALL_CFS.iter().filter(|cf| **cf != CF_UNSETTLED);
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
                let id = TaskId(
                    k[..]
                        .try_into()
                        .map_err(|_| Error::BadValue { what: "tasks key" })?,
                );
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

    /// The tasks not settled, of one requests partition or (`None`) all.
    fn unsettled(&self, partition: Option<i32>) -> Result<Vec<(TaskId, TaskSummary)>> {
        let db = &self.inner.db;
        let wanted = |p: Option<i32>| partition.is_none() || p == partition;
        let Some(index) = db.cf_handle(CF_UNSETTLED) else {
            // A ledger of format 1 opened read-only has no index: every summary is read.
            let mut out = Vec::new();
            for item in self.task_summaries() {
                let (id, summary) = item?;
                if summary.phase.is_terminal() {
                    continue;
                }
                if partition.is_some() && !wanted(request_partition(db, id)?) {
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
        let mut ids = Vec::new();
        for item in snapshot.iterator_cf(index, IteratorMode::Start) {
            let (k, v) = item?;
            let p = decode_partition_value(&v).ok_or(Error::BadValue { what: "unsettled" })?;
            if wanted(p) {
                let id = k[..].try_into().map_err(|_| Error::BadValue {
                    what: "unsettled key",
                })?;
                ids.push(TaskId(id));
            }
        }
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

    pub fn identity(&self, identity: &Identity) -> Result<Option<(TaskId, PayloadHash)>> {
        let Some(v) = self
            .inner
            .db
            .get_cf(self.cf(CF_IDENTITY), identity_key(identity))?
        else {
            return Ok(None);
        };
        if v.len() != 48 {
            return Err(Error::BadValue { what: "identity" });
        }
        Ok(Some((
            TaskId(v[..16].try_into().unwrap_or_default()),
            PayloadHash(v[16..].try_into().unwrap_or_default()),
        )))
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

/// Damage for the audit tests, and a journal that dies. Test-only: compiled only with the
/// `fault-injection` feature, which only the workspace test crate enables.
#[cfg(feature = "fault-injection")]
impl Ledger {
    /// Stores `bytes` under `lsn` in the log as they are, bypassing the journal, the envelope
    /// and the indexes (an undecodable event, or an event the index does not know).
    pub fn inject_raw_log_entry(&self, lsn: u64, bytes: &[u8]) -> Result<()> {
        Ok(self.inner.db.put_cf(self.cf(CF_LOG), lsn_key(lsn), bytes)?)
    }

    /// Removes the log entry at `lsn` and nothing else (a gap the index still points into).
    pub fn delete_log_entry(&self, lsn: u64) -> Result<()> {
        Ok(self.inner.db.delete_cf(self.cf(CF_LOG), lsn_key(lsn))?)
    }

    /// Lists `task` in the unsettled index, or removes it, whatever its summary says.
    pub fn set_unsettled_entry(&self, task: TaskId, listed: bool) -> Result<()> {
        let (db, cf) = (&self.inner.db, self.cf(CF_UNSETTLED));
        match listed {
            true => db.put_cf(cf, task.0, partition_value(None))?,
            false => db.delete_cf(cf, task.0)?,
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

/// The requests partition a task's request came from, as its first event records it.
fn request_partition(db: &DB, task: TaskId) -> Result<Option<i32>> {
    Ok(task_event(db, task, 0)?.and_then(|e| e.body.source().map(|s| s.partition)))
}

/// A task's event `seq`, read from the ledger's database.
fn task_event(db: &DB, task: TaskId, seq: u32) -> Result<Option<Event>> {
    let cf = |name| {
        db.cf_handle(name)
            .expect("column families are created at open")
    };
    let Some(lsn) = db.get_cf(cf(CF_TASK_EVENTS), task_event_key(task, seq))? else {
        return Ok(None);
    };
    let lsn = decode_u64(&lsn).ok_or(Error::BadValue {
        what: "task_events",
    })?;
    indexed_event(lsn, db.get_cf(cf(CF_LOG), lsn_key(lsn))?).map(Some)
}

/// A task's events in task order, read from the ledger's database (the journal reads them too).
pub(crate) fn task_events(db: &DB, task: TaskId) -> Result<Vec<Event>> {
    let cf = |name| {
        db.cf_handle(name)
            .expect("column families are created at open")
    };
    let mut lsns = Vec::new();
    let start = task_event_key(task, 0);
    for item in db.iterator_cf(
        cf(CF_TASK_EVENTS),
        IteratorMode::From(&start, Direction::Forward),
    ) {
        let (k, v) = item?;
        if k[..16] != task.0 {
            break;
        }
        lsns.push(decode_u64(&v).ok_or(Error::BadValue {
            what: "task_events",
        })?);
    }
    let log = cf(CF_LOG);
    let keys: Vec<_> = lsns.iter().map(|l| (log, lsn_key(*l))).collect();
    db.multi_get_cf(keys)
        .into_iter()
        .zip(&lsns)
        .map(|(v, lsn)| indexed_event(*lsn, v?))
        .collect()
}

/// The event the task index points to at `lsn`, as read from the log: missing is corruption.
fn indexed_event(lsn: u64, bytes: Option<Vec<u8>>) -> Result<Event> {
    match bytes {
        Some(bytes) => decode_event(lsn, &bytes),
        None => Err(Error::Corrupt {
            lsn,
            detail: "indexed event missing from the log".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                    found: 3,
                    supported: 2,
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
    /// opens it.
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
            Some(&[2][..])
        );
        assert_eq!(
            ids(migrated.active_tasks_of_partition(1).unwrap()),
            vec![a, d]
        );
        assert_eq!(ids(migrated.active_tasks_of_partition(2).unwrap()), vec![]);
        assert_eq!(ids(migrated.active_tasks().unwrap()), vec![a, d]);
    }

    #[test]
    fn cache_shards_hold_at_least_8_mib() {
        let mib = 1 << 20;
        for (bytes, bits) in [(4 * mib, 0), (16 * mib, 1), (64 * mib, 3), (1 << 30, 6)] {
            assert_eq!(Memory::cache_shard_bits(bytes), bits, "{bytes}");
        }
    }

    #[test]
    fn task_summary_codes_are_stable() {
        let s = TaskSummary {
            phase: Phase::ManualReview,
            next_seq: 258,
        };
        assert_eq!(s.encode(), [1, 5, 0, 0, 1, 2]);
        assert_eq!(TaskSummary::decode(&s.encode()).unwrap(), s);
        assert!(TaskSummary::decode(&[1, 99, 0, 0, 0, 0]).is_err());
    }
}
