//! `sendledger-bench kafka`: tasks per second end to end through Kafka: requests on the requests
//! topic of the embedded cluster (all produced before the service starts, or at a steady rate
//! while it runs), the whole service (ingest, engine, publisher) against the simulated remote,
//! until every task's result has been read back from the results topic; and the latency of each
//! task from its request's production to its result's reading. With `--service-process` the
//! service runs as a `sendledger run` child, so its peak memory is measured alone.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use sendledger_kafka::{request_key, Kafka, RequestProducer, ResultsReader};
use sendledger_store::Durability;

use crate::engine::parse_durability;
use crate::ledger::bench_request;
use crate::process::{own_cpu_secs, own_peak_rss_bytes, RemoteProcess, ServiceProcess};
use sendledger_node::config::Config;
use sendledger_node::service::Service;
use sendledger_node::wiring::HttpRemote;

#[derive(Args)]
pub struct KafkaArgs {
    /// Tasks to run (one request each, produced before the service starts unless --rate is
    /// given).
    #[arg(long, default_value_t = 20_000)]
    tasks: u64,
    /// Produce the requests at this many per second while the service runs, instead of all
    /// before it starts (the latency is then each request's own, not its wait in a backlog).
    #[arg(long)]
    rate: Option<u64>,
    /// `sync` (fsync per group commit) or `buffered` (no fsync; unsafe on power loss).
    #[arg(long, default_value = "sync", value_parser = parse_durability)]
    durability: Durability,
    /// Run the service in a child process (`sendledger run`, connected to the embedded
    /// cluster's listeners), so `peak_rss_bytes` is the service's alone and not the embedded
    /// cluster's or the benchmark's.
    #[arg(long)]
    service_process: bool,
    /// First run the same tasks through the engine alone (`sendledger-bench engine` in a child
    /// process: no Kafka, requests handed straight to the engine) and report its tasks/s and
    /// this run's ratio to it.
    #[arg(long)]
    compare_engine: bool,
    /// Partitions of the embedded cluster's topics. It keeps at most 5 MiB per partition, so a
    /// larger backlog (more tasks at once, or a higher `--rate`) needs more of them.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
}

pub fn run(args: KafkaArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.tasks > 0, "--tasks must be positive");
    anyhow::ensure!(args.rate != Some(0), "--rate must be positive");
    anyhow::ensure!(args.partitions > 0, "--partitions must be positive");
    sendledger_node::runtime::runtime()?.block_on(bench(args))
}

async fn bench(args: KafkaArgs) -> anyhow::Result<()> {
    let engine = if args.compare_engine {
        Some(tokio::task::block_in_place(|| {
            engine_alone(args.tasks, args.durability)
        })?)
    } else {
        None
    };
    let sim = RemoteProcess::start()?;
    let dir = tempfile::tempdir()?;
    let mut config = bench_config(&sim, dir.path(), args.durability)?;
    config.kafka.partitions = args.partitions;
    let kafka = tokio::task::block_in_place(|| Kafka::connect(config.kafka.clone()))?;
    let n = args.tasks;
    let one = serde_json::to_vec(&bench_request(0, "payments"))?.len() as u64;
    // At a steady rate, requests wait only while the service is behind: allow for 10 s (a
    // service further behind loses requests to the embedded cluster's retention, and the run
    // stops without results).
    let backlog = args.rate.map_or(n, |rate| n.min(rate.saturating_mul(10)));
    kafka.check_embedded_backlog(backlog, backlog * (one + 64))?;
    let placement = if args.service_process {
        Placement::Child {
            dir: dir.path(),
            toml: child_config(&config, kafka.bootstrap_servers())?,
        }
    } else {
        Placement::InProcess
    };
    let run = through_kafka(&config, &kafka, n, args.rate, placement).await?;
    check_remote(&sim, &run).await?;
    let remote = sim.stats().await?;
    let n = n as f64;
    println!(
        "{}",
        serde_json::json!({
            "tasks": args.tasks,
            "rate": args.rate,
            "partitions": args.partitions,
            "durability": format!("{:?}", args.durability).to_lowercase(),
            "produce_per_sec": (n / run.produce_secs).round(),
            "tasks_per_sec": run.tasks_per_sec(),
            "engine_tasks_per_sec": engine.map(|e| e.tasks_per_sec),
            "ratio_to_engine": engine.map(|e| round4(run.tasks_per_sec() / e.tasks_per_sec)),
            "tasks_per_sec_after_first_result": (n / run.steady_secs).round(),
            "first_result_after_ms": ((run.total_secs - run.steady_secs) * 1000.0).round(),
            "latency_ms_p50": run.latency_ms(0.50),
            "latency_ms_p99": run.latency_ms(0.99),
            "cpu_us_per_task": run.cpu_secs.map(|c| (c * 1e6 / n).round()),
            "engine_cpu_us_per_task": engine.map(|e| e.cpu_us_per_task),
            "fsyncs_per_task": run.batches.map(|b| round4(b as f64 / n)),
            "events_per_task": run.events.map(|e| round4(e as f64 / n)),
            "refolded_per_task": run.refolded.map(|e| round4(e as f64 / n)),
            "remote_duplicates": remote.duplicates,
            "service_process": args.service_process,
            // With --service-process the service's alone; otherwise this process's: the
            // service, the embedded cluster holding every topic, and the benchmark's producer
            // and results reader. The remote runs in a child either way.
            "peak_rss_bytes": run.service_peak_rss_bytes.unwrap_or_else(own_peak_rss_bytes),
        })
    );
    Ok(())
}

