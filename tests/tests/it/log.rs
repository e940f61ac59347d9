//! The events topic as a log of record (kafka mode's building block): one transactional writer
//! per partition, fenced by the next one, read back as a `read_committed` consumer. Against
//! Apache Kafka (three brokers), which fences transactional ids and keeps transactional
//! offsets; the embedded cluster does neither.

use std::time::Duration;

use sendledger_kafka::partition_log::{read_partition, record_event, Committed};
use sendledger_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use sendledger_kafka::rdkafka::client::DefaultClientContext;
use sendledger_kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use sendledger_kafka::rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use sendledger_kafka::rdkafka::{Offset, TopicPartitionList};
use sendledger_kafka::{
    Kafka, KafkaConfig, LogBatch, LogError, LogRecord, PartitionLog, Record, Role,
};

use sendledger_store::Logged;
use sendledger_tests::kafka::{config_for_process, Broker};

const TIMEOUT: Duration = Duration::from_secs(20);

fn records(prefix: &str, n: usize) -> Vec<LogRecord> {
    (0..n)
        .map(|i| LogRecord {
            key: format!("{prefix}-key"),
            headers: vec![(sendledger_kafka::EVENT_ID_HEADER, format!("{prefix}:{i}"))],
            payload: format!("{{\"n\":{i}}}").into_bytes(),
        })
        .collect()
}

/// The event ids of events partition `partition` from `from` on, as a `read_committed`
/// consumer sees them, and where the read ended.
fn committed_event_ids(kafka: &Kafka, partition: i32, from: i64) -> (Vec<String>, i64) {
    let mut ids = Vec::new();
    let end = read_partition(kafka, partition, from, TIMEOUT, |m| {
        let r = Record::from_message(m);
        assert_eq!(r.partition, partition);
        ids.push(r.event_id().unwrap_or_default());
        Ok(())
    })
    .expect("the partition reads back");
    (ids, end)
}

/// The record of `event` on the events topic, as a partition's writer makes it.
pub(crate) fn event_log_record(event: &sendledger_core::Event) -> LogRecord {
    event_log_record_as(event, sendledger_kafka::EventEncoding::Json)
}

/// [`event_log_record`] in `encoding`.
fn event_log_record_as(
    event: &sendledger_core::Event,
    encoding: sendledger_kafka::EventEncoding,
) -> LogRecord {
    let event_id = sendledger_core::result::event_id(event.task_id, event.task_seq);
    LogRecord {
        key: event.task_id.to_string(),
        headers: vec![(sendledger_kafka::EVENT_ID_HEADER, event_id)],
        payload: encoding.payload(event).unwrap(),
    }
}

/// Writes to events partition 0 of `kafka`, as an owner would have, tasks `range` named by
/// `key` (accepted from another requests topic, an intent, and a confirmation as `r-<i>`
/// unless `sending(i)`), in transactions of about `per_transaction` events, each event in its
/// configured encoding (`kafka.events_encoding`); `extra` events go in the last one.
pub(crate) fn write_tasks(
    kafka: &Kafka,
    range: std::ops::Range<usize>,
    key: &dyn Fn(usize) -> String,
    sending: &dyn Fn(usize) -> bool,
    per_transaction: usize,
    extra: Vec<sendledger_core::Event>,
) {
    use sendledger_core::{Event, EventBody, Evidence, Limits, Source};
    let writer = PartitionLog::open(kafka, 0, TIMEOUT).unwrap();
    let encoding = kafka.config().events_encoding;
    let topic = format!("{}.earlier", kafka.config().requests_topic);
    let mut batch = LogBatch::default();
    let last = range.end - 1;
    for i in range {
        let accepted = sendledger_tests::engine::request(&key(i))
            .accept(&Limits::default())
            .unwrap();
        let (id, payload_hash) = (accepted.task_id(), accepted.payload_hash());
        let mut bodies = vec![
            EventBody::TaskAccepted {
                request: accepted,
                payload_hash,
                source: Source {
                    topic: topic.clone(),
                    partition: 0,
                    offset: i as i64,
                },
            },
            EventBody::SendIntended {
                attempt: 1,
                idempotency_key: None,
            },
        ];
        if !sending(i) {
            bodies.push(EventBody::Confirmed {
                remote_id: format!("r-{i}"),
                evidence: Evidence::Response { status: 201 },
            });
        }
        for (seq, body) in bodies.into_iter().enumerate() {
            let event = Event {
                lsn: 0,
                task_id: id,
                task_seq: seq as u32,
                at: 1_700_000_000_000 + i as u64,
                body,
            };
            batch.events.push(event_log_record_as(&event, encoding));
        }
        if i == last {
            batch.events.extend(extra.iter().map(event_log_record));
        }
        if batch.events.len() >= per_transaction || i == last {
            writer.commit(&std::mem::take(&mut batch), None).unwrap();
        }
    }
}

/// Records at `sim` the records of the tasks named `keys`, as their attempts would have.
pub(crate) async fn post_records(sim: &sendledger_sim::Sim, keys: impl Iterator<Item = String>) {
    for key in keys {
        let reference = sendledger_tests::engine::task_id(&key).to_string();
        let body = serde_json::json!({ "request_key": key, "reference": reference });
        let (status, _) = sendledger_tests::http::request(
            &sim.addr().to_string(),
            "POST",
            "/records",
            None,
            Some(body),
        )
        .await;
        assert_eq!(status, 201);
    }
}

/// The events of events partition `partition` from `from` on, as a `read_committed` consumer
/// sees them, and where the read ended.
fn partition_events(
    kafka: &Kafka,
    partition: i32,
    from: i64,
) -> (Vec<sendledger_core::Event>, i64) {
    stable(kafka, partition);
    let mut events = Vec::new();
    let end = read_partition(kafka, partition, from, TIMEOUT, |m| {
        events.push(record_event(m)?);
        Ok(())
    })
    .expect("the partition reads back");
    (events, end)
}

