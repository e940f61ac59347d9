//! Snapshot records on the brokers: finding a partition's latest manifest, reading its chunks,
//! and writing its next snapshot.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use sendledger_core::error::Chain;

use super::{chunk_digest, chunks, decode, is_manifest, Compactor, Manifest, Record};
use crate::config::Role;
use crate::partition_log::{read_partition, record_event, LastTransaction};
use crate::Kafka;

/// The first offset events partition `partition` still holds (its low watermark).
pub fn log_start(kafka: &Kafka, partition: i32, idle: Duration) -> crate::Result<i64> {
    let topic = &kafka.config().events_topic;
    Ok(reader(kafka)?.fetch_watermarks(topic, partition, idle)?.0)
}

/// What [`write`] wrote.
#[derive(Debug)]
pub struct Written {
    pub manifest: Manifest,
    /// Events of the log read after the previous snapshot.
    pub events_read: usize,
    /// Whether the snapshots before it were deleted from the partition (the brokers may refuse).
    pub older_deleted: bool,
}

fn replay_error(kafka: &Kafka, detail: String) -> crate::Error {
    crate::Error::Replay {
        topic: kafka.config().snapshots_topic.clone(),
        detail,
    }
}

/// A reader of the snapshots topic: an offset out of range is an error, never a silent jump.
fn reader(kafka: &Kafka) -> crate::Result<BaseConsumer> {
    let mut client = kafka.client_config(Role::Replay);
    client.set("auto.offset.reset", "error");
    Ok(client.create()?)
}

/// Reads records `from..until` of the snapshots topic's partition `partition` with
/// `consumer`, handing each offset and value to `each`, which says whether to go on. Gives up
/// when nothing arrives for `idle`.
fn read_range(
    kafka: &Kafka,
    consumer: &BaseConsumer,
    partition: i32,
    from: i64,
    until: i64,
    idle: Duration,
    mut each: impl FnMut(i64, &[u8]) -> Result<bool, String>,
) -> crate::Result<()> {
    let topic = &kafka.config().snapshots_topic;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(from))?;
    consumer.assign(&tpl)?;
    let mut last_progress = Instant::now();
    let mut next = from;
    while next < until {
        match consumer.poll(Duration::from_millis(10)) {
            Some(Ok(m)) => {
                last_progress = Instant::now();
                next = m.offset() + 1;
                if m.offset() >= until {
                    break;
                }
                let go_on = each(m.offset(), m.payload().unwrap_or_default())
                    .map_err(|e| replay_error(kafka, format!("partition {partition}: {e}")))?;
                if !go_on {
                    break;
                }
            }
            Some(Err(e)) if crate::partition_log::passing(&e) => {
                tracing::debug!(partition, error = %e, "reading snapshots: librdkafka recovers")
            }
            Some(Err(e)) => return Err(e.into()),
            None if last_progress.elapsed() > idle => {
                return Err(replay_error(
                    kafka,
                    format!("partition {partition}: no record for {idle:?} at offset {next}, before {until}"),
                ))
            }
            None => {}
        }
    }
    Ok(())
}

/// The latest whole snapshot's manifest of partition `partition`, if there is one: the last
/// manifest from the partition's end, looked for in windows growing backwards from it (the
/// last record is a manifest unless a writer stopped in the middle of a snapshot).
pub fn latest(kafka: &Kafka, partition: i32, idle: Duration) -> crate::Result<Option<Manifest>> {
    let consumer = reader(kafka)?;
    let topic = kafka.config().snapshots_topic.clone();
    let (low, high) = consumer.fetch_watermarks(&topic, partition, idle)?;
    let (mut until, mut window) = (high, 4);
    while until > low {
        let from = (until - window).max(low);
        let mut found = None;
        read_range(
            kafka,
            &consumer,
            partition,
            from,
            until,
            idle,
            |offset, value| {
                if is_manifest(value) {
                    if let Record::Manifest(m) = decode(value)? {
                        found = Some((offset, m));
                    }
                }
                Ok(true)
            },
        )?;
        if let Some((_, manifest)) = found {
            return Ok(Some(manifest));
        }
        until = from;
        window *= 4;
    }
    Ok(None)
}

