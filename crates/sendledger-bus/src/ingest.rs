//! The requests-topic consumer.
//!
//! One thread owns the consumer (polls, offset stores, commits and rebalance callbacks all run
//! there, never on an async executor thread). Each message is checked and handed to the
//! [`RequestSink`] in a task of its own on the tokio runtime; when the sink's future resolves,
//! the message is durable and the task reports back. Per partition, the thread keeps the
//! offsets it received in order and stores the Kafka offset of the longest prefix that is done,
//! so an offset is never stored before everything below it is durable.
//!
//! - Duplicates: when a partition is assigned, its processed offsets are read from the ledger;
//!   a message at an offset the ledger holds as processed is dropped (and counted) without
//!   reaching the sink.
//! - Bad input (no value, oversize, invalid JSON, a request the sink refuses) is handed to
//!   [`RequestSink::reject`] (after a copy to the dead-letter topic when configured); its offset
//!   advances like any other.
//! - Backpressure: at `max_unfinished` messages, or `max_unfinished_bytes` bytes (a message's
//!   key and value as received), received and not yet durable, the assigned partitions are
//!   paused; they resume once both are at half their limit or below. A message larger than the
//!   byte budget still goes through, alone: nothing else is received until it is done.
//!   Resuming also wakes the fetchers ([`resume_and_wake`]): librdkafka would otherwise fetch again
//!   only up to a second later, which capped a backlog's rate at about `max_unfinished`
//!   messages a second. Counted in `sendledger_ingest_pauses_total`; the gauge
//!   `sendledger_ingest_paused` is 1 while paused.
//! - Rebalances: before partitions are revoked, the thread waits (bounded) for their messages in
//!   flight, stores their offsets and commits synchronously; messages of revoked partitions that
//!   finish later are durable in the ledger and dropped by whichever consumer gets them again.
//!   Partitions the group took away because this member's session expired (it was stopped or
//!   cut off) are logged as lost and counted (`sendledger_partitions_lost_total{cause="session"}`).
//! - Messages of one task identity reach the sink in partition order, so the first of two
//!   conflicting requests is the one accepted.
//! - Sink failures: one that may pass ([`SinkError::Retry`]: a failing ledger write, a full
//!   disk, an engine draining) is retried with backoff while the offset waits; a fatal one
//!   ([`SinkError::Fatal`]: the engine stopped, its ledger closed or damaged) stops the ingest
//!   with that message instead of retrying forever: [`Ingest::is_running`] turns false and
//!   [`Ingest::shutdown`] returns it.
//!
//! - Trace context: a request message's `traceparent` header (W3C) is kept in the request's
//!   metadata (`sendledger_core::trace`), so every later step of its task joins that trace; an
//!   invalid header is ignored (logged at debug). Handing a request to the sink is the task's
//!   `sendledger.accept` span.
//!
//! Metrics: `sendledger_duplicates_dropped_total{by="offset"}` (messages dropped by the
//! processed-offset check) and the gauge `sendledger_consumer_lag_messages{partition}` (from
//! librdkafka's statistics, emitted every `statistics.interval.ms`, 5 s unless configured).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{BorrowedHeaders, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::util::Timeout;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use sendledger_core::trace::TRACEPARENT;
use sendledger_core::{Source, TaskRequest, TraceParent};
use sendledger_store::Processed;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tracing::Instrument;

use crate::cluster::Kafka;
use crate::config::Role;
use crate::error::{Error, Result};
use crate::sink::{PartitionOwner, RequestSink, SinkError};

/// Header of a dead letter: why the message was rejected.
pub const REASON_HEADER: &str = "sendledger-reason";
/// Header of a dead letter: where it came from, `topic/partition@offset`.
pub const SOURCE_HEADER: &str = "sendledger-source";

const RETRY_INITIAL: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// Longest wait for a partition's start and end offsets.
const WATERMARK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long [`resume_and_wake`] waits for each answer that nobody reads.
const WAKE_TIMEOUT: Duration = Duration::from_millis(1);
/// Kafka mode: how long a partition whose take-over failed, or whose log failed, waits before
/// the next take-over.
const TAKE_OVER_RETRY: Duration = Duration::from_secs(5);
/// Kafka mode: how many session timeouts a partition whose log was fenced, but that is still
/// assigned here, waits before it is taken over again. A fencing comes with a rebalance that
/// moves the partition (this member's session expired, or another member was given the
/// partition), which this consumer learns of within a session; only a partition the group
/// still assigns here afterwards is taken back (whoever fenced it did so outside the group).
const FENCED_RETAKE_SESSIONS: u32 = 2;
/// Kafka mode: take-overs (each opening a partition's log and reading it back) run at once.
const PARALLEL_TAKE_OVERS: usize = 8;
/// librdkafka's `session.timeout.ms` when none is set.
const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(45);

/// Counters of a running ingest.
#[derive(Debug, Default)]
pub struct IngestStats {
    /// Messages received from Kafka.
    pub received: AtomicU64,
    /// Requests the sink recorded (acceptances, duplicate deliveries, conflicts).
    pub submitted: AtomicU64,
    /// Invalid messages recorded as rejected.
    pub rejected: AtomicU64,
    /// Messages dropped because the ledger already held their offset as processed.
    pub duplicates_dropped: AtomicU64,
    /// Sink calls retried after a transient failure.
    pub retries: AtomicU64,
    /// Invalid messages copied to the dead-letter topic.
    pub dead_lettered: AtomicU64,
    /// Times the partitions were paused because too many messages, or bytes, were unfinished.
    pub pauses: AtomicU64,
    /// Offset commits requested.
    pub commits: AtomicU64,
    /// Requests deleted from the topic (retention, or a broker's size limit) before they were
    /// processed: offsets the consumer's position jumped over.
    pub lost: AtomicU64,
    /// Partitions refused, with why: the ledger's processed offsets cannot belong to them (the
    /// topic was recreated), or the group committed offsets this ledger never processed
    /// (another ledger processed the partition).
    pub blocked: Mutex<BTreeMap<i32, String>>,
    /// Why nothing is consumed: the consumer group has another member, and a ledger of its
    /// own serves one instance per group. `None` while this instance holds every partition.
    pub shared_group: Mutex<Option<String>>,
}

