//! The pipeline on librdkafka's embedded mock cluster, in this process: requests produced to
//! the requests topic, the ingest feeding a real engine (RocksDB in a temporary directory)
//! that calls the simulated remote over real sockets, and the publisher writing results and
//! events back. The main scenario with duplicates and dropped responses; a rewound consumer
//! group; broker faults and a broker down; bad input and dead letters; a closed ledger; the
//! `run` and `produce` commands against the cluster over TCP; a recreated requests topic,
//! requests deleted before processing and a replaced ledger; a long task history; the byte
//! budget.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sendledger_core::{
    EventBody, Evidence, Limits, NewEvent, Phase, ResultStatus, Source, TaskId, TaskResult,
};
use sendledger_kafka::rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use sendledger_kafka::rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use sendledger_kafka::rdkafka::{Offset, TopicPartitionList};
use sendledger_kafka::{IngestStats, Kafka, KafkaConfig, Publisher, Role, TopicReader};
use sendledger_sim::{Sim, SimConfig};
use sendledger_store::{Append, Ledger, LedgerOptions, TaskSummary};
use sendledger_tests::engine::{request, target};
use sendledger_tests::kafka::{
    assert_events_published, assert_exactly_one_terminal, assert_one_record_each,
    assert_ordered_per_key, committed, config, dedupe, embedded, end_to_end, identity_key, produce,
    read_until, request_json, request_messages, results_for, service_config, task_ids,
    validate_all, wait_for, Pipeline, PARTITIONS, WAIT,
};

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
                    .header(sendledger_kafka::ingest::REASON_HEADER)
                    .unwrap_or_default();
                out.push((r.key_text(), reason));
            }
        }
        out
    })
    .await
    .unwrap()
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
    let cli = crate::sendledger;

    let (mut run, line) = tokio::task::block_in_place(|| crate::start_run(&config_file, &[]));

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
    let admin = sendledger_tests::ready_field(&line, "admin=http://");
    let metrics = tokio::task::block_in_place(|| {
        sendledger_tests::http::get(&admin, "/metrics", Duration::from_secs(30))
            .expect("/metrics answers 200")
    });
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
