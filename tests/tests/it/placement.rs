//! Kafka mode runs a request only on the partition its key belongs to (Kafka's default
//! partitioner, murmur2, over the log of record's partitions), so that one task never has two
//! owners. Two `sendledger run` instances share the partitions of Apache Kafka (three brokers);
//! requests arrive where a producer with a random partitioner, or one that knows of partitions
//! added to the requests topic, put them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use sendledger_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
use sendledger_kafka::rdkafka::client::DefaultClientContext;
use sendledger_kafka::{Partitioner, Role};
use sendledger_sim::{Sim, SimConfig};
use sendledger_tests::cluster::{
    read_and_audit_log, start_broker, Group, KeptOnFailure, ResultsFollower, PARTITIONS,
};
use sendledger_tests::kafka::{
    identity_key, produce, request_json, request_messages, task_ids, Rec,
};

use crate::SENDLEDGER;

/// The partition a request key's identity belongs to among `partitions`.
fn belongs(key: &str, partitions: i32) -> i32 {
    Partitioner::Murmur2.partition(identity_key(key).as_bytes(), partitions)
}

/// The rejected results naming `key` whose reason says it was misplaced.
fn misplaced_results<'a>(records: &'a [Rec], key: &str) -> Vec<&'a Rec> {
    (records.iter())
        .filter(|r| r.value["status"] == "rejected" && r.value["request_key"] == key)
        .filter(|r| {
            r.value["reason"]
                .as_str()
                .is_some_and(|s| s.starts_with("misplaced"))
        })
        .collect()
}

/// Waits until the results topic (read again from its start each time) holds a misplaced
/// rejection of each of `misplaced`; returns its records.
async fn wait_misplaced_rejected(
    kafka: &sendledger_kafka::Kafka,
    misplaced: &BTreeSet<String>,
) -> Vec<Rec> {
    let topic = kafka.config().results_topic.clone();
    let expected = misplaced.clone();
    let started = Instant::now();
    let records = sendledger_tests::kafka::read_until(kafka, &topic, move |r| {
        expected.iter().all(|k| !misplaced_results(r, k).is_empty())
    })
    .await;
    eprintln!("misplaced requests rejected: {:?}", started.elapsed());
    records
}