impl IngestStats {
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// The refused partitions and why.
    pub fn blocked(&self) -> BTreeMap<i32, String> {
        self.blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Why nothing is consumed because the group is shared, if it is.
    pub fn shared_group(&self) -> Option<String> {
        self.shared_group
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A running consumer of the requests topic.
pub struct Ingest {
    stop: Arc<AtomicBool>,
    grace: Arc<Mutex<Duration>>,
    thread: Option<JoinHandle<Result<()>>>,
    stats: Arc<IngestStats>,
}

impl Ingest {
    /// Subscribes to the requests topic and starts consuming into `sink` (local mode: one
    /// instance per consumer group). Must be called within a tokio runtime: the sink's futures
    /// run on it.
    pub fn start<S: RequestSink>(kafka: &Kafka, sink: Arc<S>) -> Result<Ingest> {
        Self::start_with(kafka, sink, None)
    }

    /// Kafka mode: like [`Ingest::start`], for one of several instances in the group. Each
    /// assigned partition is taken over through `owner` before its first message is handled
    /// (and at once, so its unsettled tasks resume without waiting for one), given up when
    /// revoked, and its completed offsets are committed through `owner` (in the partition's
    /// transactions) instead of by the consumer.
    pub fn start_owning<S: RequestSink>(
        kafka: &Kafka,
        sink: Arc<S>,
        owner: Arc<dyn PartitionOwner>,
    ) -> Result<Ingest> {
        Self::start_with(kafka, sink, Some(owner))
    }

    fn start_with<S: RequestSink>(
        kafka: &Kafka,
        sink: Arc<S>,
        owner: Option<Arc<dyn PartitionOwner>>,
    ) -> Result<Ingest> {
        let runtime = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let config = kafka.config().clone();
        let stats = Arc::new(IngestStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let grace = Arc::new(Mutex::new(Duration::from_secs(10)));
        let (done_tx, done_rx) = mpsc::channel();
        let tracker = Arc::new(Mutex::new(Tracker::new(done_rx, owner.clone())));
        let context = IngestContext {
            owner: owner.clone(),
            tracker: tracker.clone(),
            topic: config.requests_topic.clone(),
            revoke_grace: Duration::from_secs(10),
            stats: stats.clone(),
            closing: AtomicBool::new(false),
        };
        let client = kafka.client_config(Role::Ingest);
        let session = client
            .get("session.timeout.ms")
            .and_then(|ms| ms.parse().ok())
            .map_or(DEFAULT_SESSION_TIMEOUT, Duration::from_millis);
        let consumer: BaseConsumer<IngestContext> = client.create_with_context(context)?;
        consumer.subscribe(&[&config.requests_topic])?;
        let dead_letters = match &config.dead_letter_topic {
            Some(topic) => Some(Arc::new(DeadLetters {
                producer: kafka.client_config(Role::Producer).create()?,
                topic: topic.clone(),
            })),
            None => None,
        };
        let worker = Worker {
            owner,
            probe: kafka.client_config(Role::Replay).create()?,
            consumer,
            tracker,
            sink,
            runtime,
            stop: stop.clone(),
            grace: grace.clone(),
            stats: stats.clone(),
            done_tx,
            dead_letters,
            topic: config.requests_topic.clone(),
            budget: Budget {
                messages: config.max_unfinished,
                bytes: config.max_unfinished_bytes,
            },
            max_message_bytes: config.max_message_bytes,
            commit_interval: config.commit_interval,
            fenced_retake: session * FENCED_RETAKE_SESSIONS,
        };
        let thread = std::thread::Builder::new()
            .name("sendledger-ingest".into())
            .spawn(move || worker.run())
            .map_err(|_| Error::Thread { what: "ingest" })?;
        tracing::info!(topic = %config.requests_topic, group = %config.group_id, "ingest started");
        Ok(Ingest {
            stop,
            grace,
            thread: Some(thread),
            stats,
        })
    }

    pub fn stats(&self) -> &Arc<IngestStats> {
        &self.stats
    }

    /// False once the consumer stopped by itself (the sink failed for good).
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops taking messages, waits up to `grace` for those in flight, stores and commits their
    /// offsets, and leaves the group. Messages not finished by then are delivered again later
    /// (and dropped if they turn out to be recorded).
    pub async fn shutdown(mut self, grace: Duration) -> Result<()> {
        *self.grace.lock().unwrap_or_else(|e| e.into_inner()) = grace;
        self.stop.store(true, Ordering::SeqCst);
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || thread.join())
            .await
            .map_err(|_| Error::Thread { what: "ingest" })?
            .map_err(|_| Error::Thread { what: "ingest" })?
    }
}

impl Drop for Ingest {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

struct DeadLetters {
    producer: FutureProducer,
    topic: String,
}

/// How a message's task ended.
enum Outcome {
    /// Durable in the ledger: its offset may be stored.
    Recorded,
    /// Given up because the ingest is stopping: its offset must not be stored.
    Abandoned,
    /// The sink will never accept anything again.
    Fatal(String),
}

struct Done {
    partition: i32,
    generation: u64,
    offset: i64,
    /// The message's size as counted when it was received.
    bytes: usize,
    outcome: Outcome,
    chain: (String, u64),
}

/// What the thread knows of one assigned partition.
struct PartitionState {
    generation: u64,
    /// The ledger's processed offsets, read at the first message after assignment.
    processed: Option<Processed>,
    /// Offsets received, in order, with whether each is done.
    inflight: VecDeque<(i64, bool)>,
    unfinished: Load,
    /// Highest offset of the done prefix (stored to Kafka as the next offset to read).
    done_through: Option<i64>,
    /// The ledger's watermark as last read or raised.
    folded: Option<i64>,
    /// The last offset received, to notice the position jumping over deleted messages.
    last_seen: Option<i64>,
    /// The partition is refused: its messages are ignored and no offset is stored.
    blocked: bool,
    /// Kafka mode: the partition was taken over (its log open, its state restored); until
    /// then nothing of it is handled. Always true in local mode.
    owned: bool,
    /// Kafka mode: a failed take-over is tried again at this time (the partition is paused).
    retry_take_over: Option<Instant>,
}

struct Tracker {
    parts: BTreeMap<i32, PartitionState>,
    next_generation: u64,
    /// Unfinished messages of partitions no longer assigned.
    orphans: Load,
    done_rx: mpsc::Receiver<Done>,
    /// Per task identity: the last message handed to the sink, and the signal it sends when
    /// done (taken by the next message of the same identity).
    chains: HashMap<String, (u64, Option<oneshot::Receiver<()>>)>,
    next_chain: u64,
    paused: bool,
    /// The group has another member: every assigned partition stays paused.
    shared: bool,
    fatal: Option<String>,
    /// Kafka mode: who takes partitions over and commits their offsets.
    owner: Option<Arc<dyn PartitionOwner>>,
}

/// Messages received and not yet done, and their bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Load {
    messages: usize,
    bytes: usize,
}

impl Load {
    fn add(&mut self, other: Load) {
        self.messages += other.messages;
        self.bytes += other.bytes;
    }

    /// One message of `bytes` is done.
    fn finish(&mut self, bytes: usize) {
        self.messages = self.messages.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(bytes);
    }
}

/// When the ingest pauses its partitions, and when it resumes them.
#[derive(Debug, Clone, Copy)]
struct Budget {
    messages: usize,
    bytes: usize,
}

impl Budget {
    /// Either limit is reached: pause.
    fn reached(&self, load: Load) -> bool {
        load.messages >= self.messages || load.bytes >= self.bytes
    }

    /// Both are at half their limit or below: resume. True with nothing unfinished, so a
    /// message larger than the byte budget never leaves the partitions paused.
    fn relieved(&self, load: Load) -> bool {
        load.messages <= self.messages / 2 && load.bytes <= self.bytes / 2
    }
}

impl Tracker {
    fn new(done_rx: mpsc::Receiver<Done>, owner: Option<Arc<dyn PartitionOwner>>) -> Tracker {
        Tracker {
            parts: BTreeMap::new(),
            next_generation: 1,
            orphans: Load::default(),
            done_rx,
            chains: HashMap::new(),
            next_chain: 0,
            paused: false,
            shared: false,
            fatal: None,
            owner,
        }
    }

    fn unfinished(&self) -> Load {
        let mut load = self.orphans;
        for p in self.parts.values() {
            load.add(p.unfinished);
        }
        load
    }

    fn assign(&mut self, partition: i32) {
        let generation = self.next_generation;
        self.next_generation += 1;
        if let Some(old) = self.parts.insert(
            partition,
            PartitionState {
                generation,
                processed: None,
                inflight: VecDeque::new(),
                unfinished: Load::default(),
                done_through: None,
                folded: None,
                last_seen: None,
                blocked: false,
                owned: self.owner.is_none(),
                retry_take_over: None,
            },
        ) {
            self.orphans.add(old.unfinished);
        }
    }

    fn revoke(&mut self, partition: i32) {
        if let Some(old) = self.parts.remove(&partition) {
            self.orphans.add(old.unfinished);
        }
    }

    /// Applies a finished message; stores the partition's new done prefix.
    fn apply(&mut self, consumer: &BaseConsumer<IngestContext>, topic: &str, done: Done) {
        let (key, seq) = &done.chain;
        if self.chains.get(key).is_some_and(|(s, _)| s == seq) {
            self.chains.remove(key);
        }
        if let Outcome::Fatal(e) = &done.outcome {
            self.fatal.get_or_insert_with(|| e.clone());
        }
        let part = match self.parts.get_mut(&done.partition) {
            Some(p) if p.generation == done.generation => p,
            _ => {
                self.orphans.finish(done.bytes);
                return;
            }
        };
        part.unfinished.finish(done.bytes);
        if !matches!(done.outcome, Outcome::Recorded) {
            return;
        }
        if let Ok(i) = part
            .inflight
            .binary_search_by_key(&done.offset, |(o, _)| *o)
        {
            part.inflight[i].1 = true;
        }
        if let Some(owner) = &self.owner {
            owner.done(done.partition, done.offset, consumer.group_metadata());
        }
        advance(consumer, topic, done.partition, part, self.owner.is_some());
    }
}

/// Pops the done prefix of a partition and, in local mode, stores the offset after it. (In
/// kafka mode the owner hears of each message done, and the partition's transactions commit
/// the offsets.)
fn advance(
    consumer: &BaseConsumer<IngestContext>,
    topic: &str,
    partition: i32,
    part: &mut PartitionState,
    kafka_mode: bool,
) {
    let mut last = None;
    while let Some((offset, true)) = part.inflight.front().copied() {
        part.inflight.pop_front();
        last = Some(offset);
    }
    let Some(offset) = last else {
        return;
    };
    part.done_through = Some(offset);
    if kafka_mode {
        return;
    }
    // Stores `offset + 1`, the next offset to read.
    if let Err(e) = consumer.store_offset(topic, partition, offset) {
        tracing::debug!(partition, offset, error = %e, "offset not stored (partition no longer assigned)");
    }
}

fn lock(tracker: &Mutex<Tracker>) -> MutexGuard<'_, Tracker> {
    tracker.lock().unwrap_or_else(|e| e.into_inner())
}

/// Resumes fetching `partitions`, and wakes the threads that fetch them.
///
/// librdkafka fetches a partition on the thread of its leader's connection. While every
/// partition of a connection is paused the thread has nothing to fetch and waits for its
/// socket or a request for up to a second, and a resume alone does not wake it (it only
/// clears the partitions' pause flag, on librdkafka's main thread). So after each pause at
/// the in-flight budget, fetching started again only up to a second later: with a backlog
/// the ingest received about `max_unfinished` messages a second, whatever the machine
/// (`sendledger-bench kafka` with a budget of 2,048: about 2,400 tasks a second, 14,000 with this wake-up,
/// on one machine).
/// A request queued for the leader's connection wakes its thread, which then sees the
/// partitions fetchable: a watermark query per partition, whose answer is not waited for
/// (queued before the wait starts; one given up is dropped by librdkafka).
fn resume_and_wake(
    consumer: &BaseConsumer<IngestContext>,
    partitions: &TopicPartitionList,
) -> KafkaResult<()> {
    consumer.resume(partitions)?;
    for elem in partitions.elements() {
        let _ = consumer.fetch_watermarks(elem.topic(), elem.partition(), WAKE_TIMEOUT);
    }
    Ok(())
}

fn commit(consumer: &BaseConsumer<IngestContext>, mode: CommitMode, stats: &IngestStats) {
    match consumer.commit_consumer_state(mode) {
        Ok(()) => {
            stats.commits.fetch_add(1, Ordering::Relaxed);
        }
        Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
        Err(e) => {
            tracing::warn!(error = %e, "offset commit failed; it is retried at the next interval")
        }
    }
}

/// The consumer's context: rebalance callbacks run inside `poll`, on the ingest thread.
struct IngestContext {
    /// Kafka mode: partitions are given up through it when revoked.
    owner: Option<Arc<dyn PartitionOwner>>,
    tracker: Arc<Mutex<Tracker>>,
    topic: String,
    revoke_grace: Duration,
    stats: Arc<IngestStats>,
    /// Set once the ingest stopped: the consumer is being closed, and an assignment that
    /// arrives now is not acted on. librdkafka does not answer a question about the
    /// assignment asked from a rebalance callback while it closes: the close hung on it.
    closing: AtomicBool,
}

impl ClientContext for IngestContext {
    /// librdkafka's statistics, every `statistics.interval.ms`: the lag of each partition of
    /// the requests topic this consumer fetches (unknown lags, reported as -1, are skipped).
    fn stats(&self, statistics: Statistics) {
        let partitions = statistics.topics.get(&self.topic).map(|t| &t.partitions);
        for p in partitions.into_iter().flat_map(|p| p.values()) {
            if p.partition >= 0 && p.consumer_lag >= 0 {
                metrics::gauge!(crate::metric_definitions::CONSUMER_LAG_MESSAGES, "partition" => p.partition.to_string())
                    .set(p.consumer_lag as f64);
            }
        }
    }
}

impl ConsumerContext for IngestContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            if let Rebalance::Error(e) = rebalance {
                tracing::warn!(error = %e, "rebalance error");
            }
            return;
        };
        let revoked = partitions_of(tpl, &self.topic);
        if consumer.assignment_lost() {
            // The group gave them away without asking this member: its session expired while
            // it was stopped or cut off. Whoever has them now may be processing their
            // messages already.
            for p in &revoked {
                tracing::warn!(partition = p, "partition lost to the group: this instance's session expired (it was stopped, or cut off from the group coordinator, for longer than session.timeout.ms); another instance may own it now, and its tasks stop here");
            }
            metrics::counter!(crate::metric_definitions::PARTITIONS_LOST_TOTAL, "cause" => "session")
                .increment(revoked.len() as u64);
        }
        let mut t = lock(&self.tracker);
        let deadline = Instant::now() + self.revoke_grace;
        let pending = |t: &Tracker| {
            revoked
                .iter()
                .filter_map(|p| t.parts.get(p))
                .map(|p| p.unfinished.messages)
                .sum::<usize>()
        };
        while pending(&t) > 0 && Instant::now() < deadline {
            match t.done_rx.recv_timeout(Duration::from_millis(20)) {
                Ok(done) => t.apply(consumer, &self.topic, done),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        commit(consumer, CommitMode::Sync, &self.stats);
        for p in &revoked {
            let owned = t.parts.get(p).is_some_and(|part| part.owned);
            t.revoke(*p);
            if let (Some(owner), true) = (&self.owner, owned) {
                owner.release(*p);
            }
        }
        tracing::info!(partitions = ?revoked, "partitions revoked");
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Assign(tpl) = rebalance else {
            return;
        };
        let assigned = partitions_of(tpl, &self.topic);
        if self.closing.load(Ordering::SeqCst) {
            tracing::info!(partitions = ?assigned, "partitions assigned while the ingest stops; not consumed");
            return;
        }
        let mut t = lock(&self.tracker);
        for p in &assigned {
            t.assign(*p);
        }
        tracing::info!(partitions = ?assigned, "partitions assigned");
        if self.owner.is_some() {
            // Kafka mode: partitions are shared by design; each is taken over before use.
            if t.paused {
                if let Err(e) = consumer.pause(tpl) {
                    tracing::warn!(error = %e, "cannot pause newly assigned partitions");
                }
            }
            return;
        }
        let sharing = self.sharing(consumer);
        let was_shared = std::mem::replace(&mut t.shared, sharing.is_some());
        metrics::gauge!(crate::metric_definitions::CONSUMER_GROUP_SHARED)
            .set(f64::from(u8::from(t.shared)));
        *self
            .stats
            .shared_group
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = sharing.clone();
        match (sharing, consumer.assignment()) {
            (Some(why), Ok(all)) => {
                tracing::error!("{why}");
                if let Err(e) = consumer.pause(&all) {
                    tracing::warn!(error = %e, "cannot pause the assigned partitions; their messages are ignored");
                }
            }
            (None, Ok(all)) if was_shared && !t.paused => {
                tracing::info!("this instance holds every partition again; consuming");
                if let Err(e) = resume_and_wake(consumer, &all) {
                    tracing::warn!(error = %e, "cannot resume the assigned partitions");
                }
            }
            _ if t.paused => {
                if let Err(e) = consumer.pause(tpl) {
                    tracing::warn!(error = %e, "cannot pause newly assigned partitions");
                }
            }
            _ => {}
        }
    }
}

impl IngestContext {
    /// Why this instance must not consume: its assignment is not every partition of the
    /// requests topic, so another member of the group holds the rest (or is waiting for some).
    /// Each ledger knows only what its own instance processed, so a partition that moves to
    /// another instance would have its redelivered requests sent again. `None` when this
    /// instance holds every partition, or when the topic's partitions cannot be read (the
    /// processed-offsets check of each partition still refuses one another ledger processed).
    fn sharing(&self, consumer: &BaseConsumer<IngestContext>) -> Option<String> {
        let owned = match consumer.assignment() {
            Ok(all) => partitions_of(&all, &self.topic).len(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the assignment; the group is not checked");
                return None;
            }
        };
        let total = match consumer.fetch_metadata(Some(&self.topic), WATERMARK_TIMEOUT) {
            Ok(m) => m
                .topics()
                .iter()
                .find(|t| t.name() == self.topic)
                .map_or(0, |t| t.partitions().len()),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the topic's partitions; the group is not checked");
                return None;
            }
        };
        (total > 0 && owned < total).then(|| {
            format!(
                "this instance was assigned {owned} of the {total} partitions of {}: another \
                 instance is in its consumer group. Each instance's ledger knows only the requests \
                 it processed, so nothing is consumed while the group is shared (a request \
                 delivered again to another instance would be sent again). Run one instance per \
                 consumer group (give each its own `kafka.group_id` and requests topic), and \
                 stop the others",
                self.topic
            )
        })
    }
}

