//! The pipeline against Apache Kafka (one broker, `sendledger_tests::broker`), in local mode: the main scenario; the `sendledger run` process killed
//! (SIGKILL) mid-run and started again on its ledger; the broker unreachable for a while behind
//! a relay that cuts every connection; two instances in one consumer group.

use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use sendledger_core::{ResultStatus, TaskResult};
use sendledger_kafka::{IngestStats, Kafka};
use sendledger_sim::{Faults, Sim, SimConfig};
use sendledger_store::{Ledger, LedgerOptions};
use sendledger_tests::kafka::{
    assert_events_published, assert_exactly_one_terminal, assert_one_record_each,
    assert_ordered_per_key, broker_behind_a_relay, config, config_for_process, end_to_end, produce,
    request_messages, results_for, service_config, sim_with_latency, task_ids, terminal_by_task,
    validate_all, wait_for, Broker, Pipeline, WAIT,
};

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

/// The end-to-end scenario against Apache Kafka.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn end_to_end_against_a_separate_broker_process() {
    let broker = tokio::task::block_in_place(Broker::single);
    let kafka = Kafka::connect(config(&broker.bootstrap())).unwrap();
    kafka
        .ensure_topics(1, Duration::from_secs(10), false)
        .await
        .expect("topics created");
    end_to_end(&kafka, 300, crate::seed(0x07a4_55e0)).await;
}

/// Against Apache Kafka, the sendledger process is SIGKILLed while it works
/// and started again on the same ledger: the remote still holds one record per identity, and
/// every task has exactly one terminal result after dedupe.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn process_killed_mid_run_against_a_separate_broker() {
    let seed = crate::seed(0x6b69_6c6c);
    let broker = tokio::task::block_in_place(Broker::single);
    let brokers = broker.bootstrap();
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
    std::fs::write(
        &config_file,
        service_config(dir.path(), &broker.bootstrap(), &sim),
    )
    .unwrap();

    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let keys: Vec<String> = (0..300).map(|i| format!("kill-{i}")).collect();
    let mut deliveries: Vec<&String> = keys.iter().collect();
    deliveries.extend(keys.iter().filter(|_| rng.random_bool(0.2)));
    deliveries.shuffle(&mut rng);
    // Half the deliveries before the first process starts, the rest while it is down.
    let (early, late) = deliveries.split_at(deliveries.len() / 2);
    produce(&kafka, request_messages(early)).await;

    let spawn = || crate::start_run(&config_file, &[]).0;
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

/// The broker is unreachable for 30 s in the middle of a run (`SENDLEDGER_OUTAGE_SECS`
/// changes it): a relay between sendledger and Apache Kafka closes every
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
    let (_broker, relay, kafka) = broker_behind_a_relay().await;
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

/// Two instances, each with its own ledger, in one consumer group on Apache Kafka
/// process: the first processes 200 requests alone; the second joins and the partitions are
/// split; the same 200 requests are delivered again. Neither instance consumes while the
/// group is shared (each says why), so the remote still holds one record per identity. When
/// the second leaves, the first holds every partition again and records the redeliveries as
/// duplicates of its tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_in_one_group_never_send_a_request_twice() {
    let broker = tokio::task::block_in_place(Broker::single);
    let kafka = Kafka::connect(config_for_process(&broker)).unwrap();
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
