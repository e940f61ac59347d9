//! Kafka mode's partition snapshots against Apache Kafka (three brokers): a take-over on an
//! empty disk reads the latest snapshot and the log after it, even once the events topic's
//! retention removed the events the snapshot stands for, and the new owner writes the next
//! snapshot itself.

use std::time::Duration;

use sendledger_core::{Event, EventBody, Phase, Source};
use sendledger_kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use sendledger_kafka::take_over;
use sendledger_kafka::{snapshot, Kafka, PartitionLog, Role};
use sendledger_store::{Ledger, LedgerOptions};
use sendledger_tests::engine::{settled, task_id, wait_for};
use sendledger_tests::kafka::{config_for_process, produce, request_messages, Broker};

use crate::log::{kafka_mode_service_with, post_records, write_tasks};

const TIMEOUT: Duration = Duration::from_secs(20);

/// Restores partition 0 into `ledger` as a take-over does, from `brokers`.
fn restore_into(brokers: &Retaining, ledger: &Ledger) -> Result<take_over::Restore, String> {
    let _log = take_over::Brokers::open(brokers, 0).unwrap();
    take_over::restore(brokers, &take_over::LedgerCopy { ledger }, 0, 1_000)
}

/// A copy restored from the snapshot and the log after it, which ends at `end`: it knows
/// `tasks` tasks, `sending` of them sending, its checkpoint is after the last event (the
/// marker of its transaction ends the log), and the first settled task is what the snapshot
/// keeps of it, then the redelivery logged after it.
fn assert_restored(ledger: &Ledger, tasks: usize, sending: usize, end: i64) {
    let counts = ledger.task_counts().unwrap();
    let known: u64 = counts.by_phase.values().sum();
    assert_eq!(known, tasks as u64, "{counts:?}");
    let sending_now = counts.by_phase.get(&Phase::Sending).copied();
    assert_eq!(sending_now, Some(sending as u64));
    assert_eq!(ledger.log_checkpoint(0).unwrap(), Some(end - 1));
    let events = ledger.task_events(task_id(&key(sending))).unwrap();
    let names: Vec<(u32, &str)> = events.iter().map(|e| (e.task_seq, e.body.name())).collect();
    assert_eq!(names, [(0, "Pruned"), (3, "DuplicateDelivery")]);
}

fn key(i: usize) -> String {
    format!("snap-{i}")
}

/// The first offset and the end of `topic`'s partition 0.
fn watermarks(kafka: &Kafka, topic: &str) -> (i64, i64) {
    let consumer: BaseConsumer = kafka.client_config(Role::Replay).create().unwrap();
    consumer.fetch_watermarks(topic, 0, TIMEOUT).unwrap()
}

/// The brokers as a take-over reads them, with the events topic's retention modeled: the
/// events of partition 0 before `start` are gone (without waiting for the broker's
/// retention). A read from before `start` fails, as a consumer whose
/// offset is out of range does; a look for an event before it finds the first one after.
struct Retaining<'a> {
    kafka: &'a Kafka,
    start: i64,
}

impl take_over::Brokers for Retaining<'_> {
    type Log = PartitionLog;

    fn open(&self, partition: i32) -> Result<PartitionLog, String> {
        self.kafka.open(partition)
    }

    fn event_at(&self, partition: i32, offset: i64) -> Result<(i64, Option<(i64, Event)>), String> {
        self.kafka.event_at(partition, offset.max(self.start))
    }

    fn read(
        &self,
        partition: i32,
        from: i64,
        each: &mut dyn FnMut(i64, i64, Event) -> Result<(), String>,
    ) -> Result<(), String> {
        if from < self.start {
            return Err(format!(
                "offset {from} is out of range: the log starts at {}",
                self.start
            ));
        }
        self.kafka.read(partition, from, each)
    }

    fn log_start(&self, _partition: i32) -> Result<i64, String> {
        Ok(self.start)
    }

    fn latest_snapshot(&self, partition: i32) -> Result<Option<snapshot::Manifest>, String> {
        self.kafka.latest_snapshot(partition)
    }

    fn read_snapshot(
        &self,
        manifest: &snapshot::Manifest,
        each: &mut dyn FnMut(Vec<snapshot::Entry>) -> Result<(), String>,
    ) -> Result<(), String> {
        self.kafka.read_snapshot(manifest, each)
    }
}