/// A name for this run's topics and groups, `<prefix>-<pid>-<unix seconds>`, so that runs
/// against one broker never mix.
pub(crate) fn run_id(prefix: &str) -> anyhow::Result<String> {
    let secs = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?).as_secs();
    Ok(format!("{prefix}-{}-{secs}", std::process::id()))
}

pub(crate) fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

/// A service configuration on `data` with the one target `payments` at `sim`, on the embedded
/// cluster (callers change `kafka` and `storage.mode` as they need).
pub(crate) fn bench_config(
    sim: &RemoteProcess,
    data: &std::path::Path,
    durability: Durability,
) -> anyhow::Result<Config> {
    let mut config = Config::default();
    config.admin.enabled = false;
    config.storage.data = data.join("ledger");
    config.storage.durability = durability;
    config
        .targets
        .insert("payments".into(), serde_json::from_value(sim.target())?);
    Ok(config)
}

/// What `sendledger-bench engine` measured.
#[derive(Clone, Copy)]
struct EngineAlone {
    tasks_per_sec: f64,
    cpu_us_per_task: f64,
}

/// `sendledger-bench engine` with `tasks` tasks, run as a child process.
fn engine_alone(tasks: u64, durability: Durability) -> anyhow::Result<EngineAlone> {
    let durability = format!("{durability:?}").to_lowercase();
    let out = std::process::Command::new(std::env::current_exe()?)
        .args(["engine", "--tasks", &tasks.to_string()])
        .args(["--durability", &durability])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running `sendledger-bench engine`")?;
    anyhow::ensure!(
        out.status.success(),
        "`sendledger-bench engine` failed: {}",
        out.status
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .context("`sendledger-bench engine` printed no JSON report")?;
    let figure = |name: &str| {
        report[name]
            .as_f64()
            .with_context(|| format!("`sendledger-bench engine` reported no {name}"))
    };
    Ok(EngineAlone {
        tasks_per_sec: figure("tasks_per_sec")?,
        cpu_us_per_task: figure("cpu_us_per_task")?,
    })
}

/// The configuration file of a `sendledger run` child doing what `config` describes, on the
/// brokers at `bootstrap`: `config` itself, serialized (a configuration built as JSON would
/// carry its numbers as maps, since `arbitrary_precision` is on for the workspace). `Config`
/// serializes secrets as `***`; the benchmark's configuration has none.
pub(crate) fn child_config(config: &Config, bootstrap: &str) -> anyhow::Result<String> {
    let mut child = config.clone();
    child.kafka.brokers = bootstrap.to_string();
    // As the embedded cluster's own consumers: its brokers hold an empty fetch this long.
    (child.kafka.properties).insert("fetch.wait.max.ms".into(), "10".into());
    Ok(toml::to_string(&child)?)
}

/// Where the service under test runs.
pub(crate) enum Placement<'a> {
    /// In this process.
    InProcess,
    /// In a `sendledger run` child on configuration `toml`, with its files in `dir`.
    Child {
        dir: &'a std::path::Path,
        toml: String,
    },
}

