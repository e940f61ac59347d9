//! The events topic as a log of record, one transactional writer per partition.
//!
//! The events of the tasks of requests partition *p* go to events partition *p* (set
//! explicitly, never left to a partitioner), written by *p*'s transactional producer. Its
//! `transactional.id` is derived from the consumer group and *p*
//! ([`PartitionLog::transactional_id`]), so whoever opens *p*'s log next fences the previous
//! writer: the brokers abort its open transaction and refuse its later ones. A batch is
//! durable when its transaction commits, and only then may the tasks it records act. One
//! transaction carries a batch's events, the results they announce, and the requests-topic
//! offset the batch completes (`send_offsets_to_transaction`), so a `read_committed` reader
//! sees all of them or none.
//!
//! [`read_partition`] reads a partition back as a `read_committed` consumer: only records of
//! committed transactions, never a fenced writer's open or aborted ones.
//!
//! Every call blocks (librdkafka's transactional API does): run it on a thread of its own or
//! in `spawn_blocking`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::FromClientConfigAndContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::cluster::Kafka;
use crate::config::Role;
use crate::records::{event_from_payload, EVENT_ID_HEADER};
use sendledger_core::{Event, TaskId};
use sendledger_store::Logged;

/// Why a partition's log refused a call.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Another writer opened the partition's log after this one: the partition now belongs to
    /// another instance, and nothing more may be done for its tasks here.
    #[error("events partition {partition} was taken over by another instance (its transactional producer was fenced): {detail}")]
    Fenced { partition: i32, detail: String },
    /// The brokers do not offer transactions (or refuse this client their use).
    #[error("the brokers refused a transactional producer for events partition {partition}: {detail}; storage.mode = \"kafka\" needs brokers with transactions (Kafka 0.11 or newer, transaction.state.log settings within the cluster's size) and, with ACLs, WRITE on the transactional id {transactional_id}")]
    Unsupported {
        partition: i32,
        transactional_id: String,
        detail: String,
    },
    /// The transaction was aborted (nothing of it is visible); the batch may be written again.
    #[error("the transaction on events partition {partition} failed and was aborted: {detail}")]
    Aborted { partition: i32, detail: String },
    /// The producer failed for good for another reason; open the log again to go on.
    #[error("the transactional producer of events partition {partition} failed: {detail}")]
    Failed { partition: i32, detail: String },
    /// A batch that commits a requests offset came without the consumer's group metadata.
    #[error("a batch of events partition {partition} commits a requests offset but came without the consumer's group metadata")]
    NoGroup { partition: i32 },
    #[error("kafka")]
    Kafka(#[from] KafkaError),
}

impl LogError {
    /// Whether the partition was lost to another instance.
    pub fn is_fenced(&self) -> bool {
        matches!(self, LogError::Fenced { .. })
    }
}

/// One record of a batch: its key, its headers (the event id first, see
/// [`crate::records::record_headers`]) and its JSON value.
#[derive(Debug, Clone, PartialEq)]
pub struct LogRecord {
    pub key: String,
    pub headers: Vec<(&'static str, String)>,
    pub payload: Vec<u8>,
}

/// What one transaction makes visible at once.
#[derive(Debug, Default)]
pub struct LogBatch {
    /// Event records, in log order, to the partition's events partition.
    pub events: Vec<LogRecord>,
    /// Result records, to the results topic (partitioned by key, as the publisher does).
    pub results: Vec<LogRecord>,
    /// The next requests-topic offset to consume on this partition, committed for the group
    /// with the batch: every message before it is recorded by this batch or an earlier one.
    pub next_request_offset: Option<i64>,
}

/// Where a committed batch's events landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    /// Offsets of the batch's first and last event record on the events partition (None for a
    /// batch without events).
    pub events: Option<(i64, i64)>,
    /// How long the transaction took, begin to commit.
    pub took: Duration,
}