/// Waits until events partition `partition` holds no transaction still being completed: a
/// commit is acknowledged once the transaction coordinator decided it, and its markers reach
/// the partition a moment later, so a `read_committed` reader that starts at once may stop
/// before it (its last stable offset). The partition's last stable offset then reaches its
/// high watermark.
fn stable(kafka: &Kafka, partition: i32) {
    let topic = &kafka.config().events_topic;
    let ends = |isolation: &str| {
        let mut config = kafka.client_config(Role::Replay);
        config.set("isolation.level", isolation);
        let consumer: sendledger_kafka::rdkafka::consumer::BaseConsumer = config.create().unwrap();
        consumer
            .fetch_watermarks(topic, partition, TIMEOUT)
            .unwrap()
            .1
    };
    let deadline = std::time::Instant::now() + TIMEOUT;
    while ends("read_committed") < ends("read_uncommitted") {
        assert!(
            std::time::Instant::now() < deadline,
            "partition {partition} has a transaction under way for {TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_writer_fences_the_old_one_and_readers_see_only_committed_batches() {
    let broker = Broker::cluster();
    let kafka = Kafka::connect(config_for_process(&broker)).unwrap();
    kafka
        .ensure_topics(kafka.config().replication_factor, TIMEOUT, true)
        .await
        .unwrap();
    tokio::task::block_in_place(|| {
        let first = PartitionLog::open(&kafka, 1, TIMEOUT).expect("the first writer opens");
        let one = LogBatch {
            events: records("one", 3),
            results: records("one-result", 1),
            next_request_offset: None,
        };
        let Committed { events, .. } = first.commit(&one, None).expect("a batch commits");
        let (start, end) = events.expect("the events' offsets are reported");
        assert_eq!(end - start, 2, "three events, consecutive offsets");

        let second = PartitionLog::open(&kafka, 1, TIMEOUT).expect("the next writer opens");
        let refused = first
            .commit(
                &LogBatch {
                    events: records("zombie", 2),
                    ..LogBatch::default()
                },
                None,
            )
            .expect_err("the fenced writer cannot commit");
        assert!(refused.is_fenced(), "{refused}");
        assert!(refused.to_string().contains("partition 1"), "{refused}");

        let group: BaseConsumer = kafka.client_config(Role::Ingest).create().unwrap();
        let metadata = group.group_metadata().expect("group metadata");
        second
            .commit(
                &LogBatch {
                    events: records("two", 2),
                    results: Vec::new(),
                    next_request_offset: Some(42),
                },
                Some(&metadata),
            )
            .expect("the new writer commits");

        let (ids, next) = committed_event_ids(&kafka, 1, 0);
        assert_eq!(ids, ["one:0", "one:1", "one:2", "two:0", "two:1"]);
        assert!(next > end, "the read ends after the last record");
        let (rest, _) = committed_event_ids(&kafka, 1, end + 1);
        assert_eq!(rest, ["two:0", "two:1"], "a read from a checkpoint");
        let (none, _) = committed_event_ids(&kafka, 0, 0);
        assert!(none.is_empty(), "partition 0 got {none:?}");

        let topic = kafka.config().requests_topic.clone();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&topic, 1);
        let committed = group.committed_offsets(tpl, TIMEOUT).unwrap();
        assert_eq!(
            committed.find_partition(&topic, 1).map(|p| p.offset()),
            Some(Offset::Offset(42)),
            "the requests offset is committed with the batch"
        );
    });
}

/// A broker that refuses this client transactions: opening the log fails with an error that
/// names what kafka mode needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_refusing_transactions_are_named_at_open() {
    let kafka = tokio::task::block_in_place(|| Kafka::connect(KafkaConfig::default())).unwrap();
    let cluster = kafka.embedded().unwrap();
    cluster.request_errors(
        RDKafkaApiKey::InitProducerId,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED; 4],
    );
    let err = tokio::task::block_in_place(|| PartitionLog::open(&kafka, 0, TIMEOUT))
        .err()
        .expect("the log does not open");
    assert!(matches!(err, LogError::Unsupported { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("storage.mode"), "{text}");
    assert!(text.contains("sendledger.events.0"), "{text}");
}

/// Start-up checks of the events topic as the log of record, each refusal naming the setting:
/// created by sendledger it passes; a partition count unlike the requests topic's, finite
/// retention or compaction are refused; the override accepts finite retention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_topic_must_match_the_requests_topic_and_keep_every_event() {
    let broker = Broker::single();
    let kafka = Kafka::connect(config_for_process(&broker)).unwrap();
    kafka
        .ensure_topics(kafka.config().replication_factor, TIMEOUT, true)
        .await
        .unwrap();
    let checked = kafka
        .check_log_of_record(false, TIMEOUT)
        .await
        .expect("topics sendledger created in kafka mode pass");
    assert_eq!(checked.partitions, kafka.config().partitions);
    let warnings = checked.warnings;
    // One broker: an acknowledged commit lives on one disk, and one replica acknowledges it;
    // the check says both.
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].contains("replication factor 1") && warnings[0].contains("use 3"),
        "{warnings:?}"
    );
    assert!(
        warnings[1].contains("min.insync.replicas = 1") && warnings[1].contains("set 2"),
        "{warnings:?}"
    );

    let n = kafka.config().partitions;
    let admin: AdminClient<DefaultClientContext> =
        kafka.client_config(Role::Admin).create().unwrap();
    let opts = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    let create = |name: &'static str, partitions: i32, settings: &'static [(&str, &str)]| {
        let topic = settings.iter().fold(
            NewTopic::new(name, partitions, TopicReplication::Fixed(1)),
            |t, (k, v)| t.set(k, v),
        );
        let admin = &admin;
        let opts = &opts;
        async move {
            for r in admin.create_topics(&[topic], opts).await.unwrap() {
                r.unwrap();
            }
        }
    };
    let check = |events: &str, allow: bool| {
        let mut config = config_for_process(&broker);
        config.events_topic = events.into();
        let kafka = Kafka::connect(config).unwrap();
        async move { kafka.check_log_of_record(allow, TIMEOUT).await }
    };

    create(
        "events.fewer",
        n - 1,
        &[("retention.ms", "-1"), ("retention.bytes", "-1")],
    )
    .await;
    let err = check("events.fewer", false).await.unwrap_err().to_string();
    assert!(
        err.contains(&format!("events.fewer has {} partitions", n - 1))
            && err.contains(&format!("has {n};")),
        "{err}"
    );

    create("events.week", n, &[("retention.ms", "604800000")]).await;
    let err = check("events.week", false).await.unwrap_err().to_string();
    assert!(err.contains("retention.ms = 604800000"), "{err}");
    assert!(err.contains("allow finite retention"), "{err}");
    check("events.week", true)
        .await
        .expect("the override accepts finite retention");

    // Durability settings that let an acknowledged commit be lost are warned about, each named.
    create(
        "events.unclean",
        n,
        &[
            ("retention.ms", "-1"),
            ("retention.bytes", "-1"),
            ("min.insync.replicas", "1"),
            ("unclean.leader.election.enable", "true"),
        ],
    )
    .await;
    let warnings = check("events.unclean", false).await.unwrap().warnings;
    let all = warnings.join("\n");
    assert_eq!(warnings.len(), 3, "{all}");
    assert!(
        all.contains("min.insync.replicas = 1") && all.contains("set 2"),
        "{all}"
    );
    assert!(
        all.contains("unclean.leader.election.enable = true") && all.contains("set false"),
        "{all}"
    );

    create("events.compacted", n, &[("cleanup.policy", "compact")]).await;
    let err = check("events.compacted", false)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("cleanup.policy = compact"), "{err}");

    let err = check("events.missing", false)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("events.missing does not exist"), "{err}");
}