/// A partition's log holds 2,000 tasks (5 left sending, their records at the remote); a
/// snapshot is written after them, then 100 more tasks and a redelivery of the first task
/// are logged. Once the events topic's retention removed every event before the snapshot's
/// end (modeled: see [`Retaining`]), the partition is restored on an empty disk from the
/// snapshot and the log after it, and so is a standby's copy, and a copy an instance made
/// when the log held 1,000 tasks (older than the log's start now) is brought up to the
/// snapshot and the log after it. And an instance on an empty disk (the service, against the
/// brokers) takes the partition over from the snapshot and the log after it: it knows every task (the settled ones of the snapshot by what retention keeps of
/// them), its ledger holds only the events after the snapshot and those of the tasks left
/// sending, which it confirms by lookup, and a redelivery of early requests is a duplicate
/// answered with the stored result: nothing is sent. The new owner then writes the next
/// snapshot itself, from the previous one and the log after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_empty_disk_takes_a_partition_over_from_its_snapshot_and_the_log_after_it() {
    const TASKS: usize = 2_000;
    const SENDING: usize = 5;
    const LATER: usize = 100;
    let broker = tokio::task::block_in_place(Broker::cluster);
    let mut config = config_for_process(&broker);
    config.partitions = 1;
    config.snapshot_interval = Some(Duration::from_secs(1));
    let kafka = Kafka::connect(config).unwrap();
    kafka
        .ensure_topics(kafka.config().replication_factor, TIMEOUT, true)
        .await
        .unwrap();
    let sim = sendledger_sim::Sim::start(Default::default())
        .await
        .unwrap();
    let sending = |i: usize| i < SENDING;

    // An instance that restored the partition when it held its first 1,000 tasks, then went
    // away: its copy stays there.
    let behind_dir = tempfile::tempdir().unwrap();
    let behind = Ledger::open(behind_dir.path(), LedgerOptions::default()).unwrap();
    let written = tokio::task::block_in_place(|| {
        write_tasks(&kafka, 0..1_000, &key, &sending, 1_000, Vec::new());
        let from_start = Retaining {
            kafka: &kafka,
            start: 0,
        };
        restore_into(&from_start, &behind).expect("restored from the log's start");
        write_tasks(&kafka, 1_000..TASKS, &key, &sending, 1_000, Vec::new());
        snapshot::write(&kafka, 0, 1_700_000_100_000, None, TIMEOUT).unwrap()
    })
    .expect("a snapshot of a log with events");
    let manifest = written.manifest.clone();
    assert_eq!(written.events_read, TASKS * 3 - SENDING);
    assert_eq!(manifest.tasks, TASKS as u64);
    assert_eq!(
        manifest.kept,
        (TASKS - SENDING) as u64,
        "settled tasks kept compactly"
    );
    let again =
        tokio::task::block_in_place(|| snapshot::write(&kafka, 0, 1, None, TIMEOUT)).unwrap();
    assert!(again.is_none(), "nothing new in the log, no new snapshot");

    // The log goes on: 100 tasks more and a redelivery of the first task recorded.
    let first = task_id(&key(SENDING));
    let redelivered = Event {
        lsn: 0,
        task_id: first,
        task_seq: 3,
        at: 1_700_000_200_000,
        body: EventBody::DuplicateDelivery {
            source: Source {
                topic: "elsewhere".into(),
                partition: 0,
                offset: 1,
            },
        },
    };
    tokio::task::block_in_place(|| {
        write_tasks(
            &kafka,
            TASKS..TASKS + LATER,
            &key,
            &|_| false,
            1_000,
            vec![redelivered],
        );
    });
    let events_topic = kafka.config().events_topic.clone();
    let (_, end) = tokio::task::block_in_place(|| watermarks(&kafka, &events_topic));

    // Once the events topic's retention removed every event before the snapshot's end, a
    // take-over on an empty disk restores the partition from the snapshot and what follows.
    let copied = tempfile::tempdir().unwrap();
    let copy = Ledger::open(copied.path(), LedgerOptions::default()).unwrap();
    let retaining = Retaining {
        kafka: &kafka,
        start: manifest.next,
    };
    let restored = tokio::task::block_in_place(|| restore_into(&retaining, &copy))
        .expect("restored from the snapshot");
    assert_eq!(restored.snapshot.as_ref().map(|m| m.id), Some(manifest.id));
    assert!(restored.truncated.is_none());
    assert_restored(&copy, TASKS + LATER, SENDING, end);
    drop(copy);

    // The copy of the instance that went away is older than the log's start: it is brought
    // up to the snapshot (its settled tasks replaced by what the snapshot keeps of them) and
    // the log after it, and truncated to them.
    let caught_up = tokio::task::block_in_place(|| restore_into(&retaining, &behind))
        .expect("a copy older than the log's start is brought up to its snapshot");
    assert!(
        caught_up.truncated.is_some(),
        "its last event is gone from the log"
    );
    assert_eq!(caught_up.snapshot.as_ref().map(|m| m.id), Some(manifest.id));
    assert_restored(&behind, TASKS + LATER, SENDING, end);
    assert!(
        behind.reviews_owed(0).unwrap().is_empty(),
        "nothing of it was apart from the log"
    );
    drop(behind);

    // A standby's copy on an empty disk begins from the snapshot the same way.
    let followed = tempfile::tempdir().unwrap();
    let standby = Ledger::open(followed.path(), LedgerOptions::default()).unwrap();
    let applied = tokio::task::block_in_place(|| {
        let copy = take_over::LedgerCopy { ledger: &standby };
        sendledger_kafka::standby::catch_up(&retaining, &copy, 0, take_over::QUIESCE)
    })
    .expect("the standby catches up from the snapshot");
    assert!(
        applied > 0 && applied < 1_000,
        "{applied} events applied after the snapshot"
    );
    let counts = standby.task_counts().unwrap();
    assert_eq!(
        counts.by_phase.values().sum::<u64>(),
        (TASKS + LATER) as u64
    );
    assert!(standby.retained(task_id(&key(SENDING))).unwrap().is_some());
    drop(standby);

    // The records of the tasks left sending are at the remote: their attempts got through.
    post_records(&sim, (0..SENDING).map(key)).await;

    let dir = tempfile::tempdir().unwrap();
    let service = kafka_mode_service_with(dir.path(), &kafka, &sim, |_| {}, |_| {}).await;
    let engine = service.engine().clone();
    let ownership = engine.ownership().unwrap().clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while ownership.partitions() != [0] {
        assert!(std::time::Instant::now() < deadline, "not taken over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ledger = engine.ledger();
    let counts = ledger.task_counts().unwrap();
    let total: u64 = counts.by_phase.values().sum();
    assert_eq!(total, (TASKS + LATER) as u64, "{counts:?}");
    let kept = ledger
        .retained(first)
        .unwrap()
        .expect("kept by the snapshot");
    assert_eq!(
        kept.remote_id.as_deref(),
        Some(format!("r-{SENDING}").as_str())
    );
    let logged = ledger.read_log(0, 1_000_000).unwrap().len();
    assert!(
        logged < LATER * 3 + SENDING * 2 + 50,
        "the ledger holds {logged} events: the tail and the tasks left sending, not the history"
    );
    for i in 0..SENDING {
        let state = wait_for(&engine, task_id(&key(i)), TIMEOUT, settled).await;
        assert_eq!(state.phase, Phase::Succeeded, "{}", key(i));
    }
    let events = engine.events(first).await.unwrap();
    let names: Vec<(u32, &str)> = events.iter().map(|e| (e.task_seq, e.body.name())).collect();
    assert_eq!(names, [(0, "Pruned"), (3, "DuplicateDelivery")]);

    // Redeliveries of early requests are duplicates, answered with their stored results.
    let sample: Vec<String> = (SENDING..TASKS).step_by(TASKS / 20).map(key).collect();
    produce(&kafka, request_messages(sample.iter())).await;
    let deadline = std::time::Instant::now() + TIMEOUT;
    for k in &sample {
        loop {
            let events = engine.events(task_id(k)).await.unwrap();
            let duplicates = (events.iter())
                .filter(|e| matches!(e.body, EventBody::DuplicateDelivery { .. }))
                .count();
            let wanted = if *k == key(SENDING) { 2 } else { 1 };
            if duplicates == wanted {
                assert_eq!(events[0].body.name(), "Pruned", "{k}");
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{k}: not a duplicate: {events:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(sim.stats().posts, SENDING as u64, "a task was sent again");

    // The new owner writes the next snapshot: the previous one and the log after it.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let next = loop {
        let latest = tokio::task::block_in_place(|| snapshot::latest(&kafka, 0, TIMEOUT)).unwrap();
        if let Some(m) = latest.filter(|m| m.id != manifest.id && m.next > end) {
            break m;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no snapshot written by the owner"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(next.tasks, (TASKS + LATER) as u64);
    assert_eq!(
        next.kept,
        (TASKS + LATER) as u64,
        "every task settled by now"
    );
    service.shutdown().await.unwrap();
    sim.shutdown().await;
}