/// The transactional writer of one events partition as the replicator uses it: a
/// [`PartitionLog`] on the brokers, or a model of them (the simulation's).
pub trait TransactionalLog: Send + Sync + 'static {
    /// The requests consumer's group metadata, which a batch committing a requests offset
    /// carries (the brokers refuse it from a consumer of an older group generation).
    type Group: Send + Sync + 'static;

    /// The partition written.
    fn partition(&self) -> i32;

    /// Writes `batch` in one transaction and returns once it committed (see
    /// [`PartitionLog::commit`]).
    fn commit(&self, batch: &LogBatch, group: Option<&Self::Group>) -> Result<Committed, LogError>;
}

impl TransactionalLog for PartitionLog {
    type Group = ConsumerGroupMetadata;

    fn partition(&self) -> i32 {
        self.partition
    }

    fn commit(
        &self,
        batch: &LogBatch,
        group: Option<&ConsumerGroupMetadata>,
    ) -> Result<Committed, LogError> {
        PartitionLog::commit(self, batch, group)
    }
}

/// The transactional writer of one events partition.
pub struct PartitionLog {
    partition: i32,
    transactional_id: String,
    events_topic: String,
    results_topic: String,
    requests_topic: String,
    producer: BaseProducer<Deliveries>,
    timeout: Duration,
}

impl PartitionLog {
    /// The transactional id of partition `partition`'s log for consumer group `group`.
    pub fn transactional_id(group: &str, partition: i32) -> String {
        format!("{group}.events.{partition}")
    }

    /// Opens partition `partition`'s log: initializes its transactional producer, which fences
    /// every earlier writer of the partition and aborts its open transaction. Waits up to
    /// `timeout` for the brokers.
    pub fn open(
        kafka: &Kafka,
        partition: i32,
        timeout: Duration,
    ) -> Result<PartitionLog, LogError> {
        let config = kafka.config();
        let transactional_id = Self::transactional_id(&config.group_id, partition);
        let mut client = kafka.client_config(Role::Log);
        client.set("transactional.id", &transactional_id);
        client.set(
            "transaction.timeout.ms",
            timeout.as_millis().max(1000).to_string(),
        );
        let producer = BaseProducer::from_config_and_context(&client, Deliveries::default())?;
        let log = PartitionLog {
            partition,
            transactional_id,
            events_topic: config.events_topic.clone(),
            results_topic: config.results_topic.clone(),
            requests_topic: config.requests_topic.clone(),
            producer,
            timeout,
        };
        if let Err(e) = log.producer.init_transactions(timeout) {
            return Err(log.init_error(e));
        }
        tracing::info!(partition, transactional_id = %log.transactional_id, "events partition opened for writing");
        Ok(log)
    }

    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// Writes `batch` in one transaction and returns once it committed. `group` is the
    /// requests consumer's group metadata, needed when the batch commits a requests offset
    /// (a consumer of an older group generation is refused by the brokers: fenced).
    ///
    /// On [`LogError::Aborted`] nothing of the batch is visible and the same batch may be
    /// written again; on [`LogError::Fenced`] or [`LogError::Failed`] this writer is done.
    pub fn commit(
        &self,
        batch: &LogBatch,
        group: Option<&ConsumerGroupMetadata>,
    ) -> Result<Committed, LogError> {
        if batch.next_request_offset.is_some() && group.is_none() {
            return Err(LogError::NoGroup {
                partition: self.partition,
            });
        }
        let started = Instant::now();
        self.producer.context().clear();
        self.producer
            .begin_transaction()
            .map_err(|e| self.error(e))?;
        if let Err(e) = self.write(batch, group).and_then(|()| self.delivered()) {
            return Err(self.abort(e));
        }
        if let Err(e) = self.producer.commit_transaction(self.timeout) {
            return Err(self.commit_error(e));
        }
        let delivered = self.producer.context().take();
        if let Some(detail) = delivered.failure {
            // Cannot happen after a successful commit; refuse to report offsets we did not see.
            return Err(LogError::Failed {
                partition: self.partition,
                detail,
            });
        }
        Ok(Committed {
            events: delivered.events,
            took: started.elapsed(),
        })
    }

