//! `sendledger bench effects`: attempts per second through the effects layer against the
//! simulated remote on loopback, and the simulated remote's own capacity under a bare HTTP
//! load, so end-to-end numbers can be judged against what the remote can take.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use sendledger_core::{AcceptedRequest, Limits};
use sendledger_effects::{AttemptOutcome, Target, TargetConfig};
use sendledger_sim::{Sim, SimConfig};

#[derive(Args)]
pub struct EffectsArgs {
    /// Attempts (and bare requests) in flight at once.
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
    /// Length of each measured run, in seconds.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Worker threads of the simulated remote.
    #[arg(long, default_value_t = 1)]
    sim_threads: usize,
    /// Worker threads of the client (effects layer or bare load).
    #[arg(long, default_value_t = 1)]
    client_threads: usize,
    /// Open a new connection per attempt instead of reusing idle ones.
    #[arg(long)]
    fresh_connections: bool,
}

fn bench_request(n: u64) -> anyhow::Result<AcceptedRequest> {
    crate::bench::bench_request(n, "payments")
        .accept(&Limits::default())
        .context("bench request")
}

struct AttemptRun {
    attempts: u64,
    per_sec: f64,
    latencies_us: Vec<u64>,
    outcomes: [u64; 4],
}

async fn attempts(
    target: Arc<Target>,
    in_flight: usize,
    seconds: f64,
) -> anyhow::Result<AttemptRun> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut workers = Vec::new();
    for w in 0..in_flight as u64 {
        let target = target.clone();
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut outcomes = [0u64; 4];
            let mut n = 0u64;
            while Instant::now() < deadline {
                let request = bench_request(w << 32 | n)?;
                let t = Instant::now();
                let outcome = target.execute(&request, 1, None).await;
                latencies.push(t.elapsed().as_micros() as u64);
                outcomes[match outcome {
                    AttemptOutcome::Succeeded { .. } => 0,
                    AttemptOutcome::NotSent { .. } => 1,
                    AttemptOutcome::Rejected { .. } => 2,
                    AttemptOutcome::Unknown { .. } => 3,
                }] += 1;
                n += 1;
            }
            anyhow::Ok((latencies, outcomes))
        }));
    }
    let mut run = AttemptRun {
        attempts: 0,
        per_sec: 0.0,
        latencies_us: Vec::new(),
        outcomes: [0; 4],
    };
    for w in workers {
        let (latencies, outcomes) = w.await??;
        run.latencies_us.extend(latencies);
        for (total, n) in run.outcomes.iter_mut().zip(outcomes) {
            *total += n;
        }
    }
    run.attempts = run.latencies_us.len() as u64;
    run.per_sec = run.attempts as f64 / started.elapsed().as_secs_f64();
    run.latencies_us.sort_unstable();
    Ok(run)
}

/// Bare HTTP/1.1 creates over `in_flight` keep-alive connections: no classification, no
/// templates, the least a client can do. Returns (requests, requests per second).
async fn bare_load(
    sim_addr: std::net::SocketAddr,
    path: String,
    in_flight: usize,
    seconds: f64,
) -> anyhow::Result<(u64, f64)> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut workers = Vec::new();
    for w in 0..in_flight as u64 {
        let path = path.clone();
        workers.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(sim_addr).await?;
            stream.set_nodelay(true)?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(conn);
            let mut n = 0u64;
            while Instant::now() < deadline {
                let body =
                    format!(r#"{{"amount":1250,"currency":"EUR","request_key":"raw-{w}-{n}"}}"#);
                let request = http::Request::post(path.as_str())
                    .header(http::header::HOST, "sim")
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(Full::new(Bytes::from(body)))?;
                sender.ready().await?;
                let response = sender.send_request(request).await?;
                anyhow::ensure!(
                    response.status().is_success(),
                    "bare create answered {}",
                    response.status()
                );
                response.into_body().collect().await?;
                n += 1;
            }
            anyhow::Ok(n)
        }));
    }
    let mut total = 0;
    for w in workers {
        total += w.await??;
    }
    Ok((total, total as f64 / started.elapsed().as_secs_f64()))
}

pub fn run(args: EffectsArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.in_flight > 0, "--in-flight must be at least 1");
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
    anyhow::ensure!(
        args.sim_threads > 0 && args.client_threads > 0,
        "--sim-threads and --client-threads must be at least 1"
    );
    let sim_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.sim_threads)
        .thread_name("sim")
        .enable_all()
        .build()?;
    let sim = sim_runtime
        .block_on(Sim::start(SimConfig {
            identity_field: "reference".into(),
            ..SimConfig::default()
        }))
        .context("starting the simulated remote")?;
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads)
        .thread_name("client")
        .enable_all()
        .build()?;
    let config: TargetConfig = toml::from_str(&format!(
        "url = \"{}\"\nrequest_timeout = \"10s\"\npool_idle_timeout = \"{}\"\nbody_fields = {{ reference = \"{{task_id}}\" }}",
        sim.create_url(),
        if args.fresh_connections { "0s" } else { "5s" },
    ))?;
    let target = Arc::new(Target::from_config("payments", &config)?);

    let before = sim.stats();
    let started = Instant::now();
    let run = client.block_on(attempts(target, args.in_flight, args.seconds))?;
    let sim_posts_per_sec =
        (sim.stats().posts - before.posts) as f64 / started.elapsed().as_secs_f64();
    let (bare, bare_per_sec) = client.block_on(bare_load(
        sim.addr(),
        sim.config().create_path.clone(),
        args.in_flight,
        args.seconds,
    ))?;
    let stats = sim.stats();

    let round = |x: f64| (x * 100.0).round() / 100.0;
    let pct = |p: f64| {
        let v = &run.latencies_us;
        if v.is_empty() {
            0.0
        } else {
            round(v[((v.len() - 1) as f64 * p) as usize] as f64 / 1000.0)
        }
    };
    let report = serde_json::json!({
        "bench": "effects",
        "in_flight": args.in_flight,
        "seconds_per_run": args.seconds,
        "sim_threads": args.sim_threads,
        "client_threads": args.client_threads,
        "connections": if args.fresh_connections { "fresh" } else { "pooled" },
        "attempts": run.attempts,
        "attempts_per_sec": round(run.per_sec),
        "attempt_latency_ms": { "p50": pct(0.50), "p99": pct(0.99), "max": pct(1.0) },
        "outcomes": { "succeeded": run.outcomes[0], "not_sent": run.outcomes[1], "rejected": run.outcomes[2], "unknown": run.outcomes[3] },
        "sim_posts_per_sec_during_attempts": round(sim_posts_per_sec),
        "sim_bare_requests": bare,
        "sim_bare_requests_per_sec": round(bare_per_sec),
        "attempts_to_bare_ratio": round(run.per_sec / bare_per_sec.max(1.0)),
        "sim": { "connections": stats.connections, "records": stats.records, "duplicates": stats.duplicates },
    });
    println!("{report}");
    client.shutdown_timeout(Duration::from_secs(1));
    drop(sim);
    sim_runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}
