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
    let sim = Sim::start(SimConfig {
        identity_field: "reference".into(),
        ..SimConfig::default()
    })
    .await
    .context("starting the simulated remote")?;
    let dir = tempfile::tempdir()?;
    let mut config = Config::default();
    config.admin.enabled = false;
    config.storage.data = dir.path().join("ledger");
    config.storage.durability = args.durability;
    config.targets.insert(
        "payments".into(),
        serde_json::from_value(serde_json::json!({
            "url": sim.create_url(),
            "body_fields": { "reference": "{task_id}" },
            "lookup": { "url": format!("{}?reference={{task_id}}", sim.lookup_url()) },
        }))?,
    );
    config.validate(&BTreeMap::new())?;
    let kafka = tokio::task::block_in_place(|| Kafka::connect(config.kafka.clone()))?;

    let n = args.tasks as usize;
    let one = serde_json::to_vec(&bench_request(0, "payments"))?.len() as u64;
    kafka.check_embedded_backlog(args.tasks, args.tasks * (one + 64))?;
    let messages = (0..args.tasks).map(|i| {
        let r = bench_request(i, "payments");
        (Some(request_key(&r)), serde_json::to_vec(&r).expect("JSON"))
    });
    let produce_started = Instant::now();
    RequestProducer::new(&kafka)?.send_all(messages).await?;
    let produce_secs = produce_started.elapsed().as_secs_f64();

    let results = ResultsReader::start(&kafka)?;
    let started = Instant::now();
    let remote = Arc::new(HttpRemote::new(config.load_targets()?));
    let service = Service::start(&config, &kafka, remote, None).await?;
    let mut first_result = None;
    loop {
        let (done, _) = results.progress();
        if done > 0 && first_result.is_none() {
            first_result = Some(Instant::now());
        }
        if done >= n {
            break;
        }
        anyhow::ensure!(service.is_healthy(), "the service stopped consuming");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let total = started.elapsed().as_secs_f64();
    let steady = first_result.map_or(total, |t| t.elapsed().as_secs_f64());
    let stats = service.engine().ledger().stats();
    let batches = stats.batches.load(Ordering::Relaxed);
    let events = stats.events.load(Ordering::Relaxed);
    service.shutdown().await?;
    let (answered, more_than_one_terminal) = results.stop();
    let remote = sim.stats();
    sim.shutdown().await;
    anyhow::ensure!(
        answered == n && more_than_one_terminal == 0 && remote.duplicates == 0,
        "benchmark run broke an invariant: {answered} answered, {more_than_one_terminal} with two terminal results, {} duplicates at the remote",
        remote.duplicates
    );
    let round = |x: f64| (x * 10_000.0).round() / 10_000.0;
    println!(
        "{}",
        serde_json::json!({
            "tasks": n,
            "durability": format!("{:?}", args.durability).to_lowercase(),
            "produce_per_sec": (n as f64 / produce_secs).round(),
            "tasks_per_sec": (n as f64 / total).round(),
            "tasks_per_sec_after_first_result": (n as f64 / steady).round(),
            "first_result_after_ms": ((total - steady) * 1000.0).round(),
            "fsyncs_per_task": round(batches as f64 / n as f64),
            "events_per_task": round(events as f64 / n as f64),
            "remote_duplicates": remote.duplicates,
        })
    );
    Ok(())
}