    /// Writes the batch's records into the open transaction: its events, its results and the
    /// requests offset it commits. The brokers make them visible together or not at all (a
    /// fenced writer's open transaction is aborted), so nothing orders them within it.
    fn write(
        &self,
        batch: &LogBatch,
        group: Option<&ConsumerGroupMetadata>,
    ) -> Result<(), KafkaError> {
        self.produce(
            &self.events_topic,
            Some(self.partition),
            &batch.events,
            EVENT,
        )?;
        self.produce(&self.results_topic, None, &batch.results, RESULT)?;
        if let (Some(next), Some(group)) = (batch.next_request_offset, group) {
            let mut offsets = TopicPartitionList::new();
            offsets.add_partition_offset(
                &self.requests_topic,
                self.partition,
                Offset::Offset(next),
            )?;
            self.producer
                .send_offsets_to_transaction(&offsets, group, self.timeout)?;
        }
        Ok(())
    }

    /// Sends `records` to `topic` (to `partition`, or by key), reporting deliveries as `kind`.
    fn produce(
        &self,
        topic: &str,
        partition: Option<i32>,
        records: &[LogRecord],
        kind: usize,
    ) -> Result<(), KafkaError> {
        for r in records {
            let headers = r.headers.iter().fold(
                OwnedHeaders::new_with_capacity(r.headers.len()),
                |h, (key, value)| {
                    h.insert(Header {
                        key,
                        value: Some(value.as_str()),
                    })
                },
            );
            let mut record = BaseRecord::with_opaque_to(topic, kind)
                .key(r.key.as_bytes())
                .payload(r.payload.as_slice())
                .headers(headers);
            if let Some(p) = partition {
                record = record.partition(p);
            }
            self.send(record)?;
        }
        Ok(())
    }

    /// Sends one record, serving delivery reports while librdkafka's queue is full.
    fn send<'a>(&self, mut record: BaseRecord<'a, [u8], [u8], usize>) -> Result<(), KafkaError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r))
                    if Instant::now() < deadline =>
                {
                    record = r;
                    self.producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Waits until every record written is acknowledged and its delivery report served.
    /// `commit_transaction` would do it too, but rust-rdkafka's `BaseProducer` flushes by
    /// polling in steps of 100 ms, each step taken whole: that alone added 100 ms to every
    /// transaction (measured: p50 103 ms per commit before, against tansu).
    ///
    /// Polling with a short timeout instead spins: `poll` takes its whole timeout, and hands
    /// librdkafka what is left of it in whole milliseconds, so a 1 ms poll never blocks.
    /// Polled that way, this wait was two thirds of the log threads' CPU, a fifth of the
    /// process's in kafka mode. So it serves what is queued without waiting, and sleeps
    /// [`DELIVERY_WAIT`] when nothing was.
    fn delivered(&self) -> Result<(), KafkaError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let waiting = self.producer.in_flight_count();
            if waiting == 0 {
                return Ok(());
            }
            self.producer.poll(Duration::ZERO);
            if self.producer.in_flight_count() < waiting {
                continue;
            }
            if Instant::now() >= deadline {
                return Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut));
            }
            std::thread::sleep(DELIVERY_WAIT);
        }
    }

    /// What a failed commit leaves. A commit that timed out (a retriable error) is still in
    /// progress and may yet complete: its outcome is unknown, so the batch must not be written
    /// again, and librdkafka refuses to abort it (and to begin another transaction) while it
    /// lasts. The writer is done; whoever opens the log next completes or aborts the
    /// transaction and reads what it committed. (A fenced writer whose transaction was open
    /// gets this from brokers that never answer its commit, such as the test broker.)
    fn commit_error(&self, cause: KafkaError) -> LogError {
        match &cause {
            KafkaError::Transaction(t)
                if t.is_retriable() && !t.txn_requires_abort() && !is_fencing(t.code()) =>
            {
                LogError::Failed {
                    partition: self.partition,
                    detail: format!("the commit's outcome is unknown: {t}"),
                }
            }
            _ => self.abort(cause),
        }
    }

    /// Aborts the open transaction after `cause`, and says what became of the writer.
    fn abort(&self, cause: KafkaError) -> LogError {
        let error = self.error(cause);
        if let LogError::Aborted { .. } = error {
            if let Err(e) = self.producer.abort_transaction(self.timeout) {
                return self.error(e);
            }
        }
        error
    }

    /// Classifies a transactional error: fenced (the partition is lost), abortable (write the
    /// batch again), or fatal (open the log again).
    fn error(&self, e: KafkaError) -> LogError {
        let partition = self.partition;
        match &e {
            KafkaError::Transaction(t) => {
                let detail = t.to_string();
                if is_fencing(t.code()) {
                    LogError::Fenced { partition, detail }
                } else if t.txn_requires_abort() {
                    LogError::Aborted { partition, detail }
                } else if t.is_fatal() {
                    match self.producer.client().fatal_error() {
                        Some((code, _)) if is_fencing(code) => {
                            LogError::Fenced { partition, detail }
                        }
                        _ => LogError::Failed { partition, detail },
                    }
                } else {
                    LogError::Aborted { partition, detail }
                }
            }
            _ => match self.producer.client().fatal_error() {
                Some((code, reason)) if is_fencing(code) => LogError::Fenced {
                    partition,
                    detail: reason,
                },
                Some((_, reason)) => LogError::Failed {
                    partition,
                    detail: reason,
                },
                None => LogError::Aborted {
                    partition,
                    detail: e.to_string(),
                },
            },
        }
    }

    /// What a failed `init_transactions` says: fenced; not yet (the previous transaction of
    /// the id is still being completed, or its coordinator is moving: a take-over tries
    /// again); or brokers that refuse this client transactions.
    fn init_error(&self, e: KafkaError) -> LogError {
        if let KafkaError::Transaction(t) = &e {
            if t.is_retriable() || t.code() == RDKafkaErrorCode::ConcurrentTransactions {
                return LogError::Failed {
                    partition: self.partition,
                    detail: format!(
                        "the brokers cannot open the log yet (its previous transaction is still being completed, or its coordinator is moving): {t}"
                    ),
                };
            }
        }
        match self.error(e) {
            fenced @ LogError::Fenced { .. } => fenced,
            other => LogError::Unsupported {
                partition: self.partition,
                transactional_id: self.transactional_id.clone(),
                detail: match other {
                    LogError::Aborted { detail, .. } | LogError::Failed { detail, .. } => detail,
                    other => other.to_string(),
                },
            },
        }
    }
}

