//! `sendledger demo`: the whole service on embedded defaults. An in-process Kafka cluster, a
//! simulated remote with faults (dropped responses, hangs, 429s, lookup lag), requests produced
//! to the requests topic with duplicate deliveries, the service restarted in the middle, every
//! result read back from the results topic, and an audit of the ledger at the end.
//!
//! `--saga`: the same with a three-step operation (reserve, charge, ship) at five simulated
//! remotes, the shipment refused for one task in five, so that the reservation and the charge
//! of those tasks are undone (released, refunded) once each.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::SeedableRng;
use sendledger_core::TaskRequest;
use sendledger_kafka::{request_key, Kafka, RequestProducer, ResultsReader};
use sendledger_sim::{Faults, Sim, SimConfig, Stats as SimStats};
use sendledger_store::AuditReport;

use crate::config::{AdminConfig, Config};
use crate::service::Service;
use crate::wiring::HttpRemote;

/// What the demo runs: `sendledger demo`'s options.
pub struct DemoArgs {
    /// Distinct requests (tasks).
    pub tasks: u64,
    /// Share of requests delivered twice, within [0, 1].
    pub duplicates: f64,
    /// Seed of the remote's faults and of the delivery order.
    pub seed: u64,
    /// Ledger directory (a temporary one when `None`).
    pub data: Option<PathBuf>,
    /// Run the three-step saga instead of one call per task.
    pub saga: bool,
}

/// Runs the demo and prints its report; `Ok(false)` when an invariant failed.
pub fn run(args: DemoArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.duplicates),
        "the share of duplicates must be within [0, 1]"
    );
    anyhow::ensure!(args.tasks > 0, "the number of tasks must be positive");
    let temp = tempfile::tempdir()?;
    let data = args
        .data
        .clone()
        .unwrap_or_else(|| temp.path().join("ledger"));
    crate::runtime::runtime()?.block_on(demo(args, data))
}

/// Set up; produce every delivery; run until every task has a result, restarting the service
/// half-way; collect what the results topic said; audit the ledger and report.
async fn demo(args: DemoArgs, data: PathBuf) -> anyhow::Result<bool> {
    let setup = Setup::start(&args, data).await?;
    let deliveries = deliveries(&args);
    eprintln!(
        "sendledger demo: {} tasks, {} deliveries ({} duplicates) through Kafka at {}, {}",
        args.tasks,
        deliveries.len(),
        deliveries.len() as u64 - args.tasks,
        setup.kafka.bootstrap_servers(),
        setup
            .sims
            .iter()
            .map(|(name, sim)| format!("{name} at {}", sim.base_url()))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let results = tokio::task::block_in_place(|| ResultsReader::start(&setup.kafka))?;
    let started = Instant::now();
    let service = setup.start_service().await?;
    let produce = produce(&setup.kafka, &deliveries, setup.target())?;
    let service = run_until_answered(&setup, service, &results, args.tasks as usize).await?;
    let elapsed = started.elapsed().as_secs_f64();
    produce.await??;
    service.shutdown().await?;
    let (with_result, more_than_one_terminal) = results.stop();

    let report = audit(&setup.config.storage.data)?;
    let ok = print_report(
        &args,
        &Outcome {
            report,
            deliveries: deliveries.len(),
            with_result,
            more_than_one_terminal,
            remotes: setup
                .sims
                .iter()
                .map(|(name, sim)| (*name, sim.stats()))
                .collect(),
            elapsed,
        },
    );
    for (_, sim) in setup.sims {
        sim.shutdown().await;
    }
    Ok(ok)
}

/// What the demo runs on: the simulated remotes with their faults, by target name, the
/// service's configuration and the embedded Kafka cluster (which outlives the restart).
struct Setup {
    sims: Vec<(&'static str, Sim)>,
    config: Config,
    kafka: Kafka,
    saga: bool,
}

/// The saga of `--saga`: each step's name, target and compensating target.
const SAGA: [(&str, &str, Option<&str>); 3] = [
    ("reserve", "stock", Some("stock-release")),
    ("charge", "payments", Some("refunds")),
    ("ship", "shipments", None),
];

impl Setup {
    async fn start(args: &DemoArgs, data: PathBuf) -> anyhow::Result<Setup> {
        let faults = Faults {
            commit_then_drop: 0.05,
            commit_then_hang: 0.02,
            throttle: 0.03,
            retry_after: Duration::from_secs(1),
            latency_jitter: Duration::from_millis(5),
            ..Faults::default()
        };
        let remotes: Vec<(&'static str, Faults)> = if args.saga {
            vec![
                ("stock", faults),
                ("payments", faults),
                (
                    "shipments",
                    Faults {
                        reject: 0.2,
                        ..faults
                    },
                ),
                ("refunds", faults),
                ("stock-release", faults),
            ]
        } else {
            vec![("payments", faults)]
        };
        let mut sims = Vec::new();
        for (n, (name, faults)) in remotes.into_iter().enumerate() {
            let sim = Sim::start(SimConfig {
                identity_field: "reference".into(),
                seed: args.seed + n as u64,
                lookup_lag: Duration::from_millis(300),
                faults,
                ..SimConfig::default()
            })
            .await?;
            sims.push((name, sim));
        }
        let mut config = Config {
            admin: AdminConfig {
                enabled: false,
                ..AdminConfig::default()
            },
            ..Config::default()
        };
        config.storage.data = data;
        config.engine.shutdown_grace = Duration::from_secs(3);
        config.kafka.commit_interval = Duration::from_millis(200);
        for (name, sim) in &sims {
            let mut body = serde_json::json!({ "reference": "{task_id}" });
            // A compensation names the record it undoes.
            if let Some((step, ..)) = SAGA.iter().find(|(.., undo)| *undo == Some(*name)) {
                body["undoes"] = format!("{{steps.{step}.remote_id}}").into();
            }
            config.targets.insert(
                name.to_string(),
                serde_json::from_value(serde_json::json!({
                    "url": sim.create_url(),
                    "request_timeout": "1s",
                    "body_fields": body,
                    "lookup": {
                        "url": format!("{}?reference={{task_id}}", sim.lookup_url()),
                        "first_check": "200ms", "check_interval": "300ms", "deadline": "30s"
                    },
                }))?,
            );
        }
        if args.saga {
            let steps = SAGA.map(|(name, target, undo)| sendledger_effects::SagaStepConfig {
                name: name.into(),
                target: target.into(),
                compensate: undo.map(Into::into),
            });
            let saga = sendledger_effects::SagaConfig {
                steps: steps.to_vec(),
            };
            config.sagas.insert("order".into(), saga);
        }
        config.validate(&BTreeMap::new())?;
        let kafka = tokio::task::block_in_place(|| Kafka::connect(config.kafka.clone()))
            .context("starting the embedded kafka cluster")?;
        Ok(Setup {
            sims,
            config,
            kafka,
            saga: args.saga,
        })
    }

    /// What the requests name: the saga, or the one target.
    fn target(&self) -> &'static str {
        if self.saga {
            "order"
        } else {
            "payments"
        }
    }

    /// The service, with an HTTP client of its own as a process that starts again has (its
    /// connections and its targets' breakers start afresh).
    async fn start_service(&self) -> anyhow::Result<Service> {
        let remote = Arc::new(HttpRemote::new(self.config.load_targets()?));
        Ok(Service::start(&self.config, &self.kafka, remote, None).await?)
    }
}

/// Every request once, a share of them twice, in a seeded random order.
fn deliveries(args: &DemoArgs) -> Vec<u64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let mut deliveries: Vec<u64> = (0..args.tasks).collect();
    let twice = (args.tasks as f64 * args.duplicates) as usize;
    deliveries.extend(deliveries.clone().choose_multiple(&mut rng, twice));
    deliveries.shuffle(&mut rng);
    deliveries
}

