//! `sendledger-bench retention`: many tasks through the engine with retention removing the
//! settled ones as it goes, to see the ledger's size, the process's memory and the start-up
//! time stay flat while the history grows. Samples the ledger directory's bytes, the tasks
//! settled and removed, and the resident memory every `--sample`; at the end, every one of the
//! first `--redeliver` requests is delivered again (each must be a duplicate answered from
//! what retention kept, nothing sent); then one pass removes every task settled by then
//! (retention's own rate, alone), and the engine is started again on the ledger, timed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use sendledger_actors::{Engine, EngineConfig};
use sendledger_core::Source;
use sendledger_effects::{TargetConfig, Targets};
use sendledger_node::wiring::HttpRemote;

use crate::engine::dir_bytes;
use crate::ledger::bench_request;
use crate::process::{own_peak_rss_bytes, RemoteProcess};

#[derive(Args)]
pub struct RetentionArgs {
    /// Tasks to run.
    #[arg(long, default_value_t = 200_000)]
    tasks: u64,
    /// Submissions in flight at once.
    #[arg(long, default_value_t = 2_048)]
    in_flight: usize,
    /// How long a settled task's history is kept.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    retention: Duration,
    /// How long what retention kept of a task is kept (unset: for good).
    #[arg(long, value_parser = humantime::parse_duration)]
    identity_retention: Option<Duration>,
    /// How often a sample is taken.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    sample: Duration,
    /// How many of the first requests are delivered again at the end.
    #[arg(long, default_value_t = 10_000)]
    redeliver: u64,
    /// Submissions per second at most (0: as fast as the engine takes them). A steady state
    /// needs a rate the engine sustains while retention removes as much.
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Archive what retention removes (`storage.archive`), in a directory beside the ledger;
    /// the report gives its size.
    #[arg(long)]
    archive: bool,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// The process's resident memory now (Linux), in bytes.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kib| kib * 1024)
}

