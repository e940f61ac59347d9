//! The Kafka side of the integration tests: the brokers (librdkafka's embedded mock cluster
//! in this process, or Apache Kafka: [`Broker`], `crate::broker`), relays in front of Apache
//! Kafka (one a test can cut, one that terminates TLS), the engine with its ingest and publisher on one ledger ([`Pipeline`]),
//! requests produced to the requests topic, records read back from the results and events
//! topics, and the assertions the Kafka tests share: one record per identity at the remote,
//! one terminal result per task, results in log order, every event published, every record
//! valid against its JSON Schema. [`end_to_end`] is the main scenario, run against each kind
//! of broker.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use sendledger_actors::Engine;
use sendledger_core::{ResultStatus, TaskResult};
use sendledger_kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use sendledger_kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use sendledger_kafka::rdkafka::{Offset, TopicPartitionList};
use sendledger_kafka::{Ingest, IngestStats, Kafka, KafkaConfig, Publisher, Role, TopicReader};
use sendledger_node::wiring::EngineSink;
use sendledger_sim::{Faults, Sim, SimConfig};

pub use crate::broker::Broker;
use crate::engine::{request, target};
pub use crate::kafka_relay::Relay;

/// How long a test waits for what it expects (results, events, progress) before it fails.
pub const WAIT: Duration = Duration::from_secs(90);
/// Partitions of the topics of [`config`].
pub const PARTITIONS: i32 = 3;

/// The Kafka settings of the tests against `brokers` (`embedded` for a new embedded cluster):
/// [`PARTITIONS`] partitions, offsets committed every 200 ms.
pub fn config(brokers: &str) -> KafkaConfig {
    KafkaConfig {
        brokers: brokers.into(),
        partitions: PARTITIONS,
        commit_interval: Duration::from_millis(200),
        ..KafkaConfig::default()
    }
}

/// Engine, ingest and publisher on one ledger directory.
pub struct Pipeline {
    pub engine: Engine,
    pub ingest: Ingest,
    pub publisher: Publisher,
}

