//! The audit of an events topic: the same checks as the audit of a local ledger, on what
//! sendledger published.
//!
//! Every partition is read from its low watermark to the high watermark seen at the start, and
//! each record is read back into the ledger event it announces. A task's records share a key,
//! so they are in one partition in LSN order, but the order across partitions is lost: events
//! are grouped by task and each task is checked with the shared [`TaskAudit`] once everything
//! is read. So this mode holds every event of the topic in memory (roughly a kilobyte per
//! event); for very large topics, audit the ledger itself. A batch the publisher delivered
//! twice appears twice with the same LSN and the same content; such copies count once.
//!
//! LSNs are checked to run from 1 without a gap, and no LSN may hold two different events. A
//! topic whose retention already dropped its oldest records reports them as a gap. The index
//! and summary checks exist only for a local ledger and are listed as skipped. A topic written
//! in kafka mode (records without LSN, from several instances, in transactions) is read as a
//! `read_committed` consumer, each task's events in sequence order, and the LSN check is listed
//! as skipped.
//!
//! Blocking: call it from a thread of its own (or `spawn_blocking`).

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use sendledger_core::audit::{AuditReport, Finding, Integrity, LsnSequence, TaskAudit};
use sendledger_core::error::Chain;
use sendledger_core::{CheckConfig, Event, TaskId};

use crate::cluster::Kafka;
use crate::config::Role;
use crate::error::{Error, Result};
use crate::records::event_from_payload;

/// Longest wait for metadata or the next record before the replay gives up.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Replays `topic` and audits it. `progress` is called with the records read and the total.
pub fn audit_topic(
    kafka: &Kafka,
    topic: &str,
    config: CheckConfig,
    mut progress: impl FnMut(u64, u64),
) -> Result<AuditReport> {
    let failed = |detail: String| Error::Replay {
        topic: topic.to_string(),
        detail,
    };
    let consumer: BaseConsumer = kafka.client_config(Role::Replay).create()?;
    let metadata = consumer.fetch_metadata(Some(topic), TIMEOUT)?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(failed(
            "the topic does not exist or has no partitions; check the name and --brokers".into(),
        ));
    }
    // The end of each partition as it is now: records produced later are not audited.
    let mut ends = BTreeMap::new();
    let mut assignment = TopicPartitionList::new();
    let mut total = 0u64;
    for p in partitions {
        let (low, high) = consumer.fetch_watermarks(topic, p, TIMEOUT)?;
        if high > low {
            ends.insert(p, high);
            assignment.add_partition_offset(topic, p, Offset::Offset(low))?;
            total += (high - low) as u64;
        }
    }
    consumer.assign(&assignment)?;

    let mut report = AuditReport {
        source: format!("kafka topic {topic}"),
        skipped_checks: vec![
            "index-consistent: the task index and summaries exist only in a local ledger".into(),
        ],
        ..AuditReport::default()
    };
    let mut tasks: BTreeMap<TaskId, Vec<Event>> = BTreeMap::new();
    let mut last_progress = std::time::Instant::now();
    while !ends.is_empty() {
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            // Past a partition's last record only transaction markers (or records of aborted
            // transactions, which a read_committed consumer skips) may remain: its position
            // says whether it was read to its end.
            let positions = consumer.position()?;
            ends.retain(|&p, end| {
                !matches!(positions.find_partition(topic, p).map(|e| e.offset()), Some(Offset::Offset(o)) if o >= *end)
            });
            if !ends.is_empty() && last_progress.elapsed() > TIMEOUT {
                return Err(failed(format!(
                    "no record within {TIMEOUT:?} while partitions {:?} were not read to their end",
                    ends.keys().collect::<Vec<_>>()
                )));
            }
            continue;
        };
        let message = message?;
        last_progress = std::time::Instant::now();
        let (partition, offset) = (message.partition(), message.offset());
        match ends.get(&partition) {
            Some(&end) if offset < end => {
                if offset + 1 >= end {
                    ends.remove(&partition);
                }
            }
            _ => continue,
        }
        report.events += 1;
        if report.events % 10_000 == 0 || ends.is_empty() {
            progress(report.events, total);
        }
        let event = event_from_payload(message.payload().unwrap_or_default())
            .map_err(|e| Chain(&e).to_string());
        match event {
            Ok(event) => tasks.entry(event.task_id).or_default().push(event),
            Err(e) => report.violations.push(Finding::integrity(
                Integrity::EventDecodable,
                None,
                vec![],
                format!("record {topic}/{partition}@{offset}: {e}"),
            )),
        }
    }

    // Records of kafka mode carry no LSN (0): several instances write the topic, each event at
    // its partition and offset, and a task's events are ordered by their sequence numbers.
    let positioned = tasks.values().flatten().any(|e| e.lsn > 0);
    if !positioned {
        report.skipped_checks.push(
            "lsn-contiguous: the topic was written in kafka mode, where events carry no LSN; each task's events are checked in sequence order".into(),
        );
    }
    let mut lsns = Vec::with_capacity(report.events as usize);
    for (task, mut events) in tasks {
        events.sort_by_key(|e| (e.lsn, e.task_seq));
        events.dedup();
        let mut audit = TaskAudit::new(task, config);
        for event in &events {
            if positioned {
                lsns.push(event.lsn);
            }
            audit.push(event, &mut report);
        }
        audit.finish(&mut report);
    }
    lsns.sort_unstable();
    let mut sequence = LsnSequence::default();
    for (i, &lsn) in lsns.iter().enumerate() {
        if i > 0 && lsns[i - 1] == lsn {
            report.violations.push(Finding::integrity(
                Integrity::LsnContiguous,
                None,
                vec![lsn],
                format!("LSN {lsn} holds two different events"),
            ));
        }
        sequence.push(lsn, &mut report);
    }
    report.last_lsn = lsns.last().copied().unwrap_or(0);
    Ok(report)
}
