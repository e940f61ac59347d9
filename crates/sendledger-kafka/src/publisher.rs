//! The outbox publisher: the ledger's log, in LSN order, to the events and results topics.
//!
//! It reads a batch of events after its durable cursor (on the blocking pool), builds every
//! record of the batch (each event for the events topic, and the [`TaskResult`] an event
//! announces for the results topic), produces them all with the idempotent producer, waits for
//! every acknowledgement, and only then moves the cursor past the batch, in the ledger. A crash
//! or a failed delivery makes it publish the batch again: the records are the same, byte for
//! byte, with the same `sendledger-event-id` header, so consumers dedupe them.
//!
//! Order: a task's records share a key, so they go to one partition in LSN order; the producer
//! is idempotent and never times a message out (`message.timeout.ms = 0` unless configured), so
//! a broker outage delays a partition's records without leaving a gap that later ones could
//! overtake.
//!
//! Headers: each record carries its event id, its CloudEvents attributes (binary content mode)
//! and, when its task has a trace context, `traceparent` ([`crate::records::record_headers`]).
//! Each task with records in a batch has a `sendledger.publish` span, from the batch's
//! production to its acknowledgement, parented on the task's trace context.
//!
//! Metric: `sendledger_results_published_total` (result records acknowledged by Kafka; a batch
//! published again after a failure counts again).
//!
//! [`TaskResult`]: sendledger_core::TaskResult

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::produce::{enqueue, ensure_producer_id};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use sendledger_core::error::Chain;
use sendledger_core::result::event_id;
use sendledger_core::{TaskId, TraceParent};
use sendledger_store::{Append, Ledger};

use crate::cluster::Kafka;
use crate::config::Role;
use crate::error::{Error, Result};
use crate::projections::Projections;
pub use crate::records::EVENT_ID_HEADER;
use crate::records::{
    events_source, fold_record_headers, results_source, Attributes, EventEncoding, RecordKind, JSON,
};

/// The ledger cursor holding the last LSN whose records are acknowledged.
pub const PUBLISHER_CURSOR: &str = "publisher";

/// Most events read and published as one batch.
const BATCH: usize = 2048;
const IDLE_POLL: Duration = Duration::from_millis(5);
const RETRY_INITIAL: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Counters of a running publisher.
#[derive(Debug, Default)]
pub struct PublisherStats {
    /// Event records acknowledged (a batch published again counts again).
    pub events: AtomicU64,
    /// Result records acknowledged.
    pub results: AtomicU64,
    /// Batches that failed to publish and were tried again.
    pub failures: AtomicU64,
    /// Events of earlier batches read again from a task's history to resume projecting it (its
    /// first event in a batch when its projection was not kept, or a batch built again). A
    /// task whose projection is kept between its events adds none.
    pub refolded: AtomicU64,
    /// The cursor: every event up to this LSN is published.
    pub cursor: AtomicU64,
    /// Set when the publisher stopped by itself on a ledger error no retry can mend.
    pub stopped: AtomicBool,
}

/// A running outbox publisher.
pub struct Publisher {
    stop: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<Result<()>>>,
    stats: Arc<PublisherStats>,
}

impl Publisher {
    /// Starts publishing from the ledger's cursor. Must be called within a tokio runtime.
    pub fn start(kafka: &Kafka, ledger: Ledger) -> Result<Publisher> {
        let producer = kafka
            .client_config(Role::Producer)
            .create_with_context(Acks)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(PublisherStats::default());
        let worker = Worker {
            kafka: kafka.clone(),
            producer,
            ledger,
            stop: stop.clone(),
            stats: stats.clone(),
            results_topic: kafka.config().results_topic.clone(),
            events_topic: kafka.config().events_topic.clone(),
            events_source: events_source(&kafka.config().group_id),
            results_source: results_source(&kafka.config().group_id),
            encoding: kafka.config().events_encoding,
            projections: Projections::default(),
        };
        let handle = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let task = handle.spawn(worker.run());
        Ok(Publisher {
            stop,
            task: Some(task),
            stats,
        })
    }

    pub fn stats(&self) -> &Arc<PublisherStats> {
        &self.stats
    }

