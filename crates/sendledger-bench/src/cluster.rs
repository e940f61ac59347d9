//! `sendledger-bench cluster`: kafka mode against local mode on one instance, in one run and
//! against the same brokers (which must support transactions: kafka mode cannot run on the
//! embedded cluster). The same requests go through each mode on topics of their own; then an
//! instance on an empty disk takes the kafka-mode partitions over, which measures the restore.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use sendledger_kafka::Kafka;
use sendledger_store::Durability;

use crate::engine::parse_durability;
use crate::kafka::{bench_config, check_remote, round4, run_id, through_kafka, Placement};
use crate::process::RemoteProcess;
use sendledger_kafka::metric_definitions::{
    LOG_BATCH_EVENTS, LOG_COMMIT_SECONDS, PARTITION_TAKE_OVER_SECONDS,
};
use sendledger_node::config::{Config, StorageMode};
use sendledger_node::metric_definitions::{
    PARTITION_RESTORE_SECONDS, PARTITION_RESTORING, RESTORED_EVENTS_TOTAL,
};
use sendledger_node::service::Service;
use sendledger_node::wiring::HttpRemote;

#[derive(Args)]
pub struct ClusterArgs {
    /// Bootstrap servers of brokers that support transactions (e.g. `127.0.0.1:9092`);
    /// `scripts/bench-cluster` starts one.
    #[arg(long)]
    brokers: String,
    /// Tasks per mode (one request each, produced before the service starts).
    #[arg(long, default_value_t = 20_000)]
    tasks: u64,
    /// Partitions of each mode's topics.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// `sync` (fsync per group commit) or `buffered` (no fsync; unsafe on power loss).
    #[arg(long, default_value = "sync", value_parser = parse_durability)]
    durability: Durability,
}

pub fn run(args: ClusterArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.tasks > 0, "--tasks must be positive");
    anyhow::ensure!(args.partitions > 0, "--partitions must be positive");
    // Summaries (no buckets configured): the exporter renders their quantiles.
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .context("installing the metrics recorder")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(bench(args, metrics))
}