/// Produces the deliveries to the requests topic in the background, keyed by identity.
fn produce(
    kafka: &Kafka,
    deliveries: &[u64],
    target: &str,
) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<()>>> {
    let producer = RequestProducer::new(kafka)?;
    let messages: Vec<(Option<String>, Vec<u8>)> = deliveries
        .iter()
        .map(|n| {
            let r = request(*n, target);
            (Some(request_key(&r)), serde_json::to_vec(&r).expect("JSON"))
        })
        .collect();
    let bytes = messages.iter().map(|(_, v)| v.len() as u64).sum();
    kafka.check_embedded_backlog(messages.len() as u64, bytes)?;
    Ok(tokio::spawn(async move {
        producer.send_all(messages).await?;
        Ok(())
    }))
}

/// Waits until each of the `tasks` has a result on the topic, restarting the service once half
/// of them have. Returns the service that is running at the end.
async fn run_until_answered(
    setup: &Setup,
    mut service: Service,
    results: &ResultsReader,
    tasks: usize,
) -> anyhow::Result<Service> {
    let mut progress = Progress::new("results", tasks);
    let mut restarted = false;
    loop {
        let (done, _) = results.progress();
        progress.update(done);
        if done >= tasks {
            break;
        }
        if !restarted && done >= tasks / 2 {
            progress.note("restarting the service mid-run");
            service.shutdown().await?;
            service = setup.start_service().await?;
            restarted = true;
        }
        anyhow::ensure!(
            service.is_healthy(),
            "the service stopped consuming; see the error above"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    progress.finish();
    Ok(service)
}

/// The replay audit of the ledger the service left behind.
fn audit(data: &Path) -> anyhow::Result<AuditReport> {
    tokio::task::block_in_place(|| {
        let ledger = sendledger_store::Ledger::open(data, Default::default())?;
        Ok(sendledger_store::audit(
            &ledger,
            Default::default(),
            |_| {},
        )?)
    })
}

/// What the run left: the audit of the ledger, what the results topic said, the remote's
/// ground truth.
struct Outcome {
    report: AuditReport,
    deliveries: usize,
    with_result: usize,
    more_than_one_terminal: usize,
    /// Each remote's ground truth, by target name.
    remotes: Vec<(&'static str, SimStats)>,
    elapsed: f64,
}

/// Prints the summary table and the verdict; returns whether every invariant holds.
fn print_report(args: &DemoArgs, outcome: &Outcome) -> bool {
    let Outcome {
        report,
        deliveries,
        with_result,
        more_than_one_terminal,
        remotes,
        elapsed,
    } = outcome;
    let count = |state: &str| report.tasks_by_state.get(state).copied().unwrap_or(0);
    let (succeeded, compensated) = (count("succeeded"), count("compensated"));
    let records = |name: &str| {
        let stats = remotes.iter().find(|(n, _)| *n == name).map(|(_, s)| s);
        stats.map_or(0, |s| s.records)
    };
    let duplicates: u64 = remotes.iter().map(|(_, s)| s.duplicates).sum();
    let named = |rows: &[(&str, String)]| -> Vec<(String, String)> {
        rows.iter()
            .map(|(n, v)| (n.to_string(), v.clone()))
            .collect()
    };
    let mut rows = named(&[
        ("tasks", report.tasks.to_string()),
        ("deliveries", deliveries.to_string()),
        ("tasks with a result on the topic", with_result.to_string()),
        (
            "tasks with two different terminal results",
            more_than_one_terminal.to_string(),
        ),
        ("succeeded", succeeded.to_string()),
        ("compensated", compensated.to_string()),
        ("in manual review", report.manual_reviews_open.to_string()),
        (
            "failed or rejected",
            (report.tasks - succeeded - compensated - report.manual_reviews_open).to_string(),
        ),
    ]);
    for (name, stats) in remotes {
        rows.push((format!("records at {name}"), stats.records.to_string()));
    }
    rows.extend(named(&[
        (
            "identities with more than one record",
            duplicates.to_string(),
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
    ]));
    if args.saga {
        rows.push((
            "compensations started".into(),
            report.compensations.to_string(),
        ));
    }
    println!();
    for (name, value) in rows {
        println!("  {name:<44} {value:>12}");
    }
    // A saga's records: one shipment per task that succeeded, one release and one refund per
    // task compensated, nothing else.
    let saga_ok = !args.saga
        || (records("shipments") == succeeded
            && records("refunds") == compensated
            && records("stock-release") == compensated
            && report.compensations == 2 * compensated);
    let ok = duplicates == 0
        && saga_ok
        && report.is_clean()
        && report.tasks == args.tasks
        && *with_result == args.tasks as usize
        && *more_than_one_terminal == 0;
    println!(
        "\n  {}",
        if ok {
            "OK: every task done once, one result each, no duplicate at a remote, audit clean"
        } else {
            "FAILED: an invariant is broken (see above)"
        }
    );
    ok
}

fn request(n: u64, target: &str) -> TaskRequest {
    TaskRequest {
        tenant: "demo".into(),
        operation: "payment.create".into(),
        request_key: format!("ord-{n:06}"),
        target: target.into(),
        payload: serde_json::json!({ "amount": 100 + n % 900, "currency": "EUR" }),
        payload_text: None,
        metadata: Default::default(),
        version: 0,
    }
}

/// Progress on stderr. On a terminal, one bar redrawn in place; anywhere else (a file, a pipe,
/// a log collector), a plain line whenever another tenth of the way is done (at most ten
/// lines), with no carriage return.
struct Progress {
    what: &'static str,
    total: usize,
    terminal: bool,
    /// Whether the bar's line is open (drawn and not yet ended by a newline).
    drawn: bool,
    /// Tenths of the way done when the last plain line was printed.
    tenths: usize,
}

impl Progress {
    fn new(what: &'static str, total: usize) -> Progress {
        Progress {
            what,
            total: total.max(1),
            terminal: std::io::stderr().is_terminal(),
            drawn: false,
            tenths: 0,
        }
    }

    fn update(&mut self, done: usize) {
        let (what, total) = (self.what, self.total);
        if self.terminal {
            let width = 40;
            let filled = (done * width / total).min(width);
            eprint!(
                "\r{what:>9} [{}{}] {done}/{total}",
                "#".repeat(filled),
                ".".repeat(width - filled)
            );
            self.drawn = true;
            return;
        }
        let tenths = (done * 10 / total).min(10);
        if tenths > self.tenths {
            self.tenths = tenths;
            eprintln!("{what:>9} {:>3}% {done}/{total}", done * 100 / total);
        }
    }

    /// A message on a line of its own.
    fn note(&mut self, message: &str) {
        self.finish();
        eprintln!("{message}");
    }

    /// Ends the bar's line, if one is drawn.
    fn finish(&mut self) {
        if self.drawn {
            eprintln!();
            self.drawn = false;
        }
    }
}
