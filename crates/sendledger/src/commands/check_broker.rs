//! `sendledger check-broker`: whether the brokers keep the transactional promises kafka mode
//! relies on.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use sendledger_kafka::{Kafka, KafkaConfig};

use super::parse_property;

#[derive(Args)]
pub struct CheckBrokerArgs {
    /// The service's configuration file: its `[kafka]` section says where the brokers are and
    /// how to reach them (TLS, SASL).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["brokers", "kafka_properties"])]
    config: Option<PathBuf>,
    /// Bootstrap servers, without --config [default: localhost:9092]; `embedded` tries the
    /// in-process cluster of the demo.
    #[arg(long, value_name = "HOST:PORT,...")]
    brokers: Option<String>,
    /// A librdkafka property for the Kafka clients, such as `security.protocol=SSL`
    /// (repeatable; without --config).
    #[arg(long = "kafka-property", value_name = "KEY=VALUE", value_parser = parse_property)]
    kafka_properties: Vec<(String, String)>,
    /// Scratch topic the check writes to; created with one partition when missing and left
    /// in place (each run uses records and ids of its own).
    #[arg(long, default_value = "sendledger.broker-check")]
    topic: String,
    /// How long each call may wait for the brokers.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Print the checks as JSON.
    #[arg(long)]
    json: bool,
}

/// `sendledger check-broker`: whether the brokers keep the transactional promises kafka mode
/// relies on. Ok(false) when one that its guarantees stand on is broken.
pub fn check_broker(args: CheckBrokerArgs) -> anyhow::Result<bool> {
    let config = match &args.config {
        Some(path) => sendledger_node::config::Config::load(path)?.kafka,
        None => KafkaConfig {
            brokers: args
                .brokers
                .clone()
                .unwrap_or_else(|| "localhost:9092".into()),
            properties: args.kafka_properties.iter().cloned().collect(),
            // The embedded cluster creates the configured topics as it starts.
            events_topic: args.topic.clone(),
            ..KafkaConfig::default()
        },
    };
    let kafka = Kafka::connect(config).context("configuring the Kafka client")?;
    let brokers = kafka.bootstrap_servers().to_string();
    kafka
        .metadata(args.timeout)
        .with_context(|| format!("reaching the brokers at {brokers}"))?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(sendledger_kafka::broker_check::ensure_topic(
            &kafka,
            &args.topic,
            args.timeout,
        ))
        .with_context(|| format!("creating the scratch topic {}", args.topic))?;
    let checks =
        sendledger_kafka::broker_check::check_transactions(&kafka, &args.topic, args.timeout)
            .with_context(|| format!("checking the brokers at {brokers}"))?;
    let safe = checks.iter().all(|c| c.kept == Some(true) || !c.guarantees);
    let lagging = checks.iter().any(|c| c.kept != Some(true) && !c.guarantees);
    if args.json {
        let report = serde_json::json!({
            "brokers": brokers,
            "topic": args.topic,
            "kafka_mode_safe": safe,
            "checks": checks,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for c in &checks {
            let verdict = match c.kept {
                Some(true) => "ok    ",
                Some(false) => "BROKEN",
                None => "not tried",
            };
            println!("{verdict} {}: {} ({})", c.name, c.promise, c.detail);
        }
        if lagging {
            println!("note: kafka mode's guarantees do not stand on a promise marked BROKEN above, but its committed offsets do: a partition whose last deliveries were all dropped as processed keeps its group offset behind them, so consumer lag stays above 0 and the next owner reads them again (and drops them)");
        }
        if safe {
            println!(
                "the brokers at {brokers} keep every promise kafka mode's guarantees stand on"
            );
        } else {
            println!("the brokers at {brokers} break a promise kafka mode relies on, so its guarantees do not hold there: an owner's unfinished transaction may become part of the log of record, or a fenced owner's writes may count (docs/architecture.md, \"What kafka mode asks of the brokers\")");
        }
    }
    Ok(safe)
}