/// A partition's events, written through its log and read back, rebuild a ledger on an empty
/// disk: the new owner knows every identity (a redelivery is a duplicate, not a second send),
/// every processed offset, and resumes the tasks left unknown, which lookups then confirm.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_restored_on_an_empty_disk_resumes_its_tasks_and_sends_nothing_twice() {
    use sendledger_core::Phase;
    use sendledger_sim::{Faults, Sim, SimConfig};
    use sendledger_store::{restore_append, Ledger, LedgerOptions};
    use sendledger_tests::engine::{request, settled, source, target, task_id, wait_for};

    let sim = Sim::start(SimConfig {
        faults: Faults {
            commit_then_drop: 0.5,
            ..Faults::default()
        },
        lookup_lag: Duration::from_secs(2),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let keys: Vec<String> = (0..20).map(|i| format!("restore-{i}")).collect();
    let (first_dir, second_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = tokio::task::block_in_place(|| {
        sendledger_tests::engine::start(first_dir.path(), target(&sim.base_url(), |_| {}))
    });
    for (i, key) in keys.iter().enumerate() {
        first.submit(request(key), source(i as i64)).await.unwrap();
    }
    let deadline = std::time::Instant::now() + TIMEOUT;
    while sim.stats().posts < keys.len() as u64 {
        assert!(
            std::time::Instant::now() < deadline,
            "not every task was sent"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.shutdown(Duration::from_secs(5)).await;
    let log = Ledger::open_read_only(first_dir.path()).unwrap();
    let events = log.read_log(1, usize::MAX).unwrap();
    let unknown = keys
        .iter()
        .filter(|k| {
            let history: Vec<_> = events
                .iter()
                .filter(|e| e.task_id == task_id(k))
                .cloned()
                .collect();
            sendledger_core::fold(&history).phase == Phase::Unknown
        })
        .count();
    assert!(unknown > 0, "the test needs tasks left unknown");
    drop(log);

    let broker = Broker::cluster();
    let kafka = Kafka::connect(config_for_process(&broker)).unwrap();
    kafka
        .ensure_topics(kafka.config().replication_factor, TIMEOUT, true)
        .await
        .unwrap();
    tokio::task::block_in_place(|| {
        let writer = PartitionLog::open(&kafka, 0, TIMEOUT).unwrap();
        let batch = LogBatch {
            events: events.iter().map(event_log_record).collect(),
            ..LogBatch::default()
        };
        writer.commit(&batch, None).unwrap();

        let (read, _) = partition_events(&kafka, 0, 0);
        assert_eq!(
            read, events,
            "the partition holds the ledger's events, in order"
        );
        let restored = Ledger::open(second_dir.path(), LedgerOptions::default()).unwrap();
        let append = restore_append(&restored, read.clone()).unwrap().append;
        restored.append_blocking(append).unwrap();
        let again = restore_append(&restored, read).unwrap().append;
        assert!(again.events.is_empty(), "a second restore adds nothing");
        let processed = restored.processed("test", 0).unwrap();
        for offset in 0..keys.len() as i64 {
            assert!(processed.contains(offset), "offset {offset} not processed");
        }
    });

    let second = tokio::task::block_in_place(|| {
        sendledger_tests::engine::start(second_dir.path(), target(&sim.base_url(), |_| {}))
    });
    for key in &keys {
        let state = wait_for(&second, task_id(key), TIMEOUT, settled).await;
        assert_eq!(state.phase, Phase::Succeeded, "{key}");
    }
    let posts = sim.stats().posts;
    for (i, key) in keys.iter().enumerate() {
        second
            .submit(request(key), source(100 + i as i64))
            .await
            .unwrap();
    }
    for key in &keys {
        assert_eq!(sim.records_with_identity(key).len(), 1, "{key}");
        let events = second.events(task_id(key)).await.unwrap();
        assert!(
            events
                .iter()
                .any(|e| matches!(e.body, sendledger_core::EventBody::DuplicateDelivery { .. })),
            "{key}: the redelivery is not a duplicate"
        );
    }
    assert_eq!(sim.stats().posts, posts, "a restored task was sent again");
    second.shutdown(Duration::from_secs(5)).await;
    sim.shutdown().await;
}

/// Starts an engine in kafka mode on `dir` with the target `sim`, its ledger recording events
/// only through `replicator`.
fn replicated_engine(
    dir: &std::path::Path,
    sim: &sendledger_sim::Sim,
    replicator: std::sync::Arc<sendledger_kafka::LogReplicator>,
) -> sendledger_actors::Engine {
    use sendledger_tests::engine::{target, targets};
    let mut config = sendledger_actors::EngineConfig::new(dir);
    config.timer_tick = Duration::from_millis(5);
    config.replicated = true;
    let remote = sendledger_node::wiring::HttpRemote::new(targets(target(&sim.base_url(), |_| {})));
    let engine = tokio::task::block_in_place(|| {
        sendledger_actors::Engine::start(config, std::sync::Arc::new(remote))
    })
    .expect("engine starts");
    engine.install_replicator(replicator).expect("a replicator");
    engine
}

/// In kafka mode an engine acts only for the partitions it owns, records a task's events only
/// once its partition's log committed them (results with them), stops recording for a
/// partition whose log another instance took over, and a new owner restores the partition
/// from the log and knows every task of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_engine_in_kafka_mode_records_through_its_partition_log_and_hands_over() {
    use sendledger_actors::Error as EngineError;
    use sendledger_core::{EventBody, Phase, Source};
    use sendledger_kafka::{LogReplicator, TopicReader};
    use sendledger_sim::{Sim, SimConfig};
    use sendledger_tests::engine::{request, settled, task_id, wait_for};
    use std::sync::Arc;

    let broker = Broker::cluster();
    let kafka = Kafka::connect(config_for_process(&broker)).unwrap();
    kafka
        .ensure_topics(kafka.config().replication_factor, TIMEOUT, true)
        .await
        .unwrap();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let topic = kafka.config().requests_topic.clone();
    let source = |offset| Source {
        topic: topic.clone(),
        partition: 1,
        offset,
    };
    let keys: Vec<String> = (0..10).map(|i| format!("kmode-{i}")).collect();

    let first_dir = tempfile::tempdir().unwrap();
    let first_log = Arc::new(LogReplicator::new("sendledger"));
    let first = replicated_engine(first_dir.path(), &sim, first_log.clone());
    let refused = first
        .submit(request(&keys[0]), source(0))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, EngineError::NotOwned { partition: 1, .. }),
        "{refused}"
    );
    let log = tokio::task::block_in_place(|| PartitionLog::open(&kafka, 1, TIMEOUT)).unwrap();
    first_log.own(log);
    first.assign_partition(1).await.unwrap();
    for (i, key) in keys.iter().enumerate() {
        first.submit(request(key), source(i as i64)).await.unwrap();
    }
    for key in &keys {
        let state = wait_for(&first, task_id(key), TIMEOUT, settled).await;
        assert_eq!(state.phase, Phase::Succeeded, "{key}");
    }

    // The log holds every event the ledger recorded, in each task's order.
    let (logged, end) = tokio::task::block_in_place(|| partition_events(&kafka, 1, 0));
    let recorded = first.ledger().read_log(1, usize::MAX).unwrap();
    assert_eq!(logged.len(), recorded.len());
    for (l, r) in logged.iter().zip(&recorded) {
        assert_eq!(
            (l.task_id, l.task_seq, &l.body),
            (r.task_id, r.task_seq, &r.body)
        );
    }
    let checkpoint = first
        .ledger()
        .log_checkpoint(1)
        .unwrap()
        .expect("a checkpoint");
    let (after, _) = tokio::task::block_in_place(|| committed_event_ids(&kafka, 1, checkpoint));
    assert!(
        after.is_empty(),
        "the checkpoint is past every recorded event: {after:?}"
    );
    let results = tokio::task::block_in_place(|| {
        let reader = TopicReader::from_beginning(&kafka, &kafka.config().results_topic).unwrap();
        let mut seen = Vec::new();
        let deadline = std::time::Instant::now() + TIMEOUT;
        while seen.len() < keys.len() && std::time::Instant::now() < deadline {
            if let Some(Ok(r)) = reader.next(Duration::from_millis(100)) {
                seen.push(r.event_id().unwrap_or_default());
            }
        }
        seen
    });
    assert_eq!(
        results.len(),
        keys.len(),
        "one result per task, committed with its events"
    );

    // Another instance opens the partition's log: this one is fenced and records nothing more.
    let second_log = Arc::new(LogReplicator::new("sendledger"));
    let taken = tokio::task::block_in_place(|| PartitionLog::open(&kafka, 1, TIMEOUT)).unwrap();
    let late = first
        .submit(request("kmode-late"), source(50))
        .await
        .unwrap_err();
    assert!(!late.is_transient(), "{late}");
    assert!(!first_log.owns(1), "the fenced partition is given up");
    assert!(first
        .events(task_id("kmode-late"))
        .await
        .unwrap_or_default()
        .is_empty());

    // The new owner restores the partition on an empty disk and knows every task of it.
    let second_dir = tempfile::tempdir().unwrap();
    let second = replicated_engine(second_dir.path(), &sim, second_log.clone());
    let (restored, diverged) = second
        .restore(
            1,
            logged.clone(),
            Some(Logged {
                first: end,
                next: end,
            }),
        )
        .await
        .unwrap();
    assert_eq!(restored, logged.len());
    assert!(diverged.is_empty());
    second_log.own(taken);
    second.assign_partition(1).await.unwrap();
    let posts = sim.stats().posts;
    for (i, key) in keys.iter().enumerate() {
        second
            .submit(request(key), source(100 + i as i64))
            .await
            .unwrap();
        let events = second.events(task_id(key)).await.unwrap();
        assert!(
            matches!(
                events.last().map(|e| &e.body),
                Some(EventBody::DuplicateDelivery { .. })
            ),
            "{key}: {events:?}"
        );
        assert_eq!(sim.records_with_identity(key).len(), 1, "{key}");
    }
    assert_eq!(sim.stats().posts, posts, "a restored task was sent again");
    second
        .submit(request("kmode-late"), source(60))
        .await
        .unwrap();
    let state = wait_for(&second, task_id("kmode-late"), TIMEOUT, settled).await;
    assert_eq!(state.phase, Phase::Succeeded);
    assert_eq!(sim.records_with_identity("kmode-late").len(), 1);

    first.shutdown(Duration::from_secs(5)).await;
    second.shutdown(Duration::from_secs(5)).await;
    sim.shutdown().await;
}

/// A service in kafka mode on `dir`, against the brokers of `kafka`, with the target
/// `sim`.
async fn kafka_mode_service(
    dir: &std::path::Path,
    kafka: &Kafka,
    sim: &sendledger_sim::Sim,
) -> sendledger_node::service::Service {
    kafka_mode_service_with(dir, kafka, sim, |_| {}, |_| {}).await
}

/// [`kafka_mode_service`], its configuration changed by `change` and its target's by `target`.
pub(crate) async fn kafka_mode_service_with(
    dir: &std::path::Path,
    kafka: &Kafka,
    sim: &sendledger_sim::Sim,
    change: impl FnOnce(&mut sendledger_node::config::Config),
    target: impl FnOnce(&mut serde_json::Value),
) -> sendledger_node::service::Service {
    use sendledger_node::config::{Config, StorageMode};
    let mut config = Config::default();
    config.storage.data = dir.to_path_buf();
    config.storage.mode = StorageMode::Kafka;
    config.engine.timer_tick = Duration::from_millis(5);
    config.kafka = kafka.config().clone();
    config.admin.enabled = false;
    config.targets.insert(
        "sim".into(),
        sendledger_tests::engine::target(&sim.base_url(), target),
    );
    change(&mut config);
    config
        .validate(&Default::default())
        .expect("a valid config");
    let remote = std::sync::Arc::new(sendledger_node::wiring::HttpRemote::new(
        config.load_targets().unwrap(),
    ));
    sendledger_node::service::Service::start(&config, kafka, remote, None)
        .await
        .expect("the service starts in kafka mode")
}

/// Every event on the events topic, by task id.
fn logged_events(kafka: &Kafka) -> std::collections::BTreeMap<String, Vec<sendledger_core::Event>> {
    let mut by_task: std::collections::BTreeMap<String, Vec<_>> = Default::default();
    for partition in 0..kafka.config().partitions {
        for event in partition_events(kafka, partition, 0).0 {
            by_task
                .entry(event.task_id.to_string())
                .or_default()
                .push(event);
        }
    }
    by_task
}

/// Waits until the events topic records `n` duplicate deliveries of each of `keys`.
pub(crate) async fn each_logged_as_duplicate(kafka: &Kafka, keys: &[String], n: usize) {
    use sendledger_core::EventBody;
    let logged = || {
        let events = tokio::task::block_in_place(|| logged_events(kafka));
        keys.iter()
            .filter(|k| {
                let id = sendledger_tests::engine::task_id(k).to_string();
                events.get(&id).is_some_and(|e| {
                    e.iter()
                        .filter(|e| matches!(e.body, EventBody::DuplicateDelivery { .. }))
                        .count()
                        >= n
                })
            })
            .count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while logged() < keys.len() {
        assert!(
            std::time::Instant::now() < deadline,
            "delivery {} of each request was not recorded as a duplicate",
            n + 1
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The scenario that loses the guarantee in local mode, in kafka mode: the first instance
/// processes 200 requests alone; the second joins and the partitions are split; the same 200
/// are delivered again, many to the instance that never saw them. It restored their partitions
/// from the log, so each is a duplicate: one record per identity. When the second leaves, the
/// first takes its partitions back and a third delivery is a duplicate again. Every task has
/// exactly one terminal result for a `read_committed` reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_in_kafka_mode_split_the_partitions_and_send_nothing_twice() {
    use sendledger_sim::{Sim, SimConfig};
    use sendledger_tests::kafka::{
        assert_one_record_each, produce, request_messages, results_for, task_ids, wait_for,
    };

    let broker = tokio::task::block_in_place(Broker::cluster);
    let kafka = Kafka::connect(config_for_process(&broker)).unwrap();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let keys: Vec<String> = (0..200).map(|i| format!("shared-{i}")).collect();

    let a = kafka_mode_service(dir_a.path(), &kafka, &sim).await;
    produce(&kafka, request_messages(&keys)).await;
    let (_, results) = results_for(&kafka, task_ids(&keys)).await;
    assert_one_record_each(&sim, &keys, &results);
    let partitions = kafka.config().partitions as usize;
    let owner_a = a.engine().ownership().unwrap().clone();
    wait_for("the first instance did not own every partition", || {
        owner_a.partitions().len() == partitions
    })
    .await;

    let b = kafka_mode_service(dir_b.path(), &kafka, &sim).await;
    let owner_b = b.engine().ownership().unwrap().clone();
    wait_for(
        "the partitions were not split between the instances",
        || {
            let (pa, pb) = (owner_a.partitions(), owner_b.partitions());
            !pb.is_empty()
                && pa.len() + pb.len() == partitions
                && pa.iter().all(|p| !pb.contains(p))
        },
    )
    .await;
    produce(&kafka, request_messages(&keys)).await;
    each_logged_as_duplicate(&kafka, &keys, 1).await;
    assert_eq!(sim.stats().posts, 200, "a redelivery was sent again");
    let b_tasks: u64 = b
        .engine()
        .ledger()
        .task_counts()
        .map(|c| c.by_phase.values().sum())
        .unwrap_or(0);
    assert!(b_tasks > 0, "the second instance restored nothing");

    b.shutdown().await.unwrap();
    wait_for(
        "the first instance did not take every partition back",
        || owner_a.partitions().len() == partitions,
    )
    .await;
    produce(&kafka, request_messages(&keys)).await;
    each_logged_as_duplicate(&kafka, &keys, 2).await;
    a.shutdown().await.unwrap();
    assert_eq!(sim.stats().posts, 200, "a redelivery was sent again");
    let (_, results) = results_for(&kafka, task_ids(&keys)).await;
    assert_one_record_each(&sim, &keys, &results);

    // The log the two instances wrote audits clean, read as a read_committed consumer.
    let report = audit_events_topic(&kafka, 200);
    assert!(report
        .skipped_checks
        .iter()
        .any(|c| c.starts_with("lsn-contiguous")));
    sim.shutdown().await;
}

/// Kafka mode with the brokers unreachable for 20 s in the middle of a run: a relay between
/// the service and Apache Kafka closes every connection and refuses new ones. The
/// partitions' transactions fail and the partitions are given up; once the brokers answer
/// again they are taken over anew (their logs opened, restored from their checkpoints, their
/// tasks resumed: an attempt sent while its outcome could not be recorded is looked up, never
/// sent again). Nothing is lost or sent twice: every task has one record at the remote and
/// exactly one terminal result for a `read_committed` reader of the results topic, and the log
/// audits clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_mode_rides_out_the_brokers_unreachable_for_a_while() {
    use sendledger_tests::kafka::{
        assert_one_record_each, broker_behind_a_relay, produce, request_messages, results_for,
        sim_with_latency, task_ids,
    };

    let (_broker, relay, kafka) = broker_behind_a_relay().await;
    let sim = sim_with_latency(Duration::from_millis(20)).await;
    let dir = tempfile::tempdir().unwrap();
    let service = kafka_mode_service(dir.path(), &kafka, &sim).await;
    let keys: Vec<String> = (0..400).map(|i| format!("kafka-cut-{i}")).collect();
    produce(&kafka, request_messages(&keys[..200])).await;
    // Cut once the work is under way.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while sim.stats().posts < 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "nothing was sent before the outage"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    relay.set_cut(true);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let during = sim.stats().posts;
    relay.set_cut(false);
    produce(&kafka, request_messages(&keys[200..])).await;

    let (raw, results) = results_for(&kafka, task_ids(&keys)).await;
    let settled: std::collections::BTreeSet<String> = results
        .iter()
        .filter(|r| r.status.is_terminal())
        .map(|r| r.task_id.clone())
        .collect();
    let unsettled: Vec<String> = keys
        .iter()
        .map(|k| sendledger_tests::engine::task_id(k))
        .filter(|id| !settled.contains(&id.to_string()))
        .map(|id| {
            let events = service.engine().ledger().task_events(id).unwrap();
            let names: Vec<&str> = events.iter().map(|e| e.body.name()).collect();
            format!("{id}: {names:?}")
        })
        .collect();
    assert!(
        unsettled.is_empty(),
        "{} tasks without a terminal result, such as {:?}; partitions owned at the end: {:?}",
        unsettled.len(),
        &unsettled[..unsettled.len().min(6)],
        service.engine().ownership().map(|o| o.partitions())
    );
    assert_one_record_each(&sim, &keys, &results);
    let mut terminal: std::collections::BTreeMap<&str, usize> = Default::default();
    for r in &raw {
        let status = r.value["status"].as_str().unwrap_or_default();
        if ["succeeded", "rejected", "failed"].contains(&status) {
            *terminal
                .entry(r.value["task_id"].as_str().unwrap_or_default())
                .or_default() += 1;
        }
    }
    let twice: Vec<_> = terminal.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "tasks with more than one terminal result: {twice:?}"
    );
    assert_eq!(
        sim.stats().posts,
        400,
        "an attempt was sent again ({during} before the brokers answered again)"
    );
    service.shutdown().await.unwrap();

    audit_events_topic(&kafka, 400);
    sim.shutdown().await;
}

/// A partition whose commits hang holds up no other. A relay in front of Apache Kafka
/// holds every commit of partition 0's log (as a broker whose commits of one partition hang
/// would) while requests wait on every partition. The remote is the bottleneck (4 requests in
/// flight at once), so a task of partition 0 holding room at it while its intent cannot be
/// recorded would starve the others; and partition 0 receives more requests (150) than the
/// in-flight budget (100), so its unfinished messages would keep every partition paused if
/// they counted whole. The other partitions' requests, the same workload before the hang and
/// during it in the same run, settle at least 80% as fast during it.
/// Once the commits go through, partition 0's tasks settle too: one record each at the
/// remote, one terminal result each, and the log audits clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_whose_commits_hang_holds_up_no_other() {
    use sendledger_tests::kafka::{
        assert_exactly_one_terminal, assert_one_record_each, broker_behind_a_relay, identity_key,
        key_on, produce, request_json, results_for, sim_with_latency, task_ids, wait_for,
        PARTITIONS,
    };
    const EACH: usize = 400;

    let (_broker, relay, kafka) = broker_behind_a_relay().await;
    let sim = sim_with_latency(Duration::from_millis(20)).await;
    let dir = tempfile::tempdir().unwrap();
    // The service's client carries its in-flight budget.
    let mut budget = kafka.config().clone();
    budget.max_unfinished = 100;
    let service_kafka = tokio::task::block_in_place(|| Kafka::connect(budget)).unwrap();
    let service = kafka_mode_service_with(
        dir.path(),
        &service_kafka,
        &sim,
        |_| {},
        |t| t["max_in_flight"] = 4.into(),
    )
    .await;
    // Requests of `phase`, spread over partitions 1 and up, or all on partition 0 (keys chosen
    // for their partition: kafka mode takes a request only on its key's).
    let requests = |phase: &str, n: usize, on_zero: bool| {
        let keys: Vec<String> = (0..n)
            .map(|i| {
                let partition = if on_zero {
                    0
                } else {
                    1 + i as i32 % (PARTITIONS - 1)
                };
                key_on(&format!("stall-{phase}-{i}"), 0, partition, PARTITIONS)
            })
            .collect();
        let messages: Vec<_> = keys
            .iter()
            .map(|k| (None, identity_key(k), Some(request_json(k))))
            .collect();
        (keys, messages)
    };
    let posts = || sim.stats().posts;
    // Every partition owned and worked once before anything is timed.
    let (mut keys, warm) = requests("warm", 60, false);
    let (zero_warm, on_zero) = requests("warm-zero", 20, true);
    keys.extend(zero_warm);
    produce(&kafka, warm.into_iter().chain(on_zero).collect()).await;
    wait_for("the warm-up requests are sent", || posts() == 80).await;

    let settle = |phase: &'static str| {
        let (phase_keys, messages) = requests(phase, EACH, false);
        let kafka = kafka.clone();
        async move {
            let before = posts();
            let started = std::time::Instant::now();
            produce(&kafka, messages).await;
            wait_for("the requests of the other partitions are sent", || {
                posts() == before + EACH as u64
            })
            .await;
            (phase_keys, started.elapsed())
        }
    };
    let (before_keys, before) = settle("before").await;
    keys.extend(before_keys);

    let group = kafka.config().group_id.clone();
    let zero_log = sendledger_kafka::PartitionLog::transactional_id(&group, 0);
    relay.hold_commits_of(Some(&zero_log));
    let (zero_keys, on_zero) = requests("hung", 150, true);
    keys.extend(zero_keys);
    produce(&kafka, on_zero).await;
    wait_for("a commit of partition 0 is held", || relay.held() > 0).await;
    let (during_keys, during) = settle("during").await;
    keys.extend(during_keys);
    let held = relay.held();
    relay.hold_commits_of(None);

    let ratio = before.as_secs_f64() / during.as_secs_f64();
    eprintln!("{EACH} requests of partitions 1..{PARTITIONS} settled in {before:?} before the hang, {during:?} during it: {ratio:.2} of the throughput; {held} commits held");
    assert!(
        ratio >= 0.8,
        "the other partitions kept {ratio:.2} of their throughput while partition 0's commits hung ({before:?} before, {during:?} during)"
    );

    let (_, results) = results_for(&kafka, task_ids(&keys)).await;
    assert_exactly_one_terminal(&results, &task_ids(&keys));
    assert_one_record_each(&sim, &keys, &results);
    service.shutdown().await.unwrap();
    audit_events_topic(&kafka, keys.len() as u64);
    sim.shutdown().await;
}

