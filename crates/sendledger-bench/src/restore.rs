//! `sendledger-bench restore`: a kafka-mode take-over's restore of one partition on an empty
//! disk, whole and in its parts. A partition's log is written with generated task histories
//! (the audit benchmark's), in transactions as kafka mode writes it; then the log is read
//! without decoding its records (the brokers and librdkafka), read and decoded, its records
//! decoded in memory alone (the codec), its events applied to an empty ledger without Kafka
//! (the store, split into preparing each step and writing it), and finally restored whole by
//! the take-over's own code (`take_over::restore`: reading on a thread of its own while the
//! steps are applied) into another empty ledger, which is the number a take-over sees.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use sendledger_core::result::event_id;
use sendledger_core::{Event, TaskId};
use sendledger_kafka::partition_log::{read_partition, record_event};
use sendledger_kafka::take_over::{self, LedgerCopy, RESTORE_STEP, TAKE_OVER_TIMEOUT};
use sendledger_kafka::{
    event_from_payload, events_source, record_headers, Attributes, EventEncoding, Kafka,
    KafkaConfig, LogBatch, LogRecord, LogReplicator, PartitionLog, RecordKind,
};
use sendledger_store::{restore_append, Durability, Ledger, LedgerOptions, Logged, Memory};

use crate::kafka::round4;

#[derive(Args)]
pub struct RestoreArgs {
    /// Bootstrap servers of brokers that support transactions (e.g. `127.0.0.1:9092`);
    /// `scripts/bench-restore` starts one.
    #[arg(long)]
    brokers: String,
    /// Tasks in the partition's log (5.3 events each on average).
    #[arg(long, default_value_t = 50_000)]
    tasks: u64,
    /// Events per transaction when the log is written.
    #[arg(long, default_value_t = 1_000)]
    per_transaction: usize,
    /// Seed of the generated histories.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Measures a take-over from a snapshot instead: after `--tasks` tasks, a snapshot of the
    /// log is written (`kafka.snapshot_interval`'s writer), then this many tasks more; the
    /// restore on an empty disk reads the snapshot and the log after it. The tasks before the
    /// last 10,000 of the snapshot all settled (the generator's unsettled ones are left out),
    /// so that the work under way is the same whatever the history. The parts of a whole-log
    /// restore are not measured then.
    #[arg(long)]
    snapshot_tail: Option<u64>,
    /// With `--snapshot-tail`: the snapshot keeps the identities of the last this many tasks
    /// before it only, as an identity retention covering the time they took would
    /// (`storage.identity_retention`); the others are forgotten. All by default.
    #[arg(long)]
    keep_identities: Option<u64>,
    /// How the log's events are written (`kafka.events_encoding`): `json` or `binary`.
    #[arg(long, default_value = "json", value_parser = parse_encoding)]
    events_encoding: EventEncoding,
}

/// The records' values of `events` in the log's encoding (`kafka.events_encoding`).
fn payloads(kafka: &Kafka, events: &[Event]) -> anyhow::Result<Vec<Vec<u8>>> {
    let encoding = kafka.config().events_encoding;
    Ok(events
        .iter()
        .map(|e| encoding.payload(e))
        .collect::<Result<_, _>>()?)
}

/// An encoding by the name the configuration gives it (`kafka.events_encoding`).
fn parse_encoding(s: &str) -> Result<EventEncoding, String> {
    use serde::de::{value::Error, Deserialize, IntoDeserializer};
    EventEncoding::deserialize(s.into_deserializer()).map_err(|e: Error| e.to_string())
}

