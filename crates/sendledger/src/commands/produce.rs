//! `sendledger produce`: JSON request lines from stdin or a file to the requests topic, keyed by
//! identity, with the idempotent producer. Every line is checked before anything is sent.

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use sendledger_core::{Limits, TaskRequest};
use sendledger_kafka::{request_key, Kafka, KafkaConfig, RequestProducer};

use sendledger_node::config::Config;

#[derive(Args)]
pub struct ProduceArgs {
    /// File of JSON requests, one per line; `-` or nothing reads stdin.
    file: Option<PathBuf>,
    /// Bootstrap servers (`host:port,...`). A `run` with embedded Kafka prints its own.
    #[arg(long, conflicts_with = "config")]
    brokers: Option<String>,
    /// Take brokers, topic and client properties from the service's configuration file.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Topic, overriding the configured requests topic.
    #[arg(long)]
    topic: Option<String>,
    /// Send lines as they are, even those that are not valid requests (to try the service's
    /// handling of bad input); such lines are sent without a key.
    #[arg(long)]
    raw: bool,
    /// Sign every message with the key in this environment variable (the tenant's signing
    /// key, when the service's `[access]` rules require signed requests; docs/access.md).
    #[arg(long, value_name = "VAR")]
    sign_key_env: Option<String>,
    /// Give up when the brokers have not acknowledged everything within this long.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

pub fn produce(args: ProduceArgs) -> anyhow::Result<bool> {
    let mut kafka_config = match (&args.config, &args.brokers) {
        (Some(path), _) => Config::load(path)?.kafka,
        (None, Some(brokers)) => KafkaConfig {
            brokers: brokers.clone(),
            ..KafkaConfig::default()
        },
        (None, None) => anyhow::bail!("say where Kafka is: --brokers HOST:PORT or --config FILE"),
    };
    anyhow::ensure!(
        !kafka_config.is_embedded(),
        "an embedded cluster lives inside the process that runs it; pass --brokers with the address `sendledger run` printed"
    );
    if let Some(topic) = &args.topic {
        kafka_config.requests_topic = topic.clone();
    }

    let mut text = String::new();
    match &args.file {
        Some(path) if path.as_os_str() != "-" => {
            text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?
        }
        _ => {
            std::io::stdin()
                .read_to_string(&mut text)
                .context("reading stdin")?;
        }
    }
    let (messages, errors) = messages(&text, args.raw);
    if !errors.is_empty() {
        for e in errors.iter().take(10) {
            eprintln!("{e}");
        }
        anyhow::bail!(
            "{} invalid line(s), nothing sent; fix them or pass --raw to send them as they are",
            errors.len()
        );
    }

    let kafka = Kafka::connect(kafka_config).context("kafka")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let n = messages.len();
    let mut producer = RequestProducer::new(&kafka)?;
    if let Some(var) = &args.sign_key_env {
        let secret = std::env::var(var)
            .ok()
            .filter(|k| !k.is_empty())
            .with_context(|| format!("--sign-key-env: environment variable {var} is unset or empty; set it to the tenant's signing key"))?;
        producer = producer.signing_with(secret.into_bytes());
    }
    let acked = runtime
        .block_on(async {
            tokio::time::timeout(args.timeout, producer.send_all(messages)).await
        })
        .map_err(|_| {
            anyhow::anyhow!(
                "the brokers at {} did not acknowledge every message within {}; check that they are reachable (messages may have been delivered in part)",
                kafka.bootstrap_servers(),
                humantime::format_duration(args.timeout)
            )
        })??;
    println!(
        "produced {} request(s) to {} ({} line(s) read)",
        acked.len(),
        producer.topic(),
        n
    );
    Ok(true)
}

/// A message to produce: optional key, value.
type Message = (Option<String>, Vec<u8>);

/// The message of every non-empty line, and an error naming each invalid line.
fn messages(text: &str, raw: bool) -> (Vec<Message>, Vec<String>) {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let checked = TaskRequest::from_json(line.as_bytes())
            .and_then(|r| r.accept(&Limits::default()).map(|_| r));
        match checked {
            Ok(request) => out.push((Some(request_key(&request)), line.as_bytes().to_vec())),
            Err(_) if raw => out.push((None, line.as_bytes().to_vec())),
            Err(e) => errors.push(format!("line {}: {e}", i + 1)),
        }
    }
    (out, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_checked_and_keyed_by_identity() {
        let good =
            r#"{"tenant":"t","operation":"o","request_key":"k1","target":"p","payload":{"a":1}}"#;
        let text = format!("{good}\n\n  {{\"tenant\": 1}}\nnot json\n");
        let (msgs, errors) = messages(&text, false);
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].0.as_deref(), Some("t/o/k1"));
        assert_eq!(errors.len(), 2);
        assert!(errors[0].starts_with("line 3: "), "{errors:?}");
        assert!(errors[1].starts_with("line 4: "), "{errors:?}");
        let (msgs, errors) = messages(&text, true);
        assert_eq!((msgs.len(), errors.len()), (3, 0));
        assert_eq!(msgs[2], (None, b"not json".to_vec()));
    }
}
