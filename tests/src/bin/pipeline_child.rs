//! Child process of the Kafka kill test: the whole service (engine, ingest, publisher) on a
//! ledger directory against external brokers. Prints `started` once consuming, then runs until
//! it is killed (or its stdin closes, when it shuts down cleanly and prints `stopped`).
//!
//! Usage: `pipeline_child LEDGER_DIR TARGET_JSON BROKERS`

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use sendledger_actors::{Engine, EngineConfig, HttpRemote};
use sendledger_bus::{Ingest, Kafka, KafkaConfig, Publisher};
use sendledger_tests::engine::targets;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, target, brokers] = &args[..] else {
        panic!("usage: pipeline_child LEDGER_DIR TARGET_JSON BROKERS");
    };
    let target = serde_json::from_str(target).expect("TARGET_JSON");
    let mut config = EngineConfig::new(dir);
    config.timer_tick = Duration::from_millis(5);
    let remote = Arc::new(HttpRemote::new(targets(target)));
    let engine =
        tokio::task::block_in_place(|| Engine::start(config, remote)).expect("engine starts");
    let mut kafka_config = KafkaConfig {
        brokers: brokers.clone(),
        partitions: 3,
        commit_interval: Duration::from_millis(200),
        ..KafkaConfig::default()
    };
    // A killed predecessor's group membership expires quickly.
    kafka_config
        .properties
        .insert("session.timeout.ms".into(), "6000".into());
    kafka_config
        .properties
        .insert("heartbeat.interval.ms".into(), "500".into());
    let kafka = Kafka::connect(kafka_config).expect("kafka config");
    let ingest = Ingest::start(&kafka, Arc::new(engine.clone())).expect("ingest starts");
    let publisher = Publisher::start(&kafka, engine.ledger().clone()).expect("publisher starts");
    println!("started");

    // Until stdin closes.
    let _ = tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    })
    .await;
    ingest
        .shutdown(Duration::from_secs(10))
        .await
        .expect("ingest stops");
    publisher
        .shutdown(Duration::from_secs(10))
        .await
        .expect("publisher stops");
    engine.shutdown(Duration::from_secs(5)).await;
    println!("stopped");
}
