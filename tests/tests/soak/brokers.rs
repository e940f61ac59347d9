//! Failures only a real cluster of brokers has: a broker killed or frozen under kafka mode.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use sendledger_sim::{Sim, SimConfig};
use sendledger_tests::cluster::{
    each_answered, start_broker, why_unanswered, Group, KeptOnFailure, ResultsFollower, Stream,
    PARTITIONS,
};

use crate::SENDLEDGER;

/// Failures only a real cluster has, with two instances in kafka mode and requests streaming
/// in: the broker leading events partition 0 is killed (`kill -9`) and started again on its
/// data; then the broker leading events partition 1 is frozen (`SIGSTOP`) for 20 s and
/// thawed; then the broker coordinating the consumer group is killed and started again. With
/// three replicas and `min.insync.replicas=2`, one broker away loses no acknowledged commit:
/// nothing is sent twice, every task settles once with each result once on the results topic,
/// none goes to review, and the events topic audits clean.
///
/// The first two pass (runs on Apache Kafka 4.1.1 with the product's 10 s session). **The
/// coordinator's kill fails today**: with a 10 s session every member's session expired
/// before another broker coordinated the group (all partitions lost and taken over again;
/// intents committed and not sent go to review); with 20 s
/// (`SENDLEDGER_SOAK_SESSION_MS=20000`) no session expired, but the requests of some
/// partitions never reached the log for the test's 90 s, though the consumer received them
/// from the partitions' new leaders. Kept outside `scripts/test` until that is understood.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a chaos soak, failing at the coordinator's kill: run it with scripts/soak-cluster"]
async fn a_broker_killed_then_another_frozen_loses_and_duplicates_nothing() {
    let root = KeptOnFailure::new();
    let (mut broker, mut kafka_config, kafka) = start_broker().await;
    // The product's own session, or SENDLEDGER_SOAK_SESSION_MS: the tests' 6 s is shorter than
    // the brokers' detection of a dead broker (broker.session.timeout.ms, 9 s), so the death
    // of the group's coordinator expired every member's session.
    for key in [
        "consumer.session.timeout.ms",
        "consumer.heartbeat.interval.ms",
    ] {
        kafka_config.properties.remove(key);
    }
    // librdkafka's own trace of the producers (e.g. `eos`) or the consumers (e.g.
    // `fetch,topic,metadata`), for an investigation; with `RUST_LOG=info,librdkafka=debug` the
    // instances log it.
    for (var, key) in [
        ("SENDLEDGER_SOAK_PRODUCER_DEBUG", "producer.debug"),
        ("SENDLEDGER_SOAK_CONSUMER_DEBUG", "consumer.debug"),
    ] {
        if let Ok(debug) = std::env::var(var) {
            kafka_config.properties.insert(key.into(), debug);
        }
    }
    if let Ok(ms) = std::env::var("SENDLEDGER_SOAK_SESSION_MS") {
        eprintln!("session.timeout.ms = {ms}");
        (kafka_config.properties).insert("consumer.session.timeout.ms".into(), ms);
    }
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let target = sendledger_tests::engine::target(&sim.base_url(), |_| {});
    let mut group = Group::start(SENDLEDGER, root.path(), 2, &kafka_config, target).await;
    let results = ResultsFollower::start(&kafka);
    let stream = Stream::start(&kafka, "brokers", 5, Duration::from_millis(50));
    let all: BTreeSet<i32> = (0..PARTITIONS).collect();
    let admins: Vec<String> = (group.instances.iter())
        .map(|i| i.admin().to_string())
        .collect();
    let answered_since = |from: usize| {
        let (results, stream, admins) = (&results, &stream, &admins);
        let all = all.clone();
        async move {
            let limit = Instant::now() + Duration::from_secs(90);
            while !each_answered(results, &stream.produced(), from, &all) {
                if Instant::now() > limit {
                    let why = tokio::task::block_in_place(|| {
                        why_unanswered(results, &stream.produced(), from, &all)
                    });
                    for admin in admins {
                        eprintln!("{admin}: {}", what_an_instance_says(admin));
                    }
                    panic!("not every partition answered again: {why}");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    answered_since(0).await;

    let events_topic = kafka_config.events_topic.clone();
    let killed = broker.leader_of(&events_topic, 0);
    broker.kill(killed);
    let at = stream.produced().len();
    answered_since(at).await;
    eprintln!("broker {killed} (leading events partition 0) killed: every partition answers");
    broker.restart(killed);
    tokio::task::block_in_place(|| broker.wait_ready());

    let frozen = broker.leader_of(&events_topic, 1);
    broker.freeze(frozen, true);
    tokio::time::sleep(Duration::from_secs(20)).await;
    broker.freeze(frozen, false);
    let at = stream.produced().len();
    answered_since(at).await;
    eprintln!("broker {frozen} (leading events partition 1) frozen for 20 s and thawed");

    let coordinator = broker.coordinator_of(&kafka_config.group_id);
    broker.kill(coordinator);
    let at = stream.produced().len();
    answered_since(at).await;
    eprintln!("broker {coordinator} (the group's coordinator) killed: every partition answers");
    broker.restart(coordinator);
    tokio::task::block_in_place(|| broker.wait_ready());

    let produced = stream.stop().await;
    let keys: Vec<String> = produced.iter().map(|(k, _)| k.clone()).collect();
    let report = group.finish(results, &sim, &keys).await;
    assert_eq!(report.tasks, keys.len() as u64, "{report:?}");
    assert_eq!(sim.stats().posts, keys.len() as u64, "{:?}", sim.stats());
    sim.shutdown().await;
    drop(broker);
}

/// An instance's `/healthz`, and the lines of its `/metrics` about its partitions, its ingest
/// and its log: what it says of itself when a partition does not answer.
fn what_an_instance_says(admin: &str) -> String {
    let get = |path: &str| {
        sendledger_tests::http::get_any(admin, path, Duration::from_secs(2))
            .map_or_else(|| "no answer".to_string(), |(_, body)| body)
    };
    let metrics: Vec<String> = get("/metrics")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            [
                "ingest",
                "partition",
                "log_",
                "consumer_lag",
                "in_flight",
                "journal",
            ]
            .iter()
            .any(|k| l.contains(k))
        })
        .map(str::to_string)
        .collect();
    format!("{}\n{}", get("/healthz"), metrics.join("\n"))
}
