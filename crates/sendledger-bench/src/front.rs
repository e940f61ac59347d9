//! `sendledger-bench front`: tasks per second through the HTTP front door, each submitted with
//! its own `Idempotency-Key` and `Prefer: wait`, by many keep-alive connections at once,
//! against the simulated remote answering after a fixed latency; each task's latency from its
//! POST to the answer with its result; the service's peak memory (it runs as a `sendledger
//! run` child on the embedded cluster of this process). With `--compare-kafka` the same tasks
//! then go through the requests topic alone, on a fresh cluster, in the same run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use sendledger_kafka::Kafka;
use sendledger_store::Durability;

use crate::kafka::{bench_config, check_remote, child_config, round4, through_kafka, Placement};
use crate::ledger::bench_request;
use crate::process::{RemoteProcess, ServiceProcess};

#[derive(Args)]
pub struct FrontArgs {
    /// Tasks to submit, one POST each.
    #[arg(long, default_value_t = 20_000)]
    tasks: u64,
    /// Keep-alive connections submitting at once, each one request after another.
    #[arg(long, default_value_t = 64)]
    connections: u64,
    /// How long the simulated remote takes to answer each attempt.
    #[arg(long, default_value = "5ms", value_parser = humantime::parse_duration)]
    remote_latency: Duration,
    /// `Prefer: wait=N`, in seconds.
    #[arg(long, default_value_t = 10)]
    wait: u64,
    /// Partitions of the requests and results topics.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Then run the same tasks through the requests topic (all produced up front, results
    /// read back from the results topic) on a fresh embedded cluster, and report its tasks/s
    /// and this run's ratio to it.
    #[arg(long)]
    compare_kafka: bool,
}

pub fn run(args: FrontArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.tasks > 0, "--tasks must be positive");
    anyhow::ensure!(args.connections > 0, "--connections must be positive");
    sendledger_node::runtime::runtime()?.block_on(bench(args))
}

/// What the clients saw.
struct Answers {
    secs: f64,
    /// Each POST's time to its answer, sorted.
    latencies: Vec<Duration>,
    /// 201 with a succeeded result; 202 (the wait passed); anything else.
    created: u64,
    pending: u64,
    other: u64,
}

async fn bench(args: FrontArgs) -> anyhow::Result<()> {
    let sim = RemoteProcess::start_with(args.remote_latency)?;
    let dir = tempfile::tempdir()?;
    let mut config = bench_config(&sim, dir.path(), Durability::Sync)?;
    config.kafka.partitions = args.partitions;
    let kafka = tokio::task::block_in_place(|| Kafka::connect(config.kafka.clone()))?;
    let one = serde_json::to_vec(&bench_request(0, "payments"))?.len() as u64;
    kafka.check_embedded_backlog(args.tasks, args.tasks * (one + 64))?;
    kafka
        .ensure_topics(
            config.kafka.replication_factor,
            Duration::from_secs(30),
            false,
        )
        .await?;
    let addr = free_port()?;
    config.front.enabled = true;
    config.front.listen = addr;
    config.front.max_connections = (args.connections as usize + 16).max(1024);
    config.validate(&Default::default())?;
    let mut service = ServiceProcess::start(
        dir.path(),
        &child_config(&config, kafka.bootstrap_servers())?,
    )?;
    wait_until_listening(addr, &mut service).await?;

    let cpu_before = service.cpu_secs()?;
    let answers = submit_all(addr, &args).await?;
    let service_cpu = service.cpu_secs()? - cpu_before;
    let peak_rss = service.peak_rss_bytes()?;
    let status = tokio::task::block_in_place(|| service.stop(Duration::from_secs(30)))?;
    anyhow::ensure!(status.success(), "the service exited with {status}");
    let remote = sim.stats().await?;
    anyhow::ensure!(
        remote.duplicates == 0,
        "benchmark run broke an invariant: {} duplicates at the remote",
        remote.duplicates
    );

    let kafka_path = match args.compare_kafka {
        false => None,
        true => Some(kafka_alone(&args).await?),
    };
    let n = args.tasks as f64;
    let tasks_per_sec = (n / answers.secs).round();
    let quantile = |q: f64| {
        let last = answers.latencies.len().saturating_sub(1);
        let at = answers.latencies.get((last as f64 * q).round() as usize);
        at.map_or(0.0, |d| (d.as_secs_f64() * 10_000.0).round() / 10.0)
    };
    println!(
        "{}",
        serde_json::json!({
            "tasks": args.tasks,
            "connections": args.connections,
            "remote_latency_ms": args.remote_latency.as_millis() as u64,
            "wait_secs": args.wait,
            "partitions": args.partitions,
            "tasks_per_sec": tasks_per_sec,
            "latency_ms_p50": quantile(0.50),
            "latency_ms_p99": quantile(0.99),
            "latency_ms_max": quantile(1.0),
            "answered_201": answers.created,
            "answered_202": answers.pending,
            "answered_other": answers.other,
            "remote_records": remote.records,
            "remote_duplicates": remote.duplicates,
            "service_peak_rss_bytes": peak_rss,
            // The service's own CPU time per task (the clients, the embedded cluster and the
            // remote run in other processes or in this one, on the same cores).
            "service_cpu_us_per_task": (service_cpu * 1e6 / n).round(),
            "kafka_tasks_per_sec": kafka_path.as_ref().map(|k| k.tasks_per_sec()),
            "kafka_latency_ms_p99": kafka_path.as_ref().map(|k| k.latency_ms(0.99)),
            "kafka_service_cpu_us_per_task": kafka_path.as_ref().and_then(|k| k.cpu_secs).map(|c| (c * 1e6 / n).round()),
            "ratio_to_kafka": kafka_path.as_ref().map(|k| round4(tasks_per_sec / k.tasks_per_sec())),
        })
    );
    Ok(())
}