async fn bench(args: ClusterArgs, metrics: PrometheusHandle) -> anyhow::Result<()> {
    // One remote per mode: both modes send the same tasks.
    let (sim, sim_kafka) = (RemoteProcess::start()?, RemoteProcess::start()?);
    let dir = tempfile::tempdir()?;
    let run_id = run_id("bench")?;
    let config_for = |mode: StorageMode, data: &str| -> anyhow::Result<Config> {
        let sim = if mode == StorageMode::Kafka {
            &sim_kafka
        } else {
            &sim
        };
        let mut config = bench_config(sim, &dir.path().join(data), args.durability)?;
        let name = format!(
            "{run_id}-{}",
            if mode == StorageMode::Kafka {
                "kafka"
            } else {
                "local"
            }
        );
        config.storage.mode = mode;
        let k = &mut config.kafka;
        k.brokers = args.brokers.clone();
        k.partitions = args.partitions;
        k.group_id = name.clone();
        k.requests_topic = format!("{name}.requests");
        k.results_topic = format!("{name}.results");
        k.events_topic = format!("{name}.events");
        k.instance_id = Some(String::new());
        for (key, value) in [
            ("consumer.session.timeout.ms", "6000"),
            ("consumer.heartbeat.interval.ms", "500"),
        ] {
            k.properties.insert(key.into(), value.into());
        }
        Ok(config)
    };

    let local = config_for(StorageMode::Local, "local")?;
    let kafka_local = tokio::task::block_in_place(|| Kafka::connect(local.kafka.clone()))?;
    let local_run =
        through_kafka(&local, &kafka_local, args.tasks, None, Placement::InProcess).await?;
    check_remote(&sim, &local_run).await?;

    let mode = config_for(StorageMode::Kafka, "kafka")?;
    let kafka_mode = tokio::task::block_in_place(|| Kafka::connect(mode.kafka.clone()))?;
    let kafka_run =
        through_kafka(&mode, &kafka_mode, args.tasks, None, Placement::InProcess).await?;
    check_remote(&sim_kafka, &kafka_run).await?;
    let after_run = metrics.render();

    // Restore: a new instance on an empty disk takes every partition of the log over.
    let mut restore = mode.clone();
    restore.storage.data = dir.path().join("restored").join("ledger");
    let before = Sample::of(&metrics.render());
    let started = Instant::now();
    let remote = std::sync::Arc::new(HttpRemote::new(restore.load_targets()?));
    let service = Service::start(&restore, &kafka_mode, remote, None).await?;
    let ownership = service
        .engine()
        .ownership()
        .context("kafka mode has ownership")?
        .clone();
    let deadline = Instant::now() + Duration::from_secs(300);
    // When the first partition began to restore (its log open): partitions restore at once.
    let mut first_restoring = None;
    while ownership.partitions().len() < args.partitions as usize {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the partitions were not all taken over within 5 minutes"
        );
        if first_restoring.is_none()
            && metrics
                .render()
                .lines()
                .any(|l| l.starts_with(&format!("{PARTITION_RESTORING}{{")) && l.ends_with(" 1"))
        {
            first_restoring = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let all_owned_secs = started.elapsed().as_secs_f64();
    let restore_wall_secs = first_restoring.map_or(all_owned_secs, |at| at.elapsed().as_secs_f64());
    let restored_tasks = service
        .engine()
        .ledger()
        .task_counts()
        .map(|c| c.by_phase.values().sum::<u64>())?;
    service.shutdown().await?;
    let after = Sample::of(&metrics.render());
    let restored_events = after.restored_events - before.restored_events;
    let take_over_secs = after.take_over_secs - before.take_over_secs;
    let restore_secs = after.restore_secs - before.restore_secs;
    anyhow::ensure!(
        restored_tasks == args.tasks,
        "the restore found {restored_tasks} tasks of {}",
        args.tasks
    );
    check_remote(&sim_kafka, &kafka_run).await?;

    let quantile = |name: &str, q: &str| -> Option<f64> {
        let prefix = format!("{name}{{quantile=\"{q}\"}} ");
        after_run
            .lines()
            .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
    };
    let ms = |s: Option<f64>| s.map(|s| round4(s * 1000.0));
    println!(
        "{}",
        serde_json::json!({
            "tasks": args.tasks,
            "partitions": args.partitions,
            "durability": format!("{:?}", args.durability).to_lowercase(),
            "local_tasks_per_sec": local_run.tasks_per_sec(),
            "kafka_mode_tasks_per_sec": kafka_run.tasks_per_sec(),
            "kafka_mode_ratio": round4(kafka_run.total_secs.recip() / local_run.total_secs.recip()),
            "local_first_result_after_ms": ((local_run.total_secs - local_run.steady_secs) * 1000.0).round(),
            "kafka_mode_first_result_after_ms": ((kafka_run.total_secs - kafka_run.steady_secs) * 1000.0).round(),
            "log_commit_ms_p50": ms(quantile(LOG_COMMIT_SECONDS, "0.5")),
            "log_commit_ms_p99": ms(quantile(LOG_COMMIT_SECONDS, "0.99")),
            "log_batch_events_p50": quantile(LOG_BATCH_EVENTS, "0.5"),
            "log_batch_events_p99": quantile(LOG_BATCH_EVENTS, "0.99"),
            "restored_events": restored_events,
            "take_over_secs": round4(take_over_secs),
            "restore_secs_summed_over_partitions": round4(restore_secs),
            "restore_wall_secs": round4(restore_wall_secs),
            "restore_events_per_sec": (restored_events / restore_wall_secs).round(),
            "restore_start_to_all_owned_secs": round4(all_owned_secs),
            "remote_duplicates": 0,
        })
    );
    Ok(())
}

/// The restore counters of one rendering of the metrics.
struct Sample {
    restored_events: f64,
    take_over_secs: f64,
    restore_secs: f64,
}

impl Sample {
    fn of(text: &str) -> Sample {
        let sum = |prefix: &str| -> f64 {
            text.lines()
                .filter(|l| l.starts_with(prefix))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        Sample {
            restored_events: sum(&format!("{RESTORED_EVENTS_TOTAL}{{")),
            take_over_secs: sum(&format!("{PARTITION_TAKE_OVER_SECONDS}_sum")),
            restore_secs: sum(&format!("{PARTITION_RESTORE_SECONDS}_sum")),
        }
    }
}
