//! `sendledger-bench engine`: tasks per second through the whole engine (durable acceptance,
//! intent, attempt over HTTP, outcome) against the simulated remote, with task latencies and
//! the fsyncs each task cost. The remote runs in a child process, so the peak memory reported
//! is the engine's own (with its RocksDB and HTTP client), as in a deployment, and so is the
//! CPU time per task (`cpu_us_per_task`: this process's, the engine's and the loop handing it
//! the requests, from the engine's start to the last task done).
//!
//! `--steps N` runs each task as a saga of N steps instead (each a call at a target of its own,
//! all at the one simulated remote): a task is done when its last step is confirmed, and it
//! costs N attempts, each with its intent and outcome.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use sendledger_actors::{Engine, EngineConfig};
use sendledger_core::{Event, EventBody, Source};

use crate::ledger::bench_request;
use crate::process::{own_cpu_secs, own_peak_rss_bytes, RemoteProcess};
use sendledger_effects::{SagaConfig, SagaStepConfig, TargetConfig, Targets};
use sendledger_node::wiring::HttpRemote;
use sendledger_store::Durability;

#[derive(Args)]
pub struct EngineArgs {
    /// Tasks to run.
    #[arg(long, default_value_t = 20_000)]
    tasks: u64,
    /// Submissions in flight at once (as an ingest with that many unacknowledged messages).
    #[arg(long, default_value_t = 2_048)]
    in_flight: usize,
    /// `sync` (fsync per group commit) or `buffered` (no fsync; unsafe on power loss).
    #[arg(long, default_value = "sync", value_parser = parse_durability)]
    durability: Durability,
    /// Steps per task: 1 is a one-step task; more runs each task as a saga of that many steps.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=16))]
    steps: u64,
}

pub fn parse_durability(s: &str) -> Result<Durability, String> {
    match s {
        "sync" => Ok(Durability::Sync),
        "buffered" => Ok(Durability::Buffered),
        other => Err(format!(
            "`{other}` is not a durability; use `sync` or `buffered`"
        )),
    }
}

pub fn run(args: EngineArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.tasks > 0 && args.in_flight > 0,
        "--tasks and --in-flight must be positive"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let sim = RemoteProcess::start()?;
    let (targets, name) = if args.steps == 1 {
        let target: TargetConfig = serde_json::from_value(sim.target())?;
        let targets = Targets::from_config(&BTreeMap::from([("bench".to_string(), target)]))?;
        (targets, "bench")
    } else {
        let steps: Vec<SagaStepConfig> = (0..args.steps)
            .map(|n| SagaStepConfig {
                name: format!("s{n}"),
                target: format!("step-{n}"),
                compensate: None,
            })
            .collect();
        // Each step's record has an identity of its own at the remote (`<task id>-s<n>`), so
        // the remote's duplicate count stays a count of records made twice.
        let mut each = BTreeMap::new();
        for step in &steps {
            let mut config = sim.target();
            let reference = format!("{{task_id}}-{}", step.name);
            config["body_fields"]["reference"] = reference.clone().into();
            config["lookup"]["url"] = format!("{}?reference={reference}", sim.lookup_url()).into();
            each.insert(step.target.clone(), serde_json::from_value(config)?);
        }
        let targets = Targets::from_config(&each)?;
        let saga = BTreeMap::from([("bench-saga".to_string(), SagaConfig { steps })]);
        (targets.with_sagas(&saga)?, "bench-saga")
    };
    let dir = tempfile::tempdir()?;
    let mut config = EngineConfig::new(dir.path());
    config.durability = args.durability;
    config.max_live_tasks = args.in_flight * 2;
    // Timed from the engine's start (opening its ledger), as `sendledger-bench kafka` times the service
    // from its start: the two figures cover the same span of work.
    let started = Instant::now();
    let cpu_before = own_cpu_secs();
    let engine = Engine::start(config, Arc::new(HttpRemote::new(targets)))?;
    let total = args.tasks;
    runtime.block_on(async {
        let mut submits = tokio::task::JoinSet::new();
        for n in 0..total {
            let engine = engine.clone();
            submits.spawn(async move {
                engine
                    .submit(
                        bench_request(n, name),
                        Source {
                            topic: "bench".into(),
                            partition: 0,
                            offset: n as i64,
                        },
                    )
                    .await
            });
            while submits.len() >= args.in_flight {
                submits.join_next().await.expect("non-empty")??;
            }
        }
        while let Some(r) = submits.join_next().await {
            r??;
        }
        // Every task is done once the remote holds its record and no task is left active.
        loop {
            let active = engine
                .ledger()
                .read(|l| Ok(l.active_tasks()?.len()))
                .await?;
            if active == 0 && sim.stats().await?.records >= total * args.steps {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        anyhow::Ok(())
    })?;
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = own_cpu_secs() - cpu_before;

    let mut latencies = Vec::with_capacity(total as usize);
    let mut succeeded = 0u64;
    for n in 0..total {
        let task = bench_request(n, name)
            .accept(&Default::default())?
            .task_id();
        let events = engine.ledger().task_events(task)?;
        let accepted = events.first().map(|e| e.at).unwrap_or(0);
        let confirmed = |e: &&Event| matches!(e.body, EventBody::Confirmed { .. });
        let done = events.iter().filter(confirmed).nth(args.steps as usize - 1);
        if let Some(done) = done {
            succeeded += 1;
            latencies.push(done.at - accepted);
        }
    }
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    let stats = engine.ledger().stats();
    let batches = stats.batches.load(Ordering::Relaxed);
    let events = stats.events.load(Ordering::Relaxed);
    let remote = runtime.block_on(sim.stats())?;
    let report = serde_json::json!({
        "bench": "engine",
        "tasks": total,
        "steps": args.steps,
        "succeeded": succeeded,
        "durability": format!("{:?}", args.durability).to_lowercase(),
        "seconds": (elapsed * 1000.0).round() / 1000.0,
        "tasks_per_sec": (total as f64 / elapsed).round(),
        "latency_ms_p50": pct(0.50),
        "latency_ms_p99": pct(0.99),
        "fsyncs_per_task": (batches as f64 / total as f64 * 10_000.0).round() / 10_000.0,
        "events_per_task": (events as f64 / total as f64 * 100.0).round() / 100.0,
        "remote_records": remote.records,
        "remote_duplicates": remote.duplicates,
        "cpu_us_per_task": (cpu * 1e6 / total as f64).round(),
        "peak_rss_bytes": own_peak_rss_bytes(),
    });
    runtime.block_on(engine.shutdown(Duration::from_secs(5)));
    // What the ledger's directory holds once its engine stopped: every settled task kept.
    let mut report = report;
    let bytes = dir_bytes(dir.path())?;
    report["ledger_bytes"] = bytes.into();
    report["ledger_bytes_per_task"] = (bytes as f64 / total as f64).round().into();
    println!("{report}");
    Ok(())
}

/// The bytes of the files under `dir`.
pub(crate) fn dir_bytes(dir: &std::path::Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += match meta.is_dir() {
            true => dir_bytes(&entry.path())?,
            false => meta.len(),
        };
    }
    Ok(total)
}