struct Worker<S: RequestSink> {
    /// Kafka mode: takes partitions over and commits their offsets.
    owner: Option<Arc<dyn PartitionOwner>>,
    /// Reads a record here and there to check a partition's end (see [`Worker::record_at`]).
    probe: BaseConsumer,
    consumer: BaseConsumer<IngestContext>,
    tracker: Arc<Mutex<Tracker>>,
    sink: Arc<S>,
    runtime: Handle,
    stop: Arc<AtomicBool>,
    grace: Arc<Mutex<Duration>>,
    stats: Arc<IngestStats>,
    done_tx: mpsc::Sender<Done>,
    dead_letters: Option<Arc<DeadLetters>>,
    topic: String,
    budget: Budget,
    max_message_bytes: usize,
    commit_interval: Duration,
    /// Kafka mode: how long a fenced partition still assigned here waits to be taken back.
    fenced_retake: Duration,
}

/// What to do with one message.
enum Work {
    Submit(Box<TaskRequest>),
    Reject(String),
}

impl<S: RequestSink> Worker<S> {
    fn run(self) -> Result<()> {
        let mut last_commit = Instant::now();
        let mut result = Ok(());
        while !self.stop.load(Ordering::SeqCst) {
            let paused = {
                let mut t = lock(&self.tracker);
                while let Ok(done) = t.done_rx.try_recv() {
                    t.apply(&self.consumer, &self.topic, done);
                }
                if let Some(e) = t.fatal.take() {
                    tracing::error!(error = %e, "the request sink stopped; ingest stops, nothing more is consumed");
                    result = Err(Error::SinkFatal(e));
                    break;
                }
                self.backpressure(&mut t);
                if t.paused {
                    // Wait for a message to finish rather than spin.
                    if let Ok(done) = t.done_rx.recv_timeout(Duration::from_millis(5)) {
                        t.apply(&self.consumer, &self.topic, done);
                    }
                }
                t.paused
            };
            let timeout = if paused {
                Duration::ZERO
            } else {
                Duration::from_millis(20)
            };
            match self.consumer.poll(timeout) {
                None => {}
                Some(Err(e)) => {
                    // A fatal error (a fenced static member: another live instance took this
                    // instance id) ends the consumer; polling on would only repeat it.
                    if let Some((code, reason)) = self.consumer.client().fatal_error() {
                        let detail = format!("{code:?}: {reason}");
                        tracing::error!(error = %detail, "the consumer was stopped by the brokers; ingest stops, nothing more is consumed");
                        result = Err(Error::ConsumerFatal(detail));
                        break;
                    }
                    tracing::warn!(error = %e, "kafka consumer error")
                }
                Some(Ok(msg)) => {
                    if let Err(e) = self.handle(&msg) {
                        result = Err(e);
                        break;
                    }
                }
            }
            self.retake_lost();
            if let Err(e) = self.take_over_assigned() {
                result = Err(e);
                break;
            }
            if last_commit.elapsed() >= self.commit_interval {
                self.checkpoint(CommitMode::Async);
                last_commit = Instant::now();
            }
        }
        self.drain();
        self.checkpoint(CommitMode::Sync);
        // Dropping the consumer closes it, and serves the rebalances still queued.
        self.consumer
            .context()
            .closing
            .store(true, Ordering::SeqCst);
        tracing::info!("ingest stopped");
        result
    }