/// Reads the chunks of the snapshot `manifest` describes, in order, handing each one's entries
/// to `each` once its digest is checked: a chunk missing, out of order or changed ends the read
/// with an error (what was handed over until then is a prefix of the snapshot).
pub fn read_chunks(
    kafka: &Kafka,
    manifest: &Manifest,
    idle: Duration,
    each: &mut dyn FnMut(Vec<super::Entry>) -> Result<(), String>,
) -> crate::Result<()> {
    let consumer = reader(kafka)?;
    let topic = kafka.config().snapshots_topic.clone();
    let (_, high) = consumer.fetch_watermarks(&topic, manifest.partition, idle)?;
    let mut index = 0usize;
    read_range(
        kafka,
        &consumer,
        manifest.partition,
        manifest.first_chunk,
        high,
        idle,
        |_, value| {
            if is_manifest(value) || index == manifest.chunks.len() {
                return Ok(index < manifest.chunks.len());
            }
            let Record::Chunk(chunk) = decode(value)? else {
                return Ok(true);
            };
            if chunk.id != manifest.id {
                return Ok(true);
            }
            if chunk.index as usize != index || chunk_digest(value) != manifest.chunks[index] {
                return Err(format!(
                    "chunk {} of snapshot {:x} is not the one its manifest names (expected chunk {index})",
                    chunk.index, manifest.id
                ));
            }
            index += 1;
            each(chunk.entries)?;
            Ok(index < manifest.chunks.len())
        },
    )?;
    if index != manifest.chunks.len() {
        return Err(replay_error(
            kafka,
            format!(
                "partition {}: snapshot {:x} lacks chunks from {index} of {} (deleted?)",
                manifest.partition,
                manifest.id,
                manifest.chunks.len()
            ),
        ));
    }
    Ok(())
}

/// Writes partition `partition`'s next snapshot, when its log holds events after the latest
/// one: that snapshot and the log after it folded ([`Compactor`]), its chunks, then its
/// manifest. The snapshots before it are then deleted from the partition where the brokers
/// allow it (`DeleteRecords`). `now` is the time in ms; with `identity_retention`, the tasks
/// settled longer ago than it are left out ([`Compactor`]).
///
/// Refused when the log no longer holds the events after the latest snapshot (or, without
/// one, its first events): a snapshot must account for every event before it. The manifest's
/// `tail_first` is the start of the last transaction this read met (the run of consecutive
/// offsets it ended with).
pub fn write(
    kafka: &Kafka,
    partition: i32,
    now: u64,
    identity_retention: Option<Duration>,
    idle: Duration,
) -> crate::Result<Option<Written>> {
    let previous = latest(kafka, partition, idle)?;
    let events_topic = kafka.config().events_topic.clone();
    let (low, high) = reader(kafka)?.fetch_watermarks(&events_topic, partition, idle)?;
    let from = previous.as_ref().map_or(0, |m| m.next);
    if previous.as_ref().is_some_and(|m| m.next >= high) {
        return Ok(None);
    }
    if low > from {
        return Err(replay_error(
            kafka,
            format!(
                "partition {partition}: the events topic starts at offset {low}, after {from} where the next snapshot must read it from; the events between are lost to snapshots (its retention is shorter than the time between snapshots)"
            ),
        ));
    }
    let mut compactor = match identity_retention {
        Some(kept_for) => Compactor::forgetting(now.saturating_sub(kept_for.as_millis() as u64)),
        None => Compactor::default(),
    };
    if let Some(previous) = &previous {
        read_chunks(kafka, previous, idle, &mut |entries| {
            entries.into_iter().try_for_each(|e| compactor.previous(e))
        })?;
    }
    let mut tail = LastTransaction::default();
    let mut last = None;
    let mut events_read = 0;
    read_partition(kafka, partition, from, idle, |record| {
        let event = record_event(record)?;
        let timestamp = record.timestamp().to_millis().unwrap_or(0);
        tail.read(record.offset(), timestamp, &event);
        events_read += 1;
        last = Some(super::envelope(&event));
        compactor
            .event(event)
            .map_err(|why| replay_error(kafka, why))
    })?;
    let (Some(logged), Some(last)) = (tail.logged(), last) else {
        return Ok(None);
    };
    if previous.as_ref().is_some_and(|m| m.next >= logged.next) {
        return Ok(None);
    }
    let id = snapshot_id(now, partition);
    let compacted = compactor.entries();
    let tasks = compacted.entries.len() as u64;
    let values = chunks(id, compacted.entries);
    let offsets = produce(kafka, partition, &values, idle)?;
    let manifest = Manifest {
        id,
        partition,
        next: logged.next,
        tail_first: logged.first,
        last,
        first_chunk: offsets.first().copied().unwrap_or(0),
        chunks: values.iter().map(|v| chunk_digest(v)).collect(),
        tasks,
        kept: compacted.kept,
        forgotten: compacted.forgotten,
        written_at: now,
    };
    let at = produce(kafka, partition, &[super::encode_manifest(&manifest)], idle)?;
    let before = offsets.first().copied().unwrap_or(at[0]);
    let older_deleted = !DELETE_REFUSED.load(Ordering::Relaxed)
        && match delete_before(kafka, partition, before, idle) {
            Ok(()) => true,
            Err(e) => {
                // Not asked again: some brokers do not implement it (and one took it badly).
                DELETE_REFUSED.store(true, Ordering::Relaxed);
                tracing::warn!(partition, error = %Chain(&e), "the brokers did not delete the snapshots before the one just written (DeleteRecords); older snapshots stay in the snapshots topic, where they only take room (the latest is found from the end); not asked again until restart");
                false
            }
        };
    Ok(Some(Written {
        manifest,
        events_read,
        older_deleted,
    }))
}

