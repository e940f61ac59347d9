//! Kafka mode with `storage.retention`: each instance's copy of the partitions (those it owns
//! and those it follows for another) keeps only what retention keeps of settled tasks, and the
//! guarantee holds across take-overs of partitions whose copies were pruned. Two services
//! against Apache Kafka (three brokers), the simulated remote over real sockets; checked on the
//! remote's records, each ledger's copy, the results topic and the audits.

use std::time::Duration;

use sendledger_kafka::Kafka;
use sendledger_store::Ledger;
use sendledger_tests::engine::task_id;
use sendledger_tests::kafka::{
    assert_one_record_each, config_for_process, produce, request_messages, results_for, task_ids,
    wait_for, Broker,
};

use crate::log::{audit_events_topic, kafka_mode_service_with};

/// How many of `keys` the copy in `ledger` holds only by what retention kept of them.
fn pruned(ledger: &Ledger, keys: &[String]) -> usize {
    let only_kept = |key: &String| {
        let events = ledger.task_events(task_id(key)).unwrap();
        matches!(&events[..], [kept] if kept.body.name() == "Pruned")
    };
    keys.iter().filter(|k| only_kept(k)).count()
}

/// A service in kafka mode with a retention of 1 s (on `kafka`, which says whether it follows
/// the partitions it does not own).
async fn service(
    dir: &std::path::Path,
    kafka: &Kafka,
    sim: &sendledger_sim::Sim,
) -> sendledger_node::service::Service {
    let change = |config: &mut sendledger_node::config::Config| {
        config.storage.retention = Some(Duration::from_secs(1));
    };
    kafka_mode_service_with(dir, kafka, sim, change, |_| {}).await
}

/// Two instances with a retention of 1 s, each following the other's partitions. The first
/// processes 200 requests alone and prunes its copy. The second joins: the partitions are
/// split, and its copy (the partitions it took over, restored from the log, and those it
/// follows, written only by its standby) is pruned too. A redelivery of every request is a
/// duplicate wherever it lands, answered from what was kept; the duplicates' events reach both
/// copies and are pruned again, by the owner of their partition and by the follower. When the
/// second leaves, the first takes its partitions back over its pruned copy, and a third
/// delivery is a duplicate again; then identity retention forgets every task in its copy. One
/// record per request at the remote, one result per task, the events topic and the first's
/// ledger audit clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copies_of_owned_and_followed_partitions_are_pruned_and_nothing_is_sent_twice() {
    use sendledger_sim::{Sim, SimConfig};

    let broker = tokio::task::block_in_place(Broker::cluster);
    let kafka = Kafka::connect(sendledger_kafka::KafkaConfig {
        standby: true,
        ..config_for_process(&broker)
    })
    .unwrap();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let keys: Vec<String> = (0..200).map(|i| format!("pruned-copy-{i}")).collect();
    let a = service(dir_a.path(), &kafka, &sim).await;
    produce(&kafka, request_messages(&keys)).await;
    let (_, results) = results_for(&kafka, task_ids(&keys)).await;
    assert_one_record_each(&sim, &keys, &results);
    let ledger_a = a.engine().ledger().clone();
    wait_for("the first instance did not prune its copy", || {
        pruned(&ledger_a, &keys) == keys.len()
    })
    .await;

    let b = service(dir_b.path(), &kafka, &sim).await;
    let (owner_a, owner_b) = (
        a.engine().ownership().unwrap().clone(),
        b.engine().ownership().unwrap().clone(),
    );
    let partitions = kafka.config().partitions as usize;
    wait_for("the partitions were not split", || {
        let (pa, pb) = (owner_a.partitions(), owner_b.partitions());
        !pa.is_empty() && !pb.is_empty() && pa.len() + pb.len() == partitions
    })
    .await;
    let ledger_b = b.engine().ledger().clone();
    wait_for(
        "the second instance's copy (taken over and followed) was not pruned",
        || pruned(&ledger_b, &keys) == keys.len(),
    )
    .await;

    produce(&kafka, request_messages(&keys)).await;
    crate::log::each_logged_as_duplicate(&kafka, &keys, 1).await;
    assert_eq!(sim.stats().posts, 200, "a redelivery was sent again");
    wait_for(
        "the duplicates' events were not pruned from both copies",
        || pruned(&ledger_a, &keys) == keys.len() && pruned(&ledger_b, &keys) == keys.len(),
    )
    .await;

    b.shutdown().await.unwrap();
    wait_for(
        "the first instance did not take every partition back",
        || owner_a.partitions().len() == partitions,
    )
    .await;
    produce(&kafka, request_messages(&keys)).await;
    crate::log::each_logged_as_duplicate(&kafka, &keys, 2).await;
    // Identity retention's pass, with a cutoff after every task settled: every identity the
    // copy kept goes, through the tasks' actors (a removed task names no partition).
    let forgotten = a.engine().forget_expired(u64::MAX).await.unwrap();
    assert_eq!(forgotten, 200);
    let gone = |key: &String| {
        let task = task_id(key);
        ledger_a.task_events(task).unwrap().is_empty() && ledger_a.retained(task).unwrap().is_none()
    };
    assert!(keys.iter().all(gone), "an identity was kept");
    a.shutdown().await.unwrap();
    assert_eq!(sim.stats().posts, 200, "a redelivery was sent again");
    let (_, results) = results_for(&kafka, task_ids(&keys)).await;
    assert_one_record_each(&sim, &keys, &results);
    audit_events_topic(&kafka, 200);

    drop(ledger_a);
    let ledger = Ledger::open_read_only(dir_a.path()).unwrap();
    assert!(ledger.pruned_totals().unwrap().tasks >= 200);
    let report =
        sendledger_store::audit(&ledger, sendledger_core::CheckConfig::default(), |_| {}).unwrap();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    drop((ledger, ledger_b));
    sim.shutdown().await;
}