pub fn run(args: RestoreArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.tasks > 0, "--tasks must be positive");
    anyhow::ensure!(
        args.per_transaction > 0,
        "--per-transaction must be positive"
    );
    let run_id = crate::kafka::run_id("bench-restore")?;
    let config = KafkaConfig {
        brokers: args.brokers.clone(),
        group_id: run_id.clone(),
        requests_topic: format!("{run_id}.requests"),
        results_topic: format!("{run_id}.results"),
        events_topic: format!("{run_id}.events"),
        snapshots_topic: format!("{run_id}.snapshots"),
        snapshot_interval: args.snapshot_tail.map(|_| Duration::from_secs(600)),
        events_encoding: args.events_encoding,
        partitions: 1,
        ..KafkaConfig::default()
    };
    let kafka = Kafka::connect(config)?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(kafka.ensure_topics(-1, Duration::from_secs(30), true))?;

    if let Some(tail) = args.snapshot_tail {
        return from_snapshot(&kafka, &args, tail);
    }
    let events = crate::audit::sample_events(args.seed, args.tasks);
    let payloads = payloads(&kafka, &events)?;
    let bytes: usize = payloads.iter().map(Vec::len).sum();
    let count = events.len();

    let started = Instant::now();
    write_log(&kafka, &events, &payloads, args.per_transaction)?;
    let write_secs = started.elapsed().as_secs_f64();

    // The brokers and librdkafka: every record handed over, none decoded.
    let started = Instant::now();
    let mut read = 0usize;
    read_partition(&kafka, 0, 0, TAKE_OVER_TIMEOUT, |_| {
        read += 1;
        Ok(())
    })?;
    let read_secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(read == count, "read {read} records of {count}");

    let started = Instant::now();
    let mut decoded = 0usize;
    read_partition(&kafka, 0, 0, TAKE_OVER_TIMEOUT, |record| {
        record_event(record)?;
        decoded += 1;
        Ok(())
    })?;
    let read_decode_secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(decoded == count, "decoded {decoded} records of {count}");

    // The codec alone, in memory.
    let started = Instant::now();
    for payload in &payloads {
        event_from_payload(payload)?;
    }
    let decode_secs = started.elapsed().as_secs_f64();

    // The store alone: the restore's steps applied to an empty ledger.
    let dir = tempfile::tempdir()?;
    let ledger = open_ledger(&dir.path().join("applied"))?;
    let (mut prepare, mut write) = (Duration::ZERO, Duration::ZERO);
    for (i, step) in events.chunks(RESTORE_STEP).enumerate() {
        let at = Instant::now();
        let restored = restore_append(&ledger, step.to_vec())?;
        let next = ((i + 1) * RESTORE_STEP) as i64;
        let (append, _) = restored.into_append(0, Some(Logged { first: next, next }));
        prepare += at.elapsed();
        let at = Instant::now();
        ledger.append_blocking(append)?;
        write += at.elapsed();
    }
    drop(ledger);

    // The whole restore, as a take-over runs it.
    let ledger = open_ledger(&dir.path().join("restored"))?;
    // A take-over opens the partition's log first, fencing every earlier writer.
    let _log = PartitionLog::open(&kafka, 0, TAKE_OVER_TIMEOUT)?;
    let started = Instant::now();
    let restore = take_over::restore(&kafka, &LedgerCopy { ledger: &ledger }, 0, RESTORE_STEP)
        .map_err(anyhow::Error::msg)
        .context("restoring the partition")?;
    let restore_secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        restore.events == count,
        "the restore applied {} events of {count}",
        restore.events
    );
    let tasks = ledger.task_summaries_of(&[events[0].task_id])?;
    anyhow::ensure!(
        tasks[0].is_some(),
        "the restored ledger lacks the first task"
    );

    let rate = |secs: f64| (count as f64 / secs).round();
    let report = serde_json::json!({
        "benchmark": "restore",
        "tasks": args.tasks,
        "events": count,
        "events_encoding": args.events_encoding,
        "record_bytes_mean": (bytes as f64 / count as f64).round(),
        "per_transaction": args.per_transaction,
        "write_secs": round4(write_secs),
        "read_only": {"secs": round4(read_secs), "events_per_sec": rate(read_secs)},
        "read_and_decode": {"secs": round4(read_decode_secs), "events_per_sec": rate(read_decode_secs)},
        "decode_in_memory": {"secs": round4(decode_secs), "events_per_sec": rate(decode_secs)},
        "apply_without_kafka": {
            "secs": round4((prepare + write).as_secs_f64()),
            "events_per_sec": rate((prepare + write).as_secs_f64()),
            "prepare_secs": round4(prepare.as_secs_f64()),
            "write_secs": round4(write.as_secs_f64()),
        },
        "take_over_restore": {
            "secs": round4(restore_secs),
            "events_per_sec": rate(restore_secs),
            "applying_secs": round4(restore.applying.as_secs_f64()),
        },
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// Of the tasks before a snapshot, the last this many may be unsettled: the work under way.
/// Those older than them all settled, as in a service that has run for a while (a task stays
/// unsettled until its deadline, or in review until someone acts), so the snapshot's unsettled
/// part does not grow with the history before it.
const UNDER_WAY: u64 = 10_000;

/// `tasks` generated tasks, one after the other, the first `tasks - recent` of them settled
/// (the generator leaves about 2% of its tasks unsettled wherever they are: those are replaced
/// by the next settled ones).
fn settled_history(seed: u64, tasks: u64, recent: u64) -> anyhow::Result<Vec<Event>> {
    let old = tasks.saturating_sub(recent);
    // Enough generated tasks for the unsettled ones left out.
    let generated = crate::audit::sample_events(seed, tasks + old / 20 + 100);
    let (mut events, mut kept) = (Vec::new(), 0u64);
    for task in generated.chunk_by(|a, b| a.task_id == b.task_id) {
        if kept == tasks {
            break;
        }
        if kept < old && !sendledger_core::fold(task).phase.is_terminal() {
            continue;
        }
        events.extend_from_slice(task);
        kept += 1;
    }
    anyhow::ensure!(kept == tasks, "too few tasks generated");
    for (lsn, e) in (1..).zip(&mut events) {
        e.lsn = lsn;
    }
    Ok(events)
}

/// `--snapshot-tail`: the log of `args.tasks` tasks, a snapshot of it, `tail` tasks more, and
/// the take-over's restore on an empty disk, which begins from the snapshot.
fn from_snapshot(kafka: &Kafka, args: &RestoreArgs, tail: u64) -> anyhow::Result<()> {
    let mut events = settled_history(args.seed, args.tasks + tail, UNDER_WAY + tail)?;
    // Tasks 16 ms apart, as if they came one after the other (the generated ones share one
    // start time), so that an identity retention reaches back to a given task.
    let (mut task, mut previous) = (0u64, None);
    for e in &mut events {
        if previous != Some(e.task_id) {
            (task, previous) = (task + 1, Some(e.task_id));
        }
        e.at += task * 16;
    }
    // The first event of task number `args.tasks` (a task's events are contiguous).
    let mut seen = std::collections::HashSet::new();
    let split = (events.iter())
        .position(|e| seen.insert(e.task_id) && seen.len() as u64 > args.tasks)
        .unwrap_or(events.len());
    let payloads = payloads(kafka, &events)?;
    let started = Instant::now();
    write_log(
        kafka,
        &events[..split],
        &payloads[..split],
        args.per_transaction,
    )?;
    let write_secs = started.elapsed().as_secs_f64();

    // An identity retention reaching back to the first of the last `keep` tasks.
    let now = now_ms()?;
    let identity_retention = match args.keep_identities {
        Some(keep) => {
            let mut seen = std::collections::HashSet::new();
            let oldest = args.tasks.saturating_sub(keep);
            let at = (events[..split].iter())
                .find(|e| seen.insert(e.task_id) && seen.len() as u64 > oldest)
                .map_or(now, |e| e.at);
            Some(Duration::from_millis(now.saturating_sub(at)))
        }
        None => None,
    };
    let started = Instant::now();
    let written =
        sendledger_kafka::snapshot::write(kafka, 0, now, identity_retention, TAKE_OVER_TIMEOUT)?
            .context("no snapshot written")?;
    let snapshot_secs = started.elapsed().as_secs_f64();
    write_log(
        kafka,
        &events[split..],
        &payloads[split..],
        args.per_transaction,
    )?;

    let dir = tempfile::tempdir()?;
    let ledger = open_ledger(dir.path())?;
    let _log = PartitionLog::open(kafka, 0, TAKE_OVER_TIMEOUT)?;
    let started = Instant::now();
    let restore = take_over::restore(kafka, &LedgerCopy { ledger: &ledger }, 0, RESTORE_STEP)
        .map_err(anyhow::Error::msg)
        .context("restoring the partition")?;
    let restore_secs = started.elapsed().as_secs_f64();
    let manifest = restore
        .snapshot
        .as_ref()
        .context("the restore used no snapshot")?;
    anyhow::ensure!(
        manifest.id == written.manifest.id,
        "another snapshot was used"
    );
    let counts = ledger.task_counts()?;
    let known: u64 = counts.by_phase.values().sum();
    let forgotten = written.manifest.forgotten;
    anyhow::ensure!(
        known + forgotten == args.tasks + tail,
        "the restored ledger knows {known} tasks of {} ({forgotten} forgotten)",
        args.tasks + tail
    );
    let report = serde_json::json!({
        "benchmark": "restore-from-snapshot",
        "events_encoding": args.events_encoding,
        "tasks_before_snapshot": args.tasks,
        "events_before_snapshot": split,
        "tasks_after_snapshot": tail,
        "events_after_snapshot": events.len() - split,
        "write_secs": round4(write_secs),
        "snapshot": {
            "write_secs": round4(snapshot_secs),
            "tasks": written.manifest.tasks,
            "kept": written.manifest.kept,
            "forgotten": forgotten,
            "chunks": written.manifest.chunks.len(),
        },
        "take_over_restore": {
            "secs": round4(restore_secs),
            "applying_secs": round4(restore.applying.as_secs_f64()),
            "events_applied": restore.events,
        },
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

fn now_ms() -> anyhow::Result<u64> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    Ok(now.as_millis() as u64)
}

/// Writes `events` (with their records' `payloads`) to events partition 0 in transactions of
/// `per_transaction` events, each with the results its events announce, as the partition's
/// owner writes them (a log whose last results are missing would have them published again).
fn write_log(
    kafka: &Kafka,
    events: &[Event],
    payloads: &[Vec<u8>],
    per_transaction: usize,
) -> anyhow::Result<()> {
    let log = PartitionLog::open(kafka, 0, TAKE_OVER_TIMEOUT)?;
    let source = events_source(&kafka.config().group_id);
    let replicator = LogReplicator::<PartitionLog>::new(&kafka.config().group_id);
    // Where each task's events begin (a task's events are contiguous here).
    let mut first: HashMap<TaskId, usize> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        first.entry(e.task_id).or_insert(i);
    }
    for (n, (chunk, payloads)) in (events.chunks(per_transaction))
        .zip(payloads.chunks(per_transaction))
        .enumerate()
    {
        let start = n * per_transaction;
        // A task's events before this transaction.
        let history = |task: TaskId| Ok(events[first[&task]..start.max(first[&task])].to_vec());
        let results = replicator
            .results_of(0, chunk, &history)
            .map_err(|e| anyhow::anyhow!("projecting the results: {e:?}"))?;
        let batch = LogBatch {
            events: (chunk.iter().zip(payloads))
                .map(|(e, payload)| LogRecord {
                    key: e.task_id.to_string(),
                    headers: record_headers(&Attributes {
                        id: &event_id(e.task_id, e.task_seq),
                        source: &source,
                        kind: &RecordKind::Event(e.body.name()).ce_type(),
                        content_type: kafka.config().events_encoding.content_type(),
                        at_ms: e.at,
                        trace: None,
                    }),
                    payload: payload.clone(),
                })
                .collect(),
            results,
            ..LogBatch::default()
        };
        log.commit(&batch, None)
            .map_err(|e| anyhow::anyhow!("writing the log: {e:?}"))?;
    }
    Ok(())
}

/// An empty ledger as kafka mode opens one (durable writes, the service's default memory).
fn open_ledger(dir: &std::path::Path) -> anyhow::Result<Ledger> {
    let options = LedgerOptions {
        durability: Durability::Sync,
        memory: Memory::default(),
        replicated: true,
        archive: None,
    };
    Ok(Ledger::open(dir, options)?)
}