/// Set once the brokers refused to delete older snapshots.
static DELETE_REFUSED: AtomicBool = AtomicBool::new(false);

/// An id for a snapshot: its time and writer, so two writers' chunks never share one.
fn snapshot_id(now: u64, partition: i32) -> u64 {
    let nanos = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH))
        .map_or(0, |d| d.subsec_nanos() as u64);
    (now << 20) ^ nanos ^ (u64::from(std::process::id()) << 40) ^ partition as u64
}

/// Delivery reports, by the index of the record sent.
#[derive(Default)]
struct Acks {
    reports: Mutex<Vec<(usize, Result<i64, String>)>>,
}

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, index: usize) {
        let report = match result {
            Ok(m) => Ok(m.offset()),
            Err((e, _)) => Err(e.to_string()),
        };
        (self.reports.lock().unwrap_or_else(|e| e.into_inner())).push((index, report));
    }
}

/// Produces `values` to the snapshots partition in order and waits for each to be
/// acknowledged; returns their offsets.
fn produce(
    kafka: &Kafka,
    partition: i32,
    values: &[Vec<u8>],
    idle: Duration,
) -> crate::Result<Vec<i64>> {
    let topic = kafka.config().snapshots_topic.clone();
    let producer: BaseProducer<Acks> = kafka
        .client_config(Role::Producer)
        .create_with_context(Acks::default())?;
    let key = partition.to_be_bytes();
    for (i, value) in values.iter().enumerate() {
        let mut record = BaseRecord::with_opaque_to(&topic, i)
            .partition(partition)
            .key(&key[..])
            .payload(&value[..]);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => return Err(e.into()),
            }
        }
    }
    producer.flush(idle)?;
    let mut reports = std::mem::take(
        &mut *(producer.context().reports.lock()).unwrap_or_else(|e| e.into_inner()),
    );
    reports.sort_by_key(|(i, _)| *i);
    if reports.len() != values.len() {
        return Err(replay_error(
            kafka,
            format!(
                "partition {partition}: {} of {} snapshot records acknowledged",
                reports.len(),
                values.len()
            ),
        ));
    }
    reports
        .into_iter()
        .map(|(_, r)| r.map_err(|e| replay_error(kafka, format!("partition {partition}: {e}"))))
        .collect()
}

/// Deletes the records of the snapshots partition before `offset` (`DeleteRecords`).
fn delete_before(kafka: &Kafka, partition: i32, offset: i64, idle: Duration) -> crate::Result<()> {
    let admin: AdminClient<DefaultClientContext> = kafka.client_config(Role::Admin).create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(
        &kafka.config().snapshots_topic,
        partition,
        Offset::Offset(offset),
    )?;
    let opts = AdminOptions::new().operation_timeout(Some(idle));
    // The admin client's answer is a future: awaited on a thread of its own, outside any
    // runtime the caller may be in.
    let done = std::thread::scope(|s| {
        s.spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|_| crate::Error::Thread {
                    what: "snapshot deletion",
                })?;
            Ok::<_, crate::Error>(runtime.block_on(admin.delete_records(&tpl, &opts))?)
        })
        .join()
        .map_err(|_| crate::Error::Thread {
            what: "snapshot deletion",
        })?
    })?;
    for e in done.elements() {
        if let Err(e) = e.error() {
            return Err(e.into());
        }
    }
    Ok(())
}
