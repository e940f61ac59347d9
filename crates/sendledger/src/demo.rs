//! `sendledger demo`: the whole service on embedded defaults. An in-process Kafka cluster, a
//! simulated remote with faults (dropped responses, hangs, 429s, lookup lag), requests produced
//! to the requests topic with duplicate deliveries, the service restarted in the middle, every
//! result read back from the results topic, and an audit of the ledger at the end.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::SeedableRng;
use sendledger_bus::{request_key, Kafka, RequestProducer, ResultsReader};
use sendledger_core::TaskRequest;
use sendledger_sim::{Faults, Sim, SimConfig};

use crate::config::{AdminConfig, Config};
use crate::service::Service;
use crate::wiring::HttpRemote;

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
    /// Ledger directory (a temporary one by default). Inspect or audit it afterwards.
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
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(demo(args, data))
}

async fn demo(args: DemoArgs, data: PathBuf) -> anyhow::Result<bool> {
    let sim = Sim::start(SimConfig {
        identity_field: "reference".into(),
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
    })
    .await?;
    let mut config = Config {
        admin: AdminConfig {
            enabled: false,
            ..AdminConfig::default()
        },
        ..Config::default()
    };
    config.storage.data = data.clone();
    config.engine.shutdown_grace = Duration::from_secs(3);
    config.kafka.commit_interval = Duration::from_millis(200);
    config.targets.insert(
        "payments".into(),
        serde_json::from_value(serde_json::json!({
            "url": sim.create_url(),
            "request_timeout": "1s",
            "body_fields": { "reference": "{task_id}" },
            "lookup": {
                "url": format!("{}?reference={{task_id}}", sim.lookup_url()),
                "first_check": "200ms", "check_interval": "300ms", "deadline": "30s"
            },
        }))?,
    );
    config.validate(&BTreeMap::new())?;
    let kafka = tokio::task::block_in_place(|| Kafka::connect(config.kafka.clone()))
        .context("starting the embedded kafka cluster")?;
    let remote = Arc::new(HttpRemote::new(config.load_targets()?));

    // Every request once, a share of them twice, in a seeded random order.
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let mut deliveries: Vec<u64> = (0..args.tasks).collect();
    let twice = (args.tasks as f64 * args.duplicates) as usize;
    deliveries.extend(deliveries.clone().choose_multiple(&mut rng, twice));
    deliveries.shuffle(&mut rng);
    let total = deliveries.len();
    eprintln!(
        "sendledger demo: {} tasks, {total} deliveries ({twice} duplicates) through Kafka at {}, remote at {}",
        args.tasks,
        kafka.bootstrap_servers(),
        sim.base_url()
    );

    let results = ResultsReader::start(&kafka)?;
    let started = Instant::now();
    let mut service = Service::start(&config, &kafka, remote.clone(), None).await?;
    let producer = RequestProducer::new(&kafka)?;
    let messages: Vec<(Option<String>, Vec<u8>)> = deliveries
        .iter()
        .map(|n| {
            let r = request(*n);
            (Some(request_key(&r)), serde_json::to_vec(&r).expect("JSON"))
        })
        .collect();
    let bytes = messages.iter().map(|(_, v)| v.len() as u64).sum();
    kafka.check_embedded_backlog(messages.len() as u64, bytes)?;
    let produce = tokio::spawn(async move { producer.send_all(messages).await });

    // Restart once half of the tasks have their result.
    let n = args.tasks as usize;
    let mut restarted = false;
    loop {
        let (done, _) = results.progress();
        progress("results", done, n);
        if done >= n {
            break;
        }
        if !restarted && done >= n / 2 {
            eprintln!("\nrestarting the service mid-run");
            service.shutdown().await?;
            service = Service::start(&config, &kafka, remote.clone(), None).await?;
            restarted = true;
        }
        anyhow::ensure!(
            service.is_healthy(),
            "the service stopped consuming; see the error above"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!();
    produce.await??;
    service.shutdown().await?;
    let (with_result, more_than_one_terminal) = results.stop();

    let ledger =
        tokio::task::block_in_place(|| sendledger_store::Ledger::open(&data, Default::default()))?;
    let report = tokio::task::block_in_place(|| {
        sendledger_store::audit(&ledger, Default::default(), |_| {})
    })?;
    let stats = sim.stats();
    let succeeded = report.tasks_by_state.get("succeeded").copied().unwrap_or(0);
    let rows = [
        ("tasks", report.tasks.to_string()),
        ("deliveries", total.to_string()),
        ("tasks with a result on the topic", with_result.to_string()),
        (
            "tasks with two different terminal results",
            more_than_one_terminal.to_string(),
        ),
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
            "  interrupted by the restart",
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
        println!("  {name:<44} {value:>12}");
    }
    let ok = stats.duplicates == 0
        && report.is_clean()
        && report.tasks == args.tasks
        && with_result == n
        && more_than_one_terminal == 0;
    println!(
        "\n  {}",
        if ok {
            "OK: every task done once, one result each, no duplicate at the remote, audit clean"
        } else {
            "FAILED: an invariant is broken (see above)"
        }
    );
    sim.shutdown().await;
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
    let filled = (done * width / total.max(1)).min(width);
    eprint!(
        "\r{what:>9} [{}{}] {done}/{total}",
        "#".repeat(filled),
        ".".repeat(width - filled)
    );
}
