//! `sendledger check-broker`: does a broker keep the transactional promises kafka mode stands on?
//!
//! Kafka mode trusts the brokers with three things (docs/architecture.md, "kafka mode"): a
//! transaction's records are visible to a `read_committed` reader once it committed and never
//! before; the next owner's `init_transactions` fences the previous writer of a partition and
//! **aborts** its open transaction; and offsets sent in a transaction become the group's
//! committed offsets with it. Kafka does all three. A Kafka-compatible broker may not, and then
//! a killed owner's half-written transaction (an intent never acted on, or a result whose event
//! is missing) can become part of the log of record. This module plays the scenario on a
//! scratch topic with two producers sharing one `transactional.id` and reports each promise.
//!
//! Blocking: call it from a thread that may block (it waits for the brokers).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::admin::{NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use crate::cluster::Kafka;
use crate::config::Role;
use crate::error::Result;

/// One promise and whether the broker kept it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Stable name, for machines.
    pub name: &'static str,
    /// What kafka mode relies on.
    pub promise: &'static str,
    /// Whether kafka mode's guarantees stand on it. A promise they do not stand on, broken,
    /// costs consumer lag and deliveries read again, never an outcome.
    pub guarantees: bool,
    /// `None` when the promise could not be tried (an earlier step failed).
    pub kept: Option<bool>,
    /// What was observed.
    pub detail: String,
}

/// A promise: its stable name, what kafka mode relies on, and whether its guarantees stand on
/// it (see [`Check::guarantees`]).
type Promise = (&'static str, &'static str, bool);

const TRANSACTIONS: Promise = ("transactions", "a transactional producer initializes", true);
const COMMITTED_VISIBLE: Promise = (
    "committed_visible",
    "a committed transaction's record is visible to read_committed readers",
    true,
);
const OFFSETS_IN_TRANSACTION: Promise = (
    "offsets_in_transaction",
    "offsets sent in a committed transaction become the group's committed offsets",
    true,
);
const OFFSETS_ALONE: Promise = (
    "offsets_alone",
    "a later transaction that carries only offsets commits them",
    false,
);
const OPEN_HIDDEN: Promise = (
    "open_hidden",
    "an open transaction's record is invisible to read_committed readers",
    true,
);
const FENCING_ABORTS: Promise = (
    "fencing_aborts",
    "the next writer's init_transactions aborts the previous writer's open transaction",
    true,
);
const FENCED_REFUSED: Promise = (
    "fenced_refused",
    "the fenced writer can neither write nor commit",
    true,
);

/// How long a reader waits for one more record before it takes what it has as everything
/// visible: long enough for a broker to make a commit visible, short enough for a check that
/// runs a handful of reads.
const READ_IDLE: Duration = Duration::from_millis(1500);

/// Creates `topic` with one partition unless it exists (a scratch topic for the check).
pub async fn ensure_topic(kafka: &Kafka, topic: &str, timeout: Duration) -> Result<()> {
    if kafka.embedded().is_some() {
        // The embedded cluster creates its topics at start (the events topic is the scratch
        // topic there).
        return Ok(());
    }
    let scratch = NewTopic::new(topic, 1, TopicReplication::Fixed(-1));
    kafka.create_topics(&[scratch], timeout, "topic").await
}

