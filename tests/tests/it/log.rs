//! The events topic as a log of record (kafka mode's building block): one transactional writer
//! per partition, fenced by the next one, read back as a `read_committed` consumer. Against
//! the separate broker process, which fences transactional ids and keeps transactional
//! offsets; the embedded cluster does neither.

use std::time::Duration;

use sendledger_bus::log::{read_partition, Committed};
use sendledger_bus::rdkafka::consumer::{BaseConsumer, Consumer};
use sendledger_bus::rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use sendledger_bus::rdkafka::{Offset, TopicPartitionList};
use sendledger_bus::{Kafka, KafkaConfig, LogBatch, LogError, LogRecord, PartitionLog, Role};

use crate::kafka::{config_for_process, start_tansu};

const TIMEOUT: Duration = Duration::from_secs(20);

fn records(prefix: &str, n: usize) -> Vec<LogRecord> {
    (0..n)
        .map(|i| LogRecord {
            key: format!("{prefix}-key"),
            event_id: format!("{prefix}:{i}"),
            payload: format!("{{\"n\":{i}}}").into_bytes(),
        })
        .collect()
}

/// The event ids of events partition `partition` from `from` on, as a `read_committed`
/// consumer sees them, and where the read ended.
fn committed_event_ids(kafka: &Kafka, partition: i32, from: i64) -> (Vec<String>, i64) {
    let mut ids = Vec::new();
    let end = read_partition(kafka, partition, from, TIMEOUT, |r| {
        assert_eq!(r.partition, partition);
        ids.push(r.event_id().unwrap_or_default());
        Ok(())
    })
    .expect("the partition reads back");
    (ids, end)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_writer_fences_the_old_one_and_readers_see_only_committed_batches() {
    let tansu = start_tansu();
    let kafka = Kafka::connect(config_for_process(&format!("127.0.0.1:{}", tansu.port))).unwrap();
    kafka.ensure_topics(1, TIMEOUT).await.unwrap();
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
    cluster
        .request_errors(
            RDKafkaApiKey::InitProducerId,
            vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED; 4],
        )
        .unwrap();
    let err = tokio::task::block_in_place(|| PartitionLog::open(&kafka, 0, TIMEOUT))
        .err()
        .expect("the log does not open");
    assert!(matches!(err, LogError::Unsupported { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("storage.mode"), "{text}");
    assert!(text.contains("sendledger.events.0"), "{text}");
}
