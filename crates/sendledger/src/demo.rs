//! `sendledger demo`: the whole engine on embedded defaults against a fault-injecting simulated
//! remote, with duplicate deliveries and a restart in the middle, ending in an audit.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::SeedableRng;
use sendledger_actors::{Engine, EngineConfig, HttpRemote};
use sendledger_core::{Phase, Source, TaskRequest};
use sendledger_effects::{TargetConfig, Targets};
use sendledger_sim::{Faults, Sim, SimConfig};

#[derive(Args)]
pub struct DemoArgs {
    /// Distinct requests (tasks).
    #[arg(long, default_value_t = 10_000)]
    tasks: u64,
    /// Share of requests delivered twice.
    #[arg(long, default_value_t = 0.2)]
    duplicates: f64,
    /// Seed of the remote's faults and of the delivery order.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Ledger directory (a temporary one by default).
    #[arg(long)]
    data: Option<PathBuf>,
}

pub fn run(args: DemoArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.duplicates),
        "--duplicates must be within [0, 1]"
    );
    anyhow::ensure!(args.tasks > 0, "--tasks must be positive");
    let temp = tempfile::tempdir()?;
    let data = args
        .data
        .clone()
        .unwrap_or_else(|| temp.path().join("ledger"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let sim = runtime.block_on(Sim::start(SimConfig {
        seed: args.seed,
        lookup_lag: Duration::from_millis(300),
        faults: Faults {
            commit_then_drop: 0.05,
            commit_then_hang: 0.02,
            throttle: 0.03,
            retry_after: Duration::from_secs(1),
            latency_jitter: Duration::from_millis(5),
            ..Faults::default()
        },
        ..SimConfig::default()
    }))?;
    let target: TargetConfig = serde_json::from_value(serde_json::json!({
        "url": sim.create_url(),
        "request_timeout": "1s",
        "body_fields": { "request_key": "{request_key}" },
        "lookup": {
            "url": format!("{}?request_key={{request_key}}", sim.lookup_url()),
            "first_check": "200ms", "check_interval": "300ms", "deadline": "30s"
        },
    }))?;
    let targets = Targets::from_config(&BTreeMap::from([("payments".to_string(), target)]))?;
    let remote = Arc::new(HttpRemote::new(targets));
    let start = |data: &PathBuf| -> anyhow::Result<Engine> {
        let mut config = EngineConfig::new(data);
        config.seed = args.seed;
        Engine::start(config, remote.clone()).context("starting the engine")
    };

    // Every request once, a share of them twice, in a seeded random order.
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let mut deliveries: Vec<u64> = (0..args.tasks).collect();
    let twice = (args.tasks as f64 * args.duplicates) as usize;
    deliveries.extend(deliveries.clone().choose_multiple(&mut rng, twice));
    deliveries.shuffle(&mut rng);
    let total = deliveries.len();
    eprintln!(
        "sendledger demo: {} tasks, {total} deliveries ({twice} duplicates), remote at {}",
        args.tasks,
        sim.base_url()
    );

    let started = Instant::now();
    let mut engine = start(&data)?;
    let restart_at = total / 2;
    for (chunk_start, chunk) in deliveries
        .chunks(1_000)
        .enumerate()
        .map(|(i, c)| (i * 1_000, c))
    {
        if chunk_start >= restart_at && chunk_start < restart_at + 1_000 {
            eprintln!("\nrestarting the engine mid-run");
            runtime.block_on(engine.shutdown(Duration::from_secs(2)));
            engine = start(&data)?;
        }
        runtime.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for (i, n) in chunk.iter().enumerate() {
                let engine = engine.clone();
                let source = Source {
                    topic: "demo".into(),
                    partition: 0,
                    offset: (chunk_start + i) as i64,
                };
                let request = request(*n);
                set.spawn(async move { engine.submit(request, source).await });
            }
            while let Some(r) = set.join_next().await {
                r??;
            }
            anyhow::Ok(())
        })?;
        progress("delivered", chunk_start + chunk.len(), total);
    }
    eprintln!();
    // Wait until every task is settled: terminal or in review.
    loop {
        let open = runtime.block_on(engine.ledger().read(|l| {
            Ok(l.active_tasks()?
                .iter()
                .filter(|(_, s)| s.phase != Phase::ManualReview)
                .count())
        }))?;
        progress(
            "settled",
            args.tasks as usize - open.min(args.tasks as usize),
            args.tasks as usize,
        );
        if open == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!();
    runtime.block_on(engine.shutdown(Duration::from_secs(2)));

    let ledger = sendledger_store::Ledger::open(&data, Default::default())?;
    let report = sendledger_store::audit(&ledger, |_| {})?;
    let stats = sim.stats();
    let succeeded = report.tasks_by_state.get("succeeded").copied().unwrap_or(0);
    let rows = [
        ("tasks", report.tasks.to_string()),
        ("deliveries", total.to_string()),
        ("succeeded", succeeded.to_string()),
        ("in manual review", report.manual_reviews_open.to_string()),
        (
            "failed or rejected",
            (report.tasks - succeeded - report.manual_reviews_open).to_string(),
        ),
        ("records at the remote", stats.records.to_string()),
        (
            "identities with more than one record",
            stats.duplicates.to_string(),
        ),
        ("unknown outcomes", report.unknown_outcomes.to_string()),
        (
            "  resolved by lookup",
            report.unknowns_resolved_by_lookup.to_string(),
        ),
        (
            "  after the restart (recovery)",
            report.recovered_after_crash.to_string(),
        ),
        ("duplicates dropped", report.duplicates_dropped.to_string()),
        ("audit violations", report.violations.len().to_string()),
        (
            "throughput",
            format!("{:.0} tasks/s", args.tasks as f64 / elapsed),
        ),
    ];
    println!();
    for (name, value) in rows {
        println!("  {name:<40} {value:>12}");
    }
    let ok = stats.duplicates == 0 && report.is_clean() && report.tasks == args.tasks;
    println!(
        "\n  {}",
        if ok {
            "OK: every task done once, no duplicate at the remote, audit clean"
        } else {
            "FAILED: an invariant is broken (see above)"
        }
    );
    runtime.block_on(sim.shutdown());
    Ok(ok)
}

fn request(n: u64) -> TaskRequest {
    TaskRequest {
        tenant: "demo".into(),
        operation: "payment.create".into(),
        request_key: format!("ord-{n:06}"),
        target: "payments".into(),
        payload: serde_json::json!({ "amount": 100 + n % 900, "currency": "EUR" }),
        metadata: Default::default(),
    }
}

fn progress(what: &str, done: usize, total: usize) {
    let width = 40;
    let filled = done * width / total.max(1);
    eprint!(
        "\r{what:>9} [{}{}] {done}/{total}",
        "#".repeat(filled),
        ".".repeat(width - filled)
    );
}