/// Plays the fencing scenario on partition 0 of `topic` (which must exist) and reports every
/// promise. `timeout` bounds each call to the brokers. An error means the check could not run
/// at all (no brokers, no topic); a broken promise is a [`Check`] with `kept: Some(false)`.
pub fn check_transactions(kafka: &Kafka, topic: &str, timeout: Duration) -> Result<Vec<Check>> {
    // Unique per run, so earlier runs' records and offsets on the same topic do not count.
    let run = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let run = format!("{run:x}-{}", std::process::id());
    let transactional_id = format!("sendledger.broker-check.{run}");
    let group = format!("sendledger.broker-check.{run}");
    let value = |what: &str| format!("{what}-{run}");
    let producer = |name: &str| -> Result<BaseProducer> {
        let mut client = kafka.client_config(Role::Log);
        client.set("transactional.id", &transactional_id);
        client.set("client.id", format!("sendledger-broker-check-{name}"));
        client.set("transaction.timeout.ms", "60000");
        // The first writer is fenced on purpose; librdkafka's error logs about it would read
        // as a failure of the check (the check reports what happened).
        if name == "first" {
            client.set("log_level", "2");
        }
        Ok(client.create()?)
    };
    let mut checks = Vec::new();
    let mut check = |(name, promise, guarantees): Promise, kept: Option<bool>, detail: String| {
        checks.push(Check {
            name,
            promise,
            guarantees,
            kept,
            detail,
        })
    };

    let first = producer("first")?;
    if let Err(e) = first.init_transactions(timeout) {
        check(
            TRANSACTIONS,
            Some(false),
            format!("init_transactions failed: {e}"),
        );
        return Ok(checks);
    }
    check(
        TRANSACTIONS,
        Some(true),
        "init_transactions succeeded".into(),
    );

    // A committed transaction carrying a record and a consumer group's offset.
    let committed = value("committed");
    let group_client = {
        let mut c = kafka.client_config(Role::Replay);
        c.set("group.id", &group);
        c
    };
    let group_consumer: BaseConsumer = group_client.create()?;
    let sent_offset = 1;
    let Some(metadata) = group_consumer.group_metadata() else {
        check(
            COMMITTED_VISIBLE,
            None,
            "librdkafka gave no group metadata for the check's consumer".into(),
        );
        return Ok(checks);
    };
    let outcome = commit_with_offset(
        &first,
        topic,
        Some(&committed),
        sent_offset,
        &metadata,
        timeout,
    );
    if let Err(e) = outcome {
        check(
            COMMITTED_VISIBLE,
            Some(false),
            format!("the transaction did not commit: {e}"),
        );
        return Ok(checks);
    }
    let seen = visible(kafka, topic, timeout)?;
    check(
        COMMITTED_VISIBLE,
        Some(seen.contains(&committed)),
        found(&seen, &committed),
    );
    let stored = group_offset(&group_consumer, topic, timeout);
    check(
        OFFSETS_IN_TRANSACTION,
        Some(stored == Some(Offset::Offset(sent_offset))),
        offset_found(stored, sent_offset),
    );

    // A transaction with offsets and no records: kafka mode's turn for messages that were all
    // dropped as processed.
    let alone_offset = sent_offset + 1;
    let outcome = commit_with_offset(&first, topic, None, alone_offset, &metadata, timeout);
    if let Err(e) = outcome {
        check(
            OFFSETS_ALONE,
            Some(false),
            format!("the transaction did not commit: {e}"),
        );
        return Ok(checks);
    }
    let stored = group_offset(&group_consumer, topic, timeout);
    check(
        OFFSETS_ALONE,
        Some(stored == Some(Offset::Offset(alone_offset))),
        offset_found(stored, alone_offset),
    );

    // An open transaction, then a second writer with the same transactional.id.
    let open = value("open");
    let outcome = first
        .begin_transaction()
        .and_then(|()| send(&first, topic, &open));
    if let Err(e) = outcome {
        check(
            OPEN_HIDDEN,
            None,
            format!("could not write in a second transaction: {e}"),
        );
        return Ok(checks);
    }
    let seen = visible(kafka, topic, timeout)?;
    check(
        OPEN_HIDDEN,
        Some(!seen.contains(&open)),
        found(&seen, &open),
    );
    let second = producer("second")?;
    let started = Instant::now();
    if let Err(e) = second.init_transactions(timeout) {
        check(
            FENCING_ABORTS,
            None,
            format!("the second writer could not initialize: {e}"),
        );
        return Ok(checks);
    }
    let init_took = started.elapsed();
    let seen = visible(kafka, topic, timeout)?;
    check(
        FENCING_ABORTS,
        Some(!seen.contains(&open)),
        format!(
            "{} (the second writer initialized in {} ms)",
            found(&seen, &open),
            init_took.as_millis()
        ),
    );

    // The fenced writer tries to go on.
    let late = value("late");
    let outcome = send(&first, topic, &late).and_then(|()| first.commit_transaction(timeout));
    let seen = visible(kafka, topic, timeout)?;
    let refused = outcome.is_err() && !seen.contains(&late);
    check(
        FENCED_REFUSED,
        Some(refused),
        match outcome {
            Ok(()) => format!("its commit succeeded; {}", found(&seen, &late)),
            Err(e) => format!("its commit failed ({e}); {}", found(&seen, &late)),
        },
    );
    Ok(checks)
}

/// Produces `value` to partition 0 and waits until it reached the brokers.
fn send(
    producer: &BaseProducer,
    topic: &str,
    value: &str,
) -> std::result::Result<(), rdkafka::error::KafkaError> {
    producer
        .send(BaseRecord::<(), str>::to(topic).partition(0).payload(value))
        .map_err(|(e, _)| e)?;
    producer.flush(Duration::from_secs(10))
}

/// One transaction of `producer`: `value` (if any) on partition 0 of `topic`, and `offset` of
/// that partition for the group of `metadata`.
fn commit_with_offset(
    producer: &BaseProducer,
    topic: &str,
    value: Option<&str>,
    offset: i64,
    metadata: &ConsumerGroupMetadata,
    timeout: Duration,
) -> std::result::Result<(), rdkafka::error::KafkaError> {
    producer.begin_transaction()?;
    if let Some(value) = value {
        send(producer, topic, value)?;
    }
    let mut offsets = TopicPartitionList::new();
    offsets.add_partition_offset(topic, 0, Offset::Offset(offset))?;
    producer.send_offsets_to_transaction(&offsets, metadata, timeout)?;
    producer.commit_transaction(timeout)
}

/// The group's committed offset of partition 0 of `topic`, if it has one.
fn group_offset(consumer: &BaseConsumer, topic: &str, timeout: Duration) -> Option<Offset> {
    let mut asked = TopicPartitionList::new();
    asked.add_partition(topic, 0);
    consumer
        .committed_offsets(asked, timeout)
        .ok()
        .and_then(|l| l.find_partition(topic, 0).map(|p| p.offset()))
}

fn offset_found(stored: Option<Offset>, sent: i64) -> String {
    match stored {
        Some(Offset::Offset(o)) => format!("the group's committed offset is {o}, {sent} was sent"),
        _ => format!("the group has no committed offset, {sent} was sent"),
    }
}

fn found(seen: &[String], value: &str) -> String {
    let state = if seen.iter().any(|v| v == value) {
        "visible"
    } else {
        "not visible"
    };
    format!("its record is {state} to a read_committed reader")
}

/// Every value a `read_committed` reader sees on partition 0 of `topic` now: read from the
/// start until no record came for [`READ_IDLE`].
fn visible(kafka: &Kafka, topic: &str, timeout: Duration) -> Result<Vec<String>> {
    let mut client = kafka.client_config(Role::Replay);
    client.set("isolation.level", "read_committed");
    let consumer: BaseConsumer = client.create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + timeout;
    let mut last = Instant::now();
    let mut values = Vec::new();
    while last.elapsed() < READ_IDLE && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(50)) {
            Some(Ok(m)) => {
                last = Instant::now();
                values.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    Ok(values)
}
