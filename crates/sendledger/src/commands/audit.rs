//! `sendledger audit`: replay the ledger (or an events topic) and check every rule.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use sendledger_kafka::{Kafka, KafkaConfig};
use sendledger_store::AuditReport;

use super::{open_read_only, parse_property};

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
    /// The service's configuration file: every decision recorded under a named credential is
    /// checked against its `[admin.operators]` (a credential no operator holds or held, one
    /// used after it was revoked, or one recorded for another operator is a violation). The
    /// operators' `tokens_env` variables must be set.
    #[arg(long, value_name = "FILE")]
    operators: Option<PathBuf>,
    /// Audit retention's archive in this directory too (`storage.archive`): its chain of
    /// checkpoints, each removed history against the rules and against the digest the ledger
    /// kept of it, and the chain's end against the ledger's record. Its report follows the
    /// ledger's (with --json: `{"ledger": …, "archive": …}`).
    #[arg(long, value_name = "DIR", conflicts_with = "from_kafka")]
    archive: Option<PathBuf>,
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
    let roster = match &args.operators {
        Some(path) => Some(
            sendledger_node::config::AdminConfig::operators_of_file(path)
                .context("reading the operators to check decisions against")?
                .roster(),
        ),
        None => None,
    };
    let mut progress = Progress::new();
    let check = sendledger_core::CheckConfig {
        max_policy_resends: args.max_policy_resends,
        ..sendledger_core::CheckConfig::default()
    };
    let report = match &args.from_kafka {
        Some(topic) => {
            let brokers = args.brokers.as_deref().unwrap_or("localhost:9092");
            anyhow::ensure!(
                brokers != sendledger_kafka::config::EMBEDDED,
                "an embedded cluster starts empty; pass the --brokers that hold {topic}"
            );
            let config = KafkaConfig {
                brokers: brokers.into(),
                events_topic: topic.clone(),
                properties: args.kafka_properties.iter().cloned().collect(),
                ..KafkaConfig::default()
            };
            let kafka = Kafka::connect(config).context("configuring the Kafka client")?;
            sendledger_kafka::audit_topic(&kafka, topic, check, |n, total| {
                progress.update(n, total)
            })
            .with_context(|| format!("auditing topic {topic} at {brokers}"))?
        }
        None => {
            let ledger = open_read_only(&args.data)?;
            let total = ledger.last_lsn();
            sendledger_store::audit(&ledger, check, |n| progress.update(n, total))?
        }
    };
    progress.finish();
    let archived = match &args.archive {
        Some(dir) => {
            let ledger = open_read_only(&args.data)?;
            let report = sendledger_store::archive_audit::audit_archive(dir, Some(&ledger), check)
                .with_context(|| format!("auditing the archive in {}", dir.display()))?;
            Some(report)
        }
        None => None,
    };
    let mut reports: Vec<AuditReport> = [report].into_iter().chain(archived).collect();
    for report in &mut reports {
        match &roster {
            Some(roster) => report.check_operators(roster),
            None if !report.credentialed.is_empty() => report.skipped_checks.push(
                "the credentials of operators' decisions (pass --operators with the service's configuration)".into(),
            ),
            None => {}
        }
    }
    if args.json {
        let json = match &reports[..] {
            [ledger, archive] => serde_json::json!({ "ledger": ledger, "archive": archive }),
            [report] => serde_json::to_value(report)?,
            _ => unreachable!("one or two reports"),
        };
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        for (i, report) in reports.iter().enumerate() {
            if i > 0 {
                println!();
            }
            print_report(report);
        }
    }
    Ok(reports.iter().all(AuditReport::is_clean))
}

fn print_report(report: &AuditReport) {
    println!(
        "{}: events {}   tasks {}   attempts {}",
        report.source, report.events, report.tasks, report.attempts
    );
    if report.pruned_tasks > 0 {
        println!(
            "removed by retention: {} tasks, {} events",
            report.pruned_tasks, report.pruned_events
        );
    }
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
    println!(
        "operator decisions {}   without a named credential {}",
        report.operator_decisions, report.decisions_without_credential
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
