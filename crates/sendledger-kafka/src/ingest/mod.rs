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
//!   advances like any other. In kafka mode a request must also be keyed by its identity and
//!   have arrived on its key's partition (`kafka.partitioner` over the log of record's
//!   partitions); one that did not is rejected the same way, never sent.
//! - Backpressure: at `max_unfinished` messages, or `max_unfinished_bytes` bytes (a message's
//!   key and value as received), received and not yet durable, the assigned partitions are
//!   paused; they resume once both are at half their limit or below. In kafka mode a partition
//!   whose log stalled (a transaction under way for 500 ms or more) also pauses alone at its
//!   share of the budget (divided by the partitions assigned), so one whose messages do not
//!   finish cannot hold the others up. A message larger than the byte budget
//!   still goes through, alone: nothing else is received until it is done.
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
//!
//! Where each part is:
//! - `tracker`: the offset tracker (per partition, the offsets received in order and their done
//!   prefix) and the in-flight budget of messages and bytes; bookkeeping only, with its unit
//!   tests.
//! - `rebalance`: the consumer's context (assign and revoke, local mode's one-instance-per-group
//!   check, the lag gauge), and applying a finished message: its offset stored through the
//!   consumer, the commits, resuming partitions with their fetchers woken.
//! - `guards`: each partition's processed offsets, read and checked at its first message (a
//!   recreated topic, a partition another ledger processed, offsets deleted before they were
//!   processed), and each message admitted against them (duplicates dropped, requests lost
//!   counted).
//! - `takeover`: kafka mode's take-over of assigned partitions, and the take-back of one whose
//!   log was lost.
//! - `group_watch`: kafka mode's check that the group formed: a member holding no partition
//!   while requests wait, unconsumed, rejoins.
//! - `jobs`: each message's work and its job on the runtime (into the [`RequestSink`], in its
//!   chain's order), and dead letters.
//! - this module: the [`Ingest`] handle, its start and stop, and the ingest thread's loop
//!   (polls, backpressure, checkpoints, the drain at shutdown), with the consumer helpers
//!   the others share (a partition's committed offset, pausing one partition).
//!
//! [`resume_and_wake`]: rebalance::resume_and_wake

mod group_watch;
mod guards;
mod jobs;
mod rebalance;
mod takeover;
mod tracker;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use sendledger_core::access::Access;
use tokio::runtime::Handle;

use crate::cluster::Kafka;
use crate::config::Role;
use crate::error::{Error, Result};
use crate::partitioner::Partitioner;
use crate::sink::{PartitionOwner, RequestSink, SinkError};
use jobs::DeadLetters;
use rebalance::{commit, sync_pauses, IngestContext};
use takeover::FENCED_RETAKE_SESSIONS;
use tracker::{lock, Budget, Done, Tracker};

pub use jobs::{REASON_HEADER, SOURCE_HEADER};

