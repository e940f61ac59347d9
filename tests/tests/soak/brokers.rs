//! Failures only a real cluster of brokers has: a broker killed or frozen under kafka mode.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use sendledger_sim::{Sim, SimConfig};
use sendledger_tests::cluster::{
    assert_settled_once, each_answered, read_and_audit_log, start_broker, Group, Instance,
    KeptOnFailure, ResultsFollower, Stream, Timeline, PARTITIONS,
};
use sendledger_tests::kafka::task_ids;

use crate::SENDLEDGER;

/// Failures only a real cluster has, with two instances in kafka mode and requests streaming
/// in: the broker leading events partition 0 is killed (`kill -9`) and started again on its
/// data; then the broker leading events partition 1 is frozen (`SIGSTOP`) for 20 s and thawed.
/// With three replicas and `min.insync.replicas=2`, one broker away loses no acknowledged
/// commit: nothing is sent twice, every task settles once with each result once on the
/// results topic, none goes to review, and the events topic audits clean.
///
/// **It fails today** (found on its first run): after the kill, a take-over of a partition
/// that moved is refused by `init_transactions` ("another concurrent operation on the same
/// transaction was ongoing") again and again, and the partition answers nothing for over 90 s.
/// Kept here, outside `scripts/test`, until that is understood and fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a chaos soak, and failing: run it with scripts/soak-cluster"]
async fn a_broker_killed_then_another_frozen_loses_and_duplicates_nothing() {
    let root = KeptOnFailure::new();
    let (mut broker, mut kafka_config, kafka) = start_broker().await;
    // The product's own session (10 s): the tests' 6 s is shorter than the brokers' detection
    // of a dead broker (broker.session.timeout.ms, 9 s), so the death of the group's
    // coordinator expired every member's session.
    for key in ["consumer.session.timeout.ms", "consumer.heartbeat.interval.ms"] {
        kafka_config.properties.remove(key);
    }
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let target = sendledger_tests::engine::target(&sim.base_url(), |_| {});
    let timeline = Timeline::default();
    let mut group = Group {
        instances: (0..2)
            .map(|i| Instance::new(SENDLEDGER, root.path(), i, &kafka_config, target.clone()))
            .collect(),
        timeline: timeline.clone(),
    };
    for i in 0..2 {
        tokio::task::block_in_place(|| group.instances[i].start(&timeline));
    }
    let took = group.wait_settled(Duration::from_secs(60)).await;
    assert!(
        took.is_some(),
        "not every partition owned: {}",
        group.owners()
    );
    let results = ResultsFollower::start(&kafka);
    let stream = Stream::start(&kafka, "brokers", 5, Duration::from_millis(50));
    let all: BTreeSet<i32> = (0..PARTITIONS).collect();
    let answered_since = |from: usize| {
        let (results, stream) = (&results, &stream);
        let all = all.clone();
        async move {
            let limit = Instant::now() + Duration::from_secs(90);
            while !each_answered(results, &stream.produced(), from, &all) {
                assert!(Instant::now() < limit, "not every partition answered again");
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

    let produced = stream.stop().await;
    let keys: Vec<String> = produced.iter().map(|(k, _)| k.clone()).collect();
    let tasks = task_ids(&keys);
    group
        .wait_answered(&results, &tasks, Duration::from_secs(90))
        .await;
    group.stop_all();
    let raw = results.stop();
    let ((events, _), report) = tokio::task::block_in_place(|| read_and_audit_log(&kafka));
    let reviews = assert_settled_once(&sim, &keys, &raw, &events);
    assert!(reviews.is_empty(), "tasks in review: {reviews:?}");
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(report.tasks, keys.len() as u64, "{report:?}");
    assert_eq!(sim.stats().posts, keys.len() as u64, "{:?}", sim.stats());
    sim.shutdown().await;
    drop(broker);
}