impl Pipeline {
    pub fn start(kafka: &Kafka, dir: &Path, sim: &Sim) -> Pipeline {
        let engine = tokio::task::block_in_place(|| {
            crate::engine::start(dir, target(&sim.base_url(), |_| {}))
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

    pub async fn stop(self) {
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
    pub async fn published(&self) {
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

/// The key of a request message: the identity of [`request`]`(key)`.
pub fn identity_key(key: &str) -> String {
    format!("acme/payment.create/{key}")
}

/// The request key `{stem}-{n}` (the first `n` from `from` on) whose identity key belongs to
/// `partition` of `partitions` under Kafka's default partitioner (murmur2): a request kafka
/// mode accepts on that partition, whoever chooses it (the key, or the producer).
pub fn key_on(stem: &str, from: usize, partition: i32, partitions: i32) -> String {
    (from..)
        .map(|n| format!("{stem}-{n}"))
        .find(|k| {
            sendledger_kafka::Partitioner::Murmur2.partition(identity_key(k).as_bytes(), partitions)
                == partition
        })
        .expect("a key for every partition")
}

/// Produces `(partition, key, value)` to the requests topic and waits for every ack. A `None`
/// partition lets the key choose; a `None` value is a tombstone.
pub async fn produce(
    kafka: &Kafka,
    messages: Vec<(Option<i32>, String, Option<Vec<u8>>)>,
) -> Vec<(i32, i64)> {
    produce_with(&requests_producer(kafka), kafka, messages).await
}

/// A producer of requests, for [`produce_with`].
pub fn requests_producer(kafka: &Kafka) -> FutureProducer {
    kafka
        .client_config(Role::Producer)
        .create()
        .expect("producer")
}

/// [`produce`] through `producer`, one of [`requests_producer`].
pub async fn produce_with(
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
pub fn request_messages<K: AsRef<str>>(
    keys: impl IntoIterator<Item = K>,
) -> Vec<(Option<i32>, String, Option<Vec<u8>>)> {
    request_messages_to(keys, "sim")
}

/// As [`request_messages`], the requests naming `target` (a target or a saga).
pub fn request_messages_to<K: AsRef<str>>(
    keys: impl IntoIterator<Item = K>,
    target: &str,
) -> Vec<(Option<i32>, String, Option<Vec<u8>>)> {
    keys.into_iter()
        .map(|k| {
            let mut r = request(k.as_ref());
            r.target = target.to_string();
            (
                None,
                identity_key(k.as_ref()),
                Some(serde_json::to_vec(&r).unwrap()),
            )
        })
        .collect()
}

/// A simulated remote whose every answer takes `latency`, with no other fault.
pub async fn sim_with_latency(latency: Duration) -> Sim {
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

/// The JSON of [`request`]`(key)`, as produced to the requests topic.
pub fn request_json(key: &str) -> Vec<u8> {
    serde_json::to_vec(&request(key)).unwrap()
}

/// One record read back from a topic.
#[derive(Debug, Clone)]
pub struct Rec {
    pub key: String,
    pub event_id: String,
    pub value: serde_json::Value,
}

/// Reads every partition of `topic` from the start until `done` holds for what was read.
pub async fn read_until(
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
/// the same record, or (re-announced from what retention kept of a task) the same record less
/// what retention does not keep.
pub fn dedupe(records: &[Rec]) -> Vec<TaskResult> {
    let mut seen: HashMap<&str, &serde_json::Value> = HashMap::new();
    let mut out = Vec::new();
    for r in records {
        match seen.get(r.event_id.as_str()) {
            Some(v) if r.value == as_kept(v) => {}
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

/// The terminal results of each task, by task id.
pub fn terminal_by_task(results: &[TaskResult]) -> BTreeMap<String, Vec<&TaskResult>> {
    let mut map: BTreeMap<String, Vec<&TaskResult>> = BTreeMap::new();
    for r in results.iter().filter(|r| r.status.is_terminal()) {
        map.entry(r.task_id.clone()).or_default().push(r);
    }
    map
}

/// The validator of `schemas/<name>`.
pub fn schema(name: &str) -> jsonschema::Validator {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../schemas")
        .join(name);
    let schema: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    jsonschema::validator_for(&schema).expect("a valid schema")
}

/// Every record is valid against `schemas/<schema_name>`.
pub fn validate_all(records: &[Rec], schema_name: &str) {
    let validator = schema(schema_name);
    for r in records {
        if let Err(e) = validator.validate(&r.value) {
            panic!("{schema_name}: {e}\n{}", r.value);
        }
    }
}

/// The remote holds exactly one record per identity, and each task's result names it.
pub fn assert_one_record_each(sim: &Sim, keys: &[String], results: &[TaskResult]) {
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
        let task = crate::engine::task_id(key).to_string();
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

/// A result record as it is re-announced once retention removed its task's history
/// (`docs/operating/retention.md`): without the evidence, the remote's answer, the source and
/// the steps.
fn as_kept(record: &serde_json::Value) -> serde_json::Value {
    let mut kept = record.clone();
    if let Some(fields) = kept.as_object_mut() {
        for field in ["evidence", "detail", "source", "review"] {
            if let Some(v) = fields.get_mut(field) {
                *v = serde_json::Value::Null;
            }
        }
        if let Some(v) = fields.get_mut("remote_ids") {
            *v = serde_json::json!([]);
        }
        fields.remove("steps");
    }
    kept
}

/// Waits for one terminal result for each of `tasks` on the results topic, and returns the
/// deduplicated results.
pub async fn results_for(kafka: &Kafka, tasks: BTreeSet<String>) -> (Vec<Rec>, Vec<TaskResult>) {
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

/// The task ids of [`request`]`(key)` for each of `keys`.
pub fn task_ids(keys: &[String]) -> BTreeSet<String> {
    keys.iter()
        .map(|k| crate::engine::task_id(k).to_string())
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
pub fn assert_exactly_one_terminal(results: &[TaskResult], tasks: &BTreeSet<String>) {
    let terminal = terminal_by_task(results);
    for t in tasks {
        let n = terminal.get(t).map_or(0, Vec::len);
        assert_eq!(n, 1, "task {t}: {n} terminal results");
    }
}

/// A task's results reach the topic in log order: per key, first occurrences by increasing LSN.
pub fn assert_ordered_per_key(raw: &[Rec]) {
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
pub async fn assert_events_published(kafka: &Kafka, last_lsn: u64) {
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
pub async fn end_to_end(kafka: &Kafka, n: usize, seed: u64) {
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

/// A client of a new embedded cluster with [`config`].
pub fn embedded() -> Kafka {
    tokio::task::block_in_place(|| Kafka::connect(config("embedded")).expect("embedded cluster"))
}

/// The offset the ingest's consumer group committed for a requests-topic partition.
pub fn committed(kafka: &Kafka, partition: i32) -> Offset {
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
pub fn service_config(dir: &Path, brokers: &str, sim: &Sim) -> String {
    let mut config = sendledger_node::config::Config::default();
    config.storage.data = dir.join("ledger");
    config.engine.timer_tick = Duration::from_millis(5);
    config.kafka = process_kafka(brokers);
    config.admin.enabled = false;
    config
        .targets
        .insert("sim".into(), target(&sim.base_url(), |_| {}));
    toml::to_string(&config).expect("a config serializes to TOML")
}

/// The Kafka settings of a service against Apache Kafka (`broker`): [`process_kafka`], topics
/// replicated to every node (three at most).
pub fn config_for_process(broker: &Broker) -> KafkaConfig {
    KafkaConfig {
        replication_factor: broker.nodes().min(3) as i32,
        ..process_kafka(&broker.bootstrap())
    }
}

/// The Kafka settings of a service in a process of its own against `brokers`: topics with one
/// replica, a killed member's session expires after 6s, and (in kafka mode) the send lease is
/// 2s, short enough for the test target's lookup deadline (3s) with its request timeout.
pub fn process_kafka(brokers: &str) -> KafkaConfig {
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

/// Apache Kafka (one node), reached only through a [`Relay`] (it advertises the relay's
/// address to clients), and a client of it through the relay.
pub async fn broker_behind_a_relay() -> (Broker, Relay, Kafka) {
    let relay_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let broker = tokio::task::block_in_place(|| Broker::single_advertising(relay_port));
    let relay = Relay::start_on(relay_port, broker.port).await;
    let kafka = Kafka::connect(config_for_process(&broker)).unwrap();
    (broker, relay, kafka)
}

/// Waits until `done` holds, or fails with `what`.
pub async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A TLS relay (socat) in front of a plain-text broker: the broker itself does not terminate
/// TLS, the relay does, with a certificate made at test time.
pub struct TlsRelay {
    child: Child,
    pub port: u16,
}

impl Drop for TlsRelay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TlsRelay {
    /// Listens with TLS on `port` (`cert` and `key`) and relays to `target` in plain text.
    pub fn start(port: u16, cert: &Path, key: &Path, target: u16) -> TlsRelay {
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

/// A local-mode service's configuration on `dir` against `kafka`, with the test target at `sim`
/// and no admin endpoint (to start with [`start_local_service`]).
pub fn local_service(
    dir: &std::path::Path,
    kafka: &sendledger_kafka::Kafka,
    sim: &sendledger_sim::Sim,
) -> sendledger_node::config::Config {
    let mut config = sendledger_node::config::Config::default();
    config.storage.data = dir.to_path_buf();
    config.kafka = kafka.config().clone();
    config.admin.enabled = false;
    config
        .targets
        .insert("sim".into(), crate::engine::target(&sim.base_url(), |_| {}));
    config
}

/// Validates `config` and starts the service it describes on `kafka`.
pub async fn start_local_service(
    config: sendledger_node::config::Config,
    kafka: &sendledger_kafka::Kafka,
) -> sendledger_node::Result<sendledger_node::service::Service> {
    config.validate(&Default::default()).unwrap();
    let remote = std::sync::Arc::new(sendledger_node::wiring::HttpRemote::new(
        config.load_targets().unwrap(),
    ));
    sendledger_node::service::Service::start(&config, kafka, remote, None).await
}