/// The service under test, running.
enum Running {
    InProcess(Service),
    Child(ServiceProcess),
}

impl Running {
    fn ensure_healthy(&mut self) -> anyhow::Result<()> {
        match self {
            Running::InProcess(service) => {
                anyhow::ensure!(service.is_healthy(), "the service stopped consuming");
                Ok(())
            }
            Running::Child(child) => child.ensure_running(),
        }
    }
}

/// How long a run may go without a new result before it is given up.
const STALLED: Duration = Duration::from_secs(60);

/// What one run through Kafka measured.
pub(crate) struct Run {
    pub tasks: u64,
    pub produce_secs: f64,
    /// From the service's start to the last result read back.
    pub total_secs: f64,
    /// From the first result read back to the last.
    pub steady_secs: f64,
    /// Journal batches (fsyncs) and events recorded (unknown for a service in a child).
    pub batches: Option<u64>,
    pub events: Option<u64>,
    /// Events the outbox publisher read again to project tasks (see `PublisherStats::refolded`).
    pub refolded: Option<u64>,
    /// A service in a child: its peak resident memory.
    pub service_peak_rss_bytes: Option<u64>,
    /// A service in this process: the CPU time this process used from the service's start to
    /// the last result read back (the service, the embedded cluster's brokers, the results
    /// reader, and with a rate the requests' producer; not the remote, in a child). A service
    /// in a child: the child's own CPU time, from its start.
    pub cpu_secs: Option<f64>,
    /// Each task's time from its request handed to the producer to its result read back,
    /// sorted.
    pub latencies: Vec<Duration>,
}

impl Run {
    pub fn tasks_per_sec(&self) -> f64 {
        (self.tasks as f64 / self.total_secs).round()
    }

    /// The latency at quantile `q` (0 to 1), in milliseconds to a tenth.
    pub fn latency_ms(&self, q: f64) -> f64 {
        let Some(last) = self.latencies.len().checked_sub(1) else {
            return 0.0;
        };
        let at = self.latencies[(last as f64 * q).round() as usize];
        (at.as_secs_f64() * 10_000.0).round() / 10.0
    }
}

/// When each request was handed to the producer (index: request number), and how long
/// producing them all took until the last acknowledgement.
struct Produced {
    at: Vec<Instant>,
    secs: f64,
}

/// Produces requests `0..n`, all at once, or `rate` per second.
async fn produce(kafka: &Kafka, n: u64, rate: Option<u64>) -> anyhow::Result<Produced> {
    let producer = RequestProducer::new(kafka)?;
    producer.ready().await;
    let started = Instant::now();
    let begin = tokio::time::Instant::now();
    let mut at = Vec::with_capacity(n as usize);
    let mut acks = Vec::with_capacity(n as usize);
    for i in 0..n {
        if let Some(rate) = rate {
            tokio::time::sleep_until(begin + Duration::from_secs_f64(i as f64 / rate as f64)).await;
        }
        let request = bench_request(i, "payments");
        let value = serde_json::to_vec(&request)?;
        at.push(Instant::now());
        acks.push(producer.send(Some(&request_key(&request)), &value).await?);
    }
    for ack in acks {
        ack.await?;
    }
    Ok(Produced {
        at,
        secs: started.elapsed().as_secs_f64(),
    })
}

