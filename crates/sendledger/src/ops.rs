//! Operator commands: `inspect` a task, `audit` a ledger directory or an events topic.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use sendledger_bus::{Kafka, KafkaConfig};
use sendledger_core::fold;
use sendledger_store::{AuditReport, Error as StoreError, Ledger};

use crate::timeline::{parse_task, task_json, time};

#[derive(Args)]
pub struct InspectArgs {
    /// Task id (32 hex digits), or `tenant/operation/request_key` (a `/` inside a part
    /// written `%2F`, a `%` as `%25`).
    task: String,
    /// Ledger directory.
    #[arg(long, default_value = "sendledger-data")]
    data: PathBuf,
    /// Print JSON instead of a timeline.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct AuditArgs {
    /// Ledger directory.
    #[arg(long, default_value = "sendledger-data")]
    data: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Replay this events topic instead of the local ledger: the same rule checks, without the
    /// index checks that exist only for a ledger. Holds the topic's events in memory.
    #[arg(long, value_name = "TOPIC")]
    from_kafka: Option<String>,
    /// Bootstrap servers of the cluster holding the topic (with --from-kafka) [default:
    /// localhost:9092].
    #[arg(long, value_name = "HOST:PORT,...", requires = "from_kafka")]
    brokers: Option<String>,
    /// A librdkafka property for the Kafka client, such as `security.protocol=SSL`
    /// (repeatable; with --from-kafka).
    #[arg(long = "kafka-property", value_name = "KEY=VALUE", value_parser = parse_property, requires = "from_kafka")]
    kafka_properties: Vec<(String, String)>,
    /// The most resends a target's policy may authorize per task: the highest
    /// `lookup.max_policy_resends` of the configured targets. A task with more is a violation.
    #[arg(long, default_value_t = sendledger_core::decide::DEFAULT_MAX_POLICY_RESENDS)]
    max_policy_resends: u32,
}

fn parse_property(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("`{s}` is not KEY=VALUE"))
}

/// Opens the ledger read-only: these commands create and change nothing where they point.
fn open(data: &Path) -> anyhow::Result<Ledger> {
    Ledger::open_read_only(data).map_err(|e| match e {
        StoreError::NoLedger { .. } => anyhow::anyhow!("{e}; pass --data DIR"),
        e => anyhow::Error::new(e).context(format!("opening the ledger at {}", data.display())),
    })
}

pub fn inspect(args: InspectArgs) -> anyhow::Result<()> {
    let ledger = open(&args.data)?;
    let task = parse_task(&args.task)?;
    let events = ledger.task_events(task)?;
    anyhow::ensure!(
        !events.is_empty(),
        "task {task} is not in the ledger at {}",
        args.data.display()
    );
    let state = fold(&events);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&task_json(task, &state, &events))?
        );
        return Ok(());
    }
    println!(
        "task {task}: {} after {} events, {} attempts",
        state.phase.name(),
        events.len(),
        state.attempts
    );
    for e in &events {
        println!(
            "{}  #{:<3} {:<21} {}",
            time(e.at),
            e.task_seq,
            e.body.name(),
            e.body.summary(e.at)
        );
    }
    Ok(())
}

/// A one-line progress bar on stderr, drawn only when stderr is a terminal, at most ten times
/// a second.
struct Progress {
    enabled: bool,
    started: Instant,
    drawn: Option<Instant>,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            enabled: std::io::stderr().is_terminal(),
            started: Instant::now(),
            drawn: None,
        }
    }

    fn update(&mut self, done: u64, total: u64) {
        if !self.enabled
            || self
                .drawn
                .is_some_and(|t| t.elapsed() < Duration::from_millis(100))
        {
            return;
        }
        self.drawn = Some(Instant::now());
        let total = total.max(done).max(1);
        let width = 30;
        let filled = (done * width / total) as usize;
        let rate = done as f64 / self.started.elapsed().as_secs_f64().max(1e-3);
        eprint!(
            "\raudit [{}{}] {:>3}%  {done}/{total} events  {rate:.0}/s ",
            "#".repeat(filled),
            ".".repeat(width as usize - filled),
            done * 100 / total
        );
    }

    fn finish(&self) {
        if self.drawn.is_some() {
            eprintln!();
        }
    }
}