pub fn run(args: RetentionArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.tasks > 0 && args.in_flight > 0 && args.redeliver <= args.tasks,
        "--tasks and --in-flight must be positive, --redeliver at most --tasks"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let sim = RemoteProcess::start()?;
    let target: TargetConfig = serde_json::from_value(sim.target())?;
    let targets = Targets::from_config(&BTreeMap::from([("bench".to_string(), target)]))?;
    let dir = tempfile::tempdir()?;
    let archive = tempfile::tempdir()?;
    let mut config = EngineConfig::new(dir.path());
    config.max_live_tasks = args.in_flight * 2;
    config.archive = args.archive.then(|| archive.path().to_path_buf());
    let remote = Arc::new(HttpRemote::new(targets));
    let engine = Engine::start(config.clone(), remote.clone())?;
    let started = Instant::now();
    let total = args.tasks;
    let submitted = Arc::new(AtomicU64::new(0));
    let pruned = Arc::new(AtomicU64::new(0));
    let retention_ms = args.retention.as_millis() as u64;
    let identities = args.identity_retention;
    let samples = runtime.block_on(async {
        // Retention's loop, as the service runs it (nothing publishes here).
        let pruner = {
            let (engine, pruned) = (engine.clone(), pruned.clone());
            let every = sendledger_node::retention::pass_interval(args.retention);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let cutoff = now_ms().saturating_sub(retention_ms);
                    match engine.prune_settled(cutoff, None).await {
                        Ok(n) => pruned.fetch_add(n, Ordering::Relaxed),
                        Err(_) => return,
                    };
                    if let Some(kept) = identities {
                        let cutoff = now_ms().saturating_sub(kept.as_millis() as u64);
                        if engine.forget_expired(cutoff).await.is_err() {
                            return;
                        }
                    }
                }
            })
        };
        let sampler = {
            let (dir, submitted, pruned) =
                (dir.path().to_path_buf(), submitted.clone(), pruned.clone());
            let every = args.sample;
            tokio::spawn(async move {
                let mut samples = Vec::new();
                loop {
                    tokio::time::sleep(every).await;
                    samples.push(serde_json::json!({
                        "seconds": started.elapsed().as_secs(),
                        "submitted": submitted.load(Ordering::Relaxed),
                        "pruned": pruned.load(Ordering::Relaxed),
                        "ledger_bytes": dir_bytes(&dir).unwrap_or(0),
                        "rss_bytes": rss_bytes(),
                    }));
                    if submitted.load(Ordering::Relaxed) == total {
                        return samples;
                    }
                }
            })
        };
        let mut submits = tokio::task::JoinSet::new();
        for n in 0..total {
            if args.rate > 0 && n % 64 == 0 {
                let due = Duration::from_secs_f64(n as f64 / args.rate as f64);
                if let Some(ahead) = due.checked_sub(started.elapsed()) {
                    tokio::time::sleep(ahead).await;
                }
            }
            let engine = engine.clone();
            submits.spawn(async move {
                let source = Source {
                    topic: "bench".into(),
                    partition: 0,
                    offset: n as i64,
                };
                engine.submit(bench_request(n, "bench"), source).await
            });
            while submits.len() >= args.in_flight {
                submits.join_next().await.expect("non-empty")??;
                submitted.fetch_add(1, Ordering::Relaxed);
            }
        }
        while let Some(r) = submits.join_next().await {
            r??;
            submitted.fetch_add(1, Ordering::Relaxed);
        }
        let elapsed = started.elapsed().as_secs_f64();
        let samples = sampler.await?;
        pruner.abort();
        anyhow::Ok((samples, elapsed))
    })?;
    let (samples, elapsed) = samples;

    // Every early request again: a duplicate each, answered from what was kept.
    let (mut duplicates, mut from_retained) = (0u64, 0u64);
    runtime.block_on(async {
        for n in 0..args.redeliver {
            let source = Source {
                topic: "bench".into(),
                partition: 0,
                offset: (total + n) as i64,
            };
            let reply = engine.submit(bench_request(n, "bench"), source).await?;
            duplicates += u64::from(reply.events == ["DuplicateDelivery"]);
            let task = bench_request(n, "bench")
                .accept(&Default::default())?
                .task_id();
            from_retained += u64::from(engine.ledger().retained(task)?.is_some());
        }
        anyhow::Ok(())
    })?;
    // Then every task settled by now, in one pass: how fast retention removes alone.
    let catch_up = Instant::now();
    let caught_up = runtime.block_on(engine.prune_settled(now_ms(), None))?;
    let catch_up_secs = catch_up.elapsed().as_secs_f64();
    let remote_stats = runtime.block_on(sim.stats())?;
    runtime.block_on(engine.shutdown(Duration::from_secs(5)));
    let bytes = dir_bytes(dir.path())?;
    let archive_bytes = dir_bytes(archive.path())?;
    let restart = Instant::now();
    let engine = Engine::start(config, remote)?;
    let restart_ms = restart.elapsed().as_millis() as u64;
    let totals = engine.ledger().pruned_totals()?;
    runtime.block_on(engine.shutdown(Duration::from_secs(5)));
    let report = serde_json::json!({
        "bench": "retention",
        "tasks": total,
        "retention_seconds": args.retention.as_secs_f64(),
        "seconds": (elapsed * 1000.0).round() / 1000.0,
        "tasks_per_sec": (total as f64 / elapsed).round(),
        "identity_retention_seconds": args.identity_retention.map(|d| d.as_secs_f64()),
        "pruned_tasks": totals.tasks,
        "forgotten_tasks": totals.forgotten,
        "pruned_events": totals.events,
        "caught_up_tasks": caught_up,
        "caught_up_per_sec": (caught_up as f64 / catch_up_secs).round(),
        "redelivered": args.redeliver,
        "redelivered_duplicates": duplicates,
        "redelivered_from_retained": from_retained,
        "remote_records": remote_stats.records,
        "remote_duplicates": remote_stats.duplicates,
        "ledger_bytes": bytes,
        "ledger_bytes_per_task": (bytes as f64 / total as f64).round(),
        "archive_bytes": args.archive.then_some(archive_bytes),
        "archive_bytes_per_removed_task": args
            .archive
            .then(|| (archive_bytes as f64 / totals.tasks.max(1) as f64).round()),
        "archive_files": args.archive.then(|| std::fs::read_dir(archive.path()).map_or(0, |d| d.count())),
        "restart_ms": restart_ms,
        "peak_rss_bytes": own_peak_rss_bytes(),
        "samples": samples,
    });
    println!("{report}");
    Ok(())
}
