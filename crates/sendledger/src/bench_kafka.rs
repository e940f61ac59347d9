//! `sendledger bench kafka`: tasks per second end to end through Kafka: requests already on the
//! requests topic of the embedded cluster, the whole service (ingest, engine, publisher) against
//! the simulated remote, until every task's result has been read back from the results topic.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use sendledger_bus::{request_key, Kafka, RequestProducer, ResultsReader};
use sendledger_sim::{Sim, SimConfig};
use sendledger_store::Durability;

use crate::bench::bench_request;
use crate::bench_engine::parse_durability;
use crate::config::Config;
use crate::service::Service;
use crate::wiring::HttpRemote;

#[derive(Args)]
pub struct KafkaArgs {
    /// Tasks to run (one request each, produced before the service starts).
    #[arg(long, default_value_t = 20_000)]
    tasks: u64,
    /// `sync` (fsync per group commit) or `buffered` (no fsync; unsafe on power loss).
    #[arg(long, default_value = "sync", value_parser = parse_durability)]
    durability: Durability,
}

pub fn run(args: KafkaArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.tasks > 0, "--tasks must be positive");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(bench(args))
}

async fn bench(args: KafkaArgs) -> anyhow::Result<()> {
    let sim = bench_sim().await?;
    let dir = tempfile::tempdir()?;
    let config = bench_config(&sim, dir.path(), args.durability)?;
    let kafka = tokio::task::block_in_place(|| Kafka::connect(config.kafka.clone()))?;
    let n = args.tasks;
    let one = serde_json::to_vec(&bench_request(0, "payments"))?.len() as u64;
    kafka.check_embedded_backlog(n, n * (one + 64))?;
    let run = through_kafka(&config, &kafka, n).await?;
    check_remote(&sim, &run)?;
    let n = n as f64;
    println!(
        "{}",
        serde_json::json!({
            "tasks": args.tasks,
            "durability": format!("{:?}", args.durability).to_lowercase(),
            "produce_per_sec": (n / run.produce_secs).round(),
            "tasks_per_sec": run.tasks_per_sec(),
            "tasks_per_sec_after_first_result": (n / run.steady_secs).round(),
            "first_result_after_ms": ((run.total_secs - run.steady_secs) * 1000.0).round(),
            "fsyncs_per_task": round4(run.batches as f64 / n),
            "events_per_task": round4(run.events as f64 / n),
            "remote_duplicates": sim.stats().duplicates,
        })
    );
    sim.shutdown().await;
    Ok(())
}

pub(crate) fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

/// The simulated remote of the Kafka benchmarks: records told apart by `reference`.
pub(crate) async fn bench_sim() -> anyhow::Result<Sim> {
    Sim::start(SimConfig {
        identity_field: "reference".into(),
        ..SimConfig::default()
    })
    .await
    .context("starting the simulated remote")
}

/// A service configuration on `data` with the one target `payments` at `sim`, on the embedded
/// cluster (callers change `kafka` and `storage.mode` as they need).
pub(crate) fn bench_config(
    sim: &Sim,
    data: &std::path::Path,
    durability: Durability,
) -> anyhow::Result<Config> {
    let mut config = Config::default();
    config.admin.enabled = false;
    config.storage.data = data.join("ledger");
    config.storage.durability = durability;
    config.targets.insert(
        "payments".into(),
        serde_json::from_value(serde_json::json!({
            "url": sim.create_url(),
            "body_fields": { "reference": "{task_id}" },
            "lookup": { "url": format!("{}?reference={{task_id}}", sim.lookup_url()) },
        }))?,
    );
    Ok(config)
}

/// What one run through Kafka measured.
pub(crate) struct Run {
    pub tasks: u64,
    pub produce_secs: f64,
    /// From the service's start to the last result read back.
    pub total_secs: f64,
    /// From the first result read back to the last.
    pub steady_secs: f64,
    /// Journal batches (fsyncs) and events recorded.
    pub batches: u64,
    pub events: u64,
}

impl Run {
    pub fn tasks_per_sec(&self) -> f64 {
        (self.tasks as f64 / self.total_secs).round()
    }
}

/// Produces `n` requests, starts the service of `config` on `kafka`, waits until every task's
/// result has been read back from the results topic (a `read_committed` reader deduplicating by
/// event id), stops the service, and checks that each task had one terminal result.
pub(crate) async fn through_kafka(config: &Config, kafka: &Kafka, n: u64) -> anyhow::Result<Run> {
    config.validate(&BTreeMap::new())?;
    let messages = (0..n).map(|i| {
        let r = bench_request(i, "payments");
        (Some(request_key(&r)), serde_json::to_vec(&r).expect("JSON"))
    });
    kafka
        .ensure_topics(
            config.kafka.replication_factor,
            Duration::from_secs(30),
            config.storage.mode == crate::config::StorageMode::Kafka,
        )
        .await?;
    let produce_started = Instant::now();
    RequestProducer::new(kafka)?.send_all(messages).await?;
    let produce_secs = produce_started.elapsed().as_secs_f64();

    let results = ResultsReader::start(kafka)?;
    let started = Instant::now();
    let remote = Arc::new(HttpRemote::new(config.load_targets()?));
    let service = Service::start(config, kafka, remote, None).await?;
    let mut first_result = None;
    loop {
        let (done, _) = results.progress();
        if done > 0 && first_result.is_none() {
            first_result = Some(Instant::now());
        }
        if done >= n as usize {
            break;
        }
        anyhow::ensure!(service.is_healthy(), "the service stopped consuming");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let total_secs = started.elapsed().as_secs_f64();
    let steady_secs = first_result.map_or(total_secs, |t| t.elapsed().as_secs_f64());
    let stats = service.engine().ledger().stats();
    let batches = stats.batches.load(Ordering::Relaxed);
    let events = stats.events.load(Ordering::Relaxed);
    service.shutdown().await?;
    let (answered, more_than_one_terminal) = results.stop();
    anyhow::ensure!(
        answered == n as usize && more_than_one_terminal == 0,
        "benchmark run broke an invariant: {answered} of {n} answered, {more_than_one_terminal} with two terminal results"
    );
    Ok(Run {
        tasks: n,
        produce_secs,
        total_secs,
        steady_secs,
        batches,
        events,
    })
}

/// Fails when the remote holds two records of one task.
pub(crate) fn check_remote(sim: &Sim, run: &Run) -> anyhow::Result<()> {
    let duplicates = sim.stats().duplicates;
    anyhow::ensure!(
        duplicates == 0,
        "benchmark run broke an invariant: {duplicates} duplicates at the remote after {} tasks",
        run.tasks
    );
    Ok(())
}