    fn backpressure(&self, t: &mut Tracker) {
        let load = t.unfinished();
        let pause = !t.paused && self.budget.reached(load);
        // A shared group keeps every partition paused.
        let resume = t.paused && !t.shared && self.budget.relieved(load);
        if !(pause || resume) {
            return;
        }
        let assignment = match self.consumer.assignment() {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the assignment");
                return;
            }
        };
        let res = if pause {
            self.stats.pauses.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                messages = load.messages,
                bytes = load.bytes,
                "pausing partitions"
            );
            self.consumer.pause(&assignment)
        } else {
            tracing::debug!(
                messages = load.messages,
                bytes = load.bytes,
                "resuming partitions"
            );
            resume_and_wake(&self.consumer, &assignment)
        };
        match res {
            Ok(()) => {
                t.paused = pause;
                if pause {
                    metrics::counter!(crate::metric_definitions::INGEST_PAUSES_TOTAL).increment(1);
                }
                metrics::gauge!(crate::metric_definitions::INGEST_PAUSED)
                    .set(f64::from(u8::from(pause)));
            }
            Err(e) => tracing::warn!(error = %e, "cannot pause or resume partitions"),
        }
    }

    /// Waits (up to the grace period) for messages in flight, applying them as they finish.
    fn drain(&self) {
        let grace = *self.grace.lock().unwrap_or_else(|e| e.into_inner());
        let deadline = Instant::now() + grace;
        let mut t = lock(&self.tracker);
        while t.unfinished().messages > 0 && Instant::now() < deadline {
            match t.done_rx.recv_timeout(Duration::from_millis(20)) {
                Ok(done) => t.apply(&self.consumer, &self.topic, done),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let left = t.unfinished().messages;
        if left > 0 {
            tracing::warn!(
                unfinished = left,
                "messages still unfinished at shutdown; they are delivered again at the next start"
            );
        }
    }

    /// Commits stored offsets and raises the ledger's watermarks to the done prefixes.
    fn checkpoint(&self, mode: CommitMode) {
        commit(&self.consumer, mode, &self.stats);
        let marks: Vec<(i32, i64)> = {
            let t = lock(&self.tracker);
            t.parts
                .iter()
                .filter(|(_, p)| p.processed.is_some())
                .filter_map(|(&i, p)| match (p.done_through, p.folded) {
                    (Some(d), Some(f)) if d <= f => None,
                    (Some(d), _) => Some((i, d)),
                    _ => None,
                })
                .collect()
        };
        if marks.is_empty() {
            return;
        }
        let fut = self
            .sink
            .raise_watermarks(self.topic.clone(), marks.clone());
        match self.runtime.block_on(fut) {
            Ok(()) => {
                let mut t = lock(&self.tracker);
                for (p, d) in marks {
                    if let Some(part) = t.parts.get_mut(&p) {
                        part.folded = Some(part.folded.map_or(d, |f| f.max(d)));
                    }
                }
            }
            Err(SinkError::Fatal(e)) => {
                lock(&self.tracker).fatal.get_or_insert(e);
            }
            Err(e) => tracing::warn!(error = %e, "processed watermarks not raised; retried later"),
        }
    }

    /// Checks a newly assigned partition against the ledger's processed offsets. Returns
    /// whether it must be refused (see [`Worker::refusal`]), and the offset through which it is
    /// accounted for (processed, or lost). Unprocessed offsets below the partition's start
    /// were deleted before they were processed: counted as lost.
    fn check_partition(&self, partition: i32, processed: &Processed) -> (bool, Option<i64>) {
        let was_blocked = self
            .stats
            .blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&partition)
            .is_some();
        if was_blocked {
            metrics::gauge!(crate::metric_definitions::PARTITION_BLOCKED, "partition" => partition.to_string())
                .set(0.0);
        }
        let watermark = processed.watermark;
        let (low, high) = match self.consumer.fetch_watermarks(
            &self.topic,
            partition,
            WATERMARK_TIMEOUT,
        ) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(partition, error = %e, "cannot read the partition's offsets; not checked against the ledger");
                return (false, watermark);
            }
        };
        if let Some(why) = self.refusal(partition, processed, high) {
            tracing::error!(topic = %self.topic, partition, ?watermark, high, "{why}");
            metrics::gauge!(crate::metric_definitions::PARTITION_BLOCKED, "partition" => partition.to_string())
                .set(1.0);
            self.stats
                .blocked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(partition, why);
            if let Err(e) = self.pause_partition(partition) {
                tracing::warn!(partition, error = %e, "cannot pause the refused partition; its messages are ignored");
            }
            return (true, watermark);
        }
        let Some(watermark) = watermark else {
            return (false, None);
        };
        // The partition's start offset is at hand: no second fetch.
        self.report_lost(partition, watermark + 1, low);
        (false, Some(watermark.max(low - 1)))
    }

    /// Whether the partition holds a record at `offset` or after it: a second opinion before a
    /// partition is refused as recreated, since some brokers report the end of a partition as
    /// the start of its last batch plus one (the separate test broker does).
    fn record_at(&self, partition: i32, offset: i64) -> bool {
        let mut tpl = TopicPartitionList::new();
        if tpl
            .add_partition_offset(&self.topic, partition, Offset::Offset(offset))
            .is_err()
            || self.probe.assign(&tpl).is_err()
        {
            return false;
        }
        let deadline = Instant::now() + WATERMARK_TIMEOUT;
        let mut found = false;
        while Instant::now() < deadline {
            match self.probe.poll(Duration::from_millis(100)) {
                Some(Ok(m)) if m.offset() >= offset => {
                    found = true;
                    break;
                }
                Some(Ok(_)) | None => {}
                Some(Err(e)) => {
                    tracing::debug!(partition, offset, error = %e, "probe read failed");
                    break;
                }
            }
        }
        let _ = self.probe.unassign();
        found
    }

    /// Why a partition ending at `high` must not be consumed with these processed offsets:
    /// - a watermark at or above its end means the processed offsets belong to another
    ///   incarnation of the topic (deleted and recreated while the ledger was kept); consuming
    ///   would drop new requests as duplicates of old ones;
    /// - the group's committed offset follows a message this ledger never processed: another
    ///   ledger processed the partition (another instance, or this one on a disk since
    ///   replaced), and a request it accepted, delivered again, would be sent again from here.
    ///   The offset this ledger commits always follows a message it recorded.
    fn refusal(&self, partition: i32, processed: &Processed, high: i64) -> Option<String> {
        let topic = &self.topic;
        let past_end = |w: &i64| *w >= high && !self.record_at(partition, *w);
        if let Some(watermark) = processed.watermark.filter(past_end) {
            return Some(format!(
                "the ledger processed offsets of {topic}/{partition} up to {watermark}, but the \
                 partition ends at {high}: the topic was recreated (or the ledger belongs to \
                 another cluster). Nothing of it is consumed. If the old topic is gone for good, \
                 stop the service and run `sendledger offsets reset --data DIR --topic {topic} \
                 --partition {partition}`"
            ));
        }
        let committed = self.committed(partition)?;
        if committed <= 0 || committed > high || processed.contains(committed - 1) {
            return None;
        }
        let last = committed - 1;
        Some(format!(
            "the consumer group committed {topic}/{partition} up to offset {last}, which this \
             ledger never processed: another ledger processed the partition (another instance in \
             the group, or this one before its data directory was replaced). Nothing of it is \
             consumed: a request that ledger accepted, delivered again, would be sent again from \
             here. Run the instance that holds that ledger. If it is lost for good, settle its \
             tasks by hand, stop this service and run `sendledger offsets reset --data DIR \
             --topic {topic} --partition {partition} --through {last}`: requests delivered \
             after offset {last} are then new to this ledger, and are sent"
        ))
    }

    /// The group's committed offset of a partition (the next offset to read), if it has one.
    fn committed(&self, partition: i32) -> Option<i64> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.topic, partition);
        match self.consumer.committed_offsets(tpl, WATERMARK_TIMEOUT) {
            Ok(tpl) => match tpl.find_partition(&self.topic, partition)?.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            },
            Err(e) => {
                tracing::warn!(partition, error = %e, "cannot read the group's committed offset; not checked against the ledger");
                None
            }
        }
    }

    /// Offsets from `from` up to `to` (exclusive) that the partition no longer holds (below its
    /// start offset) were deleted before they were processed: an error, counted per partition.
    /// Gaps above the start offset are normal (transaction markers, compaction).
    fn count_deleted(&self, partition: i32, from: i64, to: i64) {
        if to <= from {
            return;
        }
        match self
            .consumer
            .fetch_watermarks(&self.topic, partition, WATERMARK_TIMEOUT)
        {
            Ok((low, _)) => self.report_lost(partition, from, low.min(to)),
            Err(e) => {
                tracing::warn!(partition, error = %e, "cannot read the partition's start offset; a gap is not checked");
            }
        }
    }

    /// Offsets from `from` up to `end` (exclusive) were deleted before they were processed.
    fn report_lost(&self, partition: i32, from: i64, end: i64) {
        if end <= from {
            return;
        }
        let lost = (end - from) as u64;
        tracing::error!(
            topic = %self.topic,
            partition,
            first = from,
            last = end - 1,
            lost,
            "requests were deleted from the topic before they were processed (retention or the \
             broker's size limit): they are lost to sendledger; ask their producers to send them again"
        );
        self.stats.lost.fetch_add(lost, Ordering::Relaxed);
        metrics::counter!(crate::metric_definitions::REQUESTS_LOST_TOTAL, "partition" => partition.to_string())
            .increment(lost);
    }

    fn pause_partition(&self, partition: i32) -> rdkafka::error::KafkaResult<()> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.topic, partition);
        self.consumer.pause(&tpl)
    }

    /// Reads the ledger's processed offsets of a partition, retrying while the ledger fails.
    fn load_processed(&self, partition: i32) -> Result<Option<Processed>> {
        let mut delay = RETRY_INITIAL;
        loop {
            let fut = self.sink.processed(self.topic.clone(), partition);
            match self.runtime.block_on(fut) {
                Ok(p) => return Ok(Some(p)),
                Err(SinkError::Fatal(e)) => return Err(Error::SinkFatal(e)),
                Err(e) => {
                    tracing::warn!(partition, error = %e, "cannot read processed offsets; retrying");
                    if self.stop.load(Ordering::SeqCst) {
                        return Ok(None);
                    }
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// One message from the consumer: its partition's processed offsets are loaded, the message
    /// is admitted (or dropped as a duplicate, or not ours), its work is decided from its value,
    /// and its job is dispatched after the previous job of its chain.
    fn handle(&self, msg: &rdkafka::message::BorrowedMessage<'_>) -> Result<()> {
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        let (partition, offset) = (msg.partition(), msg.offset());
        let bytes = msg.payload_len() + msg.key().map_or(0, <[u8]>::len);
        if msg.topic() != self.topic || !self.ensure_loaded(partition)? {
            return Ok(());
        }
        let Some(generation) = self.admit(partition, offset, bytes) else {
            return Ok(());
        };
        let raw = msg.payload().map(<[u8]>::to_vec);
        let mut work = self.work_of(raw.as_deref());
        if let Work::Submit(request) = &mut work {
            keep_trace_context(request, msg.headers(), partition, offset);
        }
        if self.owner.is_some() {
            work = keyed_by_identity(work, msg.key());
        }
        let job = Job {
            sink: self.sink.clone(),
            stop: self.stop.clone(),
            stats: self.stats.clone(),
            dead_letters: self.dead_letters.clone(),
            source: Source {
                topic: self.topic.clone(),
                partition,
                offset,
            },
            raw: raw.unwrap_or_default(),
            key: msg.key().map(<[u8]>::to_vec),
        };
        self.dispatch(job, work, generation, bytes);
        Ok(())
    }

    /// Kafka mode: takes over every assigned partition not taken over yet (or whose failed
    /// take-over is due again). A partition whose take-over fails is paused, reported as
    /// blocked, and tried again after [`TAKE_OVER_RETRY`]; once taken over it is consumed
    /// from its committed offset.
    fn take_over_assigned(&self) -> Result<()> {
        let Some(owner) = &self.owner else {
            return Ok(());
        };
        let due: Vec<(i32, bool)> = {
            let t = lock(&self.tracker);
            let now = Instant::now();
            t.parts
                .iter()
                .filter(|(_, p)| !p.owned && p.retry_take_over.is_none_or(|at| at <= now))
                .map(|(&i, p)| (i, p.retry_take_over.is_some()))
                .collect()
        };
        // Each take-over opens a log and reads it back: several run at once.
        for batch in due.chunks(PARALLEL_TAKE_OVERS) {
            let outcomes: Vec<_> = std::thread::scope(|scope| {
                let running: Vec<_> = batch
                    .iter()
                    .map(|&(partition, retried)| {
                        let started = Instant::now();
                        let job = scope.spawn(move || owner.take_over(partition));
                        (partition, retried, started, job)
                    })
                    .collect();
                running
                    .into_iter()
                    .map(|(partition, retried, started, job)| {
                        let outcome = job
                            .join()
                            .unwrap_or_else(|_| Err("the take-over panicked".into()));
                        (partition, retried, started, outcome)
                    })
                    .collect()
            });
            for (partition, retried, started, outcome) in outcomes {
                self.taken_over(partition, retried, started, outcome);
            }
        }
        Ok(())
    }

    /// Kafka mode: a partition whose log was given up (see [`PartitionOwner::lost`]) while it is
    /// assigned here stops like a revoked one (its unfinished messages are abandoned, its tasks
    /// stop) and is paused, then taken over again once due: after [`TAKE_OVER_RETRY`], or
    /// [`FENCED_RETAKE_SESSIONS`] session timeouts when another writer fenced it. Its messages are read again from the
    /// group's committed offset.
    fn retake_lost(&self) {
        let Some(owner) = &self.owner else {
            return;
        };
        for (partition, fenced) in owner.lost() {
            let retry_in = if fenced {
                self.fenced_retake
            } else {
                TAKE_OVER_RETRY
            };
            {
                let mut t = lock(&self.tracker);
                if !t.parts.get(&partition).is_some_and(|p| p.owned) {
                    continue;
                }
                t.assign(partition);
                if let Some(p) = t.parts.get_mut(&partition) {
                    p.retry_take_over = Some(Instant::now() + retry_in);
                }
            }
            owner.release(partition);
            if let Err(e) = self.pause_partition(partition) {
                tracing::warn!(partition, error = %e, "cannot pause the partition");
            }
            let why = match fenced {
                true => "its log was fenced by another writer while the partition is assigned here",
                false => "a transaction of its log failed",
            };
            tracing::warn!(partition, retry_in = ?retry_in, "{why}; the partition is taken over again");
            self.stats
                .blocked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(
                    partition,
                    format!("{why}; taken over again in {retry_in:?}"),
                );
        }
    }

    /// Kafka mode: takes partition `partition` over, if it is assigned and not owned yet, and
    /// no earlier failure postponed it. Returns whether it is owned afterwards.
    fn take_over(&self, partition: i32) -> Result<bool> {
        let Some(owner) = &self.owner else {
            return Ok(true);
        };
        let (needed, retry) = {
            let t = lock(&self.tracker);
            match t.parts.get(&partition) {
                None => return Ok(false),
                Some(p) => (!p.owned, p.retry_take_over),
            }
        };
        if !needed {
            return Ok(true);
        }
        if retry.is_some_and(|at| at > Instant::now()) {
            return Ok(false);
        }
        let started = Instant::now();
        let outcome = owner.take_over(partition);
        Ok(self.taken_over(partition, retry.is_some(), started, outcome))
    }

    /// Records how the take-over of `partition` (begun at `started`; `retried` after a failed
    /// one or a lost log) went; returns whether the partition is owned now.
    fn taken_over(
        &self,
        partition: i32,
        retried: bool,
        started: Instant,
        outcome: std::result::Result<(), String>,
    ) -> bool {
        match outcome {
            Ok(()) => {
                tracing::info!(partition, took = ?started.elapsed(), "partition taken over");
                metrics::histogram!(crate::metric_definitions::PARTITION_TAKE_OVER_SECONDS)
                    .record(started.elapsed().as_secs_f64());
                if retried {
                    self.unblock(partition);
                    self.rewind(partition);
                }
                let mut t = lock(&self.tracker);
                if let Some(p) = t.parts.get_mut(&partition) {
                    p.owned = true;
                    p.retry_take_over = None;
                }
                true
            }
            Err(why) => {
                tracing::error!(partition, error = %why, retry_in = ?TAKE_OVER_RETRY, "cannot take the partition over; it stays paused");
                if let Err(e) = self.pause_partition(partition) {
                    tracing::warn!(partition, error = %e, "cannot pause the partition");
                }
                self.stats
                    .blocked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(partition, format!("cannot take the partition over: {why}"));
                let mut t = lock(&self.tracker);
                if let Some(p) = t.parts.get_mut(&partition) {
                    p.retry_take_over = Some(Instant::now() + TAKE_OVER_RETRY);
                }
                false
            }
        }
    }

    /// After a failed take-over the partition's position may be past messages that were
    /// fetched and ignored meanwhile: it is read again from the group's committed offset
    /// (nothing committed: from its beginning), then resumed.
    fn rewind(&self, partition: i32) {
        let from = self
            .committed(partition)
            .map_or(Offset::Beginning, Offset::Offset);
        if let Err(e) = self
            .consumer
            .seek(&self.topic, partition, from, WATERMARK_TIMEOUT)
        {
            tracing::warn!(partition, error = %e, "cannot rewind the partition after its take-over");
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.topic, partition);
        if let Err(e) = resume_and_wake(&self.consumer, &tpl) {
            tracing::warn!(partition, error = %e, "cannot resume the partition");
        }
    }

    fn unblock(&self, partition: i32) {
        self.stats
            .blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&partition);
    }

    /// Whether the partition is ours and consumed, loading its processed offsets (and checking
    /// them against the group's position) at its first message after an assignment. In kafka
    /// mode the partition is taken over first.
    fn ensure_loaded(&self, partition: i32) -> Result<bool> {
        if !self.take_over(partition)? {
            return Ok(false);
        }
        let needs_load = {
            let t = lock(&self.tracker);
            match t.parts.get(&partition) {
                // Not (or no longer) ours: whoever owns it reads it again.
                None => return Ok(false),
                // The group is shared: nothing is consumed (no offset is stored either).
                Some(_) if t.shared => return Ok(false),
                Some(p) => p.processed.is_none(),
            }
        };
        if needs_load {
            let Some(processed) = self.load_processed(partition)? else {
                return Ok(false);
            };
            let (blocked, seen_through) = self.check_partition(partition, &processed);
            let mut t = lock(&self.tracker);
            if let Some(p) = t.parts.get_mut(&partition) {
                tracing::debug!(partition, watermark = ?processed.watermark, above = processed.above.len(), "processed offsets loaded");
                p.folded = processed.watermark;
                p.last_seen = seen_through;
                p.processed = Some(processed);
                p.blocked = blocked;
            }
        }
        Ok(true)
    }

    /// Takes the message into the partition's in-flight list and returns the partition's
    /// generation, or `None` when nothing more is to be done: the partition is gone or blocked,
    /// or the offset was processed before (a duplicate, passed in order). Offsets the consumer
    /// jumped over are counted as lost.
    fn admit(&self, partition: i32, offset: i64, bytes: usize) -> Option<u64> {
        let mut t = lock(&self.tracker);
        let part = t.parts.get_mut(&partition)?;
        if part.blocked {
            return None;
        }
        let jumped = part.last_seen.filter(|last| offset > last + 1);
        part.last_seen = Some(part.last_seen.map_or(offset, |last| last.max(offset)));
        if let Some(last) = jumped {
            self.count_deleted(partition, last + 1, offset);
        }
        if part.processed.as_ref().is_some_and(|p| p.contains(offset)) {
            self.stats
                .duplicates_dropped
                .fetch_add(1, Ordering::Relaxed);
            metrics::counter!(sendledger_store::metric_definitions::DUPLICATES_DROPPED_TOTAL, "by" => "offset").increment(1);
            part.inflight.push_back((offset, true));
            if let Some(owner) = &self.owner {
                owner.received(partition, offset, None);
                owner.done(partition, offset, self.consumer.group_metadata());
            }
            advance(
                &self.consumer,
                &self.topic,
                partition,
                part,
                self.owner.is_some(),
            );
            return None;
        }
        if let Some(owner) = &self.owner {
            owner.received(partition, offset, self.consumer.group_metadata());
        }
        part.inflight.push_back((offset, false));
        part.unfinished.add(Load { messages: 1, bytes });
        Some(part.generation)
    }

    /// What a message's value asks for: a request to submit, or a rejection with its reason.
    fn work_of(&self, raw: Option<&[u8]>) -> Work {
        match raw {
            None => Work::Reject("the message has no value (a tombstone or an empty record); a request is a JSON object".into()),
            Some(bytes) if bytes.len() > self.max_message_bytes => Work::Reject(format!(
                "the message is {} bytes, more than the limit of {} (max_message_bytes)",
                bytes.len(),
                self.max_message_bytes
            )),
            Some(bytes) => match TaskRequest::from_json(bytes) {
                Ok(request) => Work::Submit(Box::new(request)),
                Err(e) => Work::Reject(e.to_string()),
            },
        }
    }

    /// Runs the job on the runtime after the previous job of its chain: messages of one identity
    /// reach the sink in partition order, and two jobs for one message (redelivered across a
    /// rebalance while the first is still at work) one after the other.
    fn dispatch(&self, job: Job<S>, work: Work, generation: u64, bytes: usize) {
        let (partition, offset) = (job.source.partition, job.source.offset);
        let id = match &work {
            Work::Submit(r) => format!("{}\u{0}{}\u{0}{}", r.tenant, r.operation, r.request_key),
            Work::Reject(_) => format!("\u{1}{partition}\u{0}{offset}"),
        };
        let (signal, rx) = oneshot::channel();
        let (seq, prev) = {
            let mut t = lock(&self.tracker);
            let seq = t.next_chain;
            t.next_chain += 1;
            let prev = t
                .chains
                .insert(id.clone(), (seq, Some(rx)))
                .and_then(|(_, rx)| rx);
            (seq, prev)
        };
        let done_tx = self.done_tx.clone();
        self.runtime.spawn(async move {
            if let Some(prev) = prev {
                let _ = prev.await;
            }
            let outcome = job.run(work).await;
            drop(signal);
            let _ = done_tx.send(Done {
                partition,
                generation,
                offset,
                bytes,
                outcome,
                chain: (id, seq),
            });
        });
    }
}

/// Kafka mode: a request must be keyed by its identity (`tenant/operation/request_key`, as
/// `sendledger produce` keys it). Its partition decides which instance owns its task, so a
/// delivery under another key may land on a partition another instance owns, which has never
/// heard of the task and would send it again: such a message is rejected unprocessed.
fn keyed_by_identity(work: Work, key: Option<&[u8]>) -> Work {
    let Work::Submit(request) = &work else {
        return work;
    };
    let identity = crate::produce::request_key(request);
    if key == Some(identity.as_bytes()) {
        return work;
    }
    let key = key.map_or("none".to_string(), |k| {
        format!("{:?}", String::from_utf8_lossy(k))
    });
    Work::Reject(format!(
        "in kafka mode a request must be keyed by its identity {identity:?} (the key is {key}): under another key its deliveries may reach an instance that does not know the task; produce it again with that key"
    ))
}

/// Keeps a message's `traceparent` header (the last one, if repeated) with its request. An
/// invalid one is ignored: the request is processed as if it had none.
fn keep_trace_context(
    request: &mut TaskRequest,
    headers: Option<&BorrowedHeaders>,
    partition: i32,
    offset: i64,
) {
    let Some(value) = headers.and_then(|h| {
        h.iter()
            .filter(|h| h.key.eq_ignore_ascii_case(TRACEPARENT))
            .last()
    }) else {
        return;
    };
    match value
        .value
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(TraceParent::parse)
    {
        Some(trace) => request.set_traceparent(trace),
        None => tracing::debug!(
            partition,
            offset,
            "the message's traceparent header is not a valid W3C trace context; ignored"
        ),
    }
}

/// One message on its way into the sink.
struct Job<S: RequestSink> {
    sink: Arc<S>,
    stop: Arc<AtomicBool>,
    stats: Arc<IngestStats>,
    dead_letters: Option<Arc<DeadLetters>>,
    source: Source,
    raw: Vec<u8>,
    key: Option<Vec<u8>>,
}

impl<S: RequestSink> Job<S> {
    async fn run(self, work: Work) -> Outcome {
        match work {
            Work::Reject(reason) => self.reject(reason).await,
            Work::Submit(request) => {
                let span = tracing::info_span!(
                    "sendledger.accept",
                    task_id = %request.identity().task_id(),
                    target = %request.target,
                    source = %self.source,
                );
                sendledger_telemetry::join(&span, request.traceparent());
                self.submit(*request).instrument(span).await
            }
        }
    }

    /// Hands a request to the sink until it is recorded (or refused, or the ingest stops).
    async fn submit(&self, request: TaskRequest) -> Outcome {
        let mut delay = RETRY_INITIAL;
        loop {
            match self.sink.submit(request.clone(), self.source.clone()).await {
                Ok(()) => {
                    self.stats.submitted.fetch_add(1, Ordering::Relaxed);
                    return Outcome::Recorded;
                }
                Err(SinkError::Invalid(reason)) => return self.reject(reason).await,
                Err(SinkError::Fatal(e)) => return Outcome::Fatal(e),
                Err(SinkError::NotOwned(_)) => return Outcome::Abandoned,
                Err(SinkError::Retry(e)) => {
                    if !self.wait_retry(&mut delay, &e).await {
                        return Outcome::Abandoned;
                    }
                }
            }
        }
    }

    /// Sleeps before a retry; false when the ingest is stopping instead.
    async fn wait_retry(&self, delay: &mut Duration, error: &str) -> bool {
        if self.stop.load(Ordering::SeqCst) {
            return false;
        }
        self.stats.retries.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(source = %self.source, error, retry_in = ?*delay, "message not recorded; retrying");
        tokio::time::sleep(*delay).await;
        *delay = (*delay * 2).min(RETRY_MAX);
        !self.stop.load(Ordering::SeqCst)
    }

    async fn reject(&self, reason: String) -> Outcome {
        let mut delay = RETRY_INITIAL;
        // Recorded already by an earlier job for the same message: no second dead letter.
        let recorded = self
            .sink
            .processed(self.source.topic.clone(), self.source.partition)
            .await
            .is_ok_and(|p| p.contains(self.source.offset));
        if recorded {
            return Outcome::Recorded;
        }
        if let Some(dl) = &self.dead_letters {
            let source = self.source.to_string();
            loop {
                let headers = OwnedHeaders::new()
                    .insert(Header {
                        key: REASON_HEADER,
                        value: Some(reason.as_str()),
                    })
                    .insert(Header {
                        key: SOURCE_HEADER,
                        value: Some(source.as_str()),
                    });
                let mut record = FutureRecord::to(&dl.topic)
                    .payload(&self.raw)
                    .headers(headers);
                if let Some(k) = &self.key {
                    record = record.key(k);
                }
                match dl.producer.send(record, Timeout::Never).await {
                    Ok(_) => {
                        self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Err((e, _)) => {
                        if !self
                            .wait_retry(&mut delay, &format!("dead letter: {e}"))
                            .await
                        {
                            return Outcome::Abandoned;
                        }
                    }
                }
            }
        }
        let mut delay = RETRY_INITIAL;
        loop {
            match self
                .sink
                .reject(self.source.clone(), reason.clone(), self.raw.clone())
                .await
            {
                Ok(()) => {
                    self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                    return Outcome::Recorded;
                }
                Err(SinkError::Fatal(e)) => return Outcome::Fatal(e),
                Err(SinkError::NotOwned(_)) => return Outcome::Abandoned,
                Err(e) => {
                    if !self.wait_retry(&mut delay, &e.to_string()).await {
                        return Outcome::Abandoned;
                    }
                }
            }
        }
    }
}

/// The partitions of a list that belong to `topic`.
fn partitions_of(tpl: &TopicPartitionList, topic: &str) -> Vec<i32> {
    tpl.elements_for_topic(topic)
        .iter()
        .map(|e| e.partition())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka mode takes a request only under its identity's key: another key, or none, is a
    /// rejection that names the key to use; an invalid message stays rejected for its reason.
    #[test]
    fn kafka_mode_takes_a_request_only_under_its_identity_key() {
        let json = br#"{"tenant":"acme","operation":"pay","request_key":"k/1","target":"sim","payload":{}}"#;
        let submit = || Work::Submit(Box::new(TaskRequest::from_json(json).unwrap()));
        assert!(matches!(
            keyed_by_identity(submit(), Some(b"acme/pay/k%2F1")),
            Work::Submit(_)
        ));
        for key in [Some(&b"acme/pay/k/1"[..]), Some(b"k1"), None] {
            let Work::Reject(reason) = keyed_by_identity(submit(), key) else {
                panic!("{key:?} was taken");
            };
            assert!(
                reason.starts_with(
                    "in kafka mode a request must be keyed by its identity \"acme/pay/k%2F1\""
                ),
                "{reason}"
            );
        }
        let Work::Reject(reason) = keyed_by_identity(Work::Reject("bad json".into()), None) else {
            panic!()
        };
        assert_eq!(reason, "bad json");
    }

    fn load(messages: usize, bytes: usize) -> Load {
        Load { messages, bytes }
    }

    #[test]
    fn either_budget_pauses_and_both_must_halve_to_resume() {
        let budget = Budget {
            messages: 10,
            bytes: 1000,
        };
        assert!(!budget.reached(load(9, 999)));
        assert!(budget.reached(load(10, 1)));
        assert!(budget.reached(load(2, 1000)));
        assert!(!budget.relieved(load(5, 501)));
        assert!(!budget.relieved(load(6, 100)));
        assert!(budget.relieved(load(5, 500)));
        // One message above the whole byte budget pauses, and resumes once it is done.
        let mut one = Load::default();
        one.add(load(1, 5000));
        assert!(budget.reached(one));
        one.finish(5000);
        assert_eq!(one, Load::default());
        assert!(budget.relieved(one));
    }

    /// Bytes follow their messages: into the partition when received, to the orphans when the
    /// partition is revoked or reassigned, and out when each message is done.
    #[test]
    fn unfinished_bytes_are_released_by_the_messages_that_added_them() {
        let (_tx, done_rx) = mpsc::channel();
        let mut t = Tracker::new(done_rx, None);
        t.assign(0);
        t.assign(1);
        let received = [(0, 100_000), (0, 300), (1, 70_000)];
        for (p, bytes) in received {
            t.parts.get_mut(&p).unwrap().unfinished.add(load(1, bytes));
        }
        assert_eq!(t.unfinished(), load(3, 170_300));
        t.revoke(0);
        assert_eq!(t.orphans, load(2, 100_300));
        t.assign(1);
        assert_eq!(t.orphans, load(3, 170_300));
        assert_eq!(t.unfinished(), load(3, 170_300));
        for bytes in [100_000, 300, 70_000] {
            t.orphans.finish(bytes);
        }
        assert_eq!(t.unfinished(), Load::default());
    }
}