    /// The last LSN whose records are acknowledged.
    pub fn cursor(&self) -> u64 {
        self.stats.cursor.load(Ordering::SeqCst)
    }

    /// False once the publisher stopped by itself (the ledger failed for good).
    pub fn is_running(&self) -> bool {
        !self.stats.stopped.load(Ordering::SeqCst)
    }

    /// Waits until every event up to `lsn` is published, or `timeout` passes, or the publisher
    /// stopped; true if it was published.
    pub async fn wait_for(&self, lsn: u64, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.cursor() < lsn {
            if !self.is_running() || tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Lets the current batch finish (up to `grace`), then stops. A batch cut short is
    /// published again at the next start.
    pub async fn shutdown(mut self, grace: Duration) -> Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        let Some(mut task) = self.task.take() else {
            return Ok(());
        };
        match tokio::time::timeout(grace, &mut task).await {
            Ok(joined) => joined.map_err(|_| Error::Thread { what: "publisher" })?,
            Err(_) => {
                tracing::warn!("publisher did not finish its batch in time; it is published again at the next start");
                task.abort();
                Ok(())
            }
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Which topic a record goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dest {
    Events,
    Results,
}

struct OutRecord {
    dest: Dest,
    key: String,
    event_id: String,
    payload: Vec<u8>,
    /// The CloudEvents type (`sendledger.event.<Name>`, `sendledger.result.<status>`).
    ce_type: String,
    /// When the event was recorded, milliseconds since the Unix epoch (`ce_time`).
    at: u64,
    task_id: TaskId,
    target: Option<String>,
    /// The task's trace context, if it has one.
    trace: Option<TraceParent>,
}

struct Batch {
    last_lsn: u64,
    records: Vec<OutRecord>,
    /// See [`PublisherStats::refolded`].
    refolded: u64,
}

/// Reads events from `from` and builds their records. Blocking: runs on the blocking pool.
///
/// Each task is projected incrementally, from its kept projection when that stands right
/// before its first event of this batch, else from its history up to that event, folded once
/// (see [`Projections`]). A batch built again after a failure finds its tasks' projections
/// past its events, and folds them from the history.
fn build_batch(
    ledger: &Ledger,
    from: u64,
    limit: usize,
    encoding: EventEncoding,
    mut projections: Projections,
) -> Result<(Batch, Projections)> {
    let events = ledger.read_log(from, limit)?;
    projections.start_batch();
    let mut records = Vec::with_capacity(events.len() + events.len() / 2);
    let mut last_lsn = from.saturating_sub(1);
    let mut refolded = 0;
    for e in &events {
        let (projection, folded) = projections.before(e, || ledger.task_events(e.task_id))?;
        refolded += folded;
        let result = projection.apply(e);
        let key = projection.key(e.task_id);
        let (trace, target) = (
            projection.traceparent(),
            projection.target().map(str::to_owned),
        );
        records.push(OutRecord {
            dest: Dest::Events,
            key: key.clone(),
            payload: encoding.payload(e)?,
            ce_type: RecordKind::Event(e.body.name()).ce_type(),
            event_id: event_id(e.task_id, e.task_seq),
            at: e.at,
            task_id: e.task_id,
            target: target.clone(),
            trace,
        });
        if let Some(result) = result {
            records.push(OutRecord {
                dest: Dest::Results,
                key,
                payload: serde_json::to_vec(&result).map_err(json_err)?,
                ce_type: RecordKind::Result(result.status).ce_type(),
                event_id: result.event_id,
                at: result.at,
                task_id: e.task_id,
                target,
                trace,
            });
        }
        last_lsn = e.lsn;
    }
    projections.end_batch();
    let batch = Batch {
        last_lsn,
        records,
        refolded,
    };
    Ok((batch, projections))
}

/// One `sendledger.publish` span per task with records in the batch, in the order of their
/// first record, each parented on its task's trace context. They end when dropped, once the
/// batch is acknowledged or failed.
fn publish_spans(records: &[OutRecord]) -> Vec<tracing::Span> {
    let mut counts: HashMap<TaskId, usize> = HashMap::new();
    let mut first = Vec::new();
    for (i, rec) in records.iter().enumerate() {
        *counts.entry(rec.task_id).or_insert_with(|| {
            first.push(i);
            0
        }) += 1;
    }
    first
        .into_iter()
        .map(|i| {
            let rec = &records[i];
            let span = tracing::info_span!(
                "sendledger.publish",
                task_id = %rec.task_id,
                target = rec.target.as_deref(),
                records = counts.get(&rec.task_id).copied().unwrap_or(0),
                outcome = tracing::field::Empty,
            );
            sendledger_telemetry::join(&span, rec.trace);
            span
        })
        .collect()
}

fn json_err(e: serde_json::Error) -> Error {
    Error::Encode(e)
}

/// The publisher's producer context: each record's acknowledgement is counted against its
/// batch.
struct Acks;

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    type DeliveryOpaque = Arc<BatchAcks>;

    fn delivery(&self, result: &DeliveryResult<'_>, batch: Arc<BatchAcks>) {
        if let Err((e, _)) = result {
            let mut failed = batch.failed.lock().unwrap_or_else(|e| e.into_inner());
            failed.get_or_insert_with(|| e.clone());
        }
        if batch.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            batch.done.notify_one();
        }
    }
}

/// The acknowledgements of one batch: how many of its records librdkafka holds, and the first
/// delivery that failed.
#[derive(Default)]
struct BatchAcks {
    pending: AtomicUsize,
    failed: Mutex<Option<KafkaError>>,
    done: tokio::sync::Notify,
}

impl BatchAcks {
    /// Waits until every record handed over is acknowledged or failed.
    async fn settled(&self) {
        // `notify_one` keeps a permit when nobody waits, so a last acknowledgement between the
        // check and the wait is not missed.
        while self.pending.load(Ordering::Acquire) > 0 {
            self.done.notified().await;
        }
    }
}

struct Worker {
    kafka: Kafka,
    producer: ThreadedProducer<Acks>,
    ledger: Ledger,
    stop: Arc<AtomicBool>,
    stats: Arc<PublisherStats>,
    results_topic: String,
    events_topic: String,
    /// The CloudEvents sources of the event and result records.
    events_source: String,
    results_source: String,
    encoding: EventEncoding,
    projections: Projections,
}

impl Worker {
    async fn run(mut self) -> Result<()> {
        let mut cursor = self
            .ledger
            .read(|l| l.cursor(PUBLISHER_CURSOR))
            .await?
            .unwrap_or(0);
        self.stats.cursor.store(cursor, Ordering::SeqCst);
        tracing::info!(cursor, "publisher started");
        // Nothing is sent before the producer has its id; without this the first batch of
        // every start waited half a second for it.
        ensure_producer_id(&self.producer, &self.results_topic).await;
        let mut delay = RETRY_INITIAL;
        while !self.stop.load(Ordering::SeqCst) {
            if self.ledger.last_lsn() <= cursor {
                tokio::time::sleep(IDLE_POLL).await;
                continue;
            }
            let from = cursor + 1;
            let (previous, encoding) = (std::mem::take(&mut self.projections), self.encoding);
            let batch = match self
                .ledger
                .read(move |l| Ok(build_batch(l, from, BATCH, encoding, previous)))
                .await
            {
                Ok(Ok((b, projections))) => {
                    self.projections = projections;
                    self.stats.refolded.fetch_add(b.refolded, Ordering::Relaxed);
                    b
                }
                Ok(Err(e)) => {
                    tracing::error!(from, error = %Chain(&e), "cannot read the log to publish; retrying");
                    self.backoff(&mut delay).await;
                    continue;
                }
                Err(e) if !e.is_transient() => return Err(self.stopped(e)),
                Err(e) => {
                    tracing::error!(from, error = %Chain(&e), "cannot read the log to publish; retrying");
                    self.backoff(&mut delay).await;
                    continue;
                }
            };
            if batch.last_lsn < from {
                tokio::time::sleep(IDLE_POLL).await;
                continue;
            }
            match self.produce(&batch).await {
                Ok((events, results)) => {
                    let append = Append {
                        cursors: vec![(PUBLISHER_CURSOR.to_string(), batch.last_lsn)],
                        ..Append::default()
                    };
                    if let Err(e) = self.ledger.append(append).await {
                        if !e.is_transient() {
                            return Err(self.stopped(e));
                        }
                        tracing::error!(error = %Chain(&e), "cannot record the publisher cursor; the batch is published again");
                        self.backoff(&mut delay).await;
                        continue;
                    }
                    cursor = batch.last_lsn;
                    self.stats.cursor.store(cursor, Ordering::SeqCst);
                    self.stats.events.fetch_add(events, Ordering::Relaxed);
                    self.stats.results.fetch_add(results, Ordering::Relaxed);
                    metrics::counter!(crate::metric_definitions::RESULTS_PUBLISHED_TOTAL)
                        .increment(results);
                    delay = RETRY_INITIAL;
                }
                Err(e) => {
                    self.stats.failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(from, error = %e, "publishing failed; the batch is published again");
                    if let Some((code, reason)) = self.producer.client().fatal_error() {
                        tracing::warn!(%code, reason, "the producer failed for good; creating a new one");
                        match self
                            .kafka
                            .client_config(Role::Producer)
                            .create_with_context(Acks)
                        {
                            Ok(p) => self.producer = p,
                            Err(e) => tracing::error!(error = %e, "cannot create a producer"),
                        }
                    }
                    self.backoff(&mut delay).await;
                }
            }
        }
        tracing::info!(cursor, "publisher stopped");
        Ok(())
    }

    /// A ledger error no retry can mend (closed, corrupt, of a newer format): the publisher
    /// stops with it; what it did not publish is published at the next start.
    fn stopped(&self, e: sendledger_store::Error) -> Error {
        tracing::error!(error = %Chain(&e), "the ledger failed for good; the publisher stops");
        self.stats.stopped.store(true, Ordering::SeqCst);
        Error::Ledger(e)
    }

    async fn backoff(&self, delay: &mut Duration) {
        tokio::time::sleep(*delay).await;
        *delay = (*delay * 2).min(RETRY_MAX);
    }

    /// Produces every record of the batch and waits for all acknowledgements. Returns the
    /// number of event and result records.
    // rdkafka's send returns the record with its error, large, so it can be sent again.
    #[allow(clippy::result_large_err)]
    async fn produce(&self, batch: &Batch) -> std::result::Result<(u64, u64), KafkaError> {
        let spans = publish_spans(&batch.records);
        let acks = Arc::new(BatchAcks::default());
        let mut failed = None;
        for rec in &batch.records {
            let (topic, source, content_type) = match rec.dest {
                Dest::Events => (
                    &self.events_topic,
                    &self.events_source,
                    self.encoding.content_type(),
                ),
                Dest::Results => (&self.results_topic, &self.results_source, JSON),
            };
            let attributes = Attributes {
                id: &rec.event_id,
                source,
                kind: &rec.ce_type,
                content_type,
                at_ms: rec.at,
                trace: rec.trace,
            };
            let headers = fold_record_headers(
                OwnedHeaders::new_with_capacity(8),
                &attributes,
                |headers, key, value| {
                    headers.insert(Header {
                        key,
                        value: Some(value),
                    })
                },
            );
            let record = BaseRecord::with_opaque_to(topic, acks.clone())
                .key(rec.key.as_str())
                .payload(rec.payload.as_slice())
                .headers(headers);
            acks.pending.fetch_add(1, Ordering::AcqRel);
            if let Err(e) = enqueue(record, |r| self.producer.send(r)).await {
                // Not handed over: no acknowledgement will come for it.
                acks.pending.fetch_sub(1, Ordering::AcqRel);
                failed = Some(e);
                break;
            }
        }
        acks.settled().await;
        if let Some(e) = acks.failed.lock().unwrap_or_else(|e| e.into_inner()).take() {
            failed.get_or_insert(e);
        }
        let outcome = if failed.is_some() {
            "failed"
        } else {
            "acknowledged"
        };
        for span in &spans {
            span.record("outcome", outcome);
        }
        drop(spans);
        match failed {
            Some(e) => Err(e),
            None => {
                let results = batch
                    .records
                    .iter()
                    .filter(|r| r.dest == Dest::Results)
                    .count() as u64;
                Ok((batch.records.len() as u64 - results, results))
            }
        }
    }
}