const RETRY_INITIAL: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// How long a stopping ingest serves the rebalances of leaving its group before it closes.
const LEAVE_WITHIN: Duration = Duration::from_secs(1);
/// Longest wait for a partition's start and end offsets.
const WATERMARK_TIMEOUT: Duration = Duration::from_secs(5);
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
    /// Kafka mode: why this instance, holding no partition, sees requests that no member
    /// consumes (see `group_watch`). `None` while it holds partitions or none wait.
    pub unconsumed: Mutex<Option<String>>,
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

    /// Kafka mode: why requests wait that no member consumes, while this instance holds no
    /// partition.
    pub fn unconsumed(&self) -> Option<String> {
        self.unconsumed
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
        Self::start_checked(kafka, sink, None, None)
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
        Self::start_checked(kafka, sink, Some(owner), None)
    }

    /// [`Ingest::start`], or with `owner` [`Ingest::start_owning`], acting only on the
    /// requests `access` allows: the others are rejected (a rejected result naming the rule,
    /// the dead-letter topic when configured), never sent.
    pub fn start_checked<S: RequestSink>(
        kafka: &Kafka,
        sink: Arc<S>,
        owner: Option<Arc<dyn PartitionOwner>>,
        access: Option<Arc<Access>>,
    ) -> Result<Ingest> {
        let runtime = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let config = kafka.config().clone();
        let stats = Arc::new(IngestStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let grace = Arc::new(Mutex::new(Duration::from_secs(10)));
        let (done_tx, done_rx) = mpsc::channel();
        let tracker = Arc::new(Mutex::new(Tracker::new(done_rx, owner.clone())));
        let tracker_for_watch = tracker.clone();
        let rejoin = Arc::new(AtomicBool::new(false));
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
        let placement = (owner.as_ref()).map(|o| (config.partitioner, o.log_partitions()));
        let worker = Worker {
            owner,
            placement,
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
            rejoin: rejoin.clone(),
            access,
            first_tenant: Mutex::new(None),
            several_tenants: AtomicBool::new(false),
        };
        if worker.owner.is_some() {
            // Detached: it ends with `stop`, once any call to the brokers it is in returns.
            group_watch::spawn(
                kafka,
                tracker_for_watch,
                stats.clone(),
                stop.clone(),
                rejoin,
                session,
            )?;
        }
        metrics::gauge!(crate::metric_definitions::INGEST_PAUSED).set(0.0);
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
    /// Kafka mode: set by the group watch when this member must leave the group and join it
    /// again.
    rejoin: Arc<AtomicBool>,
    /// Kafka mode: the partitioner of the requests' producers and the log of record's
    /// partition count, to refuse a request that arrived on another partition than its key's.
    placement: Option<(Partitioner, i32)>,
    /// Who may ask for what; `None`: every valid request is acted on.
    access: Option<Arc<Access>>,
    /// Without access rules: the first tenant requests were seen for, and whether a second
    /// one was (warned about once).
    first_tenant: Mutex<Option<String>>,
    several_tenants: AtomicBool,
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
            if self.rejoin.swap(false, Ordering::SeqCst) {
                self.consumer.unsubscribe();
                if let Err(e) = self.consumer.subscribe(&[&self.topic]) {
                    tracing::warn!(error = %e, "cannot join the group again");
                }
            }
            self.take_over_assigned();
            if last_commit.elapsed() >= self.commit_interval {
                self.checkpoint(CommitMode::Async);
                last_commit = Instant::now();
            }
        }
        self.finish_take_overs();
        self.drain();
        self.checkpoint(CommitMode::Sync);
        self.leave_group();
        // Dropping the consumer closes it, and serves the rebalances still queued.
        self.consumer
            .context()
            .closing
            .store(true, Ordering::SeqCst);
        tracing::info!("ingest stopped");
        result
    }

    /// Leaves the group before the consumer is closed, serving the rebalances that follow
    /// (for at most [`LEAVE_WITHIN`]): an assignment already on its way (a stop right after
    /// the group was joined) is then answered while librdkafka can answer it. Answered from a
    /// rebalance callback while the consumer closes, it hung the close for good. Messages
    /// polled meanwhile are not handled: their offsets are not committed, so they are
    /// delivered again.
    fn leave_group(&self) {
        self.consumer.unsubscribe();
        let deadline = Instant::now() + LEAVE_WITHIN;
        let mut quiet = 0;
        while Instant::now() < deadline && quiet < 3 {
            let polled = self.consumer.poll(Duration::from_millis(50)).is_some();
            let assigned = (self.consumer.assignment()).map_or(0, |a| a.count());
            quiet = if polled || assigned > 0 { 0 } else { quiet + 1 };
        }
    }

    /// Pauses partitions at the in-flight budget and resumes them once relieved: every
    /// partition at the whole budget, and (kafka mode) a partition whose log stalled at its
    /// share of it ([`Budget::share`]), so that one whose messages do not finish (a hung
    /// commit) cannot hold up the others. Then sets each partition's pause through the
    /// consumer.
    ///
    /// Partitions that flow are not held to their shares: with a backlog, the consumer fetches
    /// one partition's messages ahead of another's, and pausing each at its share made a
    /// backlog go through a quarter slower (each pause drops what was fetched ahead).
    fn backpressure(&self, t: &mut Tracker) {
        let share = self.budget.share(t.parts.len());
        // A stalled partition counts toward the whole budget up to its share only: what it
        // received beyond (before its log was found stalled) must not keep the others paused
        // until its commits go through. Memory then holds at most that much more.
        let mut load = t.orphans;
        for (&partition, p) in t.parts.iter_mut() {
            let stalled = (self.owner.as_ref()).is_some_and(|o| o.stalled(partition));
            let over = stalled && share.pauses(p.over_budget, p.unfinished);
            load.add(match stalled {
                true => p.unfinished.capped(share),
                false => p.unfinished,
            });
            if over != p.over_budget {
                p.over_budget = over;
                tracing::debug!(
                    partition,
                    messages = p.unfinished.messages,
                    bytes = p.unfinished.bytes,
                    paused = over,
                    "the stalled partition's share of the in-flight budget"
                );
                if over {
                    self.stats.pauses.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!(crate::metric_definitions::INGEST_PAUSES_TOTAL).increment(1);
                }
            }
        }
        let paused = self.budget.pauses(t.paused, load);
        if paused != t.paused {
            t.paused = paused;
            tracing::debug!(
                messages = load.messages,
                bytes = load.bytes,
                paused,
                "in-flight budget"
            );
            if paused {
                self.stats.pauses.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(crate::metric_definitions::INGEST_PAUSES_TOTAL).increment(1);
            }
            metrics::gauge!(crate::metric_definitions::INGEST_PAUSED)
                .set(f64::from(u8::from(paused)));
        }
        sync_pauses(&self.consumer, &self.topic, t, &[]);
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
}