/// The sum over the instances of `sendledger_requests_misplaced_total`.
fn misplaced_counted(group: &Group) -> u64 {
    (group.instances.iter())
        .filter_map(|i| i.metrics())
        .flat_map(|text| {
            text.lines()
                .filter(|l| l.starts_with("sendledger_requests_misplaced_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .collect::<Vec<_>>()
        })
        .sum::<f64>() as u64
}

/// Requests produced to partitions a seeded random draw chose (as a producer with a random
/// partitioner would): each that arrived on its key's partition runs once; each that arrived
/// elsewhere is rejected, nothing sent, with a result that names its key's partition and the
/// partitioner, counted in `sendledger_requests_misplaced_total`. Produced again keyed the
/// usual way, every request runs exactly once: the rejection took nothing from the task.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_on_another_partition_than_its_keys_is_rejected_and_never_run_twice() {
    let seed = sendledger_tests::seed(65);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let root = KeptOnFailure::new();
    let (broker, kafka_config, kafka) = start_broker().await;
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let target = sendledger_tests::engine::target(&sim.base_url(), |_| {});
    let mut group = Group::start(SENDLEDGER, root.path(), 2, &kafka_config, target).await;
    let results = ResultsFollower::start(&kafka);

    let keys: Vec<String> = (0..60).map(|i| format!("drawn-{i}")).collect();
    let drawn: BTreeMap<String, i32> = (keys.iter())
        .map(|k| (k.clone(), rng.random_range(0..PARTITIONS)))
        .collect();
    let misplaced: BTreeSet<String> = (drawn.iter())
        .filter(|(k, p)| belongs(k, PARTITIONS) != **p)
        .map(|(k, _)| k.clone())
        .collect();
    let placed: Vec<String> = (keys.iter())
        .filter(|k| !misplaced.contains(*k))
        .cloned()
        .collect();
    assert!(
        !misplaced.is_empty() && !placed.is_empty(),
        "seed {seed} drew no mix of placed and misplaced requests"
    );
    let messages = (drawn.iter())
        .map(|(k, p)| (Some(*p), identity_key(k), Some(request_json(k))))
        .collect();
    produce(&kafka, messages).await;

    let records = wait_misplaced_rejected(&kafka, &misplaced).await;
    group
        .wait_answered(&results, &task_ids(&placed), Duration::from_secs(90))
        .await;
    for key in &misplaced {
        let rejected = misplaced_results(&records, key);
        assert_eq!(rejected.len(), 1, "{key}: {rejected:?}");
        let reason = rejected[0].value["reason"].as_str().unwrap();
        let home = belongs(key, PARTITIONS);
        assert!(
            reason.contains(&format!("belongs to partition {home} of {PARTITIONS}"))
                && reason.contains("murmur2")
                && reason.contains(&format!("arrived on partition {}", drawn[key])),
            "{reason}"
        );
        assert!(
            sim.records_with_identity(key).is_empty(),
            "{key} was sent from the wrong partition"
        );
    }
    assert_eq!(sim.stats().posts, placed.len() as u64, "{:?}", sim.stats());
    assert_eq!(misplaced_counted(&group), misplaced.len() as u64);

    // Keyed the usual way (the key chooses the partition), every request runs exactly once.
    produce(&kafka, request_messages(&keys)).await;
    group.finish(results, &sim, &keys).await;
    assert_eq!(sim.stats().posts, keys.len() as u64, "{:?}", sim.stats());
    sim.shutdown().await;
    drop(broker);
}

/// Partitions added to the requests topic mid-run (6 to 9) move most keys to another
/// partition for the producers that know of them. Nothing runs twice: a redelivery, or a new
/// request, that arrived on one of the first six partitions but belongs elsewhere among six is
/// rejected as misplaced; one that belongs there runs (or is a duplicate); the new partitions
/// have no partition in the log of record, so their requests wait, unconsumed, and the
/// instance that holds one says why in `/healthz`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitions_added_to_the_requests_topic_run_nothing_twice() {
    let root = KeptOnFailure::new();
    let (broker, mut kafka_config, kafka) = start_broker().await;
    // The instances see the new partitions within seconds (librdkafka refreshes a topic's
    // metadata every 5 minutes by default).
    (kafka_config.properties).insert(
        "consumer.topic.metadata.refresh.interval.ms".into(),
        "1000".into(),
    );
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let target = sendledger_tests::engine::target(&sim.base_url(), |_| {});
    let mut group = Group::start(SENDLEDGER, root.path(), 2, &kafka_config, target).await;
    let results = ResultsFollower::start(&kafka);

    let first: Vec<String> = (0..40).map(|i| format!("before-{i}")).collect();
    produce(&kafka, request_messages(&first)).await;
    group
        .wait_answered(&results, &task_ids(&first), Duration::from_secs(90))
        .await;

    let grown = PARTITIONS + 3;
    let admin: AdminClient<DefaultClientContext> =
        kafka.client_config(Role::Admin).create().unwrap();
    let topic = kafka_config.requests_topic.clone();
    for r in (admin.create_partitions(
        &[NewPartitions::new(&topic, grown as usize)],
        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
    ))
    .await
    .unwrap()
    {
        r.unwrap();
    }
    // A producer created now places keys among nine partitions: redeliveries of the first
    // requests and new ones.
    let second: Vec<String> = (0..40).map(|i| format!("after-{i}")).collect();
    let again: Vec<String> = first.iter().chain(&second).cloned().collect();
    let acks = produce(&kafka, request_messages(&again)).await;
    let arrived: BTreeMap<String, i32> = again
        .iter()
        .cloned()
        .zip(acks.iter().map(|(p, _)| *p))
        .collect();
    for (key, partition) in &arrived {
        assert_eq!(
            *partition,
            belongs(key, grown),
            "{key}: the producer saw 9 partitions"
        );
    }
    let on_new: BTreeSet<&String> = (arrived.iter())
        .filter(|(_, p)| **p >= PARTITIONS)
        .map(|(k, _)| k)
        .collect();
    let misplaced: BTreeSet<String> = (arrived.iter())
        .filter(|(k, p)| **p < PARTITIONS && belongs(k, PARTITIONS) != **p)
        .map(|(k, _)| k.clone())
        .collect();
    let runnable: Vec<String> = (second.iter())
        .filter(|k| arrived[*k] < PARTITIONS && !misplaced.contains(*k))
        .cloned()
        .collect();
    assert!(
        !on_new.is_empty() && !misplaced.is_empty(),
        "the keys cover every case: {arrived:?}"
    );

    let records = wait_misplaced_rejected(&kafka, &misplaced).await;
    group
        .wait_answered(&results, &task_ids(&runnable), Duration::from_secs(90))
        .await;
    for key in &misplaced {
        assert_eq!(misplaced_results(&records, key).len(), 1, "{key}");
    }
    // The new partitions are assigned, refused and said so.
    let deadline = Instant::now() + Duration::from_secs(60);
    let blocked = loop {
        let blocked: BTreeMap<String, String> = (group.instances.iter())
            .filter_map(|i| {
                let (_, body) =
                    sendledger_tests::http::get_any(i.admin(), "/healthz", Duration::from_secs(1))?;
                let health: serde_json::Value = serde_json::from_str(&body).ok()?;
                serde_json::from_value::<BTreeMap<String, String>>(
                    health["blocked_partitions"].clone(),
                )
                .ok()
            })
            .flatten()
            .collect();
        if blocked.len() == 3 {
            break blocked;
        }
        assert!(
            Instant::now() < deadline,
            "new partitions not refused: {blocked:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for (partition, why) in &blocked {
        assert!(
            partition.parse::<i32>().unwrap() >= PARTITIONS,
            "{blocked:?}"
        );
        assert!(why.contains("partitions were added"), "{why}");
    }

    // Nothing ran twice, nothing ran from a partition it does not belong to.
    for key in &again {
        let records = sim.records_with_identity(key);
        let expected = usize::from(first.contains(key) || runnable.contains(key));
        assert_eq!(records.len(), expected, "{key} arrived on {}", arrived[key]);
    }
    // The new partitions' arrival moved partitions between the instances: a misplaced request
    // handled before the move and delivered again after it is counted again (its rejection is
    // recorded once: one result each, above).
    assert!(misplaced_counted(&group) >= misplaced.len() as u64);
    group.stop_all();
    let ((_, _), report) = tokio::task::block_in_place(|| read_and_audit_log(&kafka));
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    results.stop();
    sim.shutdown().await;
    drop(broker);
}