/// Audits the ledger, or the events topic with `--from-kafka`. Returns whether it is clean.
pub fn audit(args: AuditArgs) -> anyhow::Result<bool> {
    let mut progress = Progress::new();
    let check = sendledger_core::CheckConfig {
        max_policy_resends: args.max_policy_resends,
        ..sendledger_core::CheckConfig::default()
    };
    let report = match &args.from_kafka {
        Some(topic) => {
            let brokers = args.brokers.as_deref().unwrap_or("localhost:9092");
            anyhow::ensure!(
                brokers != sendledger_bus::config::EMBEDDED,
                "an embedded cluster starts empty; pass the --brokers that hold {topic}"
            );
            let config = KafkaConfig {
                brokers: brokers.into(),
                events_topic: topic.clone(),
                properties: args.kafka_properties.iter().cloned().collect(),
                ..KafkaConfig::default()
            };
            let kafka = Kafka::connect(config).context("configuring the Kafka client")?;
            sendledger_bus::audit_topic(&kafka, topic, check, |n, total| progress.update(n, total))
                .with_context(|| format!("auditing topic {topic} at {brokers}"))?
        }
        None => {
            let ledger = open(&args.data)?;
            let total = ledger.last_lsn();
            sendledger_store::audit(&ledger, check, |n| progress.update(n, total))?
        }
    };
    progress.finish();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(report.is_clean())
}

fn print_report(report: &AuditReport) {
    println!(
        "{}: events {}   tasks {}   attempts {}",
        report.source, report.events, report.tasks, report.attempts
    );
    for (state, n) in &report.tasks_by_state {
        println!("  {state:<14} {n}");
    }
    println!(
        "unknown outcomes {} (after a crash {}): by lookup {}, by same-key resend {}, by authorized resend {}, by operator {}, open {}",
        report.unknown_outcomes,
        report.recovered_after_crash,
        report.unknowns_resolved_by_lookup,
        report.unknowns_resolved_by_same_key_resend,
        report.unknowns_resolved_by_authorized_resend,
        report.unknowns_resolved_by_operator,
        report.unknowns_open
    );
    println!(
        "manual reviews open {}   duplicates dropped {}   conflicts {}   rejected inputs {}",
        report.manual_reviews_open,
        report.duplicates_dropped,
        report.conflicts,
        report.rejected_inputs
    );
    for skipped in &report.skipped_checks {
        println!("not checked: {skipped}");
    }
    if report.is_clean() {
        println!("violations: none");
    } else {
        println!("violations: {}", report.violations.len());
        for v in &report.violations {
            println!(
                "  {} task={} lsns={:?}: {}",
                v.rule,
                v.task_id.as_deref().unwrap_or("-"),
                v.lsns,
                v.detail
            );
        }
    }
}

#[derive(Args)]
pub struct OffsetsResetArgs {
    /// Ledger directory (the service must be stopped).
    #[arg(long, default_value = "sendledger-data")]
    data: PathBuf,
    /// The requests topic.
    #[arg(long)]
    topic: String,
    /// The partition whose processed offsets are replaced.
    #[arg(long)]
    partition: i32,
    /// Count every offset up to and including this one as processed (by another ledger),
    /// instead of forgetting them all.
    #[arg(long)]
    through: Option<i64>,
}

/// Replaces a partition's processed offsets on a stopped ledger: what to do when the service
/// refuses a partition because the requests topic was deleted and recreated (forget them), or
/// because another ledger processed it (`--through`: take over from where that one stopped).
pub fn offsets_reset(args: OffsetsResetArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.partition >= 0, "--partition must be 0 or more");
    anyhow::ensure!(
        args.through.is_none_or(|t| t >= 0),
        "--through must be an offset, 0 or more"
    );
    let ledger = Ledger::open(&args.data, sendledger_store::LedgerOptions::default())
        .with_context(|| {
            format!(
                "opening the ledger at {} (stop the service first)",
                args.data.display()
            )
        })?;
    let before = ledger.processed(&args.topic, args.partition)?;
    let removed = ledger.reset_offsets(&args.topic, args.partition, args.through)?;
    if let Some(through) = args.through {
        println!(
            "{}/{}: every offset up to {through} now counts as processed by this ledger; messages above it are consumed at the next start",
            args.topic, args.partition
        );
        return Ok(());
    }
    println!(
        "{}/{}: forgot {removed} processed-offset entries (watermark was {}); its messages are consumed as new at the next start, and a redelivered known request is still a duplicate of its task",
        args.topic,
        args.partition,
        before
            .watermark
            .map_or_else(|| "none".to_string(), |w| w.to_string())
    );
    Ok(())
}

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
        Some(path) => crate::config::Config::load(path)?.kafka,
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
        .block_on(sendledger_bus::conformance::ensure_topic(
            &kafka,
            &args.topic,
            args.timeout,
        ))
        .with_context(|| format!("creating the scratch topic {}", args.topic))?;
    let checks = sendledger_bus::conformance::check_transactions(&kafka, &args.topic, args.timeout)
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
