//! Child process of the admin tests: a service with the metrics recorder installed, an engine
//! on a ledger with the one target `sim` (or several, and sagas: `TARGET_JSON` as the engine
//! child reads it), and the admin endpoint on a free loopback port. It is
//! a process of its own because the metrics recorder is process-wide: here it sees this engine
//! only, so the test can assert exact values.
//!
//! With BROKERS (a bootstrap list) it also consumes the requests topic and publishes results,
//! with librdkafka statistics every 200 ms, in a consumer group of its own (so a second child
//! on the same ledger gets every message again, from the beginning of the topic).
//!
//! Prints `admin ADDR`, then reads commands on stdin, one per line: `submit KEY` (prints
//! `submitted KEY EVENTS`). When stdin closes it shuts everything down, prints `stopped`, and
//! exits.
//!
//! Usage: `admin_child LEDGER_DIR TARGET_JSON TOKEN [BROKERS]`

use std::sync::Arc;
use std::time::Duration;

use sendledger_kafka::{Ingest, Kafka, KafkaConfig, Publisher};
use sendledger_node::admin::{install_recorder, Admin};
use sendledger_node::config::AdminConfig;
use sendledger_node::wiring::EngineSink;
use sendledger_tests::engine::{child_targets, request, source, start_with};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (dir, target, token, brokers) = match &args[..] {
        [_, dir, target, token] => (dir, target, token, None),
        [_, dir, target, token, brokers] => (dir, target, token, Some(brokers)),
        _ => panic!("usage: admin_child LEDGER_DIR TARGET_JSON TOKEN [BROKERS]"),
    };
    let metrics = install_recorder().expect("recorder installs");
    let (targets, name) = child_targets(target);
    let engine = start_with(std::path::Path::new(dir), targets);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let pipeline = brokers.map(|brokers| {
        let mut config = KafkaConfig {
            brokers: brokers.clone(),
            partitions: 3,
            commit_interval: Duration::from_millis(200),
            group_id: format!("sendledger-admin-child-{}", std::process::id()),
            ..KafkaConfig::default()
        };
        config
            .properties
            .insert("statistics.interval.ms".into(), "200".into());
        let kafka = Kafka::connect(config).expect("kafka config");
        let _guard = runtime.enter();
        let ingest = Ingest::start(&kafka, Arc::new(EngineSink::new(engine.clone())))
            .expect("ingest starts");
        let publisher =
            Publisher::start(&kafka, engine.ledger().clone()).expect("publisher starts");
        (ingest, publisher)
    });
    let config = AdminConfig {
        listen: ([127, 0, 0, 1], 0).into(),
        token: Some(token.clone()),
        ..AdminConfig::default()
    };
    let admin = runtime
        .block_on(Admin::start(&config, engine.clone(), metrics))
        .expect("admin endpoint starts");
    println!("admin {}", admin.local_addr());
    for (offset, line) in std::io::stdin().lines().enumerate() {
        let line = line.expect("stdin");
        let key = line
            .strip_prefix("submit ")
            .expect("a `submit KEY` command");
        let mut request = request(key);
        request.target.clone_from(&name);
        let reply = runtime
            .block_on(engine.submit(request, source(offset as i64)))
            .expect("submitted");
        println!("submitted {key} {}", reply.events.join(","));
    }
    runtime.block_on(async {
        admin.shutdown().await;
        if let Some((ingest, publisher)) = pipeline {
            ingest
                .shutdown(Duration::from_secs(10))
                .await
                .expect("ingest stops");
            publisher
                .shutdown(Duration::from_secs(10))
                .await
                .expect("publisher stops");
        }
        engine.shutdown(Duration::from_secs(5)).await;
    });
    println!("stopped");
}