/// Produces `n` requests (all before the service starts, or `rate` per second from its start),
/// starts the service of `config` on `kafka`, waits until every task's result has been read
/// back from the results topic (a `read_committed` reader deduplicating by event id), stops the
/// service, and checks that each task had one terminal result.
pub(crate) async fn through_kafka(
    config: &Config,
    kafka: &Kafka,
    n: u64,
    rate: Option<u64>,
    placement: Placement<'_>,
) -> anyhow::Result<Run> {
    config.validate(&BTreeMap::new())?;
    kafka
        .ensure_topics(
            config.kafka.replication_factor,
            Duration::from_secs(30),
            config.storage.mode == sendledger_node::config::StorageMode::Kafka,
        )
        .await?;
    let mut producing = None;
    let mut produced = None;
    if rate.is_none() {
        produced = Some(produce(kafka, n, None).await?);
    }

    let results = tokio::task::block_in_place(|| ResultsReader::start(kafka))?;
    let started = Instant::now();
    let cpu_before = own_cpu_secs();
    let mut service = match placement {
        Placement::InProcess => {
            let remote = Arc::new(HttpRemote::new(config.load_targets()?));
            Running::InProcess(Service::start(config, kafka, remote, None).await?)
        }
        Placement::Child { dir, toml } => Running::Child(ServiceProcess::start(dir, &toml)?),
    };
    if rate.is_some() {
        let kafka = kafka.clone();
        producing = Some(tokio::spawn(async move { produce(&kafka, n, rate).await }));
    }
    let mut first_result = None;
    let mut last_progress = (0, Instant::now());
    loop {
        let (done, _) = results.progress();
        if done > 0 && first_result.is_none() {
            first_result = Some(Instant::now());
        }
        if done >= n as usize {
            break;
        }
        if done > last_progress.0 {
            last_progress = (done, Instant::now());
        }
        anyhow::ensure!(
            last_progress.1.elapsed() < STALLED,
            "no new result for {STALLED:?} ({done} of {n} answered)"
        );
        service.ensure_healthy()?;
        if producing.as_ref().is_some_and(|p| p.is_finished()) {
            if let Some(p) = producing.take() {
                produced = Some(p.await??);
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let total_secs = started.elapsed().as_secs_f64();
    let cpu_secs = own_cpu_secs() - cpu_before;
    let steady_secs = first_result.map_or(total_secs, |t| t.elapsed().as_secs_f64());
    if let Some(p) = producing.take() {
        produced = Some(p.await??);
    }
    let produced = produced.context("the requests were not produced")?;
    let answered_at = results.answered_at();
    let mut latencies: Vec<Duration> = (0..n)
        .filter_map(|i| {
            let task = bench_request(i, "payments")
                .identity()
                .task_id()
                .to_string();
            let read = answered_at.get(&task)?;
            Some(read.saturating_duration_since(produced.at[i as usize]))
        })
        .collect();
    latencies.sort_unstable();
    let (mut batches, mut events, mut refolded, mut service_peak_rss_bytes) =
        (None, None, None, None);
    let cpu = match service {
        Running::InProcess(service) => {
            let stats = service.engine().ledger().stats();
            batches = Some(stats.batches.load(Ordering::Relaxed));
            events = Some(stats.events.load(Ordering::Relaxed));
            refolded = service
                .publisher()
                .map(|p| p.stats().refolded.load(Ordering::Relaxed));
            service.shutdown().await?;
            Some(cpu_secs)
        }
        Running::Child(child) => {
            service_peak_rss_bytes = Some(child.peak_rss_bytes()?);
            let cpu = child.cpu_secs()?;
            let status = tokio::task::block_in_place(|| child.stop(Duration::from_secs(30)))?;
            anyhow::ensure!(status.success(), "the service exited with {status}");
            Some(cpu)
        }
    };
    let (answered, more_than_one_terminal) = results.stop();
    anyhow::ensure!(
        answered == n as usize && more_than_one_terminal == 0,
        "benchmark run broke an invariant: {answered} of {n} answered, {more_than_one_terminal} with two terminal results"
    );
    Ok(Run {
        tasks: n,
        produce_secs: produced.secs,
        total_secs,
        steady_secs,
        batches,
        events,
        refolded,
        service_peak_rss_bytes,
        cpu_secs: cpu,
        latencies,
    })
}

/// Fails when the remote holds two records of one task.
pub(crate) async fn check_remote(sim: &RemoteProcess, run: &Run) -> anyhow::Result<()> {
    let duplicates = sim.stats().await?.duplicates;
    anyhow::ensure!(
        duplicates == 0,
        "benchmark run broke an invariant: {duplicates} duplicates at the remote after {} tasks",
        run.tasks
    );
    Ok(())
}