fn is_fencing(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
            | RDKafkaErrorCode::InvalidProducerIdMapping
    )
}

/// The kinds of record a delivery report is about.
const EVENT: usize = 1;
const RESULT: usize = 0;

/// What the delivery reports of the open transaction said.
#[derive(Debug, Default)]
struct Delivered {
    /// First and last offset of the event records.
    events: Option<(i64, i64)>,
    /// The first failed delivery.
    failure: Option<String>,
}

/// Collects delivery reports (served while the transaction commits).
#[derive(Default)]
struct Deliveries {
    delivered: Mutex<Delivered>,
}

impl Deliveries {
    fn lock(&self) -> std::sync::MutexGuard<'_, Delivered> {
        self.delivered.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn clear(&self) {
        *self.lock() = Delivered::default();
    }

    fn take(&self) -> Delivered {
        std::mem::take(&mut *self.lock())
    }
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    /// [`EVENT`] for an event record (its offset is reported), [`RESULT`] for a result.
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, kind: usize) {
        let mut d = self.lock();
        match result {
            Ok(m) if kind == EVENT => {
                let o = m.offset();
                d.events = Some(d.events.map_or((o, o), |(a, b)| (a.min(o), b.max(o))));
            }
            Ok(_) => {}
            Err((e, _)) => {
                d.failure.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

/// How long [`PartitionLog`] sleeps between looks for delivery reports while it waits for a
/// transaction's records to be acknowledged (a few milliseconds against a broker).
const DELIVERY_WAIT: Duration = Duration::from_micros(100);

/// Reads events partition `partition` as a `read_committed` consumer from offset `from` to
/// its end as it was when the call began (its last stable offset), handing each record to
/// `apply` as it is in the consumer's buffer ([`record_event`] decodes it). Records of open or
/// aborted transactions are never handed over. Returns the offset after the last record read
/// (`from` when there was none). Gives up when no record arrives for `idle` while the end is
/// not reached.
pub fn read_partition(
    kafka: &Kafka,
    partition: i32,
    from: i64,
    idle: Duration,
    mut apply: impl FnMut(&BorrowedMessage<'_>) -> crate::Result<()>,
) -> crate::Result<i64> {
    let topic = kafka.config().events_topic.clone();
    let consumer = committed_reader(kafka)?;
    let (_, end) = consumer.fetch_watermarks(&topic, partition, idle)?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, partition, Offset::Offset(from))?;
    consumer.assign(&tpl)?;
    let mut next = from;
    let mut last_progress = Instant::now();
    while next < end {
        // Short polls: past the last record only a transaction marker may remain, which a poll
        // never returns; the position then says the partition was read to its end.
        match consumer.poll(Duration::from_millis(10)) {
            Some(Ok(m)) => {
                last_progress = Instant::now();
                next = m.offset() + 1;
                apply(&m)?;
            }
            Some(Err(e)) if passing(&e) => {
                tracing::debug!(partition, error = %e, "reading the log: librdkafka recovers")
            }
            Some(Err(e)) => return Err(e.into()),
            None => {
                // Past the last committed record only transaction markers (or aborted records)
                // may remain: the position says how far the consumer got.
                if let Some(p) = position(&consumer, &topic, partition)? {
                    next = next.max(p);
                }
                if next < end && last_progress.elapsed() > idle {
                    return Err(crate::Error::Replay {
                        topic,
                        detail: format!(
                            "partition {partition}: no record for {idle:?} at offset {next}, before its end {end}"
                        ),
                    });
                }
            }
        }
    }
    Ok(next)
}

/// Whether a consumer's error is one librdkafka recovers from by itself: a broker connection
/// lost or refused (a broker down, its partitions' leaders moving), every broker unreachable
/// for a moment, a request timed out. A read of a partition goes on through it, and its idle
/// limit decides when to give up; anything else (the topic or partition gone, a read not
/// authorized, an offset out of range) ends the read.
pub(crate) fn passing(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        e,
        KafkaError::MessageConsumption(
            C::BrokerTransportFailure
                | C::AllBrokersDown
                | C::Resolve
                | C::OperationTimedOut
                | C::RequestTimedOut
                | C::NetworkException
                | C::LeaderNotAvailable
                | C::NotLeaderForPartition
                | C::BrokerNotAvailable
        )
    )
}

/// How far `consumer` got in `partition` of `topic` (the offset of the next record it reads).
fn position(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
) -> Result<Option<i64>, KafkaError> {
    Ok(consumer
        .position()?
        .find_partition(topic, partition)
        .and_then(|p| match p.offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        }))
}

/// Events partition `partition`'s end (its high watermark: past its last stable offset once
/// its log was opened, since opening settles the open transaction) and its first committed
/// event at or after `at`, with that event's offset: how a take-over checks that the log
/// still holds the last event its copy recorded. Reads as a `read_committed` consumer, and
/// gives up when nothing arrives for `idle` while the end is not reached.
pub fn event_at(
    kafka: &Kafka,
    partition: i32,
    at: i64,
    idle: Duration,
) -> crate::Result<(i64, Option<(i64, Event)>)> {
    let topic = kafka.config().events_topic.clone();
    let consumer = committed_reader(kafka)?;
    let (_, end) = consumer.fetch_watermarks(&topic, partition, idle)?;
    if at >= end {
        return Ok((end, None));
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, partition, Offset::Offset(at))?;
    consumer.assign(&tpl)?;
    let started = Instant::now();
    loop {
        match consumer.poll(Duration::from_millis(10)) {
            Some(Ok(m)) => return Ok((end, Some((m.offset(), record_event(&m)?)))),
            Some(Err(e)) if passing(&e) => {
                tracing::debug!(partition, error = %e, "reading the log: librdkafka recovers")
            }
            Some(Err(e)) => return Err(e.into()),
            None => {
                // Past the last committed record only markers or aborted records remain.
                if position(&consumer, &topic, partition)?.is_some_and(|p| p >= end) {
                    return Ok((end, None));
                }
                if started.elapsed() > idle {
                    return Err(crate::Error::Replay {
                        topic,
                        detail: format!(
                            "partition {partition}: no record for {idle:?} at offset {at}, before its end {end}"
                        ),
                    });
                }
            }
        }
    }
}

/// The `sendledger-event-id` header of a record, read in place.
fn message_event_id(message: &impl Message) -> Option<String> {
    (message.headers().into_iter())
        .flat_map(|h| h.iter())
        .find(|h| h.key == EVENT_ID_HEADER)
        .map(|h| String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned())
}

/// The events of the last transaction a read of the log met (its last run of consecutive
/// offsets: a transaction's events are contiguous, and its commit marker takes the offset
/// after them), where it began and when its first event was written.
#[derive(Debug, Default)]
pub struct LastTransaction {
    pub(crate) events: Vec<(TaskId, u32)>,
    /// Offset of its first event.
    pub(crate) first: i64,
    /// Offset of its last event.
    pub(crate) last: Option<i64>,
    /// Record timestamp of its first event, ms.
    pub(crate) written_at: i64,
}

impl LastTransaction {
    /// Takes in the next event read, at `offset`, written at `timestamp` (ms).
    pub fn read(&mut self, offset: i64, timestamp: i64, event: &Event) {
        if self.last.is_some_and(|l| l + 1 != offset) {
            self.events.clear();
        }
        if self.events.is_empty() {
            self.first = offset;
            self.written_at = timestamp;
        }
        self.events.push((event.task_id, event.task_seq));
        self.last = Some(offset);
    }

    /// Where the events read so far end in the log, if any was read.
    pub fn logged(&self) -> Option<Logged> {
        self.last.map(|last| Logged {
            first: self.first,
            next: last + 1,
        })
    }
}

/// A consumer outside the group that sees committed transactions only.
fn committed_reader(kafka: &Kafka) -> crate::Result<BaseConsumer> {
    Ok(committed_reader_config(kafka).create()?)
}

/// The configuration of [`committed_reader`].
pub(crate) fn committed_reader_config(kafka: &Kafka) -> rdkafka::ClientConfig {
    let mut client = kafka.client_config(Role::Replay);
    client.set("isolation.level", "read_committed");
    client
}

/// The event a record of the events topic carries (in either encoding), decoded in place (a
/// restore reads every record of a partition: copying each, or reading its headers, was a
/// third of the reading). A record that does not decode is named by its `sendledger-event-id`
/// header.
pub fn record_event(message: &impl Message) -> crate::Result<Event> {
    event_from_payload(message.payload().unwrap_or_default()).map_err(|e| match e {
        crate::Error::BadRecord { event_id, source } if event_id.is_empty() => {
            let event_id = message_event_id(message).unwrap_or_default();
            crate::Error::BadRecord { event_id, source }
        }
        e => e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::{OwnedMessage, Timestamp};

    fn message(payload: &[u8], event_id: Option<&str>) -> OwnedMessage {
        let headers = event_id.map(|id| {
            OwnedHeaders::new().insert(Header {
                key: EVENT_ID_HEADER,
                value: Some(id),
            })
        });
        let topic = "sendledger.events".to_string();
        OwnedMessage::new(
            Some(payload.to_vec()),
            None,
            topic,
            Timestamp::NotAvailable,
            0,
            7,
            headers,
        )
    }

    /// A record that does not decode is named by its event id header, when it has one.
    #[test]
    fn an_undecodable_record_is_named_by_its_header() {
        let named = record_event(&message(b"{not json", Some("abc:3")));
        match named {
            Err(crate::Error::BadRecord { event_id, .. }) => assert_eq!(event_id, "abc:3"),
            other => panic!("expected a bad record, got {other:?}"),
        }
        let anonymous = record_event(&message(b"[]", None));
        match anonymous {
            Err(crate::Error::BadRecord { event_id, .. }) => assert_eq!(event_id, ""),
            other => panic!("expected a bad record, got {other:?}"),
        }
    }
}