/// A local port free now (bound, then released), for the service's front door.
fn free_port() -> anyhow::Result<std::net::SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

/// Waits until the service's front door accepts connections.
async fn wait_until_listening(
    addr: std::net::SocketAddr,
    service: &mut ServiceProcess,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        service.ensure_running()?;
        anyhow::ensure!(
            Instant::now() < deadline,
            "the front door did not listen on {addr} within 60 s: {}",
            service.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Submits tasks `0..args.tasks` over `args.connections` connections.
async fn submit_all(addr: std::net::SocketAddr, args: &FrontArgs) -> anyhow::Result<Answers> {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let clients: Vec<_> = (0..args.connections)
        .map(|_| tokio::spawn(client(addr, next.clone(), args.tasks, args.wait)))
        .collect();
    let mut answers = Answers {
        secs: 0.0,
        latencies: Vec::with_capacity(args.tasks as usize),
        created: 0,
        pending: 0,
        other: 0,
    };
    for client in clients {
        for (latency, status, succeeded) in client.await?? {
            answers.latencies.push(latency);
            match status {
                201 if succeeded => answers.created += 1,
                202 => answers.pending += 1,
                _ => answers.other += 1,
            }
        }
    }
    answers.secs = started.elapsed().as_secs_f64();
    answers.latencies.sort_unstable();
    Ok(answers)
}

/// One connection's POSTs, one after another, until every task is taken: each one's latency,
/// status, and whether its result says succeeded.
async fn client(
    addr: std::net::SocketAddr,
    next: Arc<AtomicU64>,
    tasks: u64,
    wait: u64,
) -> anyhow::Result<Vec<(Duration, u16, bool)>> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let mut seen = Vec::new();
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= tasks {
            return Ok(seen);
        }
        let request = bench_request(i, "payments");
        let body = serde_json::to_vec(&request)?;
        let post = http::Request::post("/v1/tasks")
            .header(http::header::HOST, addr.to_string())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("idempotency-key", format!("\"{}\"", request.request_key))
            .header("prefer", format!("wait={wait}"))
            .body(Full::new(Bytes::from(body)))?;
        let sent = Instant::now();
        let answer = sender.send_request(post).await.context("POST /v1/tasks")?;
        let status = answer.status().as_u16();
        let body = answer.into_body().collect().await?.to_bytes();
        let latency = sent.elapsed();
        let result: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        seen.push((latency, status, result["status"] == "succeeded"));
    }
}

/// The same tasks through the requests topic only, on a fresh embedded cluster and ledger,
/// the service in a child, against a fresh remote with the same latency.
async fn kafka_alone(args: &FrontArgs) -> anyhow::Result<crate::kafka::Run> {
    let sim = RemoteProcess::start_with(args.remote_latency)?;
    let dir = tempfile::tempdir()?;
    let mut config = bench_config(&sim, dir.path(), Durability::Sync)?;
    config.kafka.partitions = args.partitions;
    let kafka = tokio::task::block_in_place(|| Kafka::connect(config.kafka.clone()))?;
    let toml = child_config(&config, kafka.bootstrap_servers())?;
    let run = through_kafka(
        &config,
        &kafka,
        args.tasks,
        None,
        Placement::Child {
            dir: dir.path(),
            toml,
        },
    )
    .await?;
    check_remote(&sim, &run).await?;
    Ok(run)
}