/// A group that does not form: a member holds every partition and stops answering (frozen,
/// its heartbeats still sent), so the rebalance the service's joining starts never completes
/// (the broker waits for the frozen leader's assignment until its rebalance timeout). The service holds no partition while
/// requests wait, unconsumed: `/healthz` says so (503, `unconsumed_partitions`) and the service
/// leaves the group and joins it again once they have waited its patience (30 s). Once the
/// frozen member thaws and leaves, the service takes every partition and settles every request
/// once, and `/healthz` is fine again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_holding_nothing_while_requests_wait_says_so_and_rejoins() {
    use sendledger_tests::kafka::{
        assert_one_record_each, produce, request_messages, results_for, sim_with_latency, task_ids,
    };

    let broker = Broker::cluster();
    let kafka = Kafka::connect(config_for_process(&broker)).unwrap();
    kafka
        .ensure_topics(kafka.config().replication_factor, TIMEOUT, true)
        .await
        .unwrap();
    // The member that takes every partition, then freezes.
    let squatter = tokio::task::block_in_place(|| {
        let mut client = kafka.client_config(Role::Ingest);
        client.set("max.poll.interval.ms", "600000");
        let c: BaseConsumer = client.create().unwrap();
        c.subscribe(&[&kafka.config().requests_topic]).unwrap();
        let deadline = std::time::Instant::now() + TIMEOUT;
        while c.assignment().unwrap().count() < kafka.config().partitions as usize {
            assert!(
                std::time::Instant::now() < deadline,
                "the first member never got the partitions"
            );
            c.poll(Duration::from_millis(50));
        }
        c
    });
    let sim = sim_with_latency(Duration::from_millis(1)).await;
    let dir = tempfile::tempdir().unwrap();
    let file = kafka_mode_config_file(dir.path(), &broker, &sim);
    let (child, ready) = tokio::task::block_in_place(|| crate::start_run(&file, &[]));
    let service = Killed(child);
    let admin = sendledger_tests::ready_field(&ready, "admin=http://");
    let keys: Vec<String> = (0..30).map(|i| format!("unformed-{i}")).collect();
    produce(&kafka, request_messages(&keys)).await;

    let health = || async {
        let (status, body) =
            sendledger_tests::http::request(&admin, "GET", "/healthz", None, None).await;
        (
            status,
            serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        )
    };
    let metric = || async {
        let (_, body) =
            sendledger_tests::http::request(&admin, "GET", "/metrics", None, None).await;
        body.lines()
            .find(|l| l.starts_with("sendledger_group_rejoins_total"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = health().await;
        if body.get("unconsumed_partitions").is_some() {
            assert_eq!(status, 503, "{body}");
            assert_eq!(body["owned_partitions"], serde_json::json!([]), "{body}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "healthz never said so: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(50);
    while metric().await < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the service never joined the group again"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        sim.stats().posts,
        0,
        "nothing consumed while the group did not form"
    );

    // The frozen member thaws, completes the rebalance and leaves: the group forms, and every
    // request is settled once.
    tokio::task::block_in_place(|| {
        for _ in 0..100 {
            squatter.poll(Duration::from_millis(50));
        }
        drop(squatter)
    });
    let (_, results) = results_for(&kafka, task_ids(&keys)).await;
    assert_one_record_each(&sim, &keys, &results);
    let (status, body) = health().await;
    assert_eq!(status, 200, "{body}");
    assert!(body.get("unconsumed_partitions").is_none(), "{body}");
    drop(service);
    sim.shutdown().await;
}

/// The configuration file of a `sendledger run` process in kafka mode on `dir`, against
/// `broker`, with the target `sim` and the admin endpoint on a free port.
fn kafka_mode_config_file(
    dir: &std::path::Path,
    broker: &Broker,
    sim: &sendledger_sim::Sim,
) -> std::path::PathBuf {
    use sendledger_node::config::{Config, StorageMode};
    let mut config = Config::default();
    config.storage.data = dir.join("ledger");
    config.storage.mode = StorageMode::Kafka;
    config.engine.timer_tick = Duration::from_millis(5);
    config.kafka = config_for_process(broker);
    config.admin.listen = "127.0.0.1:0".parse().unwrap();
    config.targets.insert(
        "sim".into(),
        sendledger_tests::engine::target(&sim.base_url(), |_| {}),
    );
    let file = dir.join("sendledger.toml");
    std::fs::write(&file, toml::to_string(&config).unwrap()).unwrap();
    file
}

/// A child process, killed when the test ends, passed or not.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// In kafka mode each instance's admin endpoint answers for the partitions it owns: `/healthz`
/// and `/metrics` name them, and what was restored. A task whose partition moved is still in
/// the first instance's ledger: `/tasks/{id}` shows that copy marked as not owned (with a
/// warning that it may be behind), and a review resolution sent there by an operator is
/// refused with 421, naming the partition, and not recorded there. Its owner knows the task
/// (restored from the log) and answers for it. Both instances bind requests to their tenant
/// (`[access]`): another tenant's requests are refused by whichever instance owns them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_instance_answers_for_the_partitions_it_owns() {
    use sendledger_tests::http::{get_json, request as http, resolve};
    const TOKEN: &str = "ops-token-0123456789abcdef0123456789abcdef";
    use sendledger_tests::kafka::{produce, request_messages, results_for, task_ids};

    let broker = tokio::task::block_in_place(Broker::cluster);
    let kafka = Kafka::connect(config_for_process(&broker)).unwrap();
    let sim = sendledger_sim::Sim::start(Default::default())
        .await
        .unwrap();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let env = [("OPS_TOKEN", TOKEN.to_string())];
    let start = |dir: &std::path::Path| {
        let file = kafka_mode_config_file(dir, &broker, &sim);
        let mut text = std::fs::read_to_string(&file).unwrap();
        text += "\n[admin.operators.ops]\nroles = [\"resolve\"]\ntokens_env = [\"OPS_TOKEN\"]\n";
        text += "\n[access.tenants.acme]\ntargets = [\"sim\"]\n";
        std::fs::write(&file, text).unwrap();
        let (child, ready) = tokio::task::block_in_place(|| crate::start_run(&file, &env));
        (
            Killed(child),
            sendledger_tests::ready_field(&ready, "admin=http://"),
        )
    };
    let owned = |addr: String| async move {
        let health = get_json(&addr, "/healthz").await;
        assert_eq!(health["mode"], "kafka", "{health}");
        let owned: Vec<i64> = health["owned_partitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_i64().unwrap())
            .collect();
        owned
    };

    let (mut a, admin_a) = start(dir_a.path());
    let keys: Vec<String> = (0..40).map(|i| format!("own-{i}")).collect();
    produce(&kafka, request_messages(keys.iter())).await;
    results_for(&kafka, task_ids(&keys)).await;
    let partitions = kafka.config().partitions as usize;
    assert_eq!(owned(admin_a.clone()).await.len(), partitions);

    let (mut b, admin_b) = start(dir_b.path());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let (on_a, on_b) = loop {
        let (on_a, on_b) = (owned(admin_a.clone()).await, owned(admin_b.clone()).await);
        if !on_b.is_empty() && on_a.len() + on_b.len() == partitions {
            break (on_a, on_b);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the partitions were not split: {on_a:?} / {on_b:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (_, text) = http(&admin_b, "GET", "/metrics", None, None).await;
    assert_eq!(
        sendledger_tests::metric_value(&text, "sendledger_partitions_owned"),
        Some(on_b.len() as f64),
        "{text}"
    );
    assert!(
        text.contains("sendledger_restored_events_total{partition=")
            && text.contains("sendledger_partition_take_over_seconds_bucket"),
        "{text}"
    );

    // A task of a partition that moved to B.
    let mut moved_task = None;
    for key in &keys {
        let id = sendledger_tests::engine::task_id(key).to_string();
        let copy = get_json(&admin_a, &format!("/tasks/{id}")).await;
        let partition = copy["partition"].as_i64().unwrap();
        assert_eq!(copy["owned_here"], on_a.contains(&partition), "{copy}");
        if on_b.contains(&partition) {
            assert!(copy["warning"]
                .as_str()
                .unwrap()
                .contains("owned by another instance"));
            moved_task = Some((id, partition));
            break;
        }
    }
    let (id, partition) = moved_task.expect("a task of a partition that moved");
    let on_owner = get_json(&admin_b, &format!("/tasks/{id}")).await;
    assert_eq!(on_owner["owned_here"], true, "{on_owner}");
    assert_eq!(on_owner["state"], "succeeded", "{on_owner}");
    let copy_before = get_json(&admin_a, &format!("/tasks/{id}")).await["events"].clone();
    let body = serde_json::json!({ "as": "failed", "reason": "not here" });
    let (status, answer) = resolve(&admin_a, &id, Some(TOKEN), body.clone()).await;
    assert_eq!(status, 421, "{answer}");
    let error = answer["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("requests partition {partition}")),
        "{error}"
    );
    let copy_after = get_json(&admin_a, &format!("/tasks/{id}")).await["events"].clone();
    assert_eq!(
        copy_before, copy_after,
        "nothing recorded by the instance that does not own it"
    );
    // The owner refuses it too, for the reason that applies there: the task is settled.
    let (status, answer) = resolve(&admin_b, &id, Some(TOKEN), body).await;
    assert_eq!(status, 409, "{answer}");

    // Another tenant's requests, over every partition: each instance refuses those of its own.
    let foreign: Vec<String> = (0..24).map(|i| format!("foreign-{i}")).collect();
    let messages = (foreign.iter())
        .map(|key| {
            let mut r = sendledger_tests::engine::request(key);
            r.tenant = "globex".into();
            let value = serde_json::to_vec(&r).unwrap();
            (None, format!("globex/payment.create/{key}"), Some(value))
        })
        .collect();
    produce(&kafka, messages).await;
    let refused = |admin: String| async move {
        let (_, text) = http(&admin, "GET", "/metrics", None, None).await;
        let series =
            "sendledger_requests_refused_total{tenant=\"unknown\",rule=\"unknown_tenant\"}";
        sendledger_tests::metric_value(&text, series).unwrap_or(0.0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (on_a, on_b) = (
            refused(admin_a.clone()).await,
            refused(admin_b.clone()).await,
        );
        if on_a + on_b == foreign.len() as f64 {
            assert!(on_a > 0.0 && on_b > 0.0, "refused on A {on_a}, on B {on_b}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "refused on A {on_a}, on B {on_b} of {}",
            foreign.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    for Killed(child) in [&mut a, &mut b] {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        assert!(child.wait().unwrap().success());
    }
    assert_eq!(
        sim.stats().posts,
        40,
        "no request of another tenant was sent"
    );
}

/// The log of a partition holding 100,000 tasks (written to the events topic as an owner would
/// have: 99,980 confirmed, 20 left sending with their records at the remote; the first half in
/// JSON records, the second in binary ones) is taken over by an instance on an empty disk. Once
/// it owns the partition it knows every task: the tasks' summaries by state, a redelivery of
/// 200 of the requests is a duplicate each (nothing sent), and the 20 tasks left sending are
/// resumed, reconciled and confirmed by lookup without a resend; the events topic's audit
/// reads every task settled, the new owner's binary records too. The time from start to owning
/// the partition is printed (`sendledger-bench restore` measures the restore rate).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_of_100000_tasks_is_restored_on_an_empty_disk() {
    use sendledger_core::{EventBody, Evidence, Phase};
    use sendledger_tests::engine::{settled, task_id, wait_for};
    use sendledger_tests::kafka::{produce, request_messages};

    const TASKS: usize = 100_000;
    const SENDING: usize = 10;
    let broker = tokio::task::block_in_place(Broker::cluster);
    let mut config = config_for_process(&broker);
    config.partitions = 1;
    let kafka = Kafka::connect(config).unwrap();
    kafka
        .ensure_topics(kafka.config().replication_factor, TIMEOUT, true)
        .await
        .unwrap();
    let sim = sendledger_sim::Sim::start(Default::default())
        .await
        .unwrap();
    let key = |i: usize| format!("big-{i}");

    // The log an earlier owner wrote, in transactions of 10,000 events. Its requests came from
    // another topic, so the redeliveries below (on the requests topic, which is empty so far)
    // are judged by identity alone, not by an offset already processed. Its first half is in
    // JSON, its second (and what the new owner writes) in binary records: an encoding changed
    // on a running topic.
    let mut binary = kafka.config().clone();
    binary.events_encoding = sendledger_kafka::EventEncoding::Binary;
    let binary = Kafka::connect(binary).unwrap();
    let written = std::time::Instant::now();
    tokio::task::block_in_place(|| {
        let half = TASKS / 2;
        write_tasks(&kafka, 0..half, &key, &|i| i < SENDING, 10_000, Vec::new());
        write_tasks(
            &binary,
            half..TASKS,
            &key,
            &|i| i >= TASKS - SENDING,
            10_000,
            Vec::new(),
        );
    });
    eprintln!(
        "wrote {} events in {:?}",
        TASKS * 3 - 2 * SENDING,
        written.elapsed()
    );
    // The remote holds the records of the tasks left sending: their attempts got through.
    let sending: Vec<usize> = (0..SENDING).chain(TASKS - SENDING..TASKS).collect();
    post_records(&sim, sending.iter().map(|&i| key(i))).await;

    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let service = kafka_mode_service(dir.path(), &binary, &sim).await;
    let ownership = service.engine().ownership().unwrap().clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    while ownership.partitions() != [0] {
        assert!(
            std::time::Instant::now() < deadline,
            "the partition was not taken over"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "restored {TASKS} tasks ({} events): start to partition owned in {:?}",
        TASKS * 3 - 2 * SENDING,
        started.elapsed()
    );

    let counts = service.engine().ledger().task_counts().unwrap();
    let total: u64 = counts.by_phase.values().sum();
    assert_eq!(total, TASKS as u64, "{counts:?}");
    for &i in &sending {
        let state = wait_for(service.engine(), task_id(&key(i)), TIMEOUT, settled).await;
        assert_eq!(state.phase, Phase::Succeeded, "{}", key(i));
        let events = service.engine().events(task_id(&key(i))).await.unwrap();
        assert!(events.iter().any(|e| matches!(
            e.body,
            EventBody::Confirmed {
                evidence: Evidence::Lookup,
                ..
            }
        )));
    }
    let sample: Vec<String> = (0..TASKS).step_by(TASKS / 200).map(key).collect();
    produce(&kafka, request_messages(sample.iter())).await;
    let deadline = std::time::Instant::now() + TIMEOUT;
    for k in &sample {
        loop {
            let events = service.engine().events(task_id(k)).await.unwrap();
            if events
                .iter()
                .any(|e| matches!(e.body, EventBody::DuplicateDelivery { .. }))
            {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{k}: the redelivery is not a duplicate"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(
        sim.stats().posts,
        2 * SENDING as u64,
        "a restored task was sent"
    );
    // The log reads back whole in both encodings, the new owner's binary records too.
    audit_events_topic(&binary, TASKS as u64);
    service.shutdown().await.unwrap();
    sim.shutdown().await;
}

/// A lookup whose answer arrives while its task's partition is revoked is over all the same:
/// when the partition is assigned back, the task looks the record up again and settles (it
/// used to wait forever for that answer, which had been refused, and never looked up again).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lookup_answered_while_the_partition_was_revoked_is_made_again_after_it_returns() {
    use sendledger_core::{Phase, Source};
    use sendledger_kafka::LogReplicator;
    use sendledger_sim::{Faults, Sim, SimConfig};
    use sendledger_tests::engine::{request, settled, task_id, wait_for};
    use std::sync::Arc;

    let broker = Broker::cluster();
    let kafka = Kafka::connect(config_for_process(&broker)).unwrap();
    kafka
        .ensure_topics(kafka.config().replication_factor, TIMEOUT, true)
        .await
        .unwrap();
    // Every create is committed and its response dropped; every request and lookup takes
    // 300 ms, and a record is visible to lookups a second after its creation.
    let sim = Sim::start(SimConfig {
        faults: Faults {
            commit_then_drop: 1.0,
            latency: Duration::from_millis(300),
            ..Faults::default()
        },
        lookup_lag: Duration::from_secs(1),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let replicator = Arc::new(LogReplicator::new("sendledger"));
    let engine = replicated_engine(dir.path(), &sim, replicator.clone());
    let take = |replicator: &LogReplicator| {
        let log = tokio::task::block_in_place(|| PartitionLog::open(&kafka, 1, TIMEOUT)).unwrap();
        replicator.own(log);
    };
    take(&replicator);
    engine.assign_partition(1).await.unwrap();
    let source = Source {
        topic: kafka.config().requests_topic.clone(),
        partition: 1,
        offset: 0,
    };
    engine.submit(request("revoked-1"), source).await.unwrap();

    // Revoked while the first lookup is out: its answer is refused.
    let deadline = std::time::Instant::now() + TIMEOUT;
    while sim.stats().lookups == 0 {
        assert!(std::time::Instant::now() < deadline, "no lookup was made");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    engine.revoke_partition(1);
    replicator.release(1);
    // Time for the answer to come back and be refused.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let lookups = sim.stats().lookups;

    // Assigned back (nothing to restore: no other instance wrote to the partition).
    take(&replicator);
    engine.assign_partition(1).await.unwrap();
    let state = wait_for(&engine, task_id("revoked-1"), TIMEOUT, settled).await;
    assert_eq!(state.phase, Phase::Succeeded);
    assert!(sim.stats().lookups > lookups, "{:?}", sim.stats());
    assert_eq!(sim.records_with_identity("revoked-1").len(), 1);
    engine.shutdown(Duration::from_secs(5)).await;
    sim.shutdown().await;
}

/// `check-broker` against both brokers of these tests, as an operator would run it before
/// trusting kafka mode to them. What each keeps and breaks is asserted promise by promise, so a
/// change in either broker (or in the check) fails here: Apache Kafka (three brokers) keeps
/// every promise and the check exits 0; the embedded mock cluster fences nothing, keeps no
/// transactional offsets and shows open transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_broker_names_the_promises_each_broker_keeps() {
    let broker = tokio::task::block_in_place(Broker::cluster);
    let run = |brokers: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sendledger_cli"))
            .args([
                "check-broker",
                "--json",
                "--timeout",
                "20s",
                "--brokers",
                brokers,
            ])
            .output()
            .expect("run check-broker");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "check-broker printed no JSON ({e}); stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let kept: std::collections::BTreeMap<String, serde_json::Value> = report["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .map(|c| (c["name"].as_str().unwrap().to_string(), c["kept"].clone()))
            .collect();
        // Kafka mode's guarantees stand on every promise but one, which only its committed
        // offsets need.
        for c in report["checks"].as_array().expect("checks") {
            let name = c["name"].as_str().unwrap();
            assert_eq!(c["guarantees"], name != "offsets_alone", "{name}");
        }
        (out.status.code(), report["kafka_mode_safe"].clone(), kept)
    };
    let expect = |pairs: &[(&str, bool)]| {
        pairs
            .iter()
            .map(|(name, kept)| (name.to_string(), serde_json::Value::Bool(*kept)))
            .collect::<std::collections::BTreeMap<_, _>>()
    };

    let (code, safe, kept) = tokio::task::block_in_place(|| run(&broker.bootstrap()));
    assert_eq!((code, safe), (Some(0), serde_json::Value::Bool(true)));
    assert_eq!(
        kept,
        expect(&[
            ("transactions", true),
            ("committed_visible", true),
            ("offsets_in_transaction", true),
            ("offsets_alone", true),
            ("open_hidden", true),
            ("fencing_aborts", true),
            ("fenced_refused", true),
        ]),
        "Apache Kafka"
    );

    let (code, safe, kept) = tokio::task::block_in_place(|| run("embedded"));
    assert_eq!((code, safe), (Some(2), serde_json::Value::Bool(false)));
    assert_eq!(
        kept,
        expect(&[
            ("transactions", true),
            ("committed_visible", true),
            ("offsets_in_transaction", false),
            ("offsets_alone", false),
            ("open_hidden", false),
            ("fencing_aborts", false),
            ("fenced_refused", false),
        ]),
        "the embedded cluster"
    );
}

/// Kafka mode: once every request is answered, the group's committed offsets reach the end of
/// the requests topic, so a consumer-lag monitor sees 0, and the same holds after a second
/// delivery of every request. Each message's offset rides in the transaction that records it
/// (the tasks' later events may all be committed before the consumer hears that the message
/// is recorded, so no later transaction would carry it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_answered_request_is_committed_for_the_group() {
    use sendledger_sim::{Sim, SimConfig};
    use sendledger_tests::kafka::{produce, request_messages, results_for, task_ids};

    let broker = tokio::task::block_in_place(Broker::cluster);
    let kafka = Kafka::connect(config_for_process(&broker)).unwrap();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let keys: Vec<String> = (0..40).map(|i| format!("committed-{i}")).collect();
    let service = kafka_mode_service(dir.path(), &kafka, &sim).await;
    let messages = request_messages(keys.iter());
    let acked = produce(&kafka, messages).await;
    let (_, results) = results_for(&kafka, task_ids(&keys)).await;
    assert_eq!(results.len(), keys.len());
    assert_committed_through(&kafka, &acked).await;

    // The same requests again: each is recorded as a duplicate delivery, nothing is sent.
    let again = request_messages(keys.iter());
    let acked = produce(&kafka, again).await;
    assert_committed_through(&kafka, &acked).await;
    assert_eq!(
        sim.stats().records,
        keys.len() as u64,
        "one record per request"
    );
    service.shutdown().await.unwrap();
}

/// Waits until the group's committed offset of each partition in `acked` (partition, offset
/// produced) is one past the last offset produced to it; fails after 30 s.
async fn assert_committed_through(kafka: &Kafka, acked: &[(i32, i64)]) {
    let mut ends = vec![0i64; kafka.config().partitions as usize];
    for &(p, offset) in acked {
        ends[p as usize] = ends[p as usize].max(offset + 1);
    }
    let lag = || -> Vec<(i32, i64, Offset)> {
        ends.iter()
            .enumerate()
            .filter(|(_, &end)| end > 0)
            .map(|(p, &end)| {
                (
                    p as i32,
                    end,
                    sendledger_tests::kafka::committed(kafka, p as i32),
                )
            })
            .filter(|(_, end, at)| *at != Offset::Offset(*end))
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let behind = lag();
        if behind.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "committed offsets behind the end (partition, end, committed): {behind:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `audit --from-kafka` of the events topic (read as a `read_committed` consumer): no
/// violation, and `succeeded` tasks succeeded.
pub(crate) fn audit_events_topic(
    kafka: &Kafka,
    succeeded: u64,
) -> sendledger_core::audit::AuditReport {
    let topic = kafka.config().events_topic.clone();
    let report = tokio::task::block_in_place(|| {
        sendledger_kafka::audit_topic(kafka, &topic, Default::default(), |_, _| {})
    })
    .expect("the events topic is audited");
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(
        report.tasks_by_state.get("succeeded"),
        Some(&succeeded),
        "{report:?}"
    );
    report
}

/// Two owners each wrote a history of one task into the log (the first's intent ended unknown;
/// the second, not seeing it, sent again and was answered 201). A new owner's restore finds
/// both: it rebuilds the task from the later one, and before resuming the partition sends the
/// task to review through the log, with the replaced history as evidence; a second take-over
/// finds the review and records nothing more; the events topic's audit reports the two
/// histories.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_histories_of_a_task_in_the_log_send_it_to_review() {
    use sendledger_core::event::{Evidence, ReviewReason, UnknownCause};
    use sendledger_core::{Event, EventBody, Phase, Source};
    use sendledger_kafka::LogReplicator;
    use sendledger_sim::{Sim, SimConfig};
    use sendledger_tests::engine::{request, task_id};
    use std::sync::Arc;

    let broker = Broker::cluster();
    let kafka = Kafka::connect(config_for_process(&broker)).unwrap();
    kafka
        .ensure_topics(kafka.config().replication_factor, TIMEOUT, true)
        .await
        .unwrap();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let task = task_id("forked");
    let accepted = request("forked")
        .accept(&sendledger_core::Limits::default())
        .unwrap();
    let payload_hash = accepted.payload_hash();
    let bodies = [
        (
            0,
            EventBody::TaskAccepted {
                request: accepted,
                payload_hash,
                source: Source {
                    topic: kafka.config().requests_topic.clone(),
                    partition: 1,
                    offset: 0,
                },
            },
        ),
        // The first owner's history...
        (
            1,
            EventBody::SendIntended {
                attempt: 1,
                idempotency_key: None,
            },
        ),
        (
            2,
            EventBody::SendUnknown {
                attempt: 1,
                cause: UnknownCause::Timeout,
            },
        ),
        // ...and the second's, from the same sequence number.
        (
            1,
            EventBody::SendIntended {
                attempt: 1,
                idempotency_key: None,
            },
        ),
        (
            2,
            EventBody::Confirmed {
                remote_id: "r-2".into(),
                evidence: Evidence::Response { status: 201 },
            },
        ),
    ];
    let events: Vec<Event> = bodies
        .into_iter()
        .enumerate()
        .map(|(i, (task_seq, body))| Event {
            lsn: 0,
            task_id: task,
            task_seq,
            at: 1_700_000_000_000 + i as u64,
            body,
        })
        .collect();
    tokio::task::block_in_place(|| {
        let writer = PartitionLog::open(&kafka, 1, TIMEOUT).unwrap();
        for event in &events {
            let batch = LogBatch {
                events: vec![event_log_record(event)],
                ..LogBatch::default()
            };
            writer.commit(&batch, None).unwrap();
        }
    });

    let take_over = |dir: &std::path::Path| {
        let replicator = Arc::new(LogReplicator::new("sendledger"));
        let engine = replicated_engine(dir, &sim, replicator.clone());
        let kafka = &kafka;
        async move {
            let log =
                tokio::task::block_in_place(|| PartitionLog::open(kafka, 1, TIMEOUT)).unwrap();
            let (logged, end) = tokio::task::block_in_place(|| partition_events(kafka, 1, 0));
            let (_, diverged) = engine
                .restore(
                    1,
                    logged,
                    Some(Logged {
                        first: end,
                        next: end,
                    }),
                )
                .await
                .unwrap();
            replicator.own(log);
            (engine, diverged)
        }
    };
    let first_dir = tempfile::tempdir().unwrap();
    let (first, diverged) = take_over(first_dir.path()).await;
    assert_eq!(diverged.len(), 1);
    assert_eq!((diverged[0].task_id, diverged[0].task_seq), (task, 1));
    let owed = first.ledger().reviews_owed(1).unwrap();
    assert_eq!(
        owed, diverged,
        "the review is owed, with its evidence, until it is recorded"
    );
    first.assign_partition(1).await.unwrap();
    assert!(first.ledger().reviews_owed(1).unwrap().is_empty());
    let state = first.state(task).await.unwrap();
    assert_eq!(state.phase, Phase::ManualReview);
    let Some(ReviewReason::DivergentHistory {
        task_seq: 1,
        replaced,
    }) = &state.review_reason
    else {
        panic!("{:?}", state.review_reason);
    };
    assert_eq!(replaced.len(), 2, "{replaced:?}");
    assert!(replaced[1].starts_with("SendUnknown"), "{replaced:?}");
    assert_eq!(
        state.remote_id.as_deref(),
        Some("r-2"),
        "rebuilt from the later history"
    );
    // The review is in the log of record, after the kept history.
    let (logged, _) = tokio::task::block_in_place(|| partition_events(&kafka, 1, 0));
    let last = logged.last().unwrap();
    assert_eq!((last.task_id, last.task_seq), (task, 3));
    assert!(matches!(
        last.body,
        EventBody::ManualReviewRequired {
            reason: ReviewReason::DivergentHistory { task_seq: 1, .. }
        }
    ));
    first.shutdown(Duration::from_secs(5)).await;

    // Another take-over on an empty disk finds the two histories again, and the review.
    let second_dir = tempfile::tempdir().unwrap();
    let (second, diverged) = take_over(second_dir.path()).await;
    assert_eq!(diverged.len(), 1);
    second.assign_partition(1).await.unwrap();
    let (again, _) = tokio::task::block_in_place(|| partition_events(&kafka, 1, 0));
    assert_eq!(again.len(), logged.len(), "nothing more recorded");
    assert_eq!(second.state(task).await.unwrap().phase, Phase::ManualReview);
    second.shutdown(Duration::from_secs(5)).await;

    let report = tokio::task::block_in_place(|| {
        sendledger_kafka::topic_audit::audit_topic(
            &kafka,
            &kafka.config().events_topic,
            Default::default(),
            |_, _| {},
        )
    })
    .unwrap();
    assert!(
        report.violations.iter().any(|v| v.rule == "sequence"
            && v.task_id.as_deref() == Some(&task.to_string())
            && v.detail.contains("two histories")),
        "{:?}",
        report.violations
    );
    sim.shutdown().await;
}

/// The brokers lost committed events (an unclean leader election, too few in-sync replicas):
/// the ledger's copy of a partition is ahead of its log. The next take-over finds the log
/// ending before the copy's checkpoint, restores the log from its start and truncates the copy
/// to it: a task whose lost events were harmless goes on from the log's history; a task that
/// lost an intent (a request that may have been sent) goes to review with the lost events as
/// evidence and is not sent again; a task the log lost entirely is recorded again and goes to
/// review too. Afterwards the copy is the log, the reviews are in the log, and another
/// take-over finds nothing to do. Before that, a take-over of the copy's own log checks it
/// and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_ahead_of_its_log_is_truncated_to_it() {
    use sendledger_core::event::{Evidence, ReviewReason};
    use sendledger_core::{Event, EventBody, Phase, Source, TaskId};
    use sendledger_kafka::{LogReplicator, PartitionOwner};
    use sendledger_node::wiring::KafkaOwner;
    use sendledger_sim::{Sim, SimConfig};
    use sendledger_tests::engine::{request, task_id};
    use std::sync::Arc;

    let broker = Broker::cluster();
    let kafka = Kafka::connect(config_for_process(&broker)).unwrap();
    kafka
        .ensure_topics(kafka.config().replication_factor, TIMEOUT, true)
        .await
        .unwrap();
    // The log as the brokers kept it after the loss: another events topic.
    let mut lossy = config_for_process(&broker);
    lossy.events_topic = "sendledger.events.kept".into();
    let lossy = Kafka::connect(lossy).unwrap();
    lossy
        .ensure_topics(lossy.config().replication_factor, TIMEOUT, true)
        .await
        .unwrap();
    let sim = Sim::start(SimConfig::default()).await.unwrap();

    let requests_topic = kafka.config().requests_topic.clone();
    let accepted = |key: &str, offset: i64| {
        let request = request(key)
            .accept(&sendledger_core::Limits::default())
            .unwrap();
        EventBody::TaskAccepted {
            payload_hash: request.payload_hash(),
            request,
            source: Source {
                topic: requests_topic.clone(),
                partition: 1,
                offset,
            },
        }
    };
    let intent = || EventBody::SendIntended {
        attempt: 1,
        idempotency_key: None,
    };
    let confirmed = |id: &str| EventBody::Confirmed {
        remote_id: id.into(),
        evidence: Evidence::Response { status: 201 },
    };
    let history = |key: &str, bodies| sendledger_core::fixtures::history(task_id(key), bodies);
    let dup = EventBody::DuplicateDelivery {
        source: Source {
            topic: requests_topic.clone(),
            partition: 1,
            offset: 9,
        },
    };
    // What the first owner recorded: four settled tasks and one just accepted.
    let lost_intent = history(
        "lost-intent",
        vec![accepted("lost-intent", 0), intent(), confirmed("r-x")],
    );
    let kept = history(
        "kept",
        vec![accepted("kept", 1), intent(), confirmed("r-z")],
    );
    let lost_dup = history(
        "lost-dup",
        vec![accepted("lost-dup", 2), intent(), confirmed("r-w"), dup],
    );
    let lost_task = history(
        "lost-task",
        vec![accepted("lost-task", 3), intent(), confirmed("r-v")],
    );
    let waiting = history("waiting", vec![accepted("waiting", 4)]);
    let write = |kafka: &Kafka, events: Vec<&Event>| -> i64 {
        tokio::task::block_in_place(|| {
            let writer = PartitionLog::open(kafka, 1, TIMEOUT).unwrap();
            let records = events.iter().map(|e| event_log_record(e)).collect();
            let batch = LogBatch {
                events: records,
                ..LogBatch::default()
            };
            let committed = writer.commit(&batch, None).unwrap();
            committed.events.unwrap().1 + 1
        })
    };
    let all: Vec<&Event> = [&lost_intent, &kept, &lost_dup, &lost_task, &waiting]
        .into_iter()
        .flatten()
        .collect();
    let checkpoint = write(&kafka, all.clone());
    let dir = tempfile::tempdir().unwrap();
    {
        let replicator = Arc::new(LogReplicator::new("sendledger"));
        let engine = replicated_engine(dir.path(), &sim, replicator);
        let events = all.iter().map(|e| (*e).clone()).collect();
        engine
            .restore(
                1,
                events,
                Some(Logged {
                    first: checkpoint,
                    next: checkpoint,
                }),
            )
            .await
            .unwrap();
        engine.shutdown(Duration::from_secs(5)).await;
    }

    // The ledger is free once the last user of the one before let go of it.
    let free = || async {
        for _ in 0..500 {
            match sendledger_store::Ledger::open(dir.path(), Default::default()) {
                Err(sendledger_store::Error::InUse { .. }) => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                _ => return,
            }
        }
        panic!("the ledger stays in use");
    };
    let owner = |kafka: &Kafka| {
        let replicator = Arc::new(LogReplicator::new("sendledger"));
        let engine = replicated_engine(dir.path(), &sim, replicator.clone());
        let partitions = kafka.config().partitions;
        let owner =
            KafkaOwner::new(kafka.clone(), engine.clone(), replicator, partitions, None).unwrap();
        (engine, Arc::new(owner))
    };
    let take_over = |owner: &Arc<KafkaOwner>| {
        let owner = owner.clone();
        async move {
            tokio::task::spawn_blocking(move || owner.take_over(1))
                .await
                .unwrap()
                .expect("the partition is taken over")
        }
    };
    let settle = |engine: &sendledger_actors::Engine, task: TaskId, phase: Phase| {
        let engine = engine.clone();
        async move {
            for _ in 0..500 {
                if engine.state(task).await.unwrap().phase == phase {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("task {task} never reached {phase:?}");
        }
    };

    // A take-over of the log the copy came from: the copy checks out, the waiting task is sent.
    free().await;
    let (engine, first) = owner(&kafka);
    take_over(&first).await;
    settle(&engine, task_id("waiting"), Phase::Succeeded).await;
    assert_eq!(
        engine.state(task_id("lost-intent")).await.unwrap().phase,
        Phase::Succeeded
    );
    assert!(engine.ledger().reviews_owed(1).unwrap().is_empty());
    assert_eq!(sim.stats().posts, 1);
    first.release(1);
    engine.shutdown(Duration::from_secs(5)).await;
    drop(first);

    // The log that lost events: the first acceptance of two tasks, all of two others (the
    // waiting task's attempt among them), and a redelivery.
    let survived: Vec<&Event> = [&lost_intent[..1], &kept[..], &lost_dup[..3], &waiting[..1]]
        .into_iter()
        .flatten()
        .collect();
    write(&lossy, survived);
    free().await;
    let (engine, second) = owner(&lossy);
    take_over(&second).await;
    let (logged, _) = tokio::task::block_in_place(|| partition_events(&lossy, 1, 0));
    let review_at = |key: &str| -> Option<(u32, Vec<String>)> {
        let task = task_id(key);
        logged.iter().find_map(|e| match &e.body {
            EventBody::ManualReviewRequired {
                reason: ReviewReason::DivergentHistory { task_seq, replaced },
            } if e.task_id == task => Some((*task_seq, replaced.clone())),
            _ => None,
        })
    };
    for (key, seq, lost) in [
        ("lost-intent", 1, ["SendIntended", "Confirmed"]),
        ("lost-task", 0, ["SendIntended", "Confirmed"]),
        ("waiting", 1, ["SendIntended", "Confirmed"]),
    ] {
        let (at, replaced) =
            review_at(key).unwrap_or_else(|| panic!("{key}: no review in the log"));
        assert_eq!(at, seq, "{key}");
        let names: Vec<&str> = replaced
            .iter()
            .map(|r| r.split(':').next().unwrap())
            .collect();
        assert_eq!(names, lost, "{key}: the lost events are the evidence");
        let state = engine.state(task_id(key)).await.unwrap();
        assert_eq!(state.phase, Phase::ManualReview, "{key}");
    }
    for key in ["kept", "lost-dup"] {
        assert_eq!(review_at(key), None, "{key}");
        assert_eq!(
            engine.state(task_id(key)).await.unwrap().phase,
            Phase::Succeeded,
            "{key}"
        );
    }
    // The task the log lost entirely is in it again, from its acceptance.
    let first_of_lost = logged
        .iter()
        .find(|e| e.task_id == task_id("lost-task"))
        .expect("the lost task is recorded again");
    assert_eq!(
        (first_of_lost.task_seq, first_of_lost.body.name()),
        (0, "TaskAccepted")
    );
    // The copy is the log, task by task.
    for key in ["lost-intent", "kept", "lost-dup", "lost-task", "waiting"] {
        let task = task_id(key);
        let held: Vec<(u32, EventBody)> = (engine.ledger().task_events(task).unwrap())
            .into_iter()
            .map(|e| (e.task_seq, e.body))
            .collect();
        let in_log: Vec<(u32, EventBody)> = (logged.iter())
            .filter(|e| e.task_id == task)
            .map(|e| (e.task_seq, e.body.clone()))
            .collect();
        assert_eq!(held, in_log, "{key}");
    }
    assert!(engine.ledger().reviews_owed(1).unwrap().is_empty());
    assert_eq!(sim.stats().posts, 1, "nothing was sent again");
    second.release(1);
    engine.shutdown(Duration::from_secs(5)).await;
    drop(second);

    // Another take-over finds the copy and the log alike and records nothing.
    free().await;
    let (engine, third) = owner(&lossy);
    take_over(&third).await;
    let (again, _) = tokio::task::block_in_place(|| partition_events(&lossy, 1, 0));
    assert_eq!(again.len(), logged.len());
    third.release(1);
    engine.shutdown(Duration::from_secs(5)).await;
    sim.shutdown().await;
}
